"""BERT's blocks as pure per-sequence functions, and `bert(...)`, which batches them with `jax.vmap` (in groups of
rows: row_groups). What `bert` takes and returns (its argument checks, BertOutput) is model_args.py's.

Every function takes its params subtree first, then activations of one sequence. Dropout is on exactly when an
`rng` is given. Shapes: L query positions, M key positions, D hidden, H heads, K head size, F intermediate.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxbert.attention import Keys, cross_attention, cross_keys, keys_for, self_attention
from jaxbert.cache import KVCache, init_cache
from jaxbert.config import BertConfig
from jaxbert.layout import can_stack, is_stacked, stack_layers
from jaxbert.model_args import (
    BertOutput,
    _batch_shape,
    _check_call,
    _check_length,
    _per_row,
    layer_head_mask,
    normalize_head_mask,
)
from jaxbert.ops import activation, as_bits, compute_dtype, dense, dropout, from_bits_of, layer_norm, take_rows
from jaxbert.sharding import whole_vectors


def _split(rng, n):
    return (None,) * n if rng is None else tuple(jax.random.split(rng, n))


def embeddings(
    p,
    config: BertConfig,
    input_ids: Int[Array, " L"] | None,
    token_type_ids: Int[Array, " L"],
    position_ids: Int[Array, " L"],
    inputs_embeds: Float[Array, "L D"] | None = None,
    *,
    rng=None,
) -> Float[Array, "L D"]:
    # The residual stream is float32 whatever the weights' dtype: only matmul inputs are cast down (ops.dense).
    def rows(name: str, ids) -> Float[Array, "L D"]:
        return take_rows(whole_vectors(p[name]["embedding"]), ids)

    if inputs_embeds is None:
        x = rows("word_embeddings", input_ids)
        # PyTorch's nn.Embedding(padding_idx=pad_token_id): the [PAD] row gets no gradient from its lookups (the
        # tied MLM decoder still trains it), though padded positions reach a loss (QA's span softmax, labels).
        # A null pad_token_id is no padding_idx there: every row trains.
        if config.pad_token_id is not None:
            x = jnp.where((input_ids == config.pad_token_id)[:, None], jax.lax.stop_gradient(x), x)
    else:
        x = inputs_embeds
    x = x.astype(jnp.float32) + rows("token_type_embeddings", token_type_ids).astype(jnp.float32)
    # Relative-position models still store absolute position embeddings but never add them (as transformers).
    if config.position_embedding_type == "absolute":
        x = x + rows("position_embeddings", position_ids).astype(jnp.float32)
    x = layer_norm(p["LayerNorm"], x, config.layer_norm_eps)
    return dropout(x, config.hidden_dropout_prob, rng)


def _residual_norm(p, config: BertConfig, h: Array, residual: Array, rng) -> Float[Array, "L D"]:
    h = dropout(dense(p["dense"], h), config.hidden_dropout_prob, rng)
    return layer_norm(p["LayerNorm"], h + residual, config.layer_norm_eps)


def layer(
    p,
    config: BertConfig,
    x: Float[Array, "L D"],
    keys: Keys,
    head_mask: Float[Array, " H"] | None = None,
    past=None,
    cross=None,
    *,
    rng=None,
    with_probs: bool = True,
):
    """One layer: self-attention, add & norm, [cross-attention over `cross` = ((keys, values) [H, S, K], mask
    [S], head mask [H] or None), add & norm,] GELU feed-forward, add & norm. Returns (x, self-attention probs,
    cross-attention probs, the self-attention's keys and values); see attention.self_attention for `past` and
    those keys."""
    r_attn, r_out, r_cross, r_cross_out, r_ffn = _split(rng, 5)
    context, probs, new = self_attention(
        p["attention"]["self"], config, x, keys, head_mask, past, rng=r_attn, with_probs=with_probs
    )
    if cross is None:
        return _tail(p, config, context, x, keys.rows, r_out, r_ffn), probs, None, new
    x = _residual_norm(p["attention"]["output"], config, context, x, r_out)
    context, cross_probs = cross_attention(
        p["crossattention"]["self"], config, x, *cross, rng=r_cross, with_probs=with_probs
    )
    x = _residual_norm(p["crossattention"]["output"], config, context, x, r_cross_out)
    return _feed_forward(p, config, x, r_ffn), probs, cross_probs, new


def _feed_forward(p, config: BertConfig, x: Float[Array, "L D"], rng) -> Float[Array, "L D"]:
    h = activation(config.hidden_act)(dense(p["intermediate"]["dense"], x))
    return _residual_norm(p["output"], config, h, x, rng)


# The intermediate activations [tokens, F] (float32) of one pass of the layer's row-wise tail; above this XLA:CPU's
# fused matmuls fall out of cache (see _tail).
TAIL_BYTES = 12 << 20


def tail_chunks(rows: int, L: int, F: int) -> int:
    """Into how many chunks of positions `_tail` cuts each of `rows` sequences of L positions (1: not cut): n
    dividing L, as many as leave each chunk's [rows * L / n, F] float32 intermediate at least TAIL_BYTES (fewer
    where that many would not divide L); 2,048-token bert-base chunks ran as fast as 1,024-token ones."""
    n = rows * L * F * 4 // TAIL_BYTES
    while n > 1 and L % n:
        n -= 1
    return max(n, 1)


def _tail(
    p, config: BertConfig, context: Float[Array, "L D"], x: Float[Array, "L D"], rows: int, r_out, r_ffn
) -> Float[Array, "L D"]:
    """Attention's output projection, add & norm, the feed-forward, add & norm: the layer's row-wise part.

    Without dropout (inference) and over many tokens it runs in chunks of positions, one after another (a
    `lax.map`, so XLA runs one chunk's fused matmuls at a time rather than all at once): XLA:CPU fuses this whole
    part into one kernel whose [tokens, F] intermediate falls out of cache past about a thousand bert-base tokens
    (its bfloat16 FFN: 380 GFLOP/s at 1,024 rows, 290 at 4,096, 380 again as four chunks of 1,024). bert-base 8 x
    512: bfloat16 1,610 -> 1,790 tokens/s, float32 820 -> 990; MiniLM 16 x 512 bfloat16 7,300 -> 9,800."""

    def tail(context, x):
        return _feed_forward(p, config, _residual_norm(p["attention"]["output"], config, context, x, r_out), r_ffn)

    L, D = x.shape
    n = 1 if r_out is not None else tail_chunks(rows, L, config.intermediate_size)  # r_out: dropout is on
    if n == 1:
        return tail(context, x)
    cut = (context.reshape(n, L // n, D), x.reshape(n, L // n, D))
    return jax.lax.map(lambda a: tail(*a), cut).reshape(L, D)


@flax.struct.dataclass
class _Context:
    """What each layer of one forward shares besides its own parameters."""

    keys: Keys
    cache: KVCache | None  # per sequence: key/value per layer [H, C, K]
    encoder_states: Array | None  # [S, D], when cross keys/values are computed in this forward
    encoder_mask: Array | None  # [S]


def _step(config: BertConfig, ctx: _Context, h, params, i, head_mask, rng, with_probs: bool):
    """Layer i (a Python int in the per-layer loop, traced in the scan) with its cache slots, cross keys and its
    row [H] of the head mask (original heads; see layer_head_mask).
    Returns (h, (h, probs, cross probs, new cross keys, the layer's cache with the new keys)), keys as (k, v)."""
    past = None if ctx.cache is None else (ctx.cache.key[i], ctx.cache.value[i])
    cross, new_cross = None, None
    if ctx.cache is not None and ctx.cache.has_cross:
        cross = ((ctx.cache.cross_key[i], ctx.cache.cross_value[i]), ctx.cache.cross_mask, head_mask)
    elif ctx.encoder_states is not None:
        new_cross = cross_keys(params["crossattention"]["self"], config, ctx.encoder_states)
        cross = (new_cross, ctx.encoder_mask, head_mask)
    own = layer_head_mask(config, head_mask, i)
    h, probs, cross_probs, new = layer(params, config, h, ctx.keys, own, past, cross, rng=rng, with_probs=with_probs)
    return h, (h, probs, cross_probs, new_cross, None if ctx.cache is None else new)


def _scan(stacked, config: BertConfig, ctx: _Context, x, head_mask, rng, remat: bool, with_probs: bool):
    """The layers as one `lax.scan` over stacked parameters: one compiled body whatever the depth.

    Remat goes through the scan too: under a Python loop XLA is free to hoist every layer's recomputation to
    the start of the backward pass, which keeps all activations alive and saves nothing; a scan runs the
    backward one layer at a time, so only the layer inputs are stored. A cache's per-layer arrays are stacked
    for the scan to index (copies; decoding loops use the per-layer loop, where they are updated in place)."""
    if ctx.cache is not None:
        c = ctx.cache
        stacked_cache = {
            name: None if getattr(c, name) is None else jnp.stack(getattr(c, name))
            for name in ("key", "value", "cross_key", "cross_value")
        }
        ctx = ctx.replace(cache=c.replace(**stacked_cache))

    def body(carry, xs):
        params, i, hm = xs
        r = None if rng is None else jax.random.fold_in(rng, i)
        return _step(config, ctx, carry, params, i, hm, r, with_probs)

    def scanned(carry, xs):
        (bits, weights), i, hm = xs  # the weights themselves carry the derivative (ops.from_bits_of)
        return body(carry, (jax.tree_util.tree_map(from_bits_of, bits, weights), i, hm))

    body = jax.checkpoint(body, prevent_cse=False) if remat else body
    n = config.num_hidden_layers
    xs = ((jax.tree_util.tree_map(as_bits, stacked), stacked), jnp.arange(n), head_mask)
    return jax.lax.scan(scanned, x, xs)


def _loop(p, config: BertConfig, ctx: _Context, x, head_mask, rng, remat: bool, with_probs: bool):
    """The stored per-layer tree as a Python loop (no copy of the weights per call); pruned layers, whose
    shapes differ, always run this way."""

    def step(carry, params, i, hm, r):
        return _step(config, ctx, carry, params, i, hm, r, with_probs)

    if remat:
        step = jax.checkpoint(step, static_argnums=(2,))
    outputs = []
    for i in range(config.num_hidden_layers):
        r = None if rng is None else jax.random.fold_in(rng, i)
        x, out = step(x, p["layer"][str(i)], i, None if head_mask is None else head_mask[i], r)
        outputs.append(out)
    # Per-layer probabilities keep their own shapes (pruned layers have fewer heads): tuples, not stacks.
    hidden, probs, cross_probs, new_cross, new = zip(*outputs)
    new_cross, new = (None if kv[0] is None else tuple(zip(*kv)) for kv in (new_cross, new))
    return x, (hidden, probs, cross_probs, new_cross, new)


def _per_layer(stacked_or_tuple) -> tuple:
    if stacked_or_tuple is None or isinstance(stacked_or_tuple, tuple):
        return stacked_or_tuple
    return tuple(stacked_or_tuple)


def encoder(
    p,
    config: BertConfig,
    x: Float[Array, "L D"],
    ctx: _Context,
    head_mask: Float[Array, "N H"] | None = None,
    *,
    rng=None,
    remat: bool = False,
    with_probs: bool = True,
):
    """All layers; returns (last hidden, hidden states: embeddings + each layer, self-attentions per layer,
    cross-attentions per layer, this sequence's cache with the new tokens' keys (and new cross keys) or None).

    The stacked layout (layout.py) runs as a scan, and so does the stored tree with `remat` (stacked in the
    trace: a copy per call, which the backward needs anyway); otherwise the stored tree runs as a loop. With
    `remat`, each layer's activations are recomputed in the backward pass."""
    if is_stacked(p) or (remat and can_stack(config)):
        stacked = p["stacked"] if is_stacked(p) else stack_layers(p, config, fuse_qkv=False)["stacked"]
        last, ys = _scan(stacked, config, ctx, x, head_mask, rng, remat, with_probs)
    else:
        last, ys = _loop(p, config, ctx, x, head_mask, rng, remat, with_probs)
    hidden, probs, cross_probs, new_cross, new = ys
    cache = ctx.cache
    if cache is not None:
        cache = cache.replace(key=_per_layer(new[0]), value=_per_layer(new[1]))
        if new_cross is not None:
            cache = cache.replace(
                cross_key=_per_layer(new_cross[0]), cross_value=_per_layer(new_cross[1]), cross_mask=ctx.encoder_mask
            )
    crossing = ctx.encoder_states is not None or (ctx.cache is not None and ctx.cache.has_cross)
    return (
        last,
        (x, *_per_layer(hidden)),
        _per_layer(probs) if with_probs else (),
        _per_layer(cross_probs) if with_probs and crossing else (),
        cache,
    )


def pooler(p, x: Float[Array, "L D"]) -> Float[Array, " D"]:
    return jnp.tanh(dense(p["dense"], x[0]))


def _bert_one(
    params,
    config: BertConfig,
    input_ids,
    mask,
    token_type_ids,
    position_ids,
    inputs_embeds,
    head_mask,
    rng,
    remat: bool,
    with_probs: bool = True,
    cache: KVCache | None = None,
    encoder_states=None,
    encoder_mask=None,
    at: Int[Array, ""] | None = None,
    segment_ids: Int[Array, " L"] | None = None,
    rows: int = 1,
    attention_dtype: str | None = None,
):
    """One sequence (of `rows` the enclosing vmap batches): embeddings, the layers, the pooler. With a cache, the L
    new tokens' keys go to slots at … at+L-1 (`at` is the cache's index, given apart so that it is the same for
    all rows of the vmap: see attention.self_attention); returns (last hidden, pooled, hidden states,
    attentions, cross-attentions, cache)."""
    r_emb, r_enc = _split(rng, 2)
    x = embeddings(params["embeddings"], config, input_ids, token_type_ids, position_ids, inputs_embeds, rng=r_emb)
    if cache is None:
        keys = keys_for(config, mask, segment_ids=segment_ids, rows=rows, products=attention_dtype)
    else:
        at = cache.index if at is None else at
        keys = keys_for(config, mask, cache.mask, at, products=attention_dtype)
        cache = cache.replace(mask=jax.lax.dynamic_update_slice(cache.mask, mask, (at,)))
    fresh_cross = encoder_states is not None and not (cache is not None and cache.has_cross)
    ctx = _Context(keys, cache, encoder_states if fresh_cross else None, encoder_mask if fresh_cross else None)
    x, hidden, attentions, cross_attentions, cache = encoder(
        params["encoder"], config, x, ctx, head_mask, rng=r_enc, remat=remat, with_probs=with_probs
    )
    if cache is not None:
        cache = cache.replace(index=cache.index + mask.shape[0])
    pooled = pooler(params["pooler"], x) if "pooler" in params else None
    return x, pooled, hidden, attentions, cross_attentions, cache


# The tokens of a batch that inference takes through the layers at a time (see row_groups); 0: the whole batch.
ROW_TOKENS = 2048


def row_groups(B: int, L: int) -> int:
    """Into how many groups of rows inference runs a batch of B rows of L tokens, one group after another through
    all the layers (a `lax.map` in `bert`; 1: at once): as many as leave each group at least ROW_TOKENS tokens,
    dividing B. XLA:CPU runs a big batch's attention and matmuls out of cache (and, over 512 keys, in ever
    smaller blocks of queries: attention.query_block), so per token a large batch ran slower than a small one.
    AMD EPYC Zen 4, bfloat16, tokens/s, whole -> in groups: MiniLM 32 x 512 8,500 -> 11,400, 32 x 256 12,300 ->
    13,300, 32 x 128 13,500 -> 14,400 (groups of 4,096 tokens: 10,600 / 12,000 / 13,400); bert-base 32 x 512
    1,600 -> 1,730-1,820; float32 and int8 alike (MiniLM 32 x 512 float32 5,800 -> 6,600)."""
    n = B * L // ROW_TOKENS if ROW_TOKENS else 1
    while n > 1 and B % n:
        n -= 1
    return max(n, 1)


def bert(
    params,
    config: BertConfig,
    input_ids: Int[Array, "B L"] | None = None,
    attention_mask: Int[Array, "B L"] | None = None,
    token_type_ids: Int[Array, "B L"] | None = None,
    position_ids: Int[Array, "B L"] | None = None,
    head_mask=None,
    inputs_embeds: Float[Array, "B L D"] | None = None,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    *,
    encoder_hidden_states: Float[Array, "B S D"] | None = None,
    encoder_attention_mask: Int[Array, "B S"] | None = None,
    past_key_values: KVCache | None = None,
    use_cache: bool = False,
    segment_ids: Int[Array, "B L"] | None = None,
    rng=None,
    remat: bool = False,
    attention_dtype: str | None = None,
) -> BertOutput:
    """The base model (transformers' BertModel) on a batch: the per-sequence function under `jax.vmap`.

    Decoders (config.is_decoder) attend causally; `encoder_hidden_states` feed cross-attention. With
    `past_key_values` (a cache.KVCache, e.g. from `cache.init_cache`) or `use_cache`, the new tokens attend over
    the cache and the updated cache is returned as `past_key_values`; `use_cache` without one makes a cache of
    exactly L slots. With a cache, `attention_mask` may cover the new tokens or, as in transformers, past and new
    tokens (its last L columns are used); positions default to the cache's length onward.

    `segment_ids` (1, 2, ... per packed sequence, 0 for padding; see packing.py) keep each sequence's attention
    within itself; pass its positions, restarting at 0, as `position_ids`. `pooler_output` is then the first
    sequence's: pool per segment with pooling.pool_segments. `attention_dtype` runs attention's products in that
    dtype instead of the layers' own (an int8 model's bfloat16: quantize.attention_dtype)."""
    _check_call(
        params, config, input_ids, inputs_embeds, segment_ids, past_key_values, use_cache, encoder_hidden_states
    )
    params = jax.tree_util.tree_map(jnp.asarray, params)  # host numpy trees (fresh from a checkpoint) too
    B, L = _batch_shape(input_ids, inputs_embeds, config)
    input_ids = None if input_ids is None else jnp.asarray(input_ids)
    # Positions 0 … L-1 by default: without a cache (past_key_values or use_cache) and position_ids.
    default_positions = past_key_values is None and not use_cache and position_ids is None
    _check_length(config, L, default_positions)
    cache = past_key_values
    if cache is None and use_cache:
        cache = init_cache(config, B, L, compute_dtype(params["embeddings"]))
    mask, types, positions, encoder_mask = _per_row(
        B, L, cache, attention_mask, token_type_ids, position_ids, encoder_hidden_states, encoder_attention_mask
    )
    at = None if cache is None else cache.index[0]  # the same for every row (cache.KVCache)
    rngs = None if rng is None else jax.random.split(rng, B)
    groups = 1 if rng is not None or cache is not None else row_groups(B, L)
    one = functools.partial(
        _bert_one,
        params,
        config,
        remat=remat,
        with_probs=output_attentions,
        head_mask=normalize_head_mask(config, head_mask),
        rows=B // groups,
        attention_dtype=attention_dtype,
    )

    def row(ids, m, t, pos, emb, r, c, es, em, seg):
        return one(ids, m, t, pos, emb, rng=r, cache=c, encoder_states=es, encoder_mask=em, at=at, segment_ids=seg)

    rows = jax.vmap(row, in_axes=(0, 0, 0, 0, 0, None if rngs is None else 0, 0, 0, 0, 0))
    batched = (
        *(input_ids, mask, types, positions, inputs_embeds),
        *(rngs, cache, encoder_hidden_states, encoder_mask, segment_ids),
    )
    if groups == 1:
        out = rows(*batched)
    else:  # one group of rows after another (see row_groups)
        cut = jax.tree_util.tree_map(lambda a: a.reshape(groups, B // groups, *a.shape[1:]), batched)
        out = jax.tree_util.tree_map(lambda a: a.reshape(B, *a.shape[2:]), jax.lax.map(lambda a: rows(*a), cut))
    x, pooled, hidden, attentions, cross_attentions, cache = out
    if cache is not None:  # a write past the capacity was clamped by XLA: make it loud, not silently wrong
        x = jnp.where((cache.index > cache.capacity)[:, None, None], jnp.nan, x)
    return BertOutput(
        last_hidden_state=x,
        pooler_output=pooled,
        hidden_states=hidden if output_hidden_states else None,
        attentions=attentions if output_attentions else None,
        cross_attentions=cross_attentions if output_attentions and cross_attentions else None,
        past_key_values=cache,
    )
