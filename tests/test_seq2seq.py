"""bert2bert (transformers' EncoderDecoderModel) against transformers 5: logits, attentions, the loss from
labels, the projection between different widths, loading, conversion both ways, and its errors."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SIZES, assert_close, cli_fails

import jaxbert
from jaxbert import seq2seq
from jaxbert.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _model(decoder_width=24, decoder=None, **top):
    torch.manual_seed(0)
    enc = transformers.BertConfig(**SIZES, attn_implementation="eager")
    dec = transformers.BertConfig(
        **{
            **SIZES,
            "hidden_size": decoder_width,
            "num_hidden_layers": 2,
            "intermediate_size": 37,
            "num_attention_heads": 2 if decoder_width == 32 else 3,
            **(decoder or {}),
        },
        is_decoder=True,
        add_cross_attention=True,
        attn_implementation="eager",
    )
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        enc, dec, **{"decoder_start_token_id": 2, "pad_token_id": 0, **top}
    )
    model = transformers.EncoderDecoderModel(config=config)
    model.set_attn_implementation("eager")  # attention probabilities are compared
    return model.eval()


@pytest.fixture(scope="module", params=[24, 32], ids=["projected", "same-width"])
def s2s(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("s2s") / "pt"
    model = _model(request.param)
    model.save_pretrained(directory)
    return model, str(directory)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, SIZES["vocab_size"], (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, 6:] = 0
    ids[mask == 0] = 0
    labels = rng.integers(3, SIZES["vocab_size"], (3, 6))
    labels[2, 4:] = -100
    return ids, mask, labels


def _torch(model, **feed):
    with torch.no_grad():
        return model(
            **{k: torch.as_tensor(v) for k, v in feed.items()},
            output_attentions=True,
            output_hidden_states=True,
            return_dict=True,
        )


def test_forward_and_loss_match_transformers(s2s):
    model, directory = s2s
    ids, mask, labels = _inputs()
    expected = _torch(model, input_ids=ids, attention_mask=mask, labels=labels)
    config = seq2seq.load_config(directory)
    assert isinstance(config, seq2seq.EncoderDecoderConfig) and config.projects == (
        model.config.decoder.hidden_size != SIZES["hidden_size"]
    )
    params, _ = jaxbert.checkpoint.load_params(directory, config, "EncoderDecoderModel")
    got = jaxbert.forward(
        params,
        config,
        "EncoderDecoderModel",
        jnp.asarray(ids),
        jnp.asarray(mask),
        labels=jnp.asarray(labels),
        output_attentions=True,
        output_hidden_states=True,
    )
    assert_close(got.logits, expected.logits.numpy(), "logits")
    assert_close(got.loss, expected.loss.numpy(), "loss")
    real = mask.astype(bool)
    assert_close(got.encoder_last_hidden_state, expected.encoder_last_hidden_state.numpy(), "encoder", mask=real)
    for name in ("decoder_hidden_states", "decoder_attentions", "cross_attentions", "encoder_hidden_states"):
        assert len(got[name]) == len(expected[name]) > 0, name
        for i, (g, e) in enumerate(zip(got[name], expected[name], strict=True)):
            m = real if name == "encoder_hidden_states" else None
            assert_close(g, e.numpy(), f"{name}[{i}]", mask=m)


def test_loaded_model_and_its_round_trip_through_convert_and_export(s2s, tmp_path, capsys):
    model, directory = s2s
    ids, mask, labels = _inputs(1)
    decoder_ids = np.concatenate([np.full((3, 1), 2), np.maximum(labels[:, :-1], 0)], axis=1)
    expected = _torch(model, input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits.numpy()
    assert main(["convert", directory, str(tmp_path / "jax"), "--verify"]) == 0
    assert main(["export", str(tmp_path / "jax"), str(tmp_path / "pt")]) == 0
    out = capsys.readouterr().out
    assert "head EncoderDecoderModel" in out and "encoder embeddings" in out
    assert "verify logits" in out and "ok" in out and "verify greedy tokens            0 differ ok" in out
    for d in (directory, tmp_path / "jax"):
        loaded = jaxbert.load(d)
        assert type(loaded).__name__ == "EncoderDecoder"
        assert_close(loaded(ids, mask, decoder_ids).logits, expected, f"jaxbert.load({os.path.basename(d)})")
    back = transformers.EncoderDecoderModel.from_pretrained(tmp_path / "pt").eval()
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[key].numpy(), value.numpy(), key)
    assert main(["info", str(tmp_path / "jax")]) == 0
    info = capsys.readouterr().out
    assert "decoder: layers 2" in info and "causal decoder with cross-attention" in info


def test_errors_are_named(s2s, tmp_path, capsys):
    _, directory = s2s
    loaded = jaxbert.load(directory)
    ids, mask, _ = _inputs()
    with pytest.raises(ValueError, match="decoder_input_ids: required"):
        loaded(ids, mask)
    with pytest.raises(ValueError, match="token id 97 at position"):
        loaded(ids, mask, np.full((3, 2), 97))
    plain = jaxbert.load(os.path.join(os.path.dirname(__file__), "fixtures", "golden", "relative_key"))
    with pytest.raises(
        ValueError, match="decoder_input_ids: this is a BertForPreTraining checkpoint, not an encoder-decoder one"
    ):
        plain(ids[:, :5] % 60, decoder_input_ids=ids[:, :2])
    with pytest.raises(ValueError, match="encoder_hidden_states given, but this model has no cross-attention"):
        plain(ids[:, :5] % 60, encoder_hidden_states=np.zeros((3, 4, 24), np.float32))
    config = json.loads(open(os.path.join(directory, "config.json")).read())
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(directory):
        (broken / name).write_bytes(open(os.path.join(directory, name), "rb").read())
    config["decoder"]["add_cross_attention"] = False
    (broken / "config.json").write_text(json.dumps(config))
    cli_fails(
        capsys,
        tmp_path,
        "info",
        broken,
        match="EncoderDecoderConfig.decoder: needs is_decoder=true and add_cross_attention=true",
    )
    config["decoder"]["add_cross_attention"], config["decoder_start_token_id"] = True, 500
    (broken / "config.json").write_text(json.dumps(config))
    cli_fails(capsys, tmp_path, "info", broken, match="decoder_start_token_id=500: must be a token id")
