"""Parity with transformers (PyTorch, float32) for every head, end to end and block by block, with padding."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, hf_model, jax_config, padded_batch, state_dict, torch_run

import jaxbert
from jaxbert import model as M
from jaxbert.attention import keys_for

torch = pytest.importorskip("torch")

OUTPUT_FIELDS = (
    "last_hidden_state",
    "pooler_output",
    "logits",
    "prediction_logits",
    "seq_relationship_logits",
    "start_logits",
    "end_logits",
    "loss",
)


def _feed(head, seed=0):
    feed = padded_batch(seed)
    if head == "BertForMultipleChoice":  # [B, C, L]: two questions with three choices each
        feed = {k: np.concatenate([v, v[::-1]], 0).reshape(2, 3, -1) for k, v in feed.items()}
    return feed


def _labels(head, feed):
    rng = np.random.default_rng(1)
    ids = feed["input_ids"]
    if head in ("BertForMaskedLM", "BertForPreTraining", "BertForTokenClassification", "BertLMHeadModel"):
        labels = rng.integers(0, 5 if "Token" in head else ids.max() + 1, ids.shape)
        labels[rng.random(ids.shape) < 0.4] = -100
        extra = {"next_sentence_label": rng.integers(0, 2, ids.shape[0])} if "PreTraining" in head else {}
        return {"labels": labels, **extra}
    if head == "BertForNextSentencePrediction":
        return {"labels": rng.integers(0, 2, ids.shape[0])}
    if head == "BertForSequenceClassification":
        return {"labels": rng.integers(0, 5, ids.shape[0])}
    if head == "BertForMultipleChoice":
        return {"labels": rng.integers(0, 3, ids.shape[0])}
    if head == "BertForQuestionAnswering":  # one position beyond the sequence: clamped and ignored
        return {"start_positions": np.array([1, 4, 30]), "end_positions": np.array([3, 5, 2])}
    return {}


def _jax_labels(head, labels):
    labels = {k: jnp.asarray(v) for k, v in labels.items()}
    if head == "BertForNextSentencePrediction":  # transformers names it `labels` there
        labels = {"next_sentence_label": labels.pop("labels")}
    return labels


@pytest.mark.parametrize("head", jaxbert.HEADS)
def test_every_head_matches_transformers(head):
    hf = hf_model(
        head,
        **({"num_labels": 2} if head == "BertForQuestionAnswering" else {}),
        **({"is_decoder": True} if head == "BertLMHeadModel" else {}),
    )
    config = jax_config(hf)
    params, report = jaxbert.torch_to_flax(state_dict(hf), config, head)
    feed, labels = _feed(head), _labels(head, _feed(head))
    expected = torch_run(hf, {**feed, **labels}, output_hidden_states=True, output_attentions=True)
    got = jaxbert.forward(
        params,
        config,
        head,
        **{k: jnp.asarray(v) for k, v in feed.items()},
        output_hidden_states=True,
        output_attentions=True,
        **_jax_labels(head, labels),
    )
    compared = 0
    for field in OUTPUT_FIELDS:
        if expected.get(field) is not None:
            assert_close(got[field], expected[field].numpy(), field)
            compared += 1
    assert compared >= 1 and (head == "BertModel" or expected.get("loss") is not None)
    for i, (g, e) in enumerate(zip(got.hidden_states, expected.hidden_states, strict=True)):
        assert_close(g, e.numpy(), f"hidden_states[{i}]")
    for i, (g, e) in enumerate(zip(got.attentions, expected.attentions, strict=True)):
        assert_close(g, e.numpy(), f"attentions[{i}]")


def test_each_block_matches_transformers_on_its_own_input():
    """Feed every block PyTorch's own input, so an error is pinned to the block that makes it."""
    hf = hf_model("BertModel")
    config, params = jax_config(hf), jaxbert.torch_to_flax(state_dict(hf), jax_config(hf), "BertModel")[0]
    feed = padded_batch(3)
    expected = torch_run(hf, feed, output_hidden_states=True)
    hs = [h.numpy() for h in expected.hidden_states]
    for b in range(feed["input_ids"].shape[0]):
        ids, types = feed["input_ids"][b], feed["token_type_ids"][b]
        emb = M.embeddings(params["embeddings"], config, ids, types, np.arange(ids.shape[0]))
        assert_close(emb, hs[0][b], "embeddings")
        mask = feed["attention_mask"][b].astype(bool)
        for i in range(config.num_hidden_layers):
            keys = keys_for(config, jnp.asarray(mask))
            out, _, _, _ = M.layer(params["encoder"]["layer"][str(i)], config, jnp.asarray(hs[i][b]), keys)
            assert_close(out, hs[i + 1][b], f"layer {i}")
        assert_close(M.pooler(params["pooler"], jnp.asarray(hs[-1][b])), expected.pooler_output[b].numpy(), "pooler")


ACTIVATIONS = [
    "gelu",
    "gelu_python",
    "gelu_new",
    "gelu_pytorch_tanh",
    "gelu_accurate",
    "gelu_fast",
    "gelu_10",
    "quick_gelu",
    "relu",
    "relu2",
    "relu6",
    "leaky_relu",
    "silu",
    "swish",
    "mish",
    "tanh",
    "sigmoid",
    "linear",
    "laplace",
    "gelu_python_tanh",
    "hardswish",
    "sqrtsoftplus",
]


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_every_activation_matches_transformers(act):
    hf = hf_model("BertForMaskedLM", hidden_act=act, num_hidden_layers=1)
    config = jax_config(hf)
    params, _ = jaxbert.torch_to_flax(state_dict(hf), config, "BertForMaskedLM")
    feed = padded_batch(4)
    got = jaxbert.forward(params, config, "BertForMaskedLM", **{k: jnp.asarray(v) for k, v in feed.items()})
    assert_close(got.logits, torch_run(hf, feed).logits.numpy(), act)


@pytest.mark.parametrize("problem", ["regression", "single_label_classification", "multi_label_classification"])
def test_sequence_classification_losses_per_problem_type(problem):
    num_labels = 1 if problem == "regression" else 5
    hf = hf_model("BertForSequenceClassification", problem_type=problem, num_labels=num_labels)
    config = jax_config(hf)
    params, _ = jaxbert.torch_to_flax(state_dict(hf), config, "BertForSequenceClassification")
    feed, rng = padded_batch(5), np.random.default_rng(2)
    labels = {
        "regression": rng.normal(size=3).astype(np.float32),
        "single_label_classification": rng.integers(0, 5, 3),
        "multi_label_classification": (rng.random((3, 5)) < 0.5).astype(np.float32),
    }[problem]
    expected = torch_run(hf, {**feed, "labels": labels}).loss.numpy()
    got = jaxbert.forward(
        params,
        config,
        "BertForSequenceClassification",
        **{k: jnp.asarray(v) for k, v in feed.items()},
        labels=jnp.asarray(labels),
    )
    assert_close(got.loss, expected, problem)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_cross_entropy_matches_torch_with_label_smoothing_and_ignore_index(smoothing):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 6, 13)).astype(np.float32)
    labels = rng.integers(0, 13, (4, 6))
    labels[rng.random((4, 6)) < 0.3] = -100
    expected = torch.nn.functional.cross_entropy(
        torch.tensor(logits).reshape(-1, 13), torch.tensor(labels).reshape(-1), label_smoothing=smoothing
    )
    got = jaxbert.losses.cross_entropy(jnp.asarray(logits), jnp.asarray(labels), label_smoothing=smoothing)
    assert_close(got, expected.numpy(), f"smoothing={smoothing}")


@pytest.mark.parametrize("head", [h for h in jaxbert.HEADS if h != "BertModel"])
def test_gradients_of_every_head_match_torch_autograd(head):
    """jax.grad of forward's loss equals PyTorch's backward for every parameter. The labels also score padded
    positions (and QA's span softmax runs over them), so the [PAD] lookups reach the loss: nn.Embedding's
    padding_idx gives that row no gradient from them, and neither may jaxbert."""
    import jax

    hf = hf_model(
        head,
        **({"num_labels": 2} if head == "BertForQuestionAnswering" else {}),
        **({"is_decoder": True} if head == "BertLMHeadModel" else {}),
    )
    config = jax_config(hf)
    params = jaxbert.torch_to_flax(state_dict(hf), config, head)[0]
    feed, labels = _feed(head), _labels(head, _feed(head))
    hf(**{k: torch.as_tensor(v) for k, v in {**feed, **labels}.items()}).loss.backward()
    jfeed = {k: jnp.asarray(v) for k, v in feed.items()}
    grads = jax.grad(lambda p: jaxbert.forward(p, config, head, **jfeed, **_jax_labels(head, labels)).loss)(params)
    got = jaxbert.flax_to_torch(grads, config, head)
    for name, p in hf.named_parameters():
        assert_close(got[name], p.grad.numpy(), name)


@pytest.mark.parametrize("head", ["BertForQuestionAnswering", "BertForMaskedLM"])
def test_a_null_pad_token_id_is_no_padding_idx_as_in_transformers(head, tmp_path):
    """config.json's "pad_token_id": null (transformers 5 accepts it: BertEmbeddings then has no padding_idx) was
    refused. Loaded, its outputs are transformers'; the [PAD] lookups (id 0, as BERT's tokenizers pad) now train
    row 0, as nn.Embedding without padding_idx does; and a fresh embedding table keeps its row 0."""
    import jax

    hf = hf_model(head, pad_token_id=None, **({"num_labels": 2} if head == "BertForQuestionAnswering" else {}))
    assert hf.bert.embeddings.word_embeddings.padding_idx is None
    hf.config.architectures = [head]
    hf.save_pretrained(tmp_path)
    loaded = jaxbert.load(tmp_path)
    assert loaded.config.pad_token_id is None
    feed, labels = _feed(head), _labels(head, _feed(head))
    expected, got = torch_run(hf, feed), loaded(**feed)
    field = "start_logits" if head == "BertForQuestionAnswering" else "logits"
    assert_close(getattr(got, field), getattr(expected, field).numpy(), field, mask=feed["attention_mask"] == 1)
    hf(**{k: torch.as_tensor(v) for k, v in {**feed, **labels}.items()}).loss.backward()
    config, params = loaded.config, jaxbert.torch_to_flax(state_dict(hf), loaded.config, head)[0]
    jfeed = {k: jnp.asarray(v) for k, v in feed.items()}
    grads = jax.grad(lambda p: jaxbert.forward(p, config, head, **jfeed, **_jax_labels(head, labels)).loss)(params)
    got = jaxbert.flax_to_torch(grads, config, head)
    for name, p in hf.named_parameters():
        assert_close(got[name], p.grad.numpy(), name)
    row = got["bert.embeddings.word_embeddings.weight"][0]
    assert np.abs(row).max() > 1e-4  # the padded positions' lookups reach the loss and train row 0
    fresh = jaxbert.init_params(config, jax.random.key(0), head)
    table = (fresh["bert"] if "bert" in fresh else fresh)["embeddings"]["word_embeddings"]["embedding"]
    assert np.abs(np.asarray(table[0])).max() > 0 and hf.bert.embeddings.word_embeddings.weight[0].abs().max() > 0


def test_question_answering_positions_of_shape_batch_by_one_are_squeezed():
    """transformers squeezes start/end positions [B, 1] (as a DataParallel gather gives them); jaxbert failed in
    take_along_axis ('indices and arr must have the same number of dimensions')."""
    head = "BertForQuestionAnswering"
    hf = hf_model(head, num_labels=2)
    config = jax_config(hf)
    params = jaxbert.torch_to_flax(state_dict(hf), config, head)[0]
    feed, labels = _feed(head), {k: v[:, None] for k, v in _labels(head, _feed(head)).items()}
    expected = torch_run(hf, {**feed, **labels}).loss.numpy()
    got = jaxbert.forward(
        params, config, head, **{k: jnp.asarray(v) for k, v in feed.items()}, **_jax_labels(head, labels)
    )
    assert_close(got.loss, expected, "loss")
