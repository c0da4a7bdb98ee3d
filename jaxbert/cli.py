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


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxbert", description="BERT as pure JAX functions.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="config summary and parameter counts of a jaxbert or transformers dir")
    info.add_argument("dir")
    info.set_defaults(func=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, ImportError, TypeError) as e:
        print(f"jaxbert {args.command}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
