"""Inference in cache-sized pieces: the layer's row-wise tail (attention's output projection, FFN, both add & norms)
in chunks of positions (model._tail), and a large batch through all the layers in groups of rows (model.bert,
row_groups): the same outputs, pieces only where sized, never in training or with a cache."""

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
    for dtype in ("int8", "bfloat16"):
        monkeypatch.setattr(model, "TAIL_BYTES", 12 << 20)
        want = np.asarray(jaxbert.Bert(config, params, dtype=dtype)(ids, mask).last_hidden_state)
        monkeypatch.setattr(model, "TAIL_BYTES", 5000)
        got = np.asarray(jaxbert.Bert(config, params, dtype=dtype)(ids, mask).last_hidden_state)
        if dtype == "int8":  # activations quantized per token: a chunk quantizes exactly what the whole did
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            continue
        # bfloat16: a chunk's sums, blocked by the kernel for the rows it gets, may round an activation to the other
        # neighbouring bfloat16, and that propagates through the layers (AMX Xeon: 0.0029 here, over 2e-3 in a few
        # places), so the chunked result is held to bfloat16's own distance from float32 (0.008-0.009 here).
        own = np.abs(want - whole).max()
        assert np.abs(got - want).max() <= own, (np.abs(got - want).max(), own)
        assert np.abs(got - whole).max() <= 1.1 * own, (np.abs(got - whole).max(), own)
    # with dropout (training) the tail is never cut: its random bits are drawn for the whole sequence
    _, program = _hidden(params, config.replace(hidden_dropout_prob=0.1), ids, mask, rng=jax.random.key(1))
    assert "length=4" not in program


def test_row_groups_leave_each_group_at_least_its_tokens():
    assert model.ROW_TOKENS == 2048
    assert model.row_groups(8, 128) == 1  # bert-base 8 x 128: 1,024 tokens, at once
    assert model.row_groups(16, 128) == 1
    assert model.row_groups(32, 128) == 2
    assert model.row_groups(32, 512) == 8  # four rows of 512 a group
    assert model.row_groups(24, 512) == 6
    assert model.row_groups(6, 512) == 1  # 3,072 tokens: two groups would leave 1,536 each
    assert model.row_groups(1, 512) == 1
    assert model.row_groups(7, 1024) == 1  # 3 groups would not divide 7 rows, nor would 2
    for B, L in ((32, 512), (64, 256), (12, 384), (5, 40), (1, 1)):
        n = model.row_groups(B, L)
        assert B % n == 0 and (n == 1 or model.ROW_TOKENS <= B // n * L < 2 * model.ROW_TOKENS), (B, L, n)


def _everything(params, config, feed, **kw):
    """Every output of jaxbert.bert (jitted) as numpy, and the program's jaxpr."""

    def fn(feed):
        return jaxbert.bert(params, config, **feed, output_hidden_states=True, output_attentions=True, **kw).to_dict()

    return jax.tree_util.tree_map(np.asarray, jax.jit(fn)(feed)), str(jax.make_jaxpr(fn)(feed))


@pytest.mark.parametrize("kind", ["absolute", "relative_key_query"])
def test_row_groups_give_the_whole_batch_outputs(monkeypatch, kind):
    config = jaxbert.BertConfig.from_dict({**SIZES, "position_embedding_type": kind})
    params = jaxbert.init_params(config, jax.random.key(0))
    feed = {k: jax.numpy.asarray(v) for k, v in padded_batch(seed=1, batch=6, length=20).items()}
    # two sequences packed into each of the first two rows (see packing.py): groups keep their segments apart
    seg = np.where(feed["attention_mask"] > 0, 1, 0)
    seg[:2, 9:] = np.where(feed["attention_mask"][:2, 9:] > 0, 2, 0)
    pos = np.where(np.arange(20) < 9, np.arange(20), np.arange(20) - 9) * np.ones((6, 1), int)
    feed.update(segment_ids=seg, position_ids=pos)
    whole, program = _everything(params, config, feed)
    assert "length=3" not in program
    monkeypatch.setattr(model, "ROW_TOKENS", 40)  # 6 x 20 tokens: 3 groups of 2 rows
    assert model.row_groups(6, 20) == 3
    grouped, program = _everything(params, config, feed)
    assert "length=3" in program  # the groups' lax.map is really there
    assert jax.tree_util.tree_structure(grouped) == jax.tree_util.tree_structure(whole)
    for got, want in zip(jax.tree_util.tree_leaves(grouped), jax.tree_util.tree_leaves(whole), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # a model's own calls; int8 and bfloat16 to within bfloat16's rounding (2^-8 relative: int8 attends in bfloat16
    # on a CPU with bfloat16 units, and another fusion may round one probability the other way)
    for dtype, tol in ((None, 1e-6), ("int8", 5e-3), ("bfloat16", 5e-3)):
        monkeypatch.setattr(model, "ROW_TOKENS", 2048)
        want = np.asarray(jaxbert.Bert(config, params, dtype=dtype)(feed["input_ids"]).last_hidden_state)
        monkeypatch.setattr(model, "ROW_TOKENS", 40)
        got = np.asarray(jaxbert.Bert(config, params, dtype=dtype)(feed["input_ids"]).last_hidden_state)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str(dtype))


def test_row_groups_with_cross_attention_and_never_in_training_or_with_a_cache(monkeypatch):
    config = jaxbert.BertConfig.from_dict({**SIZES, "is_decoder": True, "add_cross_attention": True})
    params = jaxbert.init_params(config, jax.random.key(2))
    feed = {k: jax.numpy.asarray(v) for k, v in padded_batch(seed=2, batch=4, length=10).items()}
    states = jax.random.normal(jax.random.key(3), (4, 7, SIZES["hidden_size"]))
    cross_mask = np.array([[1] * 7, [1] * 5 + [0] * 2, [1] * 7, [1] * 3 + [0] * 4])
    cross = dict(encoder_hidden_states=states, encoder_attention_mask=cross_mask)
    whole, _ = _everything(params, config, feed, **cross)
    monkeypatch.setattr(model, "ROW_TOKENS", 20)  # 4 x 10 tokens: 2 groups
    grouped, program = _everything(params, config, feed, **cross)
    assert "length=2" in program
    for got, want in zip(jax.tree_util.tree_leaves(grouped), jax.tree_util.tree_leaves(whole), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # dropout (training) and a cache (generation) run the batch at once
    ids, mask = feed["input_ids"], feed["attention_mask"]
    dropped = config.replace(hidden_dropout_prob=0.1)
    program = str(jax.make_jaxpr(lambda i: jaxbert.bert(params, dropped, i, mask, rng=jax.random.key(1)))(ids))
    assert "length=2" not in program
    program = str(jax.make_jaxpr(lambda i: jaxbert.bert(params, config, i, mask, use_cache=True))(ids))
    assert "length=2" not in program
