"""Stateless numerics shared by every block: dense, layer norm, activations by transformers' names, dropout (its
masks hashed: hashed_bits), parameter specs. The products of 16-bit and int8 weights and the integer views of
16-bit arrays are low_precision.py's, re-exported here (ops.matmul, ops.as_bits, ...).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxbert.low_precision import (  # noqa: F401  (re-exported: the names blocks and tests import from ops)
    _int8_matmul,
    _transposed_copy,
    as_bits,
    context_product,
    from_bits,
    from_bits_of,
    heads_first,
    matmul,
    quantize_rows,
    scores_product,
    take_rows,
)


def compute_dtype(p: dict):
    """The dtype matmuls run in: that of the block's floating weights (bfloat16 weights -> bfloat16 matmuls; int8
    weights come with float32 biases and scales, and their blocks compute in float32)."""
    return float_leaf(p).dtype


def float_leaf(p: dict) -> Array:
    """The first floating leaf of p (a block's weights; also an anchor for ops.heads_first)."""
    return next(x for x in jax.tree_util.tree_leaves(p) if jnp.issubdtype(x.dtype, jnp.floating))


# Parameter specs: leaves are (shape, init), init one of "normal" (std = initializer_range), "zeros", "ones".
def dense_spec(i: int, o: int, bias: bool = True) -> dict:
    return {"kernel": ((i, o), "normal"), **({"bias": ((o,), "zeros")} if bias else {})}


def norm_spec(d: int) -> dict:
    return {"scale": ((d,), "ones"), "bias": ((d,), "zeros")}


def dense(p: dict, x: Float[Array, "... I"]) -> Float[Array, "... O"]:
    """`x @ kernel + bias` in float32; kernel is [in, out] (the transpose of PyTorch's Linear.weight).

    The matmul runs in the kernel's dtype and accumulates in float32 (bfloat16 weights: half the memory traffic,
    float32 sums); the bias is added in float32, so activations between matmuls stay float32.

    A `weight` [out, in] (PyTorch's layout) may stand instead of the kernel: a float32 model's layers are so
    (layout.apart_layers), since XLA:CPU multiplies a few rows by it faster (a bert-base decoding step, batch 1:
    24.6 -> 22.5 ms; batch 8: 48.1 -> 44.3 ms; 1 x 128: 1.05x apart in [in, out], 1.22-1.28x in [out, in]).
    An int8 `weight` comes with a `weight_scale` per output (quantize.py): x is quantized per row, the product
    summed in int32 and scaled back (so are int8 matmuls fastest here too: bert-base's FFN down projection, 128
    rows, 0.29 vs 0.59 ms as [in, out])."""
    if "kernel" in p:
        y = matmul(x, p["kernel"])
    elif "weight_scale" in p:
        y = _int8_matmul(x, p["weight"], p["weight_scale"])
    else:
        y = matmul(x, p["weight"], axis=1)
    return y + p["bias"].astype(jnp.float32) if "bias" in p else y


def layer_norm(p: dict, x: Float[Array, "... D"], eps: float) -> Float[Array, "... D"]:
    """LayerNorm with statistics in float32 whatever the compute dtype; eps comes from the config."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def _fmix32(h: Array) -> Array:
    # MurmurHash3's finalizer: a bijection of uint32 in which every input bit flips each output bit with
    # probability about 1/2.
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hashed_bits(rng: jax.Array, shape: tuple[int, ...]) -> Array:
    """uint32 bits [*shape] from a counter hashed with two 32-bit seeds drawn from `rng`.

    Why not jax.random.bits: XLA:CPU runs threefry (and its RngBitGenerator) at about 5 ns an element, and
    bert-base's dropout masks are 38 M elements a step: 0.6 s of a 3.7 s float32 training step went to them.
    This costs as much as one elementwise pass. The counter is the element's row-major index (from iotas, so
    XLA partitions it like any elementwise op on a mesh); the first seed is added to the counter times the
    golden ratio and hashed (SplitMix's output function), and the second seed is xored in and hashed again,
    so that two keys' streams are not shifted copies of one another."""
    size = math.prod(shape)
    if size >= 2**32:
        raise ValueError(f"dropout over {size} elements: the counter has 32 bits")
    seeds = jax.random.bits(rng, (2,), jnp.uint32)
    counter = jnp.zeros(shape, jnp.uint32)
    for d in range(len(shape)):
        counter += jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(math.prod(shape[d + 1 :]))
    return _fmix32(_fmix32(counter * jnp.uint32(0x9E3779B9) + seeds[0]) ^ seeds[1])


def dropout(x: Array, rate: float, rng: jax.Array | None) -> Array:
    """Inverted dropout; the identity when `rng` is None (inference) or the rate is zero. An element is dropped
    when its hashed bits fall below round(rate * 2^32): the keep probability is 1 - rate to within 2^-32."""
    if rng is None or rate == 0.0:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    keep = hashed_bits(rng, x.shape) >= jnp.uint32(min(round(rate * 2**32), 2**32 - 1))
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _gelu_tanh(x):
    # transformers' gelu_new / gelu_pytorch_tanh / gelu_accurate: all the tanh approximation.
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_fast(x):
    return 0.5 * x * (1.0 + jnp.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _gelu_erf(x):
    # PyTorch's exact GELU, written as it is: jax.nn.gelu(approximate=False) goes through erfc, which XLA:CPU
    # expands into twice the work of erf (bert-base's [1024, 3072] FFN activations: 2.0 vs 0.95 ms, an add
    # alone 0.65).
    return x * 0.5 * (1.0 + jax.lax.erf(x / math.sqrt(2.0)))


# transformers' ACT2FN names (but prelu and xielu, which have weights of their own). Plain "gelu" is the exact erf
# form; jax.nn.gelu defaults to tanh, hence explicit.
ACTIVATIONS = {
    "gelu": _gelu_erf,
    "gelu_python": _gelu_erf,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_python_tanh": _gelu_tanh,
    "gelu_accurate": _gelu_tanh,
    "gelu_fast": _gelu_fast,
    "gelu_10": lambda x: jnp.clip(_gelu_erf(x), -10.0, 10.0),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),
    "relu6": jax.nn.relu6,
    "leaky_relu": lambda x: jax.nn.leaky_relu(x, 0.01),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)),
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "linear": lambda x: x,
    "laplace": lambda x: 0.5 * (1.0 + jax.lax.erf((x - 0.707107) / (0.282095 * math.sqrt(2.0)))),
    "hardswish": jax.nn.hard_swish,
    "sqrtsoftplus": lambda x: jnp.sqrt(jax.nn.softplus(x)),
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}") from None
