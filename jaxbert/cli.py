"""The `jaxbert` command: argparse subcommands that parse, call library functions, and print.

Expected errors (bad paths, bad files, bad configs) become one line on stderr and exit status 1, no traceback.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _info(args) -> None:
    from jaxbert.checkpoint import find_weights, load_params
    from jaxbert.config import BertConfig
    from jaxbert.heads import resolve_head
    from jaxbert.params import count_params

    config = BertConfig.from_pretrained(args.dir)
    head = resolve_head(None, config)
    weights = find_weights(args.dir)
    params, report = load_params(args.dir, config, head)
    print(f"{args.dir}: {head} ({weights.rsplit('/', 1)[-1]})")
    print(f"  layers {config.num_hidden_layers}, hidden {config.hidden_size}, heads {config.num_attention_heads}, "
          f"intermediate {config.intermediate_size}, vocab {config.vocab_size}, "
          f"max positions {config.max_position_embeddings}")
    print(f"  activation {config.hidden_act}, position embeddings {config.position_embedding_type}"
          + (f", pruned heads {dict(config.pruned_heads)}" if config.pruned_heads else ""))
    counts = count_params(params)
    itemsize = {np.asarray(x).dtype.itemsize for x in _leaves(params)}
    dtypes = sorted({str(np.asarray(x).dtype) for x in _leaves(params)})
    print(f"  {'component':<12}{'parameters':>14}{'bytes':>14}")
    for name, n in counts.items():
        print(f"  {name:<12}{n:>14,}{n * max(itemsize):>14,}")
    print(f"  stored dtype: {', '.join(dtypes)}")
    for key, reason in sorted(report.ignored.items()):
        print(f"  ignored {key}: {reason}")
    for name in report.absent:
        print(f"  absent: {name}")


def _print_summary(verb: str, summary) -> None:
    print(f"{verb} {summary.src} -> {summary.dst} in {summary.seconds:.2f} s")
    print(f"  head {summary.head} (read {summary.source_file}), parameters stored as {summary.dtype}")
    print("  parameters: " + ", ".join(f"{name} {n:,}" for name, n in summary.counts.items()))
    for key, reason in sorted(summary.ignored.items()):
        print(f"  ignored {key}: {reason}")
    for name in summary.absent:
        print(f"  absent: {name} (not in the checkpoint)")
    print("  wrote: " + ", ".join(f"{name} ({_size(n)})" for name, n in summary.files.items()))


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B"


def _convert(args) -> int:
    from jaxbert.transfer import convert_checkpoint

    summary = convert_checkpoint(args.src, args.dst, dtype=args.dtype, force=args.force)
    if args.dtype and args.dtype != "float32":
        print(f"note: floating parameters cast to {args.dtype}")
    _print_summary("converted", summary)
    if not args.verify:
        return 0
    from jaxbert.verify import verify

    worst_ok = True
    for field, (err, tol) in verify(args.src, args.dst).items():
        ok = err <= tol
        worst_ok &= ok
        print(f"  verify {field:<24} max |difference| {err:.2e} (tolerance {tol:.0e}) {'ok' if ok else 'FAILED'}")
    if not worst_ok:
        print(f"jaxbert convert: error: --verify: outputs of {args.dst} differ from PyTorch beyond tolerance",
              file=sys.stderr)
        return 1
    return 0


def _export(args) -> int:
    from jaxbert.transfer import export_checkpoint

    _print_summary("exported", export_checkpoint(args.src, args.dst, dtype=args.dtype, force=args.force))
    return 0


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxbert", description="BERT as pure JAX functions.")
    sub = parser.add_subparsers(dest="command", required=True)
    convert = sub.add_parser("convert", help="transformers BERT dir -> jaxbert dir (config, flax msgpack, tokenizer)")
    convert.add_argument("src", metavar="SRC")
    convert.add_argument("dst", metavar="DST")
    convert.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                         help="cast floating parameters (default: keep the checkpoint's)")
    convert.add_argument("--verify", action="store_true", help="compare with PyTorch on a fixed batch (needs torch)")
    convert.add_argument("--force", action="store_true", help="replace DST if it exists")
    convert.set_defaults(func=_convert)
    export = sub.add_parser("export", help="jaxbert dir -> transformers dir (model.safetensors)")
    export.add_argument("src", metavar="SRC")
    export.add_argument("dst", metavar="DST")
    export.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="parameter dtype of the export (default float32)")
    export.add_argument("--force", action="store_true", help="replace DST if it exists")
    export.set_defaults(func=_export)
    info = sub.add_parser("info", help="config summary and parameter counts of a jaxbert or transformers dir")
    info.add_argument("dir")
    info.set_defaults(func=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, OSError, ImportError, TypeError) as e:  # expected errors: one line, no traceback
        print(f"jaxbert {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
