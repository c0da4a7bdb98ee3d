"""The `jaxbert` commands on checkpoint directories: info (config summary, parameter counts), convert (with
--verify) and export, each printing what it read and wrote. Their parsers are cli.py's."""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def _info(args) -> None:
    import jax

    import jaxbert
    from jaxbert import hub
    from jaxbert.checkpoint import find_weights, load_params
    from jaxbert.heads import resolve_head
    from jaxbert.params import count_params
    from jaxbert.seq2seq import load_config

    args.dir = hub.resolve(args.dir)
    config = load_config(args.dir)
    head = resolve_head(None, config)
    weights = find_weights(args.dir)
    params, report = load_params(args.dir, config, head)
    print(f"{args.dir}: {head} ({weights.rsplit('/', 1)[-1]})")
    print(
        f"  jaxbert {jaxbert.__version__}, jax {jax.__version__}, devices: "
        + ", ".join(f"{d.platform}:{d.id}" for d in jax.devices())
    )
    sides = (
        (("encoder", config.encoder), ("decoder", config.decoder)) if head == "EncoderDecoderModel" else (("", config),)
    )
    for side, c in sides:
        kind = "; causal decoder" * c.is_decoder + " with cross-attention" * c.add_cross_attention
        print(
            f"  {side + ': ' if side else ''}layers {c.num_hidden_layers}, hidden {c.hidden_size}, "
            f"heads {c.num_attention_heads}, intermediate {c.intermediate_size}, vocab {c.vocab_size}, "
            f"max positions {c.max_position_embeddings}"
        )
        print(
            f"  {' ' * (len(side) + 2) if side else ''}activation {c.hidden_act}, position embeddings "
            f"{c.position_embedding_type}{kind}" + (f", pruned heads {dict(c.pruned_heads)}" if c.pruned_heads else "")
        )
    counts = count_params(params)
    itemsize = {np.asarray(x).dtype.itemsize for x in _leaves(params)}
    dtypes = sorted({str(np.asarray(x).dtype) for x in _leaves(params)})
    width = max(12, *(len(name) + 2 for name in counts))
    print(f"  {'component':<{width}}{'parameters':>14}{'bytes':>14}")
    for name, n in counts.items():
        print(f"  {name:<{width}}{n:>14,}{n * max(itemsize):>14,}")
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


class _VerifyFailed(Exception):
    """convert --verify's comparison failed: raised inside the write, so DST is left as it was."""


def _convert(args) -> int:
    from jaxbert.transfer import convert_checkpoint

    results: dict[str, tuple[float, float]] = {}
    check = None
    if args.verify:
        from jaxbert.verify import requirements, verify

        requirements()  # before converting anything

        def check(src: str, written: str) -> None:
            results.update(verify(src, written))
            if any(err > tol for err, tol in results.values()):
                raise _VerifyFailed

    try:
        summary = convert_checkpoint(args.src, args.dst, dtype=args.dtype, force=args.force, check=check)
    except _VerifyFailed:
        _print_verify(results)
        print(
            f"jaxbert convert: error: --verify: the conversion's outputs differ from PyTorch beyond tolerance; "
            f"{args.dst} not written",
            file=sys.stderr,
        )
        return 1
    if args.dtype and args.dtype != "float32":
        print(f"note: floating parameters cast to {args.dtype}")
    _print_summary("converted", summary)
    _print_verify(results)
    return 0


def _print_verify(results: dict[str, tuple[float, float]]) -> None:
    for field, (err, tol) in results.items():
        verdict = (
            f"{int(err)} differ" if field.endswith("tokens") else (f"max |difference| {err:.2e} (tolerance {tol:.0e})")
        )
        print(f"  verify {field:<24} {verdict} {'ok' if err <= tol else 'FAILED'}")


def _export(args) -> int:
    from jaxbert.transfer import export_checkpoint

    _print_summary("exported", export_checkpoint(args.src, args.dst, dtype=args.dtype, force=args.force))
    relative = _relative_positions(args.dst)
    if relative:  # loud here, since transformers 5 is silent: it drops distance_embedding and attends absolutely
        print(
            f"note: position_embedding_type {relative}: transformers 5 has no relative position embeddings and "
            "reads this directory as absolute attention (other outputs); load it with transformers <= 4.57"
        )
    return 0


def _relative_positions(directory: str) -> str | None:
    """The relative position_embedding_type of an exported config.json (of either half of an encoder-decoder)."""
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    kinds = {
        c.get("position_embedding_type", "absolute")
        for c in (config, config.get("encoder"), config.get("decoder"))
        if isinstance(c, dict)
    }
    return next((k for k in sorted(kinds) if k != "absolute"), None)


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)
