"""Sentence embeddings from a base model's output: the pooling modes `embed` offers."""

from __future__ import annotations

import jax.numpy as jnp

from jaxbert.model import BertOutput

POOLINGS = ("cls", "mean", "pooler")


def pool(out: BertOutput, mask, pooling: str, normalize: bool):
    """Sentence embeddings from a base-model output: [CLS] state, masked mean (as sentence-transformers), or the
    pooler; optionally unit length. Statistics in float32 whatever the compute dtype."""
    if pooling == "cls":
        emb = out.last_hidden_state[:, 0].astype(jnp.float32)
    elif pooling == "mean":
        m = mask[..., None].astype(jnp.float32)
        emb = (out.last_hidden_state.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
    else:
        emb = out.pooler_output.astype(jnp.float32)
    if normalize:
        emb = emb / jnp.maximum(jnp.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
    return emb
