"""Sentence embeddings from a base model's output: the pooling modes `embed` offers, as sentence-transformers
computes them (several modes concatenate in the order given)."""

from __future__ import annotations

import jax.numpy as jnp

from jaxbert.model import BertOutput

POOLINGS = ("cls", "mean", "max", "mean_sqrt_len_tokens", "pooler")


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
    return out.pooler_output.astype(jnp.float32)


def pool(out: BertOutput, mask, pooling: str | tuple[str, ...], normalize: bool):
    """[B, D × modes]: [CLS] state, masked mean / max / sum over √length, or the pooler; optionally unit length.
    Statistics in float32 whatever the compute dtype."""
    modes = (pooling,) if isinstance(pooling, str) else pooling
    emb = jnp.concatenate([_one(out, mask, mode) for mode in modes], axis=-1)
    if normalize:
        emb = emb / jnp.maximum(jnp.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
    return emb
