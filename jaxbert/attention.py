"""Attention for one sequence: self-attention (bidirectional, or causal for decoders, optionally over a key/value
cache) and cross-attention over an encoder's states.

Shapes: L query positions, M key positions (the cache's capacity when there is one), S encoder positions, D hidden,
H heads, K head size. Queries are [L, H, K] as projected; keys and values are heads-first, [H, M, K], the layout
of both products and of the cache, so cached keys are used as stored. Which keys a query may see is one boolean
[L, M] mask built once per forward (`Keys`), so padding, causality and the cache's filled length are all the same
mechanism.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from jaxbert.config import BertConfig
from jaxbert.ops import (
    compute_dtype,
    context_product,
    dense,
    dropout,
    float_leaf,
    heads_first,
    scores_product,
    take_rows,
)

# Backends on which `jax.nn.dot_product_attention` is used when no probabilities are needed: on GPU it picks
# cuDNN's fused kernel. On CPU it lowers to the same XLA ops as the explicit path below in a slower layout
# (scripts/benchmark.py, bert-base 8 x 128: about 10% fewer tokens/s), so CPU keeps the explicit path.
FUSED_ATTENTION_BACKENDS = ("gpu", "cuda", "rocm", "tpu")


@flax.struct.dataclass
class Keys:
    """What every layer's self-attention shares in one forward: which keys each query sees, the positions of
    queries and keys (for relative position scores), and where new keys go in a cache."""

    allowed: Bool[Array, "L M"]
    query_positions: Int[Array, " L"]
    key_positions: Int[Array, " M"]
    index: Int[Array, ""] | None = None  # cache slot of the first new key; None without a cache
    padding_only: bool = flax.struct.field(pytree_node=False, default=True)  # allowed = one row repeated
    rows: int = flax.struct.field(pytree_node=False, default=1)  # sequences the enclosing vmap batches
    products: str | None = flax.struct.field(pytree_node=False, default=None)  # see self_attention


def keys_for(
    config: BertConfig,
    mask: Bool[Array, " L"],
    cache_mask: Bool[Array, " M"] | None = None,
    index: Int[Array, ""] | None = None,
    segment_ids: Int[Array, " L"] | None = None,
    rows: int = 1,
    products: str | None = None,
) -> Keys:
    """Keys for a forward over L new tokens with key validity `mask`; with a cache, the new keys are written at
    `index` of a cache whose valid slots are `cache_mask`. Decoders (config.is_decoder) attend causally. With
    `segment_ids` (packed sequences, see packing.py; no cache) a query sees only keys of its own segment. `rows`:
    how many sequences the enclosing vmap batches (it sizes attention's query blocks, see query_block);
    `products`: the dtype of attention's products, if not the blocks' own (see self_attention)."""
    L = mask.shape[0]
    if cache_mask is None:
        valid, q_pos, k_pos = mask, jnp.arange(L), jnp.arange(L)
    else:
        valid = jax.lax.dynamic_update_slice(cache_mask, mask, (index,))
        q_pos, k_pos = index + jnp.arange(L), jnp.arange(cache_mask.shape[0])
    allowed = jnp.broadcast_to(valid[None, :], (L, valid.shape[0]))
    if config.is_decoder:
        allowed = allowed & (k_pos[None, :] <= q_pos[:, None])
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, None] == segment_ids[None, :])
    only = not config.is_decoder and cache_mask is None and segment_ids is None
    return Keys(allowed, q_pos, k_pos, index, padding_only=only, rows=rows, products=products)


def relative_scores(
    p, config: BertConfig, q: Float[Array, "L H K"], k: Float[Array, "H M K"], keys: Keys
) -> Float[Array, "H L M"]:
    """The reference's relative position terms; distances from the queries' and keys' absolute positions, so a
    query after a cache of n keys sits at position n + i, as in transformers."""
    distance = keys.query_positions[:, None] - keys.key_positions[None, :]
    pos = take_rows(p["distance_embedding"]["embedding"], distance + config.max_position_embeddings - 1).astype(q.dtype)
    scores = jnp.einsum("lhk,lmk->hlm", q, pos, preferred_element_type=jnp.float32)
    if config.position_embedding_type == "relative_key_query":
        scores = scores + jnp.einsum("hmk,lmk->hlm", k, pos, preferred_element_type=jnp.float32)
    return scores


def _fused(config: BertConfig, keys: Keys, relative: bool, with_probs: bool, head_mask, rng) -> bool:
    return (
        jax.default_backend() in FUSED_ATTENTION_BACKENDS
        and keys.padding_only
        and not relative
        and not with_probs
        and head_mask is None
        and (rng is None or config.attention_probs_dropout_prob == 0.0)
    )


# Above this many bytes of float32 scores for a whole batch, attention over long rows runs in blocks of queries.
BLOCK_BYTES = 16 << 20


def query_block(rows: int, H: int, L: int, M: int, dtype) -> int | None:
    """The number of queries attention takes at a time (None: all), for `rows` sequences of L queries over M keys.

    XLA:CPU runs attention over 512 keys several times slower as one product over all queries than in blocks
    whose scores stay within a few MB (bfloat16, 12 heads, 4 x 512: 43 ms a layer, against 9.5 in blocks of
    128; 8 x 512 x 64: 83 against 28 in blocks of 64). Over 256 keys it is the other way round (8 x 256: 2.9
    against 5.0), and so it is for float32 while the whole batch's scores fit in BLOCK_BYTES."""
    if M < 512 or (jnp.dtype(dtype) == jnp.float32 and rows * H * L * M * 4 <= BLOCK_BYTES):
        return None
    size = 128
    while size > 16 and rows * H * size * M * 4 > BLOCK_BYTES:
        size //= 2
    return size if size < L and L % size == 0 else None


def _normalized_late(q, k, v, allowed, scale: float, relative, anchor=None, rows: int = 1):
    """Inference without probabilities: heads first, so both products are plain batched matmuls over H (as
    [L, H, K] they need strided access, which made attention a third of MiniLM's time), and the softmax
    normalized after the value product (the division runs over [H, L, K] instead of [H, L, M] and a pass over
    the scores goes). MiniLM 32 x 128: +78% tokens/s in scripts/benchmark.py. 16-bit queries go heads first
    through ops.heads_first with the layer's `anchor`, as self_attention's keys and values do. Long rows run in
    blocks of queries (query_block). Returns [L, H, K]."""
    q = heads_first(q * jnp.asarray(scale, q.dtype), anchor)

    def block(q, bias, relative):  # q [H, l, K], bias [l, M], relative [H, l, M] or None
        scores = jnp.einsum("hlk,hmk->hlm", q, k, preferred_element_type=jnp.float32) + bias[None]
        if relative is not None:
            scores = scores + relative * scale
        weights = jnp.exp(scores - scores.max(-1, keepdims=True))
        context = jnp.einsum("hlm,hmk->hlk", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return (context / weights.sum(-1, keepdims=True)).transpose(1, 0, 2)

    # The mask as an added bias (finfo.min where masked, as the reference adds it), not a select: XLA:CPU keeps
    # an addition inside attention's fused kernel, where a select splits it (8 x 256, one layer: 3.6 vs 13.6 ms).
    bias = jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)
    H, L, _ = q.shape
    M = k.shape[1]
    size = query_block(rows, H, L, M, q.dtype)
    if size is None:
        return block(q, bias, relative)
    # The blocks are unrolled, static slices: as a lax.map, zeroing its stacked outputs, writing them and the
    # blocks' transposed copies cost 10% more (bert-base int8 8 x 512: 3,490 vs 3,890 tokens/s).
    parts = [
        block(q[:, s : s + size], bias[s : s + size], None if relative is None else relative[:, s : s + size])
        for s in range(0, L, size)
    ]
    return jnp.concatenate(parts, axis=0)


def attend(
    config: BertConfig,
    q: Float[Array, "L H K"],
    k: Float[Array, "H M K"],
    v: Float[Array, "H M K"],
    allowed: Bool[Array, "L M"],
    relative: Float[Array, "H L M"] | None,
    head_mask,
    rng,
    with_probs: bool,
    anchor=None,
    rows: int = 1,
):
    """Scaled dot-product attention: (context [L, H*K] float32, probabilities [H, L, M] or None). Scores and
    softmax in float32; masked scores are finfo.min (a fully masked row averages, as the reference does).
    `anchor`: see ops.heads_first; `rows`: see Keys."""
    L, scale = q.shape[0], 1.0 / math.sqrt(q.shape[-1])
    dropping = rng is not None and config.attention_probs_dropout_prob > 0.0
    if not (with_probs or head_mask is not None or dropping):
        return _normalized_late(q, k, v, allowed, scale, relative, anchor, rows).reshape(L, -1), None
    scores = scores_product(q, k)
    scores = (scores if relative is None else scores + relative) * scale
    probs = jax.nn.softmax(jnp.where(allowed[None], scores, jnp.finfo(jnp.float32).min), axis=-1)
    probs = dropout(probs, config.attention_probs_dropout_prob, rng)
    if head_mask is not None:
        probs = probs * head_mask[:, None, None].astype(probs.dtype)
    context = context_product(probs.astype(v.dtype), v)
    return context.reshape(L, -1), probs if with_probs else None


def _project_qkv(p, x: Float[Array, "L D"], K: int):
    """q, k, v as [L, H, K] each: one [D, 3D] matmul in the fused (stacked) layout, three otherwise."""
    if "qkv" in p:
        qkv = dense(p["qkv"], x).reshape(x.shape[0], 3, -1, K)
        return qkv[:, 0], qkv[:, 1], qkv[:, 2]
    return tuple(dense(p[name], x).reshape(x.shape[0], -1, K) for name in ("query", "key", "value"))


def self_attention(
    p,
    config: BertConfig,
    x: Float[Array, "L D"],
    keys: Keys,
    head_mask: Float[Array, " H"] | None = None,
    past=None,
    *,
    rng=None,
    with_probs: bool = True,
):
    """Self-attention over the new tokens, or, with `past` = (cached keys, values) [H, M, K] each, over the cache
    with the new keys written at slots `keys.index`…. Returns (context [L, H*K], probs [H, L, M] or None, the
    keys and values attended over: the new tokens' [H, L, K] in the weights' dtype, or with `past` the cache
    with them written, in the cache's dtype).

    `keys.index` should be the same for the rows of a vmap (not batched): XLA then turns the write (a scatter
    under vmap) into an in-place update of the batch's cache; with an index per row it copied the whole cache
    (bert-base, batch 8: 159 -> 99 ms a step). A cache wider than the weights (float32 for
    bfloat16 weights on CPU, see decoders.causal_lm) holds the same values; the products then run in its dtype.
    They run in the block's compute dtype, or in `keys.products` when given (an int8 model's bfloat16: see
    quantize.attention_dtype)."""
    K = config.head_size
    cd = compute_dtype(p) if keys.products is None else jnp.dtype(keys.products)
    q, k, v = (t.astype(cd) for t in _project_qkv(p, x, K))
    anchor = float_leaf(p)
    relative = config.position_embedding_type != "absolute"
    if past is None and _fused(config, keys, relative, with_probs, head_mask, rng):
        context = jax.nn.dot_product_attention(q, k, v, mask=keys.allowed[None])
        return context.reshape(x.shape[0], -1).astype(jnp.float32), None, (k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    if past is None:
        k, v = heads_first(k, anchor), heads_first(v, anchor)
    else:
        k, v = (
            jax.lax.dynamic_update_slice(c, n.transpose(1, 0, 2).astype(c.dtype), (0, keys.index, 0))
            for c, n in zip(past, (k, v))
        )
    scores = relative_scores(p, config, q, k, keys) if relative else None
    context, probs = attend(config, q, k, v, keys.allowed, scores, head_mask, rng, with_probs, anchor, keys.rows)
    return context, probs, (k, v)


def cross_keys(p, config: BertConfig, encoder_states: Float[Array, "S D"]):
    """Cross-attention keys and values [H, S, K] from the encoder's states: computed once per input and cached,
    since the encoder's states do not change while the decoder generates."""
    cd = compute_dtype(p)
    S = encoder_states.shape[0]
    return tuple(
        dense(p[name], encoder_states).reshape(S, -1, config.head_size).transpose(1, 0, 2).astype(cd)
        for name in ("key", "value")
    )


def cross_attention(
    p,
    config: BertConfig,
    x: Float[Array, "L D"],
    kv,
    encoder_mask: Bool[Array, " S"],
    head_mask: Float[Array, " H"] | None = None,
    *,
    rng=None,
    with_probs: bool = True,
):
    """Queries from the decoder, keys/values `kv` [H, S, K] from the encoder (always absolute positions, as in the
    reference). Returns (context [L, H*K], probs [H, L, S] or None)."""
    q = dense(p["query"], x).reshape(x.shape[0], -1, config.head_size).astype(compute_dtype(p))
    allowed = jnp.broadcast_to(encoder_mask[None, :], (x.shape[0], encoder_mask.shape[0]))
    return attend(config, q, kv[0], kv[1], allowed, None, head_mask, rng, with_probs)
