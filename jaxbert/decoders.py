"""The device programs behind `generate`: a model's step over its key/value cache, handed to generate.decode.

A step runs the model on the new tokens of every row and returns their logits and the updated cache; the search
loops in generate.py know nothing else about the model. Parameters come in the stored layout (one subtree per
layer): a scan's per-layer weight slices are copies, which would double each step's weight traffic (bert-base,
batch 1: 57 instead of 30 ms a token).
"""

from __future__ import annotations

from jaxbert.cache import init_cache
from jaxbert.config import BertConfig
from jaxbert.generate import decode
from jaxbert.heads import forward
from jaxbert.ops import compute_dtype


def causal_lm(params, config: BertConfig, ids, mask, positions, length, max_new, live, warp, rng, *, search,
              bound: int):
    """Prefill and the whole decoding loop of a BertLMHeadModel as one program over a cache of the prompt's
    bucket plus `bound` slots, within the positions (the decoder rewinds over the prompt's padding)."""
    capacity = min(ids.shape[1] + bound, config.max_position_embeddings)
    cache = init_cache(config, ids.shape[0], capacity, compute_dtype(params["bert"]["embeddings"]))

    def step(cache, ids, mask, positions):
        out = forward(params, config, "BertLMHeadModel", ids, mask, None, positions, past_key_values=cache)
        return out.logits, out.past_key_values

    return decode(step, cache, ids, mask, positions, length, max_new, live, search=search, bound=bound, warp=warp,
                  rng=rng)
