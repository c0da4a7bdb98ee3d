"""A fine-tuned model applied to files: `predict` (one JSON line per input, input order) and `evaluate` (the
task's validation metrics on a labelled file, as training reports them). How they read their inputs (columns, QA
options, multiple choice and answers) is finetuned_inputs.py's, re-exported here."""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from jaxbert import batching, cpu, hub
from jaxbert.checkpoint import model_files
from jaxbert.config import padding_id
from jaxbert.files import atomic_file, check_not_read, check_output_file
from jaxbert.finetuned_inputs import _answers, _choose, _inputs, _tag_inputs, _trained_columns, qa_options
from jaxbert.inputs import positive_int


def _prompts_used(asked, texts: tuple[str, str], loss: str = "mnrl") -> dict:
    """evaluate --task embedding's prompts for its output file: each side's text put before it (given, or named:
    asked, else its role's, task_embedding.ROLES; "" for none) and the name it came by (null for a text given), so
    that the numbers can be reproduced (--query-prompt TEXT gives them again, whatever the directory's prompts
    become). Scored pairs: the name asked, else none (the default prompt's text, as encode's)."""
    from jaxbert.train.task_embedding import ROLES, role_name

    used = {}
    roles = ROLES if loss == "mnrl" else (None, None)
    for side, (prompt, name), role, text in zip(("query", "corpus"), asked, roles, texts):
        used |= {f"{side}_prompt": text, f"{side}_prompt_name": role_name(prompt, name, role)}
    return used


def json_line(value) -> str:
    """`value` as one line of JSON, text kept readable (not \\u-escaped) except the line and paragraph separators
    U+2028 / U+2029: JSON allows them raw, but Python's `str.splitlines` and many readers of lines split there."""
    return json.dumps(value, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def predict(
    directory: str,
    input_path: str,
    output: str,
    batch_size: int = 32,
    text_column: str | None = None,
    pair_column: str | None = None,
    max_length: int | None = None,
    version_2_with_negative: bool | None = None,
    null_score_diff_threshold: float | None = None,
    aggregation_strategy: str | None = None,
    ignore_labels: list[str] | None = None,
) -> int:
    """Predictions of the model in `directory` for every input, written to `output` (.jsonl) atomically:
    classify's dicts (sequence classification), {"words": tag's list} (token classification; {"entities": ...}
    with an `aggregation_strategy`, tag's, `ignore_labels` left out), {label, scores} (multiple choice),
    {answer, score, start, end} (question answering: _answers). Returns the number of inputs.

    Texts are read at `max_length` tokens (tag's windows; classify and multiple choice cut longer ones), by default
    the length the model was trained with, else the model's, as `evaluate` reads them: the predictions are the
    ones it scores. A question-answering model's `version_2_with_negative` and `null_score_diff_threshold` (None:
    as trained) replace its trained options, as in `evaluate` (qa_options)."""
    import jaxbert
    from jaxbert.train.task_table import trained_length

    if not output.endswith(".jsonl"):
        raise ValueError(f"--output {output}: expected a .jsonl file")
    check_output_file(output)  # before any work
    directory = hub.resolve(directory)  # a hub id's snapshot: its files are the ones read
    check_not_read(output, [input_path, *model_files(directory)])
    if input_path.endswith(".txt"):  # a text a line: a column named would go unread
        for flag, column in (("--text-column", text_column), ("--text-pair-column", pair_column)):
            if column is not None:
                raise ValueError(
                    f"{flag} {column}: {input_path} is a .txt file, one text a line, no columns; give a .jsonl, "
                    ".csv or .tsv file"
                )
    bert = jaxbert.load(directory)
    if aggregation_strategy is not None and bert.head != "BertForTokenClassification":
        raise ValueError(f"--aggregation-strategy: groups a token classification model's tags; this is {bert.head}")
    if ignore_labels is not None and bert.head != "BertForTokenClassification":
        raise ValueError(
            f"--ignore-labels: labels left out of a token classification model's entities; this is {bert.head}"
        )
    if ignore_labels is not None and aggregation_strategy is None:  # before any work, as tag would refuse it
        raise ValueError("--ignore-labels: labels left out of the entities; give --aggregation-strategy too")
    task = "question-answering" if bert.head == "BertForQuestionAnswering" else bert.head
    trained_qa = qa_options(bert.config, task, version_2_with_negative, null_score_diff_threshold)
    if max_length is not None:
        positive_int("--max-seq-length", max_length, bert.config.max_position_embeddings)
    trained = trained_length(bert.config)
    length = max_length or (min(trained, bert.config.max_position_embeddings) if trained else bert.max_length(None))
    if bert.head == "BertForSequenceClassification":
        text_column, pair_column = _trained_columns(bert.config, text_column, pair_column)
        if input_path.endswith(".txt") and pair_column is not None:
            raise ValueError(
                f"{input_path}: this model reads text pairs (columns {text_column!r}, {pair_column!r}) and a .txt "
                "file holds single texts; give a .jsonl, .csv or .tsv file with both columns"
            )
        texts, pairs = _inputs(input_path, text_column or "text", pair_column)
        results = bert.classify(texts, pairs, batch_size=batch_size, max_length=length)
    elif bert.head == "BertForTokenClassification":
        if pair_column is not None:  # a tagger reads one text: the pairs would go unread
            raise ValueError(f"--text-pair-column {pair_column}: a token classification model tags single texts")
        texts, words = _tag_inputs(input_path, text_column, bert.config)
        options = dict(aggregation_strategy=aggregation_strategy, ignore_labels=ignore_labels)
        found = bert.tag(texts, batch_size=batch_size, max_length=length, is_split_into_words=words, **options)
        results = [{"words" if aggregation_strategy is None else "entities": x} for x in found]
    elif bert.head == "BertForMultipleChoice":
        text_column, pair_column = _trained_columns(bert.config, text_column, pair_column)
        results = _choose(bert, input_path, text_column or "context", pair_column or "choices", batch_size, length)
    elif bert.head == "BertForQuestionAnswering":  # the best answer of each (question, context) row
        results = _answers(
            bert, input_path, text_column or "question", pair_column or "context", batch_size, max_length, trained_qa
        )
    else:
        raise ValueError(
            f"{directory}: predict needs a sequence classification, token classification, multiple choice "
            f"or question answering model; this one is {bert.head}"
        )
    with atomic_file(output, ".jsonl") as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json_line(r) + "\n" for r in results)
    return len(results)


def evaluate(
    directory: str,
    task_name: str,
    path: str,
    output: str,
    *,
    text_column=None,
    pair_column=None,
    label_column=None,
    batch_size: int = 32,
    max_length: int | None = None,
    version_2_with_negative: bool | None = None,
    null_score_diff_threshold: float | None = None,
    prompts=((None, None), (None, None)),
    max_source_length: int | None = None,
    val_max_target_length: int | None = None,
    predict_with_generate: bool = False,
    num_beams: int | None = None,
    loss: str | None = None,
) -> dict:
    """The task's metrics of the model in `directory` on the labelled file `path` (labels named through the
    model's label2id) at `max_length` tokens (default: the length it was trained with, else the model's), written
    to `output` (.json) atomically and returned. Token classification also counts the words beyond that length,
    which are not scored (words_not_scored). Question answering reads with the options it was trained with, or
    with `version_2_with_negative` and `null_score_diff_threshold` where given (qa_options). Embedding reads the
    anchors and the others with `prompts`: ((prompt, prompt_name) of the queries, of the corpus), as
    sentence-transformers' InformationRetrievalEvaluator's query_prompt(_name) / corpus_prompt(_name); with a
    `loss` of scored pairs (cosent, cosine-similarity, angle) it reads (sentence1, sentence2, score) rows and
    reports that loss and EmbeddingSimilarityEvaluator's correlations (task_scored.py). Seq2seq cuts
    sources at `max_source_length` and targets at `val_max_target_length` (run_summarization.py's), each else at
    `max_length`, else as trained; with `predict_with_generate` it also generates for each source (`num_beams`,
    and a length of `val_max_target_length` tokens counting the decoder's start, else `max_length`, else the
    trained target length, else the model's generation config) and reports run_summarization.py's ROUGE and gen_len
    (task_seq2seq.generation_scores), the output file also holding the generated texts."""
    from types import SimpleNamespace

    from jaxbert import qa
    from jaxbert.checkpoint import load_params
    from jaxbert.heads import resolve_head
    from jaxbert.seq2seq import config_sides, load_config
    from jaxbert.tokenizer import WordPiece
    from jaxbert.train import task_qa
    from jaxbert.train.step import task_eval_step
    from jaxbert.train.task_data import read_rows
    from jaxbert.train.task_encode import IGNORE, check_tables
    from jaxbert.train.task_labels import check_scorable, model_labels
    from jaxbert.train.task_plan import evaluate_examples
    from jaxbert.train.task_table import (
        TASKS,
        columns,
        nonempty_rows,
        trained_all_tokens,
        trained_label,
        trained_length,
        trained_loss,
        trained_sides,
    )

    if not output.endswith(".json"):
        raise ValueError(f"--output {output}: expected a .json file")
    check_output_file(output)
    directory = hub.resolve(directory)  # a hub id's snapshot, as every command reads one
    check_not_read(output, [path, *model_files(directory)])
    task = TASKS[task_name]
    if task_name != "embedding" and prompts != ((None, None), (None, None)):
        raise ValueError(f"--task {task_name}: query and corpus prompts are for --task embedding")
    if num_beams is not None and not predict_with_generate:  # a search that would not run
        raise ValueError("--num-beams: the beams of --predict-with-generate's search; pass that too")
    if predict_with_generate and task_name != "seq2seq":
        raise ValueError(f"--predict-with-generate: applies to --task seq2seq only, not {task_name}")
    if predict_with_generate:
        from jaxbert.metrics_text import rouge_scorer

        rouge_scorer()  # a missing package is named before any work
    if task_name != "seq2seq" and (max_source_length, val_max_target_length) != (None, None):
        flag = "--max-source-length" if max_source_length is not None else "--val-max-target-length"
        raise ValueError(f"{flag}: applies to --task seq2seq only, not {task_name} (--max-seq-length cuts its texts)")
    if task_name != "embedding" and loss is not None:
        raise ValueError(f"--loss applies to --task embedding only, not --task {task_name}")
    config = load_config(directory)
    own_loss = trained_loss(config)  # None for a model not trained here (or not an embedding model)
    if task_name == "embedding":  # the loss it was trained with (task_table.COLUMNS_KEY) unless --loss says
        loss = loss or own_loss or "mnrl"
    if loss not in (None, "mnrl"):  # scored pairs: their columns and metrics (the model's similarity is read below)
        from jaxbert.train import task_scored

        task = task_scored.task(loss)
    trained_qa = qa_options(config, task_name, version_2_with_negative, null_score_diff_threshold)
    head = resolve_head(None, config)
    if head != task.head:
        raise ValueError(f"{directory}: a {head} checkpoint; --task {task_name} needs a {task.head}")
    if head in ("BertForSequenceClassification", "BertForTokenClassification"):
        config.label_names("the file's labels are matched to the model's by name")
    trained_heads = ("BertForSequenceClassification", "BertForMultipleChoice", "BertForTokenClassification")
    # An embedding model read with another loss than its own reads other data: not its columns.
    as_trained = task_name == "embedding" and loss == own_loss
    if head in (*trained_heads, "BertLMHeadModel", "EncoderDecoderModel") or as_trained:
        text_column, pair_column = _trained_columns(config, text_column, pair_column)
        label_column = label_column or trained_label(config)
    cols = columns(
        task, SimpleNamespace(text_column=text_column, text_pair_column=pair_column, label_column=label_column)
    )
    rows = read_rows(path, "--file", cols[0] if task.lines else None)  # a causal LM's .txt: a text a line
    cols = task.resolve(rows, cols)
    rows, _ = nonempty_rows(task, rows, cols)  # as training's validation skips them
    if not rows:
        raise ValueError(f"{path}: no examples (every text empty)")
    # One output without a problem_type is a regressor, as transformers' loss reads it (and classify's raw score):
    # its integer scores (STS-B's 0..5) are scores, not class ids outside [0, 1).
    one_output = head == "BertForSequenceClassification" and config.num_labels == 1
    problem = getattr(config, "problem_type", None) or ("regression" if one_output else None)  # a bert2bert: none
    labels = task.labels(rows, cols, problem, model_labels(config, head))
    check_scorable(rows, labels)
    tok = WordPiece.from_dir(directory)
    sides = config_sides(config)
    positions = min(side.max_position_embeddings for side in sides)
    if max_length is not None:  # beyond the positions, JAX would clamp their ids: a wrong score, no error
        positive_int("--max-seq-length", max_length, positions)
    limit = max_length or min(positions, trained_length(config) or tok.model_max_length)
    opts = {"label_all_tokens": trained_all_tokens(config)} if task_name == "token-classification" else {}
    if task_name == "seq2seq":  # each side cut as trained, or as asked
        opts["lengths"] = _seq2seq_lengths(config, tok, max_length, max_source_length, val_max_target_length)
        limit = max(opts["lengths"])
    if task_name == "embedding":  # the directory's own pooling, normalization, length and prompts (sentence_dir.py)
        from jaxbert.train.task_embedding import directory_eval

        eval_fn, limit, tok, task, opts["prompts"] = directory_eval(directory, config, tok, max_length, prompts, loss)
        used = _prompts_used(prompts, opts["prompts"], loss)
    if task_name == "question-answering":  # the options it was trained with (task_qa.QARun.final_config)
        opts = qa.check_options(trained_qa or {})
        trained = opts.pop("max_seq_length", 384)
        limit = min(max_length or trained, limit)
        # A model not fine-tuned here (or a --max-seq-length below the trained stride): the QA pipeline's default
        # stride. run_qa's 128 alone refused every model of 128 positions or fewer.
        stride = "the trained doc_stride"
        if opts.get("doc_stride", limit) >= limit:
            opts["doc_stride"], stride = qa.default_stride(limit), "the default doc_stride"
        # A question too long for the window names what set it: evaluate has no --doc-stride to name.
        opts["names"] = ("--max-seq-length" if max_length else "the window length", stride)
    data = task.encode(tok, rows, cols, labels, limit, **opts)[1]()
    if task_name == "token-classification" and not (data.tags != IGNORE).any():  # [CLS] and [SEP] alone
        raise ValueError(f"{path}: no word fits in {limit} tokens beside [CLS] and [SEP]: nothing to score")
    for side in sides:
        check_tables(data, side, rows)  # JAX would clamp an id outside them: a wrong score, no error
    params, _ = load_params(directory, config, head)
    if task_name in ("causal-lm", "seq2seq"):  # loss, perplexity, token accuracy, as training's validation
        from jaxbert.train import task_causal_lm, task_seq2seq

        step = (task_causal_lm if task_name == "causal-lm" else task_seq2seq).eval_step
        eval_fn = cpu.onednn_jit(functools.partial(step, config=config), tokens=cpu.batch_tokens)
        if task_name == "seq2seq":  # each side padded to its own length bucket, as in training
            sides, jitted = tuple(batching.length_buckets(n) for n in opts["lengths"]), eval_fn
            eval_fn = lambda p, batch: jitted(p, task_seq2seq.fit(batch, sides))  # noqa: E731
    elif task_name != "embedding":
        step = task_qa.eval_step if task_name == "question-answering" else task_eval_step
        eval_fn = cpu.onednn_jit(functools.partial(step, config=config, head=head), tokens=cpu.batch_tokens)
    # QA windows are padded to their length, as training pads them (task_qa.prepare: the span loss counts padding).
    buckets = (limit,) if task_name == "question-answering" else batching.length_buckets(limit)
    result = evaluate_examples(eval_fn, params, data, task, labels, batch_size, buckets, 1, padding_id(config))
    result = {k.removeprefix("eval_"): v for k, v in result.items()}
    if task_name == "token-classification":  # words beyond `limit` tokens: cut, as training cuts them, and counted
        result["words_not_scored"] = int(data.truncated)
    if predict_with_generate:
        length = val_max_target_length or max_length or (trained_sides(config) or (None, None))[1]
        from jaxbert.inference_seq2seq import EncoderDecoder

        # The weights evaluated above, handed over (consume): a second load would hold the model twice.
        s2s = EncoderDecoder(config, params, directory, consume=True)
        scores, texts = _generated(s2s, data, tok, batch_size, length, num_beams)
        result.update(scores)
    with atomic_file(output, ".json") as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "model": os.path.abspath(directory),
                    "task": task_name,
                    "file": os.path.abspath(path),
                    # QA's set holds windows, several per question when contexts are long
                    "examples": len(data) if task_name != "question-answering" else len(set(data.extra["example"])),
                    **(used if task_name == "embedding" else {}),
                    **result,
                    **({"predictions": texts} if predict_with_generate else {}),  # the file's order
                },
                f,
                indent=1,
            )
    return result


def _seq2seq_lengths(config, tok, max_length, source, target) -> tuple[int, int]:
    """Where `evaluate` cuts a bert2bert's sources and targets: each side's flag (--max-source-length,
    --val-max-target-length), else --max-seq-length (both sides), else as trained (task_table.trained_sides), else
    the side's positions and the tokenizer's limit."""
    from jaxbert.train.config import check_both_sides
    from jaxbert.train.task_table import trained_sides

    check_both_sides(max_length, source, target, "--val-max-target-length")
    trained = trained_sides(config) or (None, None)
    lengths = []
    for flag, given, side, was in zip(
        ("--max-source-length", "--val-max-target-length"), (source, target), (config.encoder, config.decoder), trained
    ):
        positions = side.max_position_embeddings
        if given is not None:
            # [CLS] and [SEP] around a token (a generated one); beyond the positions, JAX would clamp their ids
            if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or not 3 <= given <= positions:
                raise ValueError(f"{flag} {given!r}: must be an integer in [3, {positions}]")
            lengths.append(int(given))
        else:
            lengths.append(max_length or min(positions, was or tok.model_max_length))
    return tuple(lengths)


def _generated(s2s, data, tok, batch_size: int, length: int | None, num_beams: int | None):
    """(ROUGE and gen_len, the generated texts) of --predict-with-generate: the loaded model's (`EncoderDecoder`)
    search on each source, `length` tokens at most counting the decoder's start (transformers' max_length, as
    Seq2SeqTrainer passes run_summarization's val_max_target_length), None: its generation config's."""
    from jaxbert.train import task_seq2seq

    pad = tok.token_to_id(tok.special_tokens["pad_token"])
    options = dict(num_beams=num_beams, max_new_tokens=None if length is None else length - 1)
    generated = task_seq2seq.generate_all(s2s, data, batch_size, pad, **options)
    return task_seq2seq.generation_scores(generated, data, tok, pad)
