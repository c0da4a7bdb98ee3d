"""BERT's blocks as pure per-sequence functions, and `bert(...)`, which batches them with `jax.vmap`.

Every function takes its params subtree first, then activations of one sequence. Dropout is on exactly when an
`rng` is given. Shapes: L query positions, M key positions, D hidden, H heads, K head size, F intermediate.
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from jaxbert.config import BertConfig
from jaxbert.layout import can_stack, is_stacked, stack_layers
from jaxbert.ops import activation, as_bits, compute_dtype, dense, dropout, from_bits, layer_norm, take_rows


@flax.struct.dataclass
class BertOutput:
    """Model outputs under transformers' field names; fields a head does not produce stay None."""

    last_hidden_state: Array | None = None
    pooler_output: Array | None = None
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None
    logits: Array | None = None
    prediction_logits: Array | None = None
    seq_relationship_logits: Array | None = None
    start_logits: Array | None = None
    end_logits: Array | None = None
    loss: Array | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}

    def __getitem__(self, key: str):
        return getattr(self, key)


def _split(rng, n):
    return (None,) * n if rng is None else tuple(jax.random.split(rng, n))


def embeddings(p, config: BertConfig, input_ids: Int[Array, "L"] | None, token_type_ids: Int[Array, "L"],
               position_ids: Int[Array, "L"], inputs_embeds: Float[Array, "L D"] | None = None, *,
               rng=None) -> Float[Array, "L D"]:
    # The residual stream is float32 whatever the weights' dtype: only matmul inputs are cast down (ops.dense).
    x = take_rows(p["word_embeddings"]["embedding"], input_ids) if inputs_embeds is None else inputs_embeds
    x = x.astype(jnp.float32) + take_rows(p["token_type_embeddings"]["embedding"], token_type_ids).astype(jnp.float32)
    # Relative-position models still store absolute position embeddings but never add them (as transformers).
    if config.position_embedding_type == "absolute":
        x = x + take_rows(p["position_embeddings"]["embedding"], position_ids).astype(jnp.float32)
    x = layer_norm(p["LayerNorm"], x, config.layer_norm_eps)
    return dropout(x, config.hidden_dropout_prob, rng)


def _relative_scores(p, config: BertConfig, q: Float[Array, "L H K"], k: Float[Array, "M H K"]):
    L, M = q.shape[0], k.shape[0]
    distance = jnp.arange(L)[:, None] - jnp.arange(M)[None, :]
    pos = take_rows(p["distance_embedding"]["embedding"], distance + config.max_position_embeddings - 1).astype(q.dtype)
    scores = jnp.einsum("lhk,lmk->hlm", q, pos, preferred_element_type=jnp.float32)
    if config.position_embedding_type == "relative_key_query":
        scores = scores + jnp.einsum("mhk,lmk->hlm", k, pos, preferred_element_type=jnp.float32)
    return scores


# Backends on which `jax.nn.dot_product_attention` is used when no probabilities are needed: on GPU it picks
# cuDNN's fused kernel. On CPU it lowers to the same XLA ops as the explicit path below in a slower layout
# (scripts/benchmark.py, bert-base 8 x 128: about 10% fewer tokens/s), so CPU keeps the explicit path.
FUSED_ATTENTION_BACKENDS = ("gpu", "cuda", "rocm", "tpu")


def _fused_attention(config: BertConfig, with_probs: bool, head_mask, rng) -> bool:
    return (jax.default_backend() in FUSED_ATTENTION_BACKENDS and not with_probs and head_mask is None
            and config.position_embedding_type == "absolute"
            and (rng is None or config.attention_probs_dropout_prob == 0.0))


def _project_qkv(p, x: Float[Array, "L D"], K: int):
    """q, k, v as [L, H, K] each: one [D, 3D] matmul in the fused (stacked) layout, three otherwise."""
    if "qkv" in p:
        qkv = dense(p["qkv"], x).reshape(x.shape[0], 3, -1, K)
        return qkv[:, 0], qkv[:, 1], qkv[:, 2]
    return tuple(dense(p[name], x).reshape(x.shape[0], -1, K) for name in ("query", "key", "value"))


def _probs_attention(config: BertConfig, q, k, v, scores, head_mask, rng):
    """Softmax probabilities [H, L, M] (dropout, head mask) and the context [L, H, K]: the path that returns
    probabilities and trains."""
    probs = jax.nn.softmax(scores, axis=-1)
    probs = dropout(probs, config.attention_probs_dropout_prob, rng)
    if head_mask is not None:
        probs = probs * head_mask[:, None, None].astype(probs.dtype)
    return jnp.einsum("hlm,mhk->lhk", probs.astype(v.dtype), v, preferred_element_type=jnp.float32), probs


def _normalized_late(q, k, v, mask, scale: float, relative):
    """Inference without probabilities: heads first, so both products are plain batched matmuls over H (as
    [L, H, K] they need strided access, which made attention a third of MiniLM's time), and the softmax
    normalized after the value product (the division runs over [H, L, K] instead of [H, L, M] and a pass over
    the scores goes). MiniLM 32 x 128: +78% tokens/s in scripts/benchmark.py."""
    q, k, v = (t.transpose(1, 0, 2) for t in (q, k, v))
    scores = jnp.einsum("hlk,hmk->hlm", q * jnp.asarray(scale, q.dtype), k, preferred_element_type=jnp.float32)
    if relative is not None:
        scores = scores + relative * scale
    scores = jnp.where(mask[None, None, :], scores, jnp.finfo(jnp.float32).min)
    weights = jnp.exp(scores - scores.max(-1, keepdims=True))
    context = jnp.einsum("hlm,hmk->hlk", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return (context / weights.sum(-1, keepdims=True)).transpose(1, 0, 2)


def self_attention(p, config: BertConfig, x: Float[Array, "L D"], mask: Bool[Array, "M"],
                   head_mask: Float[Array, "H"] | None = None, *, rng=None, with_probs: bool = True):
    """Scaled dot-product attention over the unpruned heads; returns (context [L, H*K], probs [H, L, M] or
    None when not `with_probs`). Matmul inputs in the weights' dtype, scores and softmax in float32."""
    K, cd = config.head_size, compute_dtype(p)
    q, k, v = (t.astype(cd) for t in _project_qkv(p, x, K))
    if _fused_attention(config, with_probs, head_mask, rng):
        context = jax.nn.dot_product_attention(q, k, v, mask=mask[None, None, :])
        return context.reshape(x.shape[0], -1).astype(jnp.float32), None
    scale = 1.0 / math.sqrt(K)
    relative = _relative_scores(p, config, q, k) if config.position_embedding_type != "absolute" else None
    dropping = rng is not None and config.attention_probs_dropout_prob > 0.0
    if not (with_probs or head_mask is not None or dropping):
        return _normalized_late(q, k, v, mask, scale, relative).reshape(x.shape[0], -1), None
    scores = jnp.einsum("lhk,mhk->hlm", q, k, preferred_element_type=jnp.float32)
    scores = (scores if relative is None else scores + relative) * scale
    scores = jnp.where(mask[None, None, :], scores, jnp.finfo(jnp.float32).min)
    context, probs = _probs_attention(config, q, k, v, scores, head_mask, rng)
    return context.reshape(x.shape[0], -1), probs if with_probs else None


def _residual_norm(p, config: BertConfig, h: Array, residual: Array, rng) -> Float[Array, "L D"]:
    h = dropout(dense(p["dense"], h), config.hidden_dropout_prob, rng)
    return layer_norm(p["LayerNorm"], h + residual, config.layer_norm_eps)


def layer(p, config: BertConfig, x: Float[Array, "L D"], mask: Bool[Array, "M"],
          head_mask: Float[Array, "H"] | None = None, *, rng=None, with_probs: bool = True):
    """One encoder layer: attention, add & norm, GELU feed-forward, add & norm. Returns (x, attention probs)."""
    r_attn, r_out, r_ffn = _split(rng, 3)
    context, probs = self_attention(p["attention"]["self"], config, x, mask, head_mask, rng=r_attn,
                                    with_probs=with_probs)
    x = _residual_norm(p["attention"]["output"], config, context, x, r_out)
    h = activation(config.hidden_act)(dense(p["intermediate"]["dense"], x))
    return _residual_norm(p["output"], config, h, x, r_ffn), probs


def layer_head_mask(config: BertConfig, head_mask: Float[Array, "N H"] | None, i: int):
    """Layer i's head-mask entries for its remaining heads (head_mask indexes the original heads)."""
    if head_mask is None:
        return None
    return head_mask[i][jnp.asarray(config.kept_heads(i), dtype=jnp.int32)]


def _scan(stacked, config: BertConfig, x, mask, head_mask, rng, remat: bool, with_probs: bool):
    """The layers as one `lax.scan` over stacked parameters: one compiled body whatever the depth.

    Remat goes through the scan too: under a Python loop XLA is free to hoist every layer's recomputation to
    the start of the backward pass, which keeps all activations alive and saves nothing; a scan runs the
    backward one layer at a time, so only the layer inputs are stored."""
    def body(h, xs):
        params, i, hm = xs
        r = None if rng is None else jax.random.fold_in(rng, i)
        h, probs = layer(params, config, h, mask, hm, rng=r, with_probs=with_probs)
        return h, (h, probs)

    dtypes = jax.tree_util.tree_map(lambda a: a.dtype, stacked)  # 16-bit weights enter as bits: see ops.as_bits

    def scanned(h, xs):
        bits, i, hm = xs
        return body(h, (jax.tree_util.tree_map(from_bits, bits, dtypes), i, hm))

    body = jax.checkpoint(body, prevent_cse=False) if remat else body
    n = config.num_hidden_layers
    last, (hidden, probs) = jax.lax.scan(scanned, x, (jax.tree_util.tree_map(as_bits, stacked), jnp.arange(n),
                                                       head_mask))
    return last, (x, *hidden), tuple(probs) if with_probs else ()


def encoder(p, config: BertConfig, x: Float[Array, "L D"], mask: Bool[Array, "M"],
            head_mask: Float[Array, "N H"] | None = None, *, rng=None, remat: bool = False,
            with_probs: bool = True):
    """All layers; returns (last hidden, hidden states: embeddings + each layer, attentions per layer).

    The stacked layout (layout.py) runs as a scan. The stored per-layer tree runs as a Python loop (no copy of
    the weights per call), or, with `remat`, as a scan over layers stacked in the trace; pruned layers, whose
    shapes differ, always loop. With `remat`, each layer's activations are recomputed in the backward pass."""
    if is_stacked(p):
        return _scan(p["stacked"], config, x, mask, head_mask, rng, remat, with_probs)
    if remat and can_stack(config):
        stacked = stack_layers(p, config, fuse_qkv=False)["stacked"]  # a copy per call: the backward needs it
        return _scan(stacked, config, x, mask, head_mask, rng, remat, with_probs)

    def step(p_, x_, m_, hm_, r_):
        return layer(p_, config, x_, m_, hm_, rng=r_, with_probs=with_probs)

    if remat:
        step = jax.checkpoint(step)
    hidden, attentions = [x], []
    for i in range(config.num_hidden_layers):
        r = None if rng is None else jax.random.fold_in(rng, i)
        x, probs = step(p["layer"][str(i)], x, mask, layer_head_mask(config, head_mask, i), r)
        hidden.append(x)
        attentions.append(probs)
    return x, tuple(hidden), tuple(attentions) if with_probs else ()


def pooler(p, x: Float[Array, "L D"]) -> Float[Array, "D"]:
    return jnp.tanh(dense(p["dense"], x[0]))


def _bert_one(params, config: BertConfig, input_ids, mask, token_type_ids, position_ids, inputs_embeds,
              head_mask, rng, remat: bool, with_probs: bool = True):
    r_emb, r_enc = _split(rng, 2)
    x = embeddings(params["embeddings"], config, input_ids, token_type_ids, position_ids, inputs_embeds,
                   rng=r_emb)
    x, hidden, attentions = encoder(params["encoder"], config, x, mask, head_mask, rng=r_enc, remat=remat,
                                    with_probs=with_probs)
    pooled = pooler(params["pooler"], x) if "pooler" in params else None
    return x, pooled, hidden, attentions


def normalize_head_mask(config: BertConfig, head_mask) -> Float[Array, "N H"] | None:
    """transformers accepts [H] (same for every layer) or [N, H]."""
    if head_mask is None:
        return None
    head_mask = jnp.asarray(head_mask, dtype=jnp.float32)
    shape = (config.num_hidden_layers, config.num_attention_heads)
    if head_mask.ndim == 1:
        head_mask = jnp.broadcast_to(head_mask, shape)
    if head_mask.shape != shape:
        raise ValueError(f"head_mask shape {head_mask.shape}: expected ({shape[1]},) or {shape}")
    return head_mask


def bert(params, config: BertConfig, input_ids: Int[Array, "B L"] | None = None,
         attention_mask: Int[Array, "B L"] | None = None, token_type_ids: Int[Array, "B L"] | None = None,
         position_ids: Int[Array, "B L"] | None = None, head_mask=None,
         inputs_embeds: Float[Array, "B L D"] | None = None, output_hidden_states: bool = False,
         output_attentions: bool = False, *, rng=None, remat: bool = False) -> BertOutput:
    """The base model (transformers' BertModel) on a batch: the per-sequence function under `jax.vmap`."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    params = jax.tree_util.tree_map(jnp.asarray, params)  # host numpy trees (fresh from a checkpoint) too
    B, L = input_ids.shape if inputs_embeds is None else inputs_embeds.shape[:2]
    mask = jnp.ones((B, L), bool) if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
    types = jnp.zeros((B, L), jnp.int32) if token_type_ids is None else token_type_ids
    positions = jnp.broadcast_to(jnp.arange(L), (B, L)) if position_ids is None else position_ids
    rngs = None if rng is None else jax.random.split(rng, B)
    one = functools.partial(_bert_one, params, config, remat=remat, with_probs=output_attentions,
                            head_mask=normalize_head_mask(config, head_mask))
    x, pooled, hidden, attentions = jax.vmap(
        lambda ids, m, t, pos, emb, r: one(ids, m, t, pos, emb, rng=r),
        in_axes=(0, 0, 0, 0, 0, None if rngs is None else 0),
    )(input_ids, mask, types, positions, inputs_embeds, rngs)
    return BertOutput(last_hidden_state=x, pooler_output=pooled,
                      hidden_states=hidden if output_hidden_states else None,
                      attentions=attentions if output_attentions else None)
