"""The training subcommands of `jaxbert` (train, train-mlm) and the fine-tuned model's (predict, evaluate):
argparse builders that parse and call library functions. Training flags are generated from TrainConfig's
fields, so the two never drift apart."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from jaxbert.cli_flags import POSITIVE, flags_of
from jaxbert.entities import STRATEGIES

SCALE_HELP = {  # the mesh and multi-process flags (see README "Running on many machines")
    "mesh": ("data=N,fsdp=N,tensor=N", "device mesh (-1: the rest; default all devices on data)"),
    "coordinator_address": ("HOST:PORT", "multi-process: process 0's address (with --num-processes, --process-id)"),
    "num_processes": ("N", "multi-process: how many processes the run has"),
    "process_id": ("N", "multi-process: this process's number, 0 to N-1"),
}


FLAG_HELP = {  # --predict-with-generate's search, as evaluate's flags of the same names
    "num_beams": "--predict-with-generate's beams (default: the model's generation config)",
    "val_max_target_length": "--task seq2seq: validation targets cut to N tokens, and generated at most (the "
    "decoder's start counted; default --max-target-length)",
}


def _add_config_flags(parser, skip: tuple[str, ...] = ()) -> None:
    from jaxbert.train.config import EMBEDDING_LOSSES, PROBLEM_TYPES, TASKS, TrainConfig

    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.name in skip:
            continue
        if field.name == "progress":
            parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
        elif field.name == "pack":
            parser.add_argument(
                "--no-pack",
                dest="pack",
                action="store_false",
                help="one example a row, padded, instead of examples packed into shared rows (line-by-line MLM, "
                "sequence and token classification pack by default)",
            )
        elif field.name == "resume":
            parser.add_argument(
                flag,
                nargs="?",
                const="auto",
                default=None,
                metavar="auto|PATH",
                help="continue from the latest intact checkpoint in OUT (auto) or from PATH",
            )
        elif field.name == "break_lock":
            parser.add_argument(
                flag, action="store_true", help="take over OUT's lock left by an interrupted run (or by another host)"
            )
        elif field.name == "task":
            parser.add_argument(flag, required=True, choices=TASKS)
        elif field.name in SCALE_HELP:
            metavar, text = SCALE_HELP[field.name]
            kind = int if metavar == "N" else str
            parser.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)
        elif field.name == "problem_type":
            parser.add_argument(
                flag, choices=PROBLEM_TYPES, default=None, help="sequence classification (default: from the labels)"
            )
        elif field.name == "pooling":
            parser.add_argument(
                flag,
                choices=("cls", "mean", "max"),
                default=None,
                help="--task embedding: the embedding's pooling (default: the model's sentence-transformers "
                "pipeline's, else mean)",
            )
        elif field.name == "normalize":
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=None,
                help="--task embedding: unit-length embeddings (default: as the model's sentence-transformers "
                "pipeline, else not)",
            )
        elif field.name == "symmetric":
            what = "--task embedding: also positives -> anchors in the loss"
            parser.add_argument(flag, action="store_true", help=what)
        elif field.name == "loss":
            parser.add_argument(
                flag,
                choices=EMBEDDING_LOSSES,
                default="mnrl",
                help="--task embedding: mnrl on (anchor, positive[, negative_1, ...]) rows; cosent, "
                "cosine-similarity or angle on (sentence1, sentence2, score) pairs, as sentence-transformers' losses",
            )
        elif field.name == "prompts":
            parser.add_argument(
                flag,
                nargs="+",
                default=None,
                metavar="PROMPT | COLUMN=PROMPT",
                help="--task embedding: a prompt before every column's texts, or each named column's (e.g. "
                "anchor='query: ' positive='passage: '), as sentence-transformers' trainer's prompts",
            )
        elif field.name == "label_all_tokens":
            what = "--task token-classification: label a word's later sub-tokens too (B- as I-), as run_ner.py's"
            parser.add_argument(flag, action="store_true", help=what)
        elif field.name == "predict_with_generate":
            what = "--task seq2seq: each validation also generates and reports ROUGE and gen_len (run_summarization's)"
            parser.add_argument(flag, action="store_true", help=what)
        elif field.type == "bool":
            parser.add_argument(flag, action="store_true")
        elif field.default is dataclasses.MISSING:
            parser.add_argument(flag, required=True)
        else:
            kind = {"int": int, "float": float}.get(str(field.type).split(" |")[0], str)
            parser.add_argument(
                flag, type=kind, default=field.default, metavar=kind.__name__.upper(), help=FLAG_HELP.get(field.name)
            )


def _train(args) -> int:
    """Exit 1 on errors (one line), 130 on Ctrl-C and 143 on SIGTERM (naming the step and the checkpoint to
    continue from)."""
    from jaxbert.files import one_line
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.loop import Interrupted, TrainingError, train

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    try:
        train(TrainConfig(**values))
    except Interrupted as e:
        print(f"jaxbert {args.command}: {one_line(e)}", file=sys.stderr)
        return 128 + e.signum
    except TrainingError as e:
        print(f"jaxbert {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 1
    return 0


def _predict(args) -> int:
    from jaxbert.finetuned import predict

    n = predict(
        args.dir,
        args.input,
        args.output,
        batch_size=args.batch_size,
        text_column=args.text_column,
        pair_column=args.text_pair_column,
        max_length=args.max_seq_length,
        version_2_with_negative=args.version_2_with_negative,
        null_score_diff_threshold=args.null_score_diff_threshold,
        aggregation_strategy=args.aggregation_strategy,
        ignore_labels=None if args.ignore_labels is None else [x for x in args.ignore_labels.split(",") if x],
    )
    print(f"predicted {n} inputs -> {args.output}")
    return 0


def _evaluate(args) -> int:
    from jaxbert.finetuned import evaluate

    result = evaluate(
        args.dir,
        args.task,
        args.file,
        args.output,
        text_column=args.text_column,
        pair_column=args.text_pair_column,
        label_column=args.label_column,
        batch_size=args.batch_size,
        max_length=args.max_seq_length,
        version_2_with_negative=args.version_2_with_negative,
        null_score_diff_threshold=args.null_score_diff_threshold,
        prompts=((args.query_prompt, args.query_prompt_name), (args.corpus_prompt, args.corpus_prompt_name)),
        max_source_length=args.max_source_length,
        val_max_target_length=args.val_max_target_length,
        predict_with_generate=args.predict_with_generate,
        num_beams=args.num_beams,
        loss=args.loss,
    )
    types = [k.removesuffix("_number") for k in result if k.endswith("_number")]  # a tagger's entity types
    by_type = {f"{t}_{k}" for t in types for k in ("precision", "recall", "f1", "number")}
    shown = [name for name in result if name not in by_type]
    width = max(12, *map(len, shown), *map(len, types))  # spearman_cosine, query_prompt_name: one column still
    for name in shown:
        value = result[name]
        print(f"  {name:<{width}} {value}" if isinstance(value, int) else f"  {name:<{width}} {value:.4f}")
    for t in types:  # one line a type, as seqeval's classification_report
        scores = " ".join(f"{k} {result[f'{t}_{k}']:.4f}" for k in ("precision", "recall", "f1"))
        print(f"  {t:<{width}} {scores} number {result[f'{t}_number']}")
    print(f"wrote {args.output}")
    return 0


def _add_qa_flags(parser) -> None:
    qa = parser.add_argument_group("question answering (default: as the model was trained here, else run_qa's)")
    qa.add_argument(
        "--version-2-with-negative",
        action="store_true",
        default=None,
        help="SQuAD 2.0: a question may have no answer (the null answer when it beats the best span)",
    )
    qa.add_argument("--null-score-diff-threshold", type=float, default=None, help="null answer above this margin")


def add_parsers(sub) -> None:
    from jaxbert.train.config import EMBEDDING_LOSSES, TASK_FIELDS, TASKS

    mlm = sub.add_parser("train-mlm", help="masked-language-model fine-tuning (= train --task mlm)")
    _add_config_flags(mlm, skip=TASK_FIELDS)
    mlm.set_defaults(func=_train, task="mlm")
    train = sub.add_parser(
        "train",
        help="fine-tune on a task: classification, regression, NER, multiple choice, QA, embeddings, MLM, causal LM "
        "(resumable, multi-device)",
    )
    _add_config_flags(train)
    train.set_defaults(func=_train)
    predict = sub.add_parser("predict", help="a fine-tuned model's predictions for a file, one JSON line each")
    predict.add_argument("dir")
    predict.add_argument("--input", required=True, help=".txt (one text per line), .jsonl, .csv or .tsv")
    predict.add_argument("--output", required=True, help="FILE.jsonl: one JSON line per input, input order")
    predict.add_argument("--batch-size", type=POSITIVE, default=32)
    predict.add_argument("--text-column", default=None)
    predict.add_argument("--text-pair-column", default=None)
    predict.add_argument(
        "--max-seq-length", type=int, default=None, help="tokens a text is read at (default: as trained, as evaluate)"
    )
    predict.add_argument(
        "--aggregation-strategy",
        choices=STRATEGIES,
        default=None,
        help="a tagger's entities as transformers' token-classification pipeline groups them (default: tag's words)",
    )
    predict.add_argument(
        "--ignore-labels",
        default=None,
        metavar="A,B",
        help="labels left out of the entities, comma-separated ('' keeps all; default O), as the pipeline's",
    )
    _add_qa_flags(predict)
    predict.set_defaults(func=_predict, flags=flags_of(predict, max_length="--max-seq-length"))
    evaluate = sub.add_parser("evaluate", help="a fine-tuned model's validation metrics on a labelled file")
    evaluate.add_argument("dir")
    evaluate.add_argument(
        "--task",
        required=True,
        choices=tuple(t for t in TASKS if t != "mlm"),  # every fine-tuning task train has
    )
    evaluate.add_argument("--file", required=True, help=".jsonl, .csv or .tsv with the training file's columns")
    evaluate.add_argument("--output", default="eval_results.json", help="FILE.json the metrics are written to")
    evaluate.add_argument("--text-column", default=None)
    evaluate.add_argument("--text-pair-column", default=None)
    evaluate.add_argument("--label-column", default=None)
    evaluate.add_argument("--batch-size", type=POSITIVE, default=32)
    evaluate.add_argument("--max-seq-length", type=int, default=None)
    seq2seq = evaluate.add_argument_group("seq2seq (default: as the model was trained here)")
    seq2seq.add_argument("--max-source-length", type=int, default=None, help="tokens a source is cut to")
    seq2seq.add_argument(
        "--val-max-target-length",
        type=int,
        default=None,
        help="tokens a target is cut to, and generated at most (the decoder's start counted; run_summarization's)",
    )
    seq2seq.add_argument(
        "--predict-with-generate",
        action="store_true",
        help="also generate for each source and report ROUGE and gen_len, as run_summarization.py",
    )
    seq2seq.add_argument(
        "--num-beams",
        type=POSITIVE,
        default=None,
        help="the generation's beams (default: the model's generation config)",
    )
    for side, what in (("query", "anchors"), ("corpus", "positives and negatives")):  # --task embedding
        prompt = evaluate.add_mutually_exclusive_group()
        prompt.add_argument(f"--{side}-prompt", default=None, help=f"text put before the {what} (embedding)")
        prompt.add_argument(
            f"--{side}-prompt-name", default=None, help=f"the model's prompt put before the {what} (embedding)"
        )
    evaluate.add_argument(
        "--loss",
        choices=EMBEDDING_LOSSES,
        default=None,
        help="--task embedding: the loss reported; cosent, cosine-similarity or angle read (sentence1, sentence2, "
        "score) pairs and report the correlations of their similarities with the scores (default mnrl)",
    )
    _add_qa_flags(evaluate)
    evaluate.set_defaults(func=_evaluate, flags=flags_of(evaluate, max_length="--max-seq-length"))
