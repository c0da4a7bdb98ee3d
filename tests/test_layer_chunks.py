"""The layer's row-wise tail (attention's output projection, FFN, both add & norms) in chunks of positions when a
call's intermediate activations would fall out of cache (model._tail): the same outputs, chunks only where sized."""

import jax
import numpy as np
import pytest
from conftest import SIZES, padded_batch

import jaxbert
from jaxbert import model


def test_tail_chunks_keep_each_chunk_within_its_bytes():
    assert model.TAIL_BYTES == 12 << 20  # 1,024 bert-base tokens' [tokens, 3072] float32 intermediate
    assert model.tail_chunks(8, 128, 3072) == 1  # bert-base 8 x 128: already that size
    assert model.tail_chunks(8, 512, 3072) == 4  # 8 x 512: four chunks of 128 positions (1,024 tokens each)
    assert model.tail_chunks(32, 128, 3072) == 4
    assert model.tail_chunks(16, 512, 1536) == 4  # MiniLM's FFN is half as wide: 2,048 tokens a chunk
    assert model.tail_chunks(16, 128, 1536) == 1
    assert model.tail_chunks(1, 510, 24700) == 3  # 4 chunks would not divide 510 positions: 3 do
    assert model.tail_chunks(1, 509, 24700) == 1  # nor would any fewer divide a prime
    for rows, L, F in ((8, 512, 3072), (64, 256, 3072), (5, 384, 4096), (1, 1, 3072)):
        n = model.tail_chunks(rows, L, F)
        chunk = rows * (L // n) * F * 4
        assert L % n == 0 and (n == 1 or model.TAIL_BYTES <= chunk < 2 * model.TAIL_BYTES), (rows, L, F, n)


def _hidden(params, config, ids, mask, rng=None):
    fn = jax.jit(lambda ids, mask: jaxbert.bert(params, config, ids, mask, rng=rng).last_hidden_state)
    return np.asarray(fn(ids, mask)), str(jax.make_jaxpr(fn)(ids, mask))


@pytest.mark.parametrize("kind", ["absolute", "relative_key_query"])
def test_chunked_tail_gives_the_unchunked_outputs(monkeypatch, kind):
    config = jaxbert.BertConfig.from_dict({**SIZES, "position_embedding_type": kind})
    params = jaxbert.init_params(config, jax.random.key(0))
    feed = padded_batch(batch=3, length=40)
    ids, mask = feed["input_ids"], feed["attention_mask"]
    whole, program = _hidden(params, config, ids, mask)
    assert "length=4" not in program
    # 3 x 40 tokens of a 44-wide FFN: 21 KB of intermediate; at 5 KB a chunk, 4 chunks of 10 positions.
    monkeypatch.setattr(model, "TAIL_BYTES", 5000)
    assert model.tail_chunks(3, 40, config.intermediate_size) == 4
    chunked, program = _hidden(params, config, ids, mask)
    assert "length=4" in program  # the chunks' lax.map is really there
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)
    # int8 (activations quantized per token, so a chunk quantizes exactly what the whole did), and bfloat16 to
    # within its rounding (a sum's order may flip the rounding of an activation cast to bfloat16: 2^-9 relative)
    for dtype, tol in (("int8", 1e-5), ("bfloat16", 2e-3)):
        monkeypatch.setattr(model, "TAIL_BYTES", 12 << 20)
        want = np.asarray(jaxbert.Bert(config, params, dtype=dtype)(ids, mask).last_hidden_state)
        monkeypatch.setattr(model, "TAIL_BYTES", 5000)
        got = np.asarray(jaxbert.Bert(config, params, dtype=dtype)(ids, mask).last_hidden_state)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=dtype)
    # with dropout (training) the tail is never cut: its random bits are drawn for the whole sequence
    _, program = _hidden(params, config.replace(hidden_dropout_prob=0.1), ids, mask, rng=jax.random.key(1))
    assert "length=4" not in program
