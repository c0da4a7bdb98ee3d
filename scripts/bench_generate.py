"""The generation measurements behind scripts/benchmark.py's `generate` section (see bench_peers.py for how the
children run): greedy decoding of a bert-base-size BertLMHeadModel, jaxbert against transformers' PyTorch
`generate`, and two limits of this machine: its memory bandwidth, which bounds decoding at small batches (every
step reads all the weights), and XLA's own floor, a step of nothing but the weights' matmuls."""

from __future__ import annotations

import json
import os
import time

from bench_peers import _ids, _median_seconds, rss_mb
from bench_train import make_checkpoint

PROMPT, NEW, CALLS = 32, 64, 3


def make_bert_causal(directory: str) -> int:
    """A random bert-base-size BertLMHeadModel (is_decoder, no eos: every call runs all NEW steps)."""
    return make_checkpoint(directory, "BertLMHeadModel", is_decoder=True)


def _rates(batch: int, seconds: float, first: float) -> dict:
    return {
        "tokens_per_s": batch * NEW / seconds,
        "ms_per_step": seconds / NEW * 1e3,
        "seconds": seconds,
        "first_call_s": first,
        "rss_after_mb": rss_mb(),
    }


def generate_jax(model_dir: str, dtype: str, batch: str) -> dict:
    """`Bert.generate`, greedy: the first call compiles (first_call_s), the median of the next CALLS is timed."""
    import jaxbert

    lm = jaxbert.load(model_dir, dtype=None if dtype == "float32" else dtype)
    ids = _ids(model_dir, int(batch), PROMPT)
    start = time.perf_counter()
    out = lm.generate(ids, max_new_tokens=NEW)
    first = time.perf_counter() - start
    assert out.shape == (int(batch), PROMPT + NEW), out.shape
    return _rates(int(batch), _median_seconds(lambda: lm.generate(ids, max_new_tokens=NEW), CALLS), first)


def generate_torch(model_dir: str, batch: str) -> dict:
    """transformers' `generate`, greedy, eager (its default sdpa attention), torch.inference_mode, with its cache."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.BertLMHeadModel.from_pretrained(model_dir).eval()
    ids = torch.from_numpy(_ids(model_dir, int(batch), PROMPT)).long()
    mask = torch.ones_like(ids)

    def run():
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, use_cache=True)

    with torch.inference_mode():
        start = time.perf_counter()
        out = run()
        first = time.perf_counter() - start
        assert tuple(out.shape) == (int(batch), PROMPT + NEW), out.shape
        seconds = _median_seconds(run, CALLS)
    return _rates(int(batch), seconds, first)


def bandwidth(model_dir: str, dtype: str, batch: str) -> dict:
    """The decoding limit of this machine at `batch`: memory bandwidth (an XLA sum over an array as large as the
    weights) over the bytes of weights a step reads (all but the position and token type tables, which are
    gathered), times the batch."""
    import jax
    import jax.numpy as jnp

    c = json.load(open(os.path.join(model_dir, "config.json")))
    d, f, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    params = n * (4 * d * d + 2 * d * f) + d * d + v * d  # layers, LM transform, tied vocabulary projection
    size = jnp.dtype(dtype).itemsize
    a = jnp.ones((params,), dtype)
    total = jax.jit(lambda a: a.astype(jnp.float32).sum())
    total(a).block_until_ready()
    seconds = _median_seconds(lambda: total(a).block_until_ready(), 7)
    return {
        "tokens_per_s": int(batch) / seconds,
        "ms_per_step": seconds * 1e3,
        "gb_per_s": params * size / seconds / 1e9,
        "weights_mb": params * size / 1e6,
    }


def matmul_floor(model_dir: str, dtype: str, batch: str) -> dict:
    """What XLA:CPU's matmuls allow: decoding steps (a `fori_loop`, as generate's while loop) of only the
    weights' products for `batch` rows, per layer qkv, output, intermediate and output, then the LM transform
    and the tied vocabulary projection, on separate per-layer arrays laid out as generate's (float32 [out, in],
    16-bit [in, out]; see inference._decoding_params). Attention, norms and the cache are left out."""
    import jax
    import jax.numpy as jnp

    c = json.load(open(os.path.join(model_dir, "config.json")))
    d, f, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    dt, rows, steps = jnp.dtype(dtype), int(batch), 16
    wide = dt == jnp.float32
    keys = iter(jax.random.split(jax.random.key(0), 4 * n + 2))

    def weight(i, o):  # one matmul's operand in generate's layout, and how to apply it
        w = (jax.random.normal(next(keys), (o, i) if wide else (i, o)) * 0.02).astype(dt)
        return w, (((1,), (1,)) if wide else ((1,), (0,)), ((), ()))

    shapes = [(d, 3 * d), (d, d), (d, f), (f, d)] * n + [(d, d), (d, v)]
    weights, dims = zip(*(weight(i, o) for i, o in shapes))

    def steps_of(weights, x):  # weights as arguments: closed over, they would be constants XLA may pre-pack
        return jax.lax.fori_loop(0, steps, lambda _, x: step(weights, x), x)

    def step(weights, x):
        h = x
        for w, dn in zip(weights, dims):
            h = jax.lax.dot_general(h.astype(dt), w, dn, preferred_element_type=jnp.float32)
            if h.shape[1] == 3 * d:  # q, k, v summed: slicing a product would let XLA compute only that slice
                h = h.reshape(rows, 3, d).sum(1)
        return x + h.max(-1, keepdims=True) * 1e-3

    run = jax.jit(steps_of)
    x = jnp.ones((rows, d), jnp.float32)
    run(weights, x).block_until_ready()
    seconds = _median_seconds(lambda: run(weights, x).block_until_ready(), CALLS) / steps
    return {"tokens_per_s": rows / seconds, "ms_per_step": seconds * 1e3}
