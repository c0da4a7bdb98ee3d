"""The `jaxbert` command: argparse subcommands that parse, call library functions, and print.

Expected errors (bad paths, bad files, bad configs) become one line on stderr and exit status 1, no traceback.
The checkpoint commands (info, convert, export) are cli_checkpoints.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading
import traceback
import warnings

import numpy as np

from jaxbert.cli_checkpoints import _convert, _export, _info
from jaxbert.cli_flags import FINITE, NON_NEGATIVE, POSITIVE, SEED, as_flags, flags_of, number
from jaxbert.inference import DTYPES
from jaxbert.inputs import Arg, renaming


def _embed(args) -> int:
    import jaxbert
    from jaxbert.files import atomic_file, check_output_file
    from jaxbert.sentence_dir import embedding_options, resolve_prompt
    from jaxbert.texts import is_jsonl, read_text_file

    if not args.output.endswith(".npy"):
        raise ValueError(f"--output {args.output}: expected a .npy file")
    check_output_file(args.output)  # before any work
    read = read_text_file(args.input, allow_empty=True, keep_empty=True)  # a row per line, blank ones too
    texts, blank = read.texts, 0 if is_jsonl(args.input) else read.empty_lines
    blanks = f" ({blank} of them blank lines, as empty texts)" if blank else ""
    bert = jaxbert.load(args.dir, dtype=args.dtype)
    options = dict(pooling=args.pooling, normalize=args.normalize, batch_size=args.batch_size)
    prompted = dict(prompt=args.prompt, prompt_name=args.prompt_name)
    emb = bert.embed(texts, max_length=args.max_length, **options, **prompted)
    with atomic_file(args.output, ".npy") as tmp:  # never a half-written output
        np.save(tmp, emb)
    found = bert.sentence_defaults
    modes, normalize, _, _ = embedding_options(found, args.pooling, args.normalize, None)
    dense = sum(type(s).__name__ == "DenseSpec" for s in found.steps) if found and args.pooling is None else 0
    prompt = resolve_prompt(found, args.prompt, args.prompt_name)
    print(
        f"embedded {len(texts)} texts{blanks} -> {args.output} {emb.shape} ({'+'.join(modes)} pooling"
        f"{f', {dense} Dense' if dense else ''}{', normalized' if normalize else ''}"
        f"{f', prompt {prompt!r}' if prompt else ''}; {bert.compile_count} compiled programs)"
    )
    return 0


def _fill_mask(args) -> int:
    import jaxbert
    from jaxbert.tasks import fill_mask

    single = len(args.text) == 1  # one text: its errors and output as before several were taken
    bert = jaxbert.load(args.dir, dtype=args.dtype)
    # Bert.fill_mask's own function, its texts named as the output's "text N:" headers (from 1), not text[i]
    texts = args.text[0] if single else args.text
    results = fill_mask(bert, texts, args.top_k, targets=args.targets, name=lambda i: f"text {i + 1}")
    for t, per_text in enumerate([results] if single else results):
        if not single:
            print(f"{'' if t == 0 else chr(10)}text {t + 1}: {args.text[t]}")
        for i, candidates in enumerate(per_text):
            if len(per_text) > 1:
                print(f"[MASK] #{i + 1}")
            for c in candidates:  # an id of a vocabulary padded beyond the tokenizer has no token: its id shown
                token = c["token"] if c["token"] is not None else f"[id {c['token_id']}]"
                print(f"  {c['score']:.4f}  {token:<15} {c['sequence']}")
    return 0


def _answer(args) -> int:
    import jaxbert
    from jaxbert.finetuned import json_line

    bert = jaxbert.load(args.dir, dtype=args.dtype)
    with renaming(_pipeline_windows):
        answers = bert.answer(
            args.question, args.context, top_k=args.top_k, handle_impossible_answer=args.handle_impossible_answer
        )
    print(json_line(answers))
    return 0


def _pipeline_windows(parts: tuple) -> tuple:
    """An error's window, Bert.answer's `max_seq_len N` ... `doc_stride M`, as `windows of N tokens, stride M`: no
    --max-seq-len / --doc-stride here, the windows are the pipeline's defaults."""
    at = {p.name: i for i, p in enumerate(parts) if isinstance(p, Arg)}
    if "max_seq_len" not in at or at.get("doc_stride", -1) < at["max_seq_len"]:
        return parts
    a, b = at["max_seq_len"], at["doc_stride"]
    return (*parts[:a], f"windows of {parts[a].value} tokens, stride {parts[b].value}", *parts[b + 1 :])


def _generate(args) -> int:
    import jaxbert
    from jaxbert.tasks import generate_text

    options = {
        k: getattr(args, k)
        for k in ("max_new_tokens", "num_beams", "num_return_sequences", "temperature", "top_k", "top_p", "seed")
        + ("length_penalty", "min_new_tokens", "no_repeat_ngram_size", "repetition_penalty")
    }
    model = jaxbert.load(args.dir, dtype=args.dtype)
    _check_sampling_flags(args, model.directory)
    for text in generate_text(model, args.prompt, do_sample=args.do_sample or None, **options):
        print(text)
    return 0


def _check_sampling_flags(args, directory) -> None:
    """--temperature, --top-k and --top-p shape sampling alone: without it (no --do-sample, nor do_sample in the
    model's generation config) greedy and beam search ignore them, as transformers does with a warning; given on
    the command line, that is a mistake to name, not an output to print as if they had applied."""
    from jaxbert.generate_inputs import file_settings

    settings = file_settings(directory)
    given = [f"--{k.replace('_', '-')}" for k in ("temperature", "top_k", "top_p") if getattr(args, k) is not None]
    if given and not args.do_sample and settings.get("do_sample") is not True:
        raise ValueError(
            f"{', '.join(given)}: applies to sampling only, and this run searches (greedy or beams); pass --do-sample"
        )
    beams = args.num_beams or settings.get("num_beams") or 1
    if args.length_penalty is not None and beams == 1:  # greedy search and sampling ignore it, as transformers does
        raise ValueError("--length-penalty: applies to beam search only; pass --num-beams K (K > 1)")


def _add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="continue a prompt (BertLMHeadModel) or transform it (bert2bert)")
    gen.add_argument("dir")
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=POSITIVE, default=None, help="default: generation_config.json, else 20")
    gen.add_argument("--num-beams", type=POSITIVE, default=None, help="beam search with K beams (default 1: greedy)")
    gen.add_argument("--num-return-sequences", type=POSITIVE, default=None, help="sequences printed (beams, samples)")
    gen.add_argument("--do-sample", action="store_true", help="sample instead of searching")
    gen.add_argument("--temperature", type=number(0.0), default=None)
    gen.add_argument("--top-k", type=NON_NEGATIVE, default=None, help="sampling: keep the K likeliest tokens (0: all)")
    gen.add_argument("--top-p", type=number(0.0, 1.0), default=None, help="sampling: nucleus probability mass")
    gen.add_argument("--seed", type=SEED, default=0, help="sampling: the same seed draws the same text")
    gen.add_argument("--min-new-tokens", type=NON_NEGATIVE, default=None, help="no eos before that many new tokens")
    gen.add_argument("--no-repeat-ngram-size", type=NON_NEGATIVE, default=None, help="no n-gram of that size twice")
    gen.add_argument(
        "--repetition-penalty", type=number(0.0), default=None, help="> 1 discourages tokens already in the text"
    )
    gen.add_argument("--length-penalty", type=FINITE, default=None, help="beam search: > 0 favours longer texts")
    _add_dtype(gen)
    gen.set_defaults(func=_generate, flags=flags_of(gen))


def _add_dtype(parser) -> None:
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="run in this dtype (default: the checkpoint's; int8: the layers' matmuls quantized, the rest float32)",
    )


def build_parser() -> argparse.ArgumentParser:
    from jaxbert import __version__, cli_train

    parser = argparse.ArgumentParser(prog="jaxbert", description="BERT as pure JAX functions.")
    parser.add_argument("--version", action="version", version=f"jaxbert {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    convert = sub.add_parser("convert", help="transformers BERT dir -> jaxbert dir (config, flax msgpack, tokenizer)")
    convert.add_argument("src", metavar="SRC")
    convert.add_argument("dst", metavar="DST")
    convert.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="cast floating parameters (default: keep the checkpoint's)",
    )
    convert.add_argument("--verify", action="store_true", help="compare with PyTorch on a fixed batch (needs torch)")
    convert.add_argument("--force", action="store_true", help="replace DST if it exists")
    convert.set_defaults(func=_convert)
    export = sub.add_parser("export", help="jaxbert dir -> transformers dir (model.safetensors)")
    export.add_argument("src", metavar="SRC")
    export.add_argument("dst", metavar="DST")
    export.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="parameter dtype of the export (default float32)",
    )
    export.add_argument("--force", action="store_true", help="replace DST if it exists")
    export.set_defaults(func=_export)
    embed = sub.add_parser("embed", help="sentence embeddings of a text file into a .npy array")
    embed.add_argument("dir")
    embed.add_argument("--input", required=True, help='one text per line, or .jsonl with a "text" field')
    embed.add_argument("--output", required=True, help="FILE.npy: float32 [texts, hidden], input order")
    embed.add_argument(
        "--pooling",
        choices=("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "pooler"),
        default=None,
        help="default: a sentence-transformers directory's own pooling, else cls",
    )
    embed.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unit-length embeddings (default: as a sentence-transformers directory says, else no)",
    )
    embed.add_argument("--batch-size", type=POSITIVE, default=32)
    embed.add_argument("--max-length", type=POSITIVE, default=None, help="truncate texts to N tokens")
    prompts = embed.add_mutually_exclusive_group()  # encode takes both and ignores the name: a mistake here
    prompts.add_argument("--prompt", default=None, help='text put before every text (e.g. "query: ")')
    prompts.add_argument(
        "--prompt-name",
        default=None,
        help="one of the directory's prompts (config_sentence_transformers.json); default: its default prompt",
    )
    _add_dtype(embed)
    embed.set_defaults(func=_embed, flags=flags_of(embed))
    fill = sub.add_parser("fill-mask", help="top-k predictions for each [MASK] of one or more texts")
    fill.add_argument("dir")
    fill.add_argument("text", nargs="+", help="texts with [MASK] (several: packed into rows, one block each)")
    fill.add_argument("--top-k", type=POSITIVE, default=5)
    fill.add_argument("--targets", nargs="+", default=None, help="score only these tokens (as the pipeline's targets)")
    _add_dtype(fill)
    fill.set_defaults(func=_fill_mask, flags=flags_of(fill))
    answer = sub.add_parser("answer", help="extractive QA: the answer span to a question in a context (JSON)")
    answer.add_argument("dir")
    answer.add_argument("--question", required=True)
    answer.add_argument("--context", required=True)
    answer.add_argument("--top-k", type=POSITIVE, default=1)
    answer.add_argument(
        "--handle-impossible-answer", action="store_true", help='the null answer ("" at 0-0) among the answers'
    )
    _add_dtype(answer)
    answer.set_defaults(func=_answer, flags=flags_of(answer))
    _add_generate(sub)
    cli_train.add_parsers(sub)
    info = sub.add_parser("info", help="config summary and parameter counts of a jaxbert or transformers dir")
    info.add_argument("dir")
    info.set_defaults(func=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    from jaxbert import compile_cache, cpu, malloc
    from jaxbert.files import EXPECTED_ERRORS, one_line

    args = build_parser().parse_args(argv)
    if argv is None and (args.command == "train-mlm" or getattr(args, "task", None) == "mlm"):
        malloc.rerun_with_huge_pages()  # the process's own command line only; returns when it changes nothing
    if args.command in ("train", "train-mlm") and args.dtype == "bfloat16":
        cpu.bf16_matmuls()  # before JAX starts: the run's matmuls on the CPU's bfloat16 units (see cpu.py)
    if argv is None:  # the command's own process (not main() called inside another program): see compile_cache.py
        compile_cache.enable()
    terminated: list[int] = []  # SIGTERM, once it came
    try:
        with warnings.catch_warnings(), _terminate_as_interrupt(terminated):
            warnings.showwarning = functools.partial(_show_warning, args.command, warnings.showwarning)
            with as_flags(args, getattr(args, "flags", {})):  # the library's argument names as the flags
                return args.func(args) or 0
    except EXPECTED_ERRORS as e:  # one line, no traceback
        print(f"jaxbert {args.command}: error: {one_line(e)}", file=sys.stderr)
        return _leave(1)
    except KeyboardInterrupt:  # writers clean up on the way out (files.atomic_*), so nothing is half-written
        print(f"jaxbert {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return _leave(143 if terminated else 130)
    except BaseException:
        if _failed_alone():
            traceback.print_exc()
            _leave(1)
        raise


@contextlib.contextmanager
def _terminate_as_interrupt(came: list[int]):
    """SIGTERM (what `kill`, `timeout`, a scheduler or `docker stop` send) handled as Ctrl-C is while the command
    runs: a KeyboardInterrupt, so writers remove their temporaries on the way out (files.atomic_*) instead of the
    process dying with a half-written `.DST.*.partial` beside its output; `came` gets the signal. The previous
    handler comes back afterwards (main also runs inside other programs and tests). Training defers both signals
    to the end of its current step (train/interrupt.py)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        came.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _show_warning(command: str, show, message, category, *args, **kwargs) -> None:
    """jaxbert's own notes (cpu.SlowDtypeWarning, cpu.RoundedFloat32Warning) and fill-mask's --targets warnings as
    one line on stderr, not Python's file:line and source line; any other warning as Python shows it."""
    from jaxbert import cpu, tasks

    if issubclass(category, (cpu.SlowDtypeWarning, cpu.RoundedFloat32Warning)):
        print(f"jaxbert {command}: note: {message}", file=sys.stderr)
    elif isinstance(message, tasks.TargetWarning):  # the pipeline's rule: a word stands for its first word piece
        piece, target = message.piece, message.target
        took = "it has no word piece: ignored" if piece is None else f"scored as its first word piece {piece!r}"
        print(f"jaxbert {command}: warning: --targets {target!r} is not in the vocabulary: {took}", file=sys.stderr)
    else:
        show(message, category, *args, **kwargs)


def _failed_alone() -> bool:
    """Whether this process of a multi-process run failed on its own (the others were told to stop)."""
    failures = sys.modules.get("jaxbert.failures")  # not imported: not a multi-process run
    return failures is not None and failures.failing()


def _leave(code: int) -> int:
    """The exit code; a process that failed alone leaves now, its error printed (see failures.py)."""
    if _failed_alone():
        sys.modules["jaxbert.failures"].leave_failed(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
