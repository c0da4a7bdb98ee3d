"""A loaded model's device weights (inference.Bert's `weights`): a stored tree cast, laid out for compute,
placed on the devices and held as bits, built by one function whether at load time or when new weights replace
the model's (`Bert.load_weights`), so that both run the same numbers through the same compiled programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxbert import quantize, sharding
from jaxbert.config import BertConfig
from jaxbert.convert import check_cast
from jaxbert.layout import to_compute
from jaxbert.ops import as_bits

FLOAT_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def float_dtype(dtype: str | None):
    """The dtype floating parameters are cast to for `dtype` (None: kept as stored; int8 keeps float32)."""
    return jnp.float32 if dtype == "int8" else FLOAT_DTYPES.get(dtype)


def float_dtypes(params) -> list:
    return [x.dtype for x in jax.tree_util.tree_leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]


def is_float32(params, dtype: str | None) -> bool:
    """Whether the model computes in float32 throughout (its layers then held apart: layout.apart_layers)."""
    cast = float_dtype(dtype)
    return dtype != "int8" and all((cast or d) == jnp.float32 for d in float_dtypes(params))


def to_devices(tree, place):
    """place(leaf) leaf by leaf, dropping each host leaf once placed: a handed-over host tree and its device copy
    never both exist in full."""
    flat = traverse_util.flatten_dict(tree, sep="\0")
    del tree
    for key in list(flat):
        flat[key] = place(flat.pop(key))
    return traverse_util.unflatten_dict(flat, sep="\0")


def check_castable(params, dtype: str | None) -> None:
    """Refuse a stored tree with a float that `dtype`'s cast would turn infinite (convert.check_cast, naming the
    key). Without jax_enable_x64, JAX runs float64 parameters as float32: a float64 checkpoint must fit it too."""
    cast = float_dtype(dtype)
    target = jnp.float32 if cast is None and not jax.config.jax_enable_x64 else cast
    if target is not None:
        check_cast(params, target)


def lay_out(params, config: BertConfig, dtype: str | None, mesh, replicated, consume: bool = False):
    """(weights, dtypes) of a stored tree: the compute layout (a float32 model's layers apart without a `mesh`,
    else stacked; int8's quantized), floats cast to `dtype`, placed replicated (or split by sharding.py's rules
    over a given `mesh`), 16-bit floats held as their bits (`dtypes`: what each leaf's bits stand for)."""
    check_castable(params, dtype)
    cast = float_dtype(dtype)

    def place(x):
        if cast is not None and jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(cast)
        return jax.device_put(x, replicated) if mesh is None else x  # with a mesh: placed by path below

    # A float32 model's layers are held apart (layout.apart_layers: faster matmuls); 16-bit ones stay stacked,
    # where the scan's slices of the weights run beside the matmuls and leave them in cache (apart, bfloat16
    # 1 x 128 ran 5% slower on a Xeon with AMX); a mesh's sharding rules are written for the stacked layout.
    apart = is_float32(params, dtype) and mesh is None
    compute = to_devices(to_compute(params, config, consume=consume, place=place, apart=apart), place)
    del params
    if dtype == "int8":
        compute = quantize.quantize(compute)
    if mesh is not None:
        compute = jax.device_put(compute, sharding.param_shardings(compute, mesh))
    dtypes = jax.tree_util.tree_map(lambda a: a.dtype, compute)
    weights = to_devices(compute, lambda a: as_bits(a) if mesh is not None else jax.device_put(as_bits(a), replicated))
    return weights, dtypes


def signature(weights, dtypes) -> dict:
    """{leaf path: (shape, dtype)} of laid-out weights: what a compiled program was traced for."""
    flat, kinds = (traverse_util.flatten_dict(t, sep="/") for t in (weights, dtypes))
    return {k: (tuple(v.shape), np.dtype(kinds[k]).name) for k, v in flat.items()}


def check_same(had: dict, new: dict, what: str) -> None:
    """New weights must be the model's leaves, shapes and dtypes (paths of the compute layout): the compiled
    programs, and the bits each leaf is read back from, were made for those."""
    for key in sorted(had.keys() | new.keys()):
        if key not in new:
            raise ValueError(f"{what}: no {key} (the model has one of shape {had[key][0]}, {had[key][1]})")
        if key not in had:
            raise ValueError(f"{what}: {key} is not one of the model's weights")
        if new[key] != had[key]:
            (shape, kind), (was, was_kind) = new[key], had[key]
            raise ValueError(f"{what}: {key} is {shape} {kind}, the model's {was} {was_kind}")
