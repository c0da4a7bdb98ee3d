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
    if pooling == "cls":  # the first token pooled: [CLS], or a prompt's first token after it (keep)
        return jnp.take_along_axis(x, jnp.argmax(mask, axis=1)[:, None, None], axis=1)[:, 0]
    if pooling == "max":
        return jnp.where(m > 0, x, -jnp.inf).max(axis=1)
    if pooling in ("mean", "mean_sqrt_len_tokens"):
        count = jnp.maximum(m.sum(1), 1e-9)
        return (x * m).sum(1) / (count if pooling == "mean" else jnp.sqrt(count))
    if pooling == "weightedmean":  # token i of the text weighs i + 1 (rows padded on the right), a prompt's too
        w = m * jnp.arange(1, x.shape[1] + 1, dtype=jnp.float32)[:, None]
        return (x * w).sum(1) / jnp.maximum(w.sum(1), 1e-9)
    if pooling == "lasttoken":  # the last token pooled ([SEP]); sentence-transformers' zeros without one
        last = x.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)
        return jnp.take_along_axis(x * m, last[:, None, None], axis=1)[:, 0]
    return out.pooler_output.astype(jnp.float32)


def keep(mask: Int[Array, "B L"], skip) -> Int[Array, "B L"]:
    """The tokens pooled: those of `mask` but each text's first `skip` (a scalar or [B]), the prompt's tokens
    ([CLS] included) that sentence-transformers' Pooling leaves out with include_prompt false (its
    _exclude_prompt_from_mask; rows padded on the right). Every mode then pools these, as there: cls takes the
    first of them, lasttoken the last, and one without any gives [CLS] (cls), -inf (max) or zeros."""
    skip = jnp.reshape(jnp.asarray(skip), (-1, 1))
    return jnp.where(jnp.arange(mask.shape[1])[None, :] >= skip, mask, 0)


def _normalized(emb, normalize: bool):
    return emb / jnp.maximum(jnp.linalg.norm(emb, axis=-1, keepdims=True), 1e-12) if normalize else emb


def projected(emb: Float[Array, "... E"], dense: tuple, steps: tuple, normalize: bool) -> Float[Array, "... O"]:
    """The pooled embedding through a sentence-transformers directory's Dense (and Dropout) modules, then
    normalized when asked: the rest of its pipeline (no `steps`: the normalization alone)."""
    return _normalized(sentence_dense.apply(dense, steps, emb) if steps else emb, normalize)


def pool(out: BertOutput, mask, pooling: str | tuple[str, ...], normalize: bool, skip=0):
    """[B, D × modes]: [CLS] state, masked mean / max / sum over √length / mean weighted by place / last token, or
    the pooler; optionally unit length. `skip`: each text's first tokens left out (keep; never the pooler's).
    Statistics in float32 whatever the compute dtype."""
    modes = (pooling,) if isinstance(pooling, str) else pooling
    mask = keep(mask, skip)
    return _normalized(jnp.concatenate([_one(out, mask, mode) for mode in modes], axis=-1), normalize)


def pool_segments(
    hidden: Float[Array, "R L D"],
    segment_ids: Int[Array, "R L"],
    starts: Int[Array, "R S"],
    pooling: str | tuple[str, ...],
    normalize: bool,
    pooler_params=None,
    skip=0,
) -> Float[Array, "R S E"]:
    """`pool` for packed rows (packing.py): one vector per segment (segment s of row r is segment_ids == s + 1,
    starting at column starts[r, s]); the pooler, when asked for, applied to each segment's first token.
    `skip`: each segment's first tokens left out, as `pool`'s (keep).
    Sums and maxima run per segment over the flattened tokens (segment_sum / segment_max), never over an
    [R, L, S, D] broadcast."""
    R, L, D = hidden.shape
    S = starts.shape[1]
    x = hidden.astype(jnp.float32).reshape(R * L, D)
    at = jnp.take_along_axis(starts, jnp.maximum(segment_ids - 1, 0), axis=1)  # [R, L] its segment's start
    place = jnp.arange(L)[None, :] - at  # a token's place in its text, from 0
    # Token -> its segment's global number r * S + s; padding and skipped tokens go to an extra bucket R * S,
    # dropped after.
    seg = jnp.arange(R)[:, None] * S + segment_ids - 1
    ids = jnp.where((segment_ids > 0) & (place >= skip), seg, R * S).reshape(-1)
    ones = jnp.ones((R * L,), jnp.float32)
    count = jax.ops.segment_sum(ones, ids, R * S + 1)[:-1, None]  # tokens pooled
    length = jax.ops.segment_sum(ones, jnp.where(segment_ids > 0, seg, R * S).reshape(-1), R * S + 1)[:-1]
    length = length.reshape(R, S).astype(starts.dtype)  # tokens of the text
    gathered = lambda cols: jnp.take_along_axis(hidden, cols[..., None], axis=1).astype(jnp.float32)  # noqa: E731

    def one(mode: str):
        if mode == "cls":  # the first token pooled; [CLS] when none is (sentence-transformers' argmax of zeros)
            return gathered(starts + jnp.where(length > skip, skip, 0)).reshape(R * S, D)
        if mode == "pooler":
            return jnp.tanh(dense(pooler_params["dense"], gathered(starts))).reshape(R * S, D)
        if mode == "max":
            return jax.ops.segment_max(x, ids, R * S + 1)[:-1]
        if mode == "lasttoken":  # the segment's last token, at its start + its length - 1; zeros if not pooled
            last = gathered(jnp.clip(starts + length - 1, 0, L - 1)).reshape(R * S, D)
            return jnp.where(count > 0, last, 0.0)
        if mode == "weightedmean":  # a token weighs its place in its text, from 1
            w = (place + 1).astype(jnp.float32).reshape(-1, 1)
            total = jax.ops.segment_sum(x * w, ids, R * S + 1)[:-1]
            return total / jnp.maximum(jax.ops.segment_sum(w, ids, R * S + 1)[:-1], 1e-9)
        total = jax.ops.segment_sum(x, ids, R * S + 1)[:-1]
        return total / (jnp.maximum(count, 1e-9) if mode == "mean" else jnp.sqrt(jnp.maximum(count, 1e-9)))

    modes = (pooling,) if isinstance(pooling, str) else pooling
    emb = jnp.concatenate([one(mode) for mode in modes], axis=-1)
    return _normalized(emb, normalize).reshape(R, S, -1)
