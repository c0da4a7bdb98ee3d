"""Stateless numerics shared by every block: dense, layer norm, activations by transformers' names, dropout."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def compute_dtype(p: dict):
    """The dtype matmuls run in: that of the block's floating weights (bfloat16 weights -> bfloat16 matmuls; int8
    weights come with float32 biases and scales, and their blocks compute in float32)."""
    return next(x.dtype for x in jax.tree_util.tree_leaves(p) if jnp.issubdtype(x.dtype, jnp.floating))


_BITS = {jnp.dtype(jnp.bfloat16): jnp.uint16, jnp.dtype(jnp.float16): jnp.uint16}


def as_bits(a: Array) -> Array:
    """16-bit float arrays as uint16. XLA:CPU has no bfloat16 gather or dynamic-slice: it converts the whole
    operand to float32 first (a temporary twice the size of the weights, every call). Indexing the integer view
    and bitcasting the result back with `from_bits` keeps the weights 16-bit."""
    return jax.lax.bitcast_convert_type(a, _BITS[a.dtype]) if a.dtype in _BITS else a


def from_bits(a: Array, dtype) -> Array:
    return jax.lax.bitcast_convert_type(a, dtype) if a.dtype != dtype else a


def take_rows(table: Float[Array, "V D"], ids: Int[Array, ...]) -> Float[Array, "... D"]:
    """table[ids] without XLA:CPU's float32 copy of a 16-bit table (see as_bits)."""
    return from_bits(as_bits(table)[ids], table.dtype)


# Parameter specs: leaves are (shape, init), init one of "normal" (std = initializer_range), "zeros", "ones".
def dense_spec(i: int, o: int, bias: bool = True) -> dict:
    return {"kernel": ((i, o), "normal"), **({"bias": ((o,), "zeros")} if bias else {})}


def norm_spec(d: int) -> dict:
    return {"scale": ((d,), "ones"), "bias": ((d,), "zeros")}


def quantize_rows(x: Float[Array, "... I"]) -> tuple[Int[Array, "... I"], Float[Array, "... 1"]]:
    """Symmetric int8 quantization of each row (the last axis) on its own: (round(x / s), s) with s = max|x| / 127,
    so a row's largest entry maps to ±127 (an all-zero row gets s = 1). Per row rather than per tensor, as the
    activations of one token do not widen the steps of another's."""
    x = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    return jnp.round(x * (1.0 / scale)).astype(jnp.int8), scale


def _int8_matmul(x: Float[Array, "... I"], weight: Int[Array, "O I"], scale: Float[Array, " O"]) -> Array:
    """x quantized per row times an int8 weight, summed in int32, scaled back to float32."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n == 1:  # XLA:CPU's int8 matmul of one row takes a slow path: 3.4x the time of two ([768] x [3072, 768])
        rows = jnp.pad(rows, ((0, 1), (0, 0)))
    xq, x_scale = quantize_rows(rows)
    acc = jax.lax.dot_general(xq, weight, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
    return (acc[:n].astype(jnp.float32) * (x_scale[:n] * scale)).reshape(*x.shape[:-1], -1)


def dense(p: dict, x: Float[Array, "... I"]) -> Float[Array, "... O"]:
    """`x @ kernel + bias` in float32; kernel is [in, out] (the transpose of PyTorch's Linear.weight).

    The matmul runs in the kernel's dtype and accumulates in float32 (bfloat16 weights: half the memory traffic,
    float32 sums); the bias is added in float32, so activations between matmuls stay float32.

    A `weight` [out, in] (PyTorch's layout) may stand instead of the kernel: decoding's float32 copy of the
    weights (inference.Bert.layers_apart) is so, since XLA:CPU multiplies a few rows by it faster (a bert-base
    decoding step, batch 1: 24.6 -> 22.5 ms; batch 8: 48.1 -> 44.3 ms). An int8 `weight` comes with a
    `weight_scale` per output (quantize.py): x is quantized per row, the product summed in int32 and scaled back
    (so are int8 matmuls fastest here too: bert-base's FFN down projection, 128 rows, 0.29 vs 0.59 ms as [in, out])."""
    if "kernel" in p:
        kernel = p["kernel"]
        y = jnp.dot(x.astype(kernel.dtype), kernel, preferred_element_type=jnp.float32)
    else:
        weight, by_rows = p["weight"], (((x.ndim - 1,), (1,)), ((), ()))
        if "weight_scale" in p:
            y = _int8_matmul(x, weight, p["weight_scale"])
        else:
            y = jax.lax.dot_general(x.astype(weight.dtype), weight, by_rows, preferred_element_type=jnp.float32)
    return y + p["bias"].astype(jnp.float32) if "bias" in p else y


def layer_norm(p: dict, x: Float[Array, "... D"], eps: float) -> Float[Array, "... D"]:
    """LayerNorm with statistics in float32 whatever the compute dtype; eps comes from the config."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def dropout(x: Array, rate: float, rng: jax.Array | None) -> Array:
    """Inverted dropout; the identity when `rng` is None (inference) or the rate is zero."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
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


# transformers' ACT2FN names. Plain "gelu" is the exact erf form; jax.nn.gelu defaults to tanh, hence explicit.
ACTIVATIONS = {
    "gelu": _gelu_erf,
    "gelu_python": _gelu_erf,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
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
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}") from None
