"""The dtypes a checkpoint's tensors come in: `.bin` files of nn.Parameter values load, a bfloat16 `.bin` stays
bfloat16 as a bfloat16 safetensors does, and a checkpoint mixing float dtypes converts to one dtype (the widest,
exactly) that transformers can read back from config.json."""

import json
import re

import jax
import numpy as np
import pytest
from conftest import bert2bert_dir, model_dir
from safetensors.numpy import load_file, save_file

import jaxbert
from jaxbert.checkpoint import load_params, read_msgpack
from jaxbert.cli import main
from jaxbert.config import BertConfig
from jaxbert.convert import flax_to_torch_any

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
KEY = "encoder.layer.1.attention.self.query.weight"


@pytest.fixture
def src(tmp_path):
    directory = tmp_path / "src"
    model_dir(directory)
    return directory


def _state(src) -> dict:
    return safetensors_torch.load_file(src / "model.safetensors")


def _as_bin(src, state) -> None:
    (src / "model.safetensors").unlink()
    torch.save(state, src / "pytorch_model.bin")


def _convert(src, tmp_path) -> tuple[dict, dict]:
    """config.json and the PyTorch-named parameters of `jaxbert convert src`."""
    assert main(["convert", str(src), str(tmp_path / "dst")]) == 0
    config = json.loads((tmp_path / "dst" / "config.json").read_text())
    return config, flax_to_torch_any(read_msgpack(str(tmp_path / "dst" / "flax_model.msgpack")))


def test_a_bin_of_parameters_loads(src):
    config = BertConfig.from_pretrained(str(src))
    want, _ = load_params(str(src), config, "BertModel")
    # What torch.save(dict(model.named_parameters())) writes: Parameters, requires_grad set.
    _as_bin(src, {k: torch.nn.Parameter(v) if v.is_floating_point() else v for k, v in _state(src).items()})
    got, _ = load_params(str(src), config, "BertModel")
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)


def test_a_bfloat16_bin_stays_bfloat16(src, tmp_path):
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in _state(src).items()}
    _as_bin(src, state)
    config, params = _convert(src, tmp_path)
    assert config["dtype"] == "bfloat16"
    assert {str(v.dtype) for v in params.values()} == {"bfloat16"}
    np.testing.assert_array_equal(params[KEY].view(np.int16), state[KEY].view(torch.int16).numpy())


@pytest.mark.parametrize(
    "rest,one,widest",
    [
        (torch.float32, torch.float16, torch.float32),
        (torch.float32, torch.float64, torch.float64),
        (torch.bfloat16, torch.float16, torch.float32),  # neither holds the other
    ],
)
def test_mixed_float_dtypes_convert_to_the_widest(src, tmp_path, rest, one, widest):
    transformers = pytest.importorskip("transformers")
    state = {k: v.to(rest) if v.is_floating_point() else v for k, v in _state(src).items()}
    state[KEY] = state[KEY].to(one)
    safetensors_torch.save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    config, params = _convert(src, tmp_path)
    name = str(widest).removeprefix("torch.")
    assert config["dtype"] == name  # not "mixed", which no torch dtype is called
    assert str(transformers.BertConfig.from_pretrained(tmp_path / "dst").dtype) == str(widest)
    assert {str(v.dtype) for v in params.values()} == {name}
    for key in (KEY, "pooler.dense.weight"):  # widened exactly, the odd one out and the rest
        np.testing.assert_array_equal(params[key], state[key].to(widest).numpy())


@pytest.mark.parametrize("how", ["load", "export", "convert --dtype float32"])
def test_a_float64_value_beyond_float32_is_refused_where_it_would_become_inf(src, tmp_path, capsys, how):
    """float64 -> float32 went unchecked (check_fits only guarded casts to 16 bits): a weight of 1e300 became inf,
    so jaxbert.load computed inf/NaN and export wrote inf into model.safetensors (transformers then gives NaN),
    without a word; transformers 5 runs the checkpoint in float64 and stays finite."""
    state = load_file(src / "model.safetensors")
    state = {k: v.astype(np.float64) for k, v in state.items()}
    state["encoder.layer.0.output.dense.bias"][3] = 1e300
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    why = "encoder/layer/0/output/dense/bias: largest magnitude 1e+300 overflows float32"
    if how == "load":
        with pytest.raises(ValueError, match=re.escape(why)):
            jaxbert.load(str(src))
        return
    args = ["export", src, tmp_path / "dst"] if how == "export" else ["convert", src, tmp_path / "dst"]
    assert main([str(a) for a in args] + ([] if how == "export" else ["--dtype", "float32"])) == 1
    assert why in capsys.readouterr().err
    assert not (tmp_path / "dst").exists()


def test_a_float64_bert2bert_projection_beyond_float32_is_refused(tmp_path):
    """enc_to_dec_proj is held apart from the two sides, whose float64 -> float32 narrowing is checked: a
    projection weight of 1e300 became inf and every cross-attention NaN, without a word."""
    src = tmp_path / "s2s"
    bert2bert_dir(src)
    state = {k: v.astype(np.float64) for k, v in load_file(src / "model.safetensors").items()}
    state["enc_to_dec_proj.weight"][2, 5] = -1e300
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape("enc_to_dec_proj/kernel: largest magnitude 1e+300 overflows")):
        jaxbert.load(str(src))
