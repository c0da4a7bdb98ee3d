"""The compute layout (layers stacked for one scan, fused QKV) and the fast paths built on it: the same numbers
as transformers and as the stored layout, a round trip back to the stored tree, and a compiled program that does
not grow with depth."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SIZES, assert_close, hf_model, jax_config, padded_batch, state_dict, torch_run

import jaxbert
from jaxbert import attention, layout
from jaxbert import model as M

torch = pytest.importorskip("torch")
GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden")


def _hf(head="BertModel"):
    hf = hf_model(head)
    config = jax_config(hf)
    return hf, config, jaxbert.torch_to_flax(state_dict(hf), config, head)[0]


@pytest.mark.parametrize("head", ["BertModel", "BertForMaskedLM", "BertForPreTraining"])
@pytest.mark.parametrize("apart", [False, True], ids=["stacked", "apart"])
def test_compute_layout_then_back_gives_the_stored_tree(head, apart):
    _, config, params = _hf(head)
    compute = layout.to_compute(params, config, apart=apart)
    enc = compute["encoder"] if head == "BertModel" else compute["bert"]["encoder"]
    D, N, F = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    if apart:  # one subtree per layer, query/key/value fused, kernels as weights [out, in]
        assert sorted(enc["layer"], key=int) == [str(i) for i in range(N)]
        layer = enc["layer"][str(N - 1)]
        assert layer["attention"]["self"]["qkv"]["weight"].shape == (3 * D, D)
        assert layer["intermediate"]["dense"]["weight"].shape == (F, D)
        assert layout.is_apart(enc) and not layout.is_stacked(enc)
    else:
        assert enc["stacked"]["attention"]["self"]["qkv"]["kernel"].shape == (N, D, 3 * D)
        assert enc["stacked"]["intermediate"]["dense"]["kernel"].shape == (N, D, F)
    back = layout.to_stored(compute, config)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("apart", [False, True], ids=["stacked", "apart"])
def test_consuming_the_stored_tree_empties_its_layers(apart):
    _, config, params = _hf()
    layout.to_compute(params, config, consume=True, apart=apart)
    assert params["encoder"]["layer"] == {}


@pytest.mark.parametrize("head", jaxbert.HEADS)
def test_compute_layout_matches_transformers(head):
    hf = hf_model(head, **({"num_labels": 2} if head == "BertForQuestionAnswering" else {}))
    config = jax_config(hf)
    params = layout.to_compute(jaxbert.torch_to_flax(state_dict(hf), config, head)[0], config)
    feed = padded_batch(2)
    if head == "BertForMultipleChoice":
        feed = {k: np.stack([v, v[::-1]]) for k, v in feed.items()}
    # head_mask on this layout: test_golden (transformers 5 dropped it).
    expected = torch_run(hf, feed, output_hidden_states=True, output_attentions=True)
    got = jaxbert.forward(
        params,
        config,
        head,
        **{k: jnp.asarray(v) for k, v in feed.items()},
        output_hidden_states=True,
        output_attentions=True,
    )
    field = "last_hidden_state" if head == "BertModel" else next(iter(k for k in got.to_dict() if "logits" in k))
    assert_close(got[field], expected[field].numpy(), field)
    for i, (g, e) in enumerate(zip(got.hidden_states, expected.hidden_states, strict=True)):
        assert_close(g, e.numpy(), f"hidden_states[{i}]")
    for i, (g, e) in enumerate(zip(got.attentions, expected.attentions, strict=True)):
        assert_close(g, e.numpy(), f"attentions[{i}]")


@pytest.mark.parametrize("form", ["stored", "stacked", "apart"])
def test_softmax_free_path_matches_transformers(form):
    """Without requested attentions the softmax is normalized after the value product: same numbers, on each
    layout a model runs on."""
    hf, config, params = _hf("BertForMaskedLM")
    params = params if form == "stored" else layout.to_compute(params, config, apart=form == "apart")
    feed = padded_batch(6)
    expected = torch_run(hf, feed, output_hidden_states=True)
    got = jaxbert.forward(
        params, config, "BertForMaskedLM", **{k: jnp.asarray(v) for k, v in feed.items()}, output_hidden_states=True
    )
    assert got.attentions is None
    assert_close(got.logits, expected.logits.numpy(), "logits")
    for i, (g, e) in enumerate(zip(got.hidden_states, expected.hidden_states, strict=True)):
        assert_close(g, e.numpy(), f"hidden_states[{i}]")


def test_float32_models_hold_their_layers_apart_and_others_stacked():
    """jaxbert.load picks the layout by dtype: float32 apart (faster matmuls), bfloat16 and int8 stacked (and
    any model given a mesh, whose sharding rules are the stacked layout's). Generation reuses a float32 model's
    arrays instead of copying them, and `params` gives back the stored tree either way."""
    path = os.path.join(GOLDEN, "unpruned")
    f32, bf16 = jaxbert.load(path), jaxbert.load(path, dtype="bfloat16")
    enc = lambda tree: tree["bert"]["encoder"] if "bert" in tree else tree["encoder"]  # noqa: E731
    assert layout.is_apart(enc(f32.weights)) and layout.is_stacked(enc(bf16.weights))
    assert layout.is_stacked(enc(jaxbert.load(path, dtype="int8").weights))
    qkv = lambda tree: enc(tree)["layer"]["0"]["attention"]["self"]["qkv"]["weight"]  # noqa: E731
    assert qkv(f32.layers_apart(f32.weights)) is qkv(f32.weights)
    # The bfloat16 tree is the float32 one rounded to bfloat16 (nearest, ties to even), exactly: stacking, fusing
    # and splitting back move values without arithmetic. (atol 0.02 let every value of this fixture, about 0.16
    # in size, be 12% off, and its biases are all zero.)
    for a, b in zip(jax.tree_util.tree_leaves(f32.params), jax.tree_util.tree_leaves(bf16.params), strict=True):
        assert a.shape == b.shape and b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a).astype(jnp.bfloat16))


def test_fused_attention_path_matches_transformers(monkeypatch):
    """jax.nn.dot_product_attention (used on GPU/TPU) forced on here: same numbers, padding included."""
    hf, config, params = _hf()
    feed = padded_batch(4)
    expected = torch_run(hf, feed).last_hidden_state.numpy()
    calls = []
    real = jax.nn.dot_product_attention
    monkeypatch.setattr(attention, "FUSED_ATTENTION_BACKENDS", (jax.default_backend(),))
    monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    for tree in (params, layout.to_compute(params, config)):
        got = M.bert(tree, config, **{k: jnp.asarray(v) for k, v in feed.items()}).last_hidden_state
        assert_close(got, expected, "last_hidden_state", mask=feed["attention_mask"].astype(bool))
    assert calls, "the fused attention path was not taken"


def test_relative_positions_on_both_layouts_without_attentions():
    """test_golden asks for attentions (the softmax path); here the stored tree's loop and the loaded model
    (float32: its layers apart) run without them, against the same transformers 4.57 fixture."""
    data = np.load(os.path.join(GOLDEN, "relative_key_query", "io.npz"))
    bert = jaxbert.load(os.path.join(GOLDEN, "relative_key_query"))
    inputs = {k[3:]: jnp.asarray(data[k]) for k in data.files if k.startswith("in.")}
    got = jaxbert.forward(bert.params, bert.config, bert.head, **inputs)
    assert "layer" in bert.params["bert"]["encoder"]
    assert_close(got.prediction_logits, data["out.prediction_logits"], "prediction_logits")
    loaded = bert(**inputs)  # the loaded model, without attentions: the softmax-free path
    assert_close(loaded.prediction_logits, data["out.prediction_logits"], "prediction_logits (loaded)")


def _dots_in_program(layers: int) -> int:
    config = jaxbert.BertConfig.from_dict({**SIZES, "num_hidden_layers": layers})
    params = layout.to_compute(jaxbert.init_params(config, jax.random.key(0)), config)
    ids = jnp.ones((2, 8), jnp.int32)
    text = jax.jit(lambda p, i: M.bert(p, config, i).last_hidden_state).lower(params, ids).as_text()
    return text.count("stablehlo.dot_general")


def test_compiled_program_does_not_grow_with_depth():
    """One scanned layer body whatever the depth: the compile time of a stacked bert-base does not scale with
    layers (a float32 model's layers apart do, for faster matmuls: layout.apart_layers)."""
    assert _dots_in_program(2) == _dots_in_program(12) > 0


def test_bfloat16_compute_layout_stays_close_to_float32():
    _, config, params = _hf()
    feed = {k: jnp.asarray(v) for k, v in padded_batch(5).items()}
    low = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    ref = M.bert(layout.to_compute(params, config), config, **feed).last_hidden_state
    got = M.bert(layout.to_compute(low, config), config, **feed).last_hidden_state
    assert got.dtype == jnp.float32  # float32 residual stream, bfloat16 matmuls
    mask = padded_batch(5)["attention_mask"].astype(bool)
    a, b = np.asarray(ref)[mask], np.asarray(got)[mask]
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cos.min() > 0.999 and np.abs(a - b).max() > 0  # close, and really computed in bfloat16
