"""The device programs behind `generate`: a model's step over its key/value cache, handed to generate.decode.

A step runs the model on the new tokens of every row and returns their logits and the updated cache; the search
loops in generate.py know nothing else about the model. Parameters come in the stored layout (one subtree per
layer): a scan's per-layer weight slices are copies, which would double each step's weight traffic (bert-base,
batch 1: 57 instead of 30 ms a token).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from jaxbert.cache import init_cache
from jaxbert.config import BertConfig
from jaxbert.generate import decode
from jaxbert.heads import forward, mlm_logits
from jaxbert.model import bert
from jaxbert.ops import compute_dtype
from jaxbert.seq2seq import encode


def causal_lm(
    params,
    config: BertConfig,
    ids,
    mask,
    positions,
    length,
    max_new,
    live,
    warp,
    rng,
    *,
    search,
    bound: int,
    attention_dtype: str | None = None,
):
    """Prefill and the whole decoding loop of a BertLMHeadModel as one program over a cache of the prompt's
    bucket plus `bound` slots, within the positions (the decoder rewinds over the prompt's padding).
    `attention_dtype`: see model.bert."""
    capacity = min(ids.shape[1] + bound, config.max_position_embeddings)
    # On CPU the cache is float32 whatever the weights: XLA:CPU has no 16-bit batched matmul, so attention over a
    # bfloat16 cache converted every layer's cache to float32 on every step (bert-base, batch 8: 9 ms of 42).
    # It holds the same (16-bit) values.
    dtype = compute_dtype(params["bert"]["embeddings"])
    cache = init_cache(config, ids.shape[0], capacity, jnp.float32 if jax.default_backend() == "cpu" else dtype)
    embeddings = params["bert"]["embeddings"]["word_embeddings"]["embedding"]

    def step(cache, ids, mask, positions):
        out = bert(
            params["bert"], config, ids, mask, None, positions, past_key_values=cache, attention_dtype=attention_dtype
        )
        x = out.last_hidden_state
        if ids.shape[1] > 1:
            # The prefill: decode reads the logits after the prompt's last real column only, so only that column
            # is projected onto the vocabulary and stands for all (the projection of every column is the
            # largest matmul of the prefill).
            x = jax.lax.dynamic_slice_in_dim(x, length - 1, 1, axis=1)
        logits = mlm_logits(params["cls"], config, embeddings, x)
        return jnp.broadcast_to(logits, ids.shape + logits.shape[-1:]), out.past_key_values

    return decode(
        step, cache, ids, mask, positions, length, max_new, live, search=search, bound=bound, warp=warp, rng=rng
    )


def seq2seq(
    params,
    config,
    input_ids: Int[Array, "R S"],
    attention_mask: Int[Array, "R S"],
    start: Int[Array, "R 1"],
    max_new: Int[Array, ""],
    live: Bool[Array, " R"],
    warp,
    rng,
    *,
    search,
    bound: int,
):
    """A bert2bert's generation as one program (config an EncoderDecoderConfig): the encoder once, then the
    decoder's prefill of the start tokens `start` [R, 1] with the encoder's states, which puts their cross-attention
    keys in the cache, then the decoding loop over it. `params["decoder"]` in the stored layout (see above)."""
    _, states = encode(params, config, input_ids, attention_mask)
    decoder = config.decoder
    capacity = min(1 + bound, decoder.max_position_embeddings)
    cache = init_cache(decoder, start.shape[0], capacity, compute_dtype(params["decoder"]["bert"]["embeddings"]))

    def step(cache, ids, mask, positions):
        # Only the prefill computes cross keys; later the cache holds them, per beam after beam search's reorder
        # (its rows then no longer match the encoder's).
        fresh = not cache.has_cross
        out = forward(
            params["decoder"],
            decoder,
            "BertLMHeadModel",
            ids,
            mask,
            None,
            positions,
            past_key_values=cache,
            encoder_hidden_states=states if fresh else None,
            encoder_attention_mask=attention_mask if fresh else None,
        )
        return out.logits, out.past_key_values

    ones = jnp.ones_like(start)
    return decode(
        step,
        cache,
        start,
        ones,
        jnp.zeros_like(start),
        jnp.int32(1),
        max_new,
        live,
        search=search,
        bound=bound,
        warp=warp,
        rng=rng,
    )
