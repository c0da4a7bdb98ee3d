"""State dict ⇄ Flax tree: prefixes, legacy names, buffers, tied decoder, and errors that name the key."""

import jax
import numpy as np
import pytest
from conftest import SIZES, hf_model, jax_config, state_dict

import jaxbert
from jaxbert.convert import flax_to_torch_any, torch_to_flax

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mlm():
    hf = hf_model("BertForMaskedLM")
    return hf, jax_config(hf), state_dict(hf)


def _same_tree(a, b):
    flat_a, flat_b = (jax.tree_util.tree_flatten_with_path(t)[0] for t in (a, b))
    assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
    for (path, x), (_, y) in zip(flat_a, flat_b):
        assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)


def test_round_trip_into_torch_strict_load(mlm):
    hf, config, sd = mlm
    params, report = torch_to_flax(sd, config, "BertForMaskedLM")
    assert report.ignored == {
        "cls.predictions.decoder.bias": "duplicate of cls.predictions.bias",
        "cls.predictions.decoder.weight": "tied to the word embeddings",
    }
    back = jaxbert.flax_to_torch(params, config, "BertForMaskedLM")
    assert set(back) == set(sd)
    for key in sd:
        assert np.array_equal(back[key], sd[key]), key
    fresh = type(hf)(hf.config)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


def test_tree_is_flax_berts_layout(mlm):
    _, config, sd = mlm
    params, _ = torch_to_flax(sd, config, "BertForMaskedLM")
    assert set(params) == {"bert", "cls"} and "pooler" not in params["bert"]
    layer = params["bert"]["encoder"]["layer"]["0"]
    assert layer["attention"]["self"]["query"]["kernel"].shape == (32, 32)
    assert layer["intermediate"]["dense"]["kernel"].shape == (32, 44)  # [in, out]: PyTorch's transpose
    assert np.array_equal(
        layer["intermediate"]["dense"]["kernel"], sd["bert.encoder.layer.0.intermediate.dense.weight"].T
    )
    assert set(params["cls"]["predictions"]) == {"transform", "bias"}
    assert set(params["bert"]["embeddings"]["LayerNorm"]) == {"scale", "bias"}


def test_accepts_legacy_names_missing_prefix_buffers_and_absent_tied_weights(mlm):
    _, config, sd = mlm
    expected, _ = torch_to_flax(sd, config, "BertForMaskedLM")
    legacy = {}
    for key, value in sd.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        legacy[key.removeprefix("bert.")] = value
    legacy["embeddings.position_ids"] = np.arange(SIZES["max_position_embeddings"])[None]
    legacy["embeddings.token_type_ids"] = np.zeros((1, 40), np.int64)
    del legacy["cls.predictions.decoder.weight"], legacy["cls.predictions.bias"]  # only decoder.bias left
    params, report = torch_to_flax(legacy, config, "BertForMaskedLM")
    _same_tree(params, expected)
    assert report.ignored["embeddings.position_ids"] == "buffer, not a parameter"


def test_base_model_from_a_prefixed_checkpoint_reports_unused_head_keys(mlm):
    _, config, _ = mlm
    pre = state_dict(hf_model("BertForPreTraining"))
    params, report = torch_to_flax(pre, config, "BertModel")
    assert "pooler" in params and "bert" not in params
    assert report.ignored["cls.seq_relationship.weight"] == "not used by BertModel"
    params, report = torch_to_flax(pre, config, "BertForMaskedLM")
    assert report.ignored["bert.pooler.dense.weight"] == "not used by BertForMaskedLM"


def test_missing_head_is_an_error_unless_allowed():
    base = state_dict(hf_model("BertModel"))
    config = jaxbert.BertConfig.from_dict(SIZES)
    with pytest.raises(ValueError, match=r"missing keys for BertForMaskedLM: cls\.predictions\.bias, cls\.pred"):
        torch_to_flax(base, config, "BertForMaskedLM")
    params, report = torch_to_flax(base, config, "BertForMaskedLM", allow_missing_head=True)
    assert "cls.predictions.transform.dense.weight" in report.missing and "cls" not in params
    del base["encoder.layer.1.output.dense.bias"]
    with pytest.raises(ValueError, match=r"missing keys for BertForMaskedLM: bert\.encoder\.layer\.1\.output"):
        torch_to_flax(base, config, "BertForMaskedLM", allow_missing_head=True)


def test_unknown_key_shape_mismatch_and_duplicates_name_the_key(mlm):
    _, config, sd = mlm
    with pytest.raises(ValueError, match=r"unknown key 'bert\.encoder\.layer\.0\.attention\.self\.rotary'"):
        torch_to_flax({**sd, "bert.encoder.layer.0.attention.self.rotary": np.zeros(3)}, config, "mlm")
    with pytest.raises(ValueError, match=r"unknown key 'bert\.encoder\.layer\.3\.output\.dense\.bias'"):
        torch_to_flax({**sd, "bert.encoder.layer.3.output.dense.bias": np.zeros(32)}, config, "mlm")
    bad = {**sd, "bert.encoder.layer.2.intermediate.dense.weight": np.zeros((32, 44), np.float32)}
    with pytest.raises(
        ValueError,
        match=r"bert\.encoder\.layer\.2\.intermediate\.dense\.weight: shape \(32, 44\) "
        r"in the checkpoint, expected \(44, 32\)",
    ):
        torch_to_flax(bad, config, "mlm")
    dup = {**sd, "bert.embeddings.LayerNorm.gamma": sd["bert.embeddings.LayerNorm.weight"]}
    with pytest.raises(ValueError, match=r"duplicate key 'bert\.embeddings\.LayerNorm\.weight'"):
        torch_to_flax(dup, config, "mlm")
    with pytest.raises(ValueError, match="unknown head 'BertForRanking'"):
        torch_to_flax(sd, config, "BertForRanking")


def test_a_tied_decoder_weight_unlike_the_embeddings_is_refused(mlm):
    """transformers 5 keeps a stored decoder weight that differs from the word embeddings untied and applies it
    (4.57 ties it to the embeddings): taking the embeddings silently gave logits 21.8 away from transformers 5."""
    _, config, sd = mlm
    for head in ("BertForMaskedLM", "BertForPreTraining"):
        other = {**sd, "cls.predictions.decoder.weight": sd["cls.predictions.decoder.weight"] + 1}
        if head == "BertForPreTraining":
            other.update(state_dict(hf_model("BertForPreTraining")))
            other["cls.predictions.decoder.weight"] = other["bert.embeddings.word_embeddings.weight"] * 2
        with pytest.raises(ValueError, match=r"cls\.predictions\.decoder\.weight: differs from bert\.embeddings"):
            torch_to_flax(other, config, head)
    torch_to_flax(sd, config, "BertModel")  # no decoder there: nothing to compare
    untied = config.replace(tie_word_embeddings=False)
    params, _ = torch_to_flax(other, untied, "BertForPreTraining")  # what transformers 5 applies
    assert np.array_equal(params["cls"]["predictions"]["decoder"]["kernel"], other["cls.predictions.decoder.weight"].T)


def test_flax_to_torch_checks_the_tree(mlm):
    _, config, sd = mlm
    params, _ = torch_to_flax(sd, config, "mlm")
    params["cls"]["extra"] = {"kernel": np.zeros((2, 2))}
    with pytest.raises(ValueError, match="unknown parameter 'cls/extra/kernel'"):
        jaxbert.flax_to_torch(params, config, "mlm")
    del params["cls"]["extra"], params["cls"]["predictions"]["bias"]
    with pytest.raises(ValueError, match="missing parameter 'cls/predictions/bias'"):
        jaxbert.flax_to_torch(params, config, "mlm")


def test_any_flax_tree_renames_to_torch_keys(mlm):
    _, config, sd = mlm
    params, _ = torch_to_flax(sd, config, "mlm")
    again, _ = torch_to_flax(flax_to_torch_any(params), config, "mlm")
    _same_tree(again, params)


def test_init_params_follows_transformers_initialization():
    config = jaxbert.BertConfig(
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=512,
        num_hidden_layers=2,
        vocab_size=1000,
        initializer_range=0.05,
        pad_token_id=3,
    )
    params = jaxbert.init_params(config, jax.random.key(0), "pretraining")
    flat = {
        "/".join(k): np.asarray(v)
        for k, v in ((tuple(p.key for p in path), v) for path, v in jax.tree_util.tree_flatten_with_path(params)[0])
    }
    for name, value in flat.items():
        if name.endswith(("kernel", "embedding")) and value.size > 1000:
            assert abs(value.std() - 0.05) < 0.005, name
        elif name.endswith("scale"):
            assert (value == 1).all(), name
        elif name.endswith("bias"):
            assert (value == 0).all(), name
    assert (flat["bert/embeddings/word_embeddings/embedding"][3] == 0).all()
