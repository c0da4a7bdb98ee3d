"""Sentence embeddings from a base model's output: the pooling modes `embed` offers, as sentence-transformers
computes them (several modes concatenate in the order given), per row or per segment of packed rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxbert import sentence_dense
from jaxbert.model import BertOutput
from jaxbert.ops import dense

POOLINGS = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "pooler")


def _one(out: BertOutput, mask, pooling: str):
    x = out.last_hidden_state.astype(jnp.float32)
    m = mask[..., None].astype(jnp.float32)
    if pooling == "cls":
        return x[:, 0]
    if pooling == "max":
        return jnp.where(m > 0, x, -jnp.inf).max(axis=1)
    if pooling in ("mean", "mean_sqrt_len_tokens"):
        count = jnp.maximum(m.sum(1), 1e-9)
        return (x * m).sum(1) / (count if pooling == "mean" else jnp.sqrt(count))
    if pooling == "weightedmean":  # token i of the text weighs i + 1 (rows padded on the right)
        w = m * jnp.arange(1, x.shape[1] + 1, dtype=jnp.float32)[:, None]
        return (x * w).sum(1) / jnp.maximum(w.sum(1), 1e-9)
    if pooling == "lasttoken":  # the last token attended to ([SEP]); sentence-transformers' zeros without one
        last = jnp.maximum(mask.sum(1) - 1, 0)
        return jnp.take_along_axis(x * m, last[:, None, None], axis=1)[:, 0]
    return out.pooler_output.astype(jnp.float32)


def _normalized(emb, normalize: bool):
    return emb / jnp.maximum(jnp.linalg.norm(emb, axis=-1, keepdims=True), 1e-12) if normalize else emb


def projected(emb: Float[Array, "... E"], dense: tuple, steps: tuple, normalize: bool) -> Float[Array, "... O"]:
    """The pooled embedding through a sentence-transformers directory's Dense (and Dropout) modules, then
    normalized when asked: the rest of its pipeline (no `steps`: the normalization alone)."""
    return _normalized(sentence_dense.apply(dense, steps, emb) if steps else emb, normalize)


def pool(out: BertOutput, mask, pooling: str | tuple[str, ...], normalize: bool):
    """[B, D × modes]: [CLS] state, masked mean / max / sum over √length / mean weighted by place / last token, or
    the pooler; optionally unit length.
    Statistics in float32 whatever the compute dtype."""
    modes = (pooling,) if isinstance(pooling, str) else pooling
    return _normalized(jnp.concatenate([_one(out, mask, mode) for mode in modes], axis=-1), normalize)


def pool_segments(
    hidden: Float[Array, "R L D"],
    segment_ids: Int[Array, "R L"],
    starts: Int[Array, "R S"],
    pooling: str | tuple[str, ...],
    normalize: bool,
    pooler_params=None,
) -> Float[Array, "R S E"]:
    """`pool` for packed rows (packing.py): one vector per segment (segment s of row r is segment_ids == s + 1,
    starting at column starts[r, s]); the pooler, when asked for, applied to each segment's first token.
    Sums and maxima run per segment over the flattened tokens (segment_sum / segment_max), never over an
    [R, L, S, D] broadcast."""
    R, L, D = hidden.shape
    S = starts.shape[1]
    x = hidden.astype(jnp.float32).reshape(R * L, D)
    # Token -> its segment's global number r * S + s; padding goes to an extra bucket R * S, dropped after.
    ids = jnp.where(segment_ids > 0, jnp.arange(R)[:, None] * S + segment_ids - 1, R * S).reshape(-1)
    count = jax.ops.segment_sum(jnp.ones((R * L,), jnp.float32), ids, R * S + 1)[:-1, None]
    first = jnp.take_along_axis(hidden, starts[..., None], axis=1).astype(jnp.float32)  # [R, S, D]

    def one(mode: str):
        if mode == "cls":
            return first.reshape(R * S, D)
        if mode == "pooler":
            return jnp.tanh(dense(pooler_params["dense"], first)).reshape(R * S, D)
        if mode == "max":
            return jax.ops.segment_max(x, ids, R * S + 1)[:-1]
        if mode == "lasttoken":  # the segment's last token, at its start + its length - 1
            last = jnp.clip(starts + count.reshape(R, S).astype(starts.dtype) - 1, 0, L - 1)
            return jnp.take_along_axis(hidden, last[..., None], axis=1).astype(jnp.float32).reshape(R * S, D)
        if mode == "weightedmean":  # a token weighs its place in its text, from 1
            at = jnp.take_along_axis(starts, jnp.maximum(segment_ids - 1, 0), axis=1)  # [R, L] its segment's start
            w = (jnp.arange(L)[None, :] - at + 1).astype(jnp.float32).reshape(-1, 1)
            total = jax.ops.segment_sum(x * w, ids, R * S + 1)[:-1]
            return total / jnp.maximum(jax.ops.segment_sum(w, ids, R * S + 1)[:-1], 1e-9)
        total = jax.ops.segment_sum(x, ids, R * S + 1)[:-1]
        return total / (jnp.maximum(count, 1e-9) if mode == "mean" else jnp.sqrt(jnp.maximum(count, 1e-9)))

    modes = (pooling,) if isinstance(pooling, str) else pooling
    emb = jnp.concatenate([one(mode) for mode in modes], axis=-1)
    return _normalized(emb, normalize).reshape(R, S, -1)
