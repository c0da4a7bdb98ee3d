"""The compute layout: the encoder's layers stacked along a leading axis for `lax.scan`, query/key/value fused.

The stored tree (transformers' FlaxBert layout, layer keys "0"…"N-1") is what checkpoints, conversion and
training use. Inference runs on this layout instead, built once at load time: a scan compiles one layer body
whatever the depth (compile time flat in layers), and the fused [D, 3D] kernel turns three matmuls into one.
Float32 models hold their layers apart instead (`apart_layers`: fused too, kernels [out, in]), for faster
matmuls at the cost of a compile time growing with depth. `encoder` accepts any of these forms:
`{"layer": {"0": …}}` (stored or apart) or `{"stacked": …}`.

Stacking goes leaf by leaf and drops each source leaf as soon as it is stacked, so a caller that hands over its
only reference (as `jaxbert.load` does) peaks at the parameters plus one stacked leaf, not twice the parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxbert.config import BertConfig
from jaxbert.ops import from_bits

QKV = ("query", "key", "value")


def is_stacked(encoder_params) -> bool:
    return "stacked" in encoder_params


def can_stack(config: BertConfig) -> bool:
    """Pruned layers have different head counts, so their shapes cannot share one scan."""
    return not config.pruned_heads


def _xp(leaves):
    return np if all(isinstance(x, np.ndarray) for x in leaves) else jnp


def stack_layers(encoder_params, config: BertConfig, fuse_qkv: bool = True, consume: bool = False, place=None) -> dict:
    """{"layer": {"0": tree, …}} -> {"stacked": tree with a leading [N] axis}; with `fuse_qkv`, attention's
    query/key/value become one `qkv` dense (kernel [N, D, 3D], bias [N, 3D]). With `consume`, the layers are
    removed from `encoder_params` (see the module docstring); `place` (e.g. a device_put) is applied to each
    stacked leaf as soon as it is complete, so host copies are freed as the device copies appear."""
    place = place or (lambda x: x)
    if not can_stack(config):
        raise ValueError(f"cannot stack layers with pruned heads {config.pruned_heads}")
    n = config.num_hidden_layers
    layers = [traverse_util.flatten_dict(encoder_params["layer"][str(i)], sep="/") for i in range(n)]
    if consume:
        encoder_params["layer"].clear()
    to_fuse = {f"attention/self/{name}/{leaf}" for name in QKV for leaf in ("kernel", "bias")} if fuse_qkv else ()
    stacked = {}
    for key in list(layers[0]):
        parts = [layer.pop(key) for layer in layers]  # drop our references as we go (see module docstring)
        leaf = _xp(parts).stack(parts)
        del parts  # before placing: the sources, the stacked copy and the placed one never coexist
        stacked[key] = leaf if key in to_fuse else place(leaf)
        del leaf
    if fuse_qkv:
        for leaf, axis in (("kernel", 2), ("bias", 1)):
            parts = [stacked.pop(f"attention/self/{name}/{leaf}") for name in QKV]
            fused = _xp(parts).concatenate(parts, axis=axis)
            del parts
            stacked[f"attention/self/qkv/{leaf}"] = place(fused)
            del fused
    return {"stacked": traverse_util.unflatten_dict(stacked, sep="/")}


def _split_qkv(flat: dict) -> dict:
    """A flat layer (or stack of them) with its fused `qkv` dense split back into query/key/value (in place): every
    leaf along its output axis, an int8 model's `weight` [..., out, in] and `weight_scale` (quantize.py) too. Left
    fused, they kept the int8 product while the biases went to query/key/value, where nothing reads them."""
    for leaf, axis in (("kernel", -1), ("bias", -1), ("weight", -2), ("weight_scale", -1)):
        fused = flat.pop(f"attention/self/qkv/{leaf}", None)
        if fused is not None:
            for name, part in zip(QKV, _xp([fused]).split(fused, 3, axis=axis), strict=True):
                flat[f"attention/self/{name}/{leaf}"] = part
    return flat


def unstack_layers(encoder_params, config: BertConfig) -> dict:
    """The inverse of `stack_layers`: back to transformers' per-layer tree (new arrays)."""
    flat = _split_qkv(traverse_util.flatten_dict(encoder_params["stacked"], sep="/"))
    layers = {
        str(i): traverse_util.unflatten_dict({k: v[i] for k, v in flat.items()}, sep="/")
        for i in range(config.num_hidden_layers)
    }
    return {"layer": layers}


def _transposed(a):
    """a.T with its own row-major data (numpy's .T is a view, which device_put would copy anyway)."""
    return np.ascontiguousarray(a.T) if isinstance(a, np.ndarray) else jnp.transpose(a)


def is_apart(encoder_params) -> bool:
    """The layers held apart (`apart_layers`), not transformers' per-layer tree: they have a fused qkv."""
    layers = encoder_params.get("layer", {})
    return any("qkv" in layer.get("attention", {}).get("self", {}) for layer in layers.values())


def apart_layers(encoder_params, config: BertConfig, consume: bool = False, place=None) -> dict:
    """{"layer": {"0": stored tree, …}} -> the same layers held apart for a float32 model: each layer's
    query/key/value fused into one `qkv` dense and every kernel [in, out] turned into a `weight` [out, in]
    (ops.dense takes either). A layer per array, not a stack, because XLA:CPU copies what a matmul reads when it
    is a layer's slice of a stacked array, in every call: this removes that copy (bert-base float32, 1 x 128:
    1.22-1.28x; 4 x 128 1.16x; 8 x 128 1.08x; 8 x 512 1.04x), and [out, in] is the orientation XLA:CPU's float32
    matmuls of a few hundred rows read fastest (1 x 128: the stacked layout in it gained 1.13x, apart in [in, out]
    1.05x). The layers then run as a Python loop: compile time grows with depth (bert-base 1.06 against 0.72 s).
    `consume` and `place` as in stack_layers, layer by layer."""
    place = place or (lambda x: x)
    layers = encoder_params["layer"]
    out = {}
    for i in range(config.num_hidden_layers):
        flat = traverse_util.flatten_dict(layers.pop(str(i)) if consume else layers[str(i)], sep="/")
        for leaf, axis in (("kernel", 1), ("bias", 0)):
            parts = [flat.pop(f"attention/self/{name}/{leaf}") for name in QKV]
            flat[f"attention/self/qkv/{leaf}"] = _xp(parts).concatenate(parts, axis=axis)
            del parts
        for key in list(flat):
            if key.endswith("/kernel"):
                kernel = flat.pop(key)
                flat[key[: -len("kernel")] + "weight"] = place(_transposed(kernel))
                del kernel
            else:
                flat[key] = place(flat.pop(key))
        out[str(i)] = traverse_util.unflatten_dict(flat, sep="/")
    return {"layer": out}


def _stored_layer(layer: dict) -> dict:
    """The inverse of `apart_layers` for one layer: query/key/value split back, `weight`s [out, in] as kernels."""
    flat = traverse_util.flatten_dict(layer, sep="/")
    for key in [k for k in flat if k.endswith("/weight")]:
        flat[key[: -len("weight")] + "kernel"] = flat.pop(key).T
    return traverse_util.unflatten_dict(_split_qkv(flat), sep="/")


def map_encoder(params, fn):
    """`params` with its encoder subtree (at the root or under "bert") replaced by fn(encoder); shallow copies."""
    if "encoder" in params:
        return {**params, "encoder": fn(params["encoder"])}
    return {**params, "bert": map_encoder(params["bert"], fn)}


def to_compute(params, config: BertConfig, consume: bool = False, place=None, apart: bool = False):
    """The inference layout of a stored tree: its layers stacked (`stack_layers`), or with `apart` held apart
    (`apart_layers`, for float32 models); unchanged when pruned heads prevent either. See stack_layers for
    `consume` and `place`."""
    if not can_stack(config):
        return params
    build = apart_layers if apart else stack_layers
    return map_encoder(params, lambda enc: build(enc, config, consume=consume, place=place))


def _unstacked(enc, config: BertConfig):
    return unstack_layers(enc, config) if is_stacked(enc) else enc


def per_layer(params, config: BertConfig):
    """A compute tree with its layers one subtree each: stacked layers unstacked (new arrays), others unchanged."""
    return map_encoder(params, lambda enc: _unstacked(enc, config))


def to_stored(params, config: BertConfig):
    """The stored layout of a compute tree."""

    def stored(enc):
        if is_apart(enc):
            return {"layer": {i: _stored_layer(layer) for i, layer in enc["layer"].items()}}
        return _unstacked(enc, config)

    return map_encoder(params, stored)


def decoding_layout(weights, dtypes, config: BertConfig):
    """The parameters decoding runs on (see inference.Bert.layers_apart), from the compute layout's `weights` (bits) and
    their `dtypes`: the stacked layers split into {"layer": {"0": …}}, floats as such, laid out as XLA:CPU's
    matmuls of a few rows read them fastest. The layers' float32 kernels become `weight`s [out, in] (see
    ops.dense). 16-bit kernels stay [in, out], the only layout its bfloat16 matmul (YNNPACK) takes: XLA copies
    others into it in every call. So a 16-bit tied decoder gets its own [D, V] kernel (bert-base: ~30 ms a
    call). A tree without stacked layers (pruned heads, or a float32 model's layers already apart) is only turned
    back from bits, sharing its arrays."""

    def split(tree, take):
        def layers(encoder):
            if not is_stacked(encoder):
                return encoder
            return {
                "layer": {
                    str(i): jax.tree_util.tree_map(lambda a, i=i: take(a, i), encoder["stacked"])
                    for i in range(config.num_hidden_layers)
                }
            }

        return map_encoder(tree, layers)

    def orient(p):
        if not isinstance(p, dict):
            return p
        if "kernel" in p and p["kernel"].dtype == jnp.float32:
            return {"weight": p["kernel"].T, **{k: v for k, v in p.items() if k != "kernel"}}
        return {k: orient(v) for k, v in p.items()}

    params = jax.tree_util.tree_map(from_bits, split(weights, lambda a, i: a[i]), split(dtypes, lambda d, i: d))
    params = map_encoder(params, orient)
    predictions = params.get("cls", {}).get("predictions")
    embeddings = params.get("bert", {}).get("embeddings", {}).get("word_embeddings", {}).get("embedding")
    if predictions is not None and "decoder" not in predictions and jnp.dtype(embeddings.dtype).itemsize == 2:
        decoder = {"decoder": {"kernel": embeddings.T}}
        params = {**params, "cls": {**params["cls"], "predictions": {**predictions, **decoder}}}
    return params
