"""Logical axis names of every parameter leaf: the one table that says what each dimension of the parameter tree
(params.param_spec's leaves, in the stored or the compute layout) means. sharding.py maps these names to mesh axes
through its rules; nothing else decides how a parameter is split.

Names: `vocab` (word pieces), `position`, `type` (token types), `embed` (the hidden size D as a weight's input or
a residual-stream bias), `heads` (H·K of one of query/key/value), `qkv` (the fused [q | k | v] columns of the
compute layout), `mlp` (the intermediate size F), `hidden` (D as the output of a D×D projection: pooler, MLM
transform), `norm` (LayerNorm), `labels` (a classifier's outputs), `relpos` / `head_dim` (relative position
embeddings), and `layers` (the leading axis of the stacked compute layout).
"""

from __future__ import annotations

from flax import traverse_util

# (path suffix, axes), matched on whole path components, first match wins; layer indices ("0"…) and the
# "bert" / "stacked" wrappers are not part of the suffix. More specific suffixes come first.
TABLE: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("word_embeddings", "embedding"), ("vocab", "embed")),
    (("position_embeddings", "embedding"), ("position", "embed")),
    (("token_type_embeddings", "embedding"), ("type", "embed")),
    (("distance_embedding", "embedding"), ("relpos", "head_dim")),
    (("LayerNorm", "scale"), ("norm",)),
    (("LayerNorm", "bias"), ("norm",)),
    (("query", "kernel"), ("embed", "heads")),
    (("query", "bias"), ("heads",)),
    (("key", "kernel"), ("embed", "heads")),
    (("key", "bias"), ("heads",)),
    (("value", "kernel"), ("embed", "heads")),
    (("value", "bias"), ("heads",)),
    (("qkv", "kernel"), ("embed", "qkv")),
    (("qkv", "bias"), ("qkv",)),
    (("attention", "output", "dense", "kernel"), ("heads", "embed")),
    (("crossattention", "output", "dense", "kernel"), ("heads", "embed")),
    (("intermediate", "dense", "kernel"), ("embed", "mlp")),
    (("intermediate", "dense", "bias"), ("mlp",)),
    (("output", "dense", "kernel"), ("mlp", "embed")),  # the FFN's down projection (attention's matched above)
    (("output", "dense", "bias"), ("embed",)),
    (("pooler", "dense", "kernel"), ("embed", "hidden")),
    (("pooler", "dense", "bias"), ("hidden",)),
    (("transform", "dense", "kernel"), ("embed", "hidden")),
    (("transform", "dense", "bias"), ("hidden",)),
    (("predictions", "bias"), ("vocab",)),
    (("enc_to_dec_proj", "kernel"), ("embed", "hidden")),
    (("enc_to_dec_proj", "bias"), ("hidden",)),
    (("kernel",), ("embed", "labels")),  # classifier, qa_outputs, seq_relationship
    (("bias",), ("labels",)),
)


def _key(path: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p for p in path if not p.isdigit() and p not in ("bert", "stacked"))


def leaf_axes(path: tuple[str, ...], ndim: int) -> tuple[str, ...]:
    """The logical axes of the leaf at `path` (dict keys from the root) with `ndim` dimensions. An int8 `weight`
    [out, in] and its `weight_scale` [out] (quantize.py) have those of the kernel they stand for."""
    if path[-1] in ("weight", "weight_scale"):
        kernel = leaf_axes((*path[:-1], "kernel"), ndim + (path[-1] == "weight_scale"))
        return (*kernel[:-2], kernel[-1]) + ((kernel[-2],) if path[-1] == "weight" else ())
    key = _key(path)
    for suffix, axes in TABLE:
        if key[-len(suffix) :] == suffix:
            axes = (("layers",) if "stacked" in path else ()) + axes
            if len(axes) != ndim:
                raise ValueError(f"parameter {'/'.join(path)}: {ndim} dimensions, its axes are {axes}")
            return axes
    raise KeyError(f"parameter {'/'.join(path)}: no logical axes in jaxbert.axes.TABLE")


def logical_axes(params) -> dict:
    """The tree of `params` (arrays, ShapeDtypeStructs or (shape, init) specs) with each leaf's axes tuple."""
    flat = traverse_util.flatten_dict(params, is_leaf=lambda _, v: isinstance(v, tuple))
    return traverse_util.unflatten_dict({path: leaf_axes(path, _ndim(leaf)) for path, leaf in flat.items()})


def _ndim(leaf) -> int:
    if isinstance(leaf, tuple):  # params.param_spec's (shape, init)
        return len(leaf[0])
    return len(leaf.shape)
