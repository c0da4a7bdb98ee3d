"""Stateless numerics shared by every block: dense, layer norm, activations by transformers' names, dropout."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import custom_batching
from jaxtyping import Array, Float, Int


def compute_dtype(p: dict):
    """The dtype matmuls run in: that of the block's floating weights (bfloat16 weights -> bfloat16 matmuls; int8
    weights come with float32 biases and scales, and their blocks compute in float32)."""
    return float_leaf(p).dtype


def float_leaf(p: dict) -> Array:
    """The first floating leaf of p (a block's weights; also an anchor for ops.heads_first)."""
    return next(x for x in jax.tree_util.tree_leaves(p) if jnp.issubdtype(x.dtype, jnp.floating))


_BITS = {jnp.dtype(jnp.bfloat16): jnp.uint16, jnp.dtype(jnp.float16): jnp.uint16}


def as_bits(a: Array) -> Array:
    """16-bit float arrays as uint16. XLA:CPU has no bfloat16 gather or dynamic-slice: it converts the whole
    operand to float32 first (a temporary twice the size of the weights, every call). Indexing the integer view
    and bitcasting the result back with `from_bits` keeps the weights 16-bit."""
    return jax.lax.bitcast_convert_type(a, _BITS[a.dtype]) if a.dtype in _BITS else a


def from_bits(a: Array, dtype) -> Array:
    return jax.lax.bitcast_convert_type(a, dtype) if a.dtype != dtype else a


@jax.custom_jvp
def from_bits_of(bits: Array, a: Array) -> Array:
    """`from_bits(bits, a.dtype)` where `bits` is a slice of `as_bits` of an array and `a` the same slice of the
    array itself: the value comes from the bits, the derivative from `a`. A bitcast to integers has no derivative,
    so the bits alone would silently give 16-bit weights a zero gradient. `a` is not computed unless
    differentiated (XLA drops it), so the forward pass keeps the 16-bit indexing."""
    return from_bits(bits, a.dtype)


@from_bits_of.defjvp
def _from_bits_of_jvp(primals, tangents):
    bits, a = primals
    return from_bits(bits, a.dtype), tangents[1]


def take_rows(table: Float[Array, "V D"], ids: Int[Array, ...]) -> Float[Array, "... D"]:
    """table[ids] without XLA:CPU's float32 copy of a 16-bit table (see as_bits), differentiable in the table."""
    if table.dtype not in _BITS:
        return table[ids]
    return from_bits_of(as_bits(table)[ids], table[ids])


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


def _contract(x: Array, w: Array, axis: int, dtype) -> Array:
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (axis,)), ((), ())), preferred_element_type=dtype)


def _row_major(a: Array, perm: tuple[int, ...], anchor: Array | None = None) -> Array:
    """a.transpose(perm) materialized row-major for a 16-bit product, behind a conditional whose result gets the
    default layout (see _transposed_copy). Its predicate is read from `anchor` (default: a itself), a float array
    whose values XLA cannot know: one that no enclosing vmap batches keeps it a conditional there, where a
    batched predicate makes it a select computing both branches."""
    if a.size == 0:
        return a.transpose(perm)
    flipped = perm.index(0)  # where a's first axis goes: the other branch flips it before and after
    return jax.lax.cond(
        jnp.isfinite((a if anchor is None else anchor).reshape(-1)[0]),
        lambda u: u.transpose(perm),
        lambda u: jnp.flip(jnp.flip(u, 0).transpose(perm), flipped),
        a,
    )


def heads_first(t: Float[Array, "L H K"], anchor: Array | None = None) -> Float[Array, "H L K"]:
    """t as [H, L, K], the layout of attention's products. A 16-bit t with an `anchor` (an unbatched float, e.g. one
    of the layer's weights) is computed into a row-major copy (_row_major): XLA's layout assignment otherwise
    makes the transpose a strided view, which XLA:CPU's 16-bit kernels do not take, and runs the products in
    float32 with their operands converted (bert-base bfloat16 inference, 8 x 128: 24 ms of attention instead of
    about 12)."""
    if anchor is None or t.dtype not in _BITS:
        return t.transpose(1, 0, 2)
    return _row_major(t, (1, 0, 2), anchor)


def _transposed_copy(a: Float[Array, "N I"]) -> Float[Array, "I N"]:
    """a.T materialized row-major, so that the weight gradient a.T @ b is a product XLA:CPU runs in 16 bits.

    Its 16-bit kernels (YNNPACK) take only a left operand contracting its last axis in row-major order. Written
    as rows against rows, or as a plain `a.T`, which XLA's layout assignment turns into a column-major view, the
    product falls to XLA's float32 kernel with its operands converted (bert-base bfloat16 MLM step: 1.78 s).
    A conditional's result gets the default row-major layout, so the transpose is computed into one: both
    branches are the same transpose (written differently, or XLA merges them), and the predicate only has to be
    unknown at compile time (1.33 s)."""
    return _row_major(a, (1, 0))


@functools.cache
def _low_matmul(axis: int, x_dtype) -> tuple[Callable, Callable]:
    """x contracted with 16-bit w's `axis` into float32, whose gradients' products run in 16 bits too, as
    (product, the same under a custom vmap rule).

    JAX's own transpose of that product multiplies the float32 cotangent by the weights promoted to float32
    (bert-base bfloat16 training spent most of its matmul time so). Here the cotangent is cast down first and
    both backward products are 16-bit with float32 sums, as the forward one is (PyTorch autocast's rule).

    The model's blocks are per-sequence functions under `jax.vmap`, and a vmapped custom VJP computes the weight
    gradient one sequence at a time and sums afterwards ([B, in, out], 4x slower). The custom vmap rule hands
    the product the whole batch instead (x's leading axes are rows to it), so that the weight gradient is one
    product over every row."""

    @jax.custom_vjp
    def product(x, w):
        return _contract(x.astype(w.dtype), w, axis, jnp.float32)

    def forward(x, w):
        return product(x, w), (x.astype(w.dtype), w)

    def backward(res, g):
        x, w = res
        g = g.astype(w.dtype)
        dx = _contract(g, w, 1 - axis, jnp.float32).astype(x_dtype)
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        a, b = (x2, g2) if axis == 0 else (g2, x2)  # w is [in, out] (axis 0) or [out, in] (axis 1)
        dw = jax.lax.dot_general(_transposed_copy(a), b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return dx, dw.astype(w.dtype)

    product.defvjp(forward, backward)

    @custom_batching.custom_vmap
    def batched(x, w):
        return product(x, w)

    @batched.def_vmap
    def _rule(axis_size, in_batched, x, w):
        x_batched, w_batched = in_batched
        if w_batched:  # weights per sequence (rare): one product each
            return jax.vmap(product, in_axes=(0 if x_batched else None, 0))(x, w), True
        return product(x, w), x_batched  # an enclosing vmap maps `product` as it is

    return product, batched


def _batched_by_current_vmap(x: Array) -> bool:
    """Whether x is batched by the vmap being traced right now, the only place a custom vmap rule runs first:
    JAX cannot differentiate `custom_vmap` anywhere else (jax 0.10: "Linearization failed"). JAX internals;
    without them every call takes the plain product (correct, slower)."""
    try:
        from jax._src.core import trace_ctx
        from jax._src.interpreters.batching import BatchTrace

        trace = trace_ctx.trace
        return isinstance(trace, BatchTrace) and getattr(x, "_trace", None) is trace
    except (ImportError, AttributeError):
        return False


def matmul(x: Float[Array, "... I"], w: Float[Array, "A B"], axis: int = 0) -> Float[Array, "... O"]:
    """x contracted with w's `axis` (0: w is [in, out]; 1: [out, in]) in w's dtype, summed and returned in float32.
    With 16-bit weights the gradients' products run in 16 bits too (see _low_matmul)."""
    if w.dtype not in _BITS:
        return _contract(x.astype(w.dtype), w, axis, jnp.float32)
    product, batched = _low_matmul(axis, jnp.dtype(x.dtype))
    return (batched if _batched_by_current_vmap(x) else product)(x, w)


def _nn(a: Float[Array, "Z X C"], b: Float[Array, "Z C Y"]) -> Float[Array, "Z X Y"]:
    """A batched product in the form XLA:CPU's 16-bit kernels (YNNPACK) take: the left operand contracts its
    last axis, the right one its first, both row-major. Summed in float32."""
    return jax.lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32)


def _merge(a: Array) -> Array:
    return a.reshape(-1, *a.shape[2:])  # [B, H, X, Y] -> [B*H, X, Y]


# Attention's two products for a batch of sequences, in 16 bits forward and backward. JAX's own transpose
# multiplies the float32 cotangent by the other operand promoted to float32, which XLA:CPU computes in float32
# (bert-base bfloat16 MLM step: 190 ms of thunk time in oneDNN). Here the cotangent is cast down first (as in
# _low_matmul) and each backward product is put in _nn's form, its operands transposed into row-major copies.
@jax.custom_vjp
def _scores_batch(q: Float[Array, "B L H K"], k: Float[Array, "B H M K"]) -> Float[Array, "B H L M"]:
    return jnp.einsum("blhk,bhmk->bhlm", q, k, preferred_element_type=jnp.float32)


def _scores_fwd(q, k):
    return _scores_batch(q, k), (q, k)


def _scores_bwd(res, g):
    q, k = res
    g = g.astype(q.dtype)
    B, H, L, M = g.shape
    dq = _nn(_merge(g), _merge(k)).reshape(B, H, L, -1).transpose(0, 2, 1, 3)
    dk = _nn(_merge(_row_major(g, (0, 1, 3, 2))), _merge(_row_major(q, (0, 2, 1, 3)))).reshape(B, H, M, -1)
    return dq.astype(q.dtype), dk.astype(k.dtype)


_scores_batch.defvjp(_scores_fwd, _scores_bwd)


@jax.custom_vjp
def _context_batch(p: Float[Array, "B H L M"], v: Float[Array, "B H M K"]) -> Float[Array, "B L H K"]:
    B, H, L, _ = p.shape
    return _nn(_merge(p), _merge(v)).reshape(B, H, L, -1).transpose(0, 2, 1, 3)


def _context_fwd(p, v):
    return _context_batch(p, v), (p, v)


def _context_bwd(res, g):
    p, v = res
    B, H, L, M = p.shape
    g = _merge(_row_major(g.astype(p.dtype), (0, 2, 1, 3)))  # [B*H, L, K]
    dp = _nn(g, _merge(_row_major(v, (0, 1, 3, 2)))).reshape(B, H, L, M)
    dv = _nn(_merge(_row_major(p, (0, 1, 3, 2))), g).reshape(B, H, M, -1)
    return dp.astype(p.dtype), dv.astype(v.dtype)


_context_batch.defvjp(_context_fwd, _context_bwd)


def _per_sequence(batch_fn: Callable) -> Callable:
    """batch_fn over a batch, as a function of one sequence whose vmap hands batch_fn the whole batch (as
    _low_matmul's rule does: a vmapped custom VJP would run its backward products per sequence, and the
    conditionals of _row_major, their predicate batched, would become selects computing both branches)."""

    @custom_batching.custom_vmap
    def one(a, b):
        return batch_fn(a[None], b[None])[0]

    @one.def_vmap
    def _rule(axis_size, in_batched, a, b):
        a, b = (x if batched else jnp.broadcast_to(x, (axis_size, *x.shape)) for batched, x in zip(in_batched, (a, b)))
        return batch_fn(a, b), True

    return one


_scores_one, _context_one = _per_sequence(_scores_batch), _per_sequence(_context_batch)


def scores_product(q: Float[Array, "L H K"], k: Float[Array, "H M K"]) -> Float[Array, "H L M"]:
    """q . k over K, summed in float32. With 16-bit operands the gradients' products run in 16 bits too."""
    if q.dtype in _BITS and k.dtype == q.dtype and _batched_by_current_vmap(q):
        return _scores_one(q, k)
    return jnp.einsum("lhk,hmk->hlm", q, k, preferred_element_type=jnp.float32)


def context_product(p: Float[Array, "H L M"], v: Float[Array, "H M K"]) -> Float[Array, "L H K"]:
    """p . v over M, summed in float32. With 16-bit operands the gradients' products run in 16 bits too."""
    if p.dtype in _BITS and v.dtype == p.dtype and _batched_by_current_vmap(p):
        return _context_one(p, v)
    return jnp.einsum("hlm,hmk->lhk", p, v, preferred_element_type=jnp.float32)


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
