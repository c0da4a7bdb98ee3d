"""The numerics of 16-bit and int8 weights: integer views of 16-bit arrays (XLA:CPU gathers and slices them without a
float32 copy), matrix products in the weights' dtype summed in float32 whose gradients' products run in 16 bits too
(dense's matmul, attention's two products), and int8 matmuls of activations quantized per row. ops.py re-exports
them; its `dense` picks the product.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import custom_batching
from jaxtyping import Array, Float, Int

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
