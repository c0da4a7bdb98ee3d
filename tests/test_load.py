"""`jaxbert.load` on transformers directories: formats, head selection, bad inputs, unsafe pickles."""

import json
import os
import pickle

import numpy as np
import pytest
from conftest import assert_close, hf_model, padded_batch, torch_run

import jaxbert

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One BertForTokenClassification saved as safetensors, as .bin, and as sharded safetensors."""
    hf = hf_model("BertForTokenClassification")
    root = tmp_path_factory.mktemp("ckpt")
    dirs = {}
    for name, kwargs in (
        ("safetensors", {}),
        ("bin", {"safe_serialization": False}),
        ("sharded", {"max_shard_size": "20KB"}),
    ):
        dirs[name] = str(root / name)
        if name == "bin":  # transformers 5 only writes safetensors; write the .bin a 4.x user would have
            hf.config.save_pretrained(dirs[name])
            torch.save(hf.state_dict(), os.path.join(dirs[name], "pytorch_model.bin"))
        else:
            hf.save_pretrained(dirs[name], **kwargs)
    return hf, dirs


@pytest.mark.parametrize("fmt", ["safetensors", "bin", "sharded"])
def test_load_every_format_matches_transformers(saved, fmt):
    hf, dirs = saved
    if fmt == "sharded":
        assert os.path.exists(os.path.join(dirs[fmt], "model.safetensors.index.json"))
    bert = jaxbert.load(dirs[fmt])
    assert bert.head == "BertForTokenClassification"  # from config.json's architectures[0]
    feed = padded_batch(0)
    assert_close(bert(**feed).logits, torch_run(hf, feed).logits.numpy(), fmt)


def test_head_override_and_bfloat16(saved):
    hf, dirs = saved
    base = jaxbert.load(dirs["safetensors"], head="base")
    feed = padded_batch(1)
    out = base(**feed)
    assert out.logits is None and out.pooler_output is None  # a token-classification checkpoint has no pooler
    ref = torch_run(hf, feed, output_hidden_states=True).hidden_states[-1].numpy()
    assert_close(out.last_hidden_state, ref, "base head")
    low = jaxbert.load(dirs["safetensors"], dtype="bfloat16")
    assert low.params["bert"]["embeddings"]["word_embeddings"]["embedding"].dtype == "bfloat16"
    got = np.asarray(low(**feed).logits, np.float32)
    want = torch_run(hf, feed).logits.numpy()
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cos.min() > 0.99


def test_bad_inputs_are_named(saved):
    _, dirs = saved
    bert = jaxbert.load(dirs["safetensors"])
    ids = padded_batch(2)["input_ids"]
    bad = ids.copy()
    bad[1, 4] = 97
    with pytest.raises(ValueError, match=r"token id 97 at position \(1, 4\) is outside \[0, 97\)"):
        bert(bad)
    with pytest.raises(ValueError, match=r"token type id 3 at position \(0, 0\) is outside \[0, 3\)"):
        bert(ids, token_type_ids=np.full_like(ids, 3))
    with pytest.raises(ValueError, match=r"attention_mask shape \(3, 5\) does not match input_ids shape \(3, 11\)"):
        bert(ids, attention_mask=np.ones((3, 5), int))
    with pytest.raises(ValueError, match="sequence length 41 exceeds max_position_embeddings 40"):
        bert(np.ones((1, 41), int))
    with pytest.raises(ValueError, match=r"position id 40 at position \(0, 10\)"):
        bert(ids[:1], position_ids=np.arange(30, 41)[None])
    with pytest.raises(TypeError, match="input_ids must be integers"):
        bert(ids.astype(np.float32))
    with pytest.raises(ValueError, match="unknown head 'BertForRanking'"):
        jaxbert.load(dirs["safetensors"], head="BertForRanking")


def test_the_weights_config_json_names_win_as_in_transformers(tmp_path, saved):
    """transformers 5 loads the file config.json's transformers_weights names in place of model.safetensors;
    jaxbert read model.safetensors beside it, other weights (logits 3.99 apart), without a word."""
    import shutil

    from jaxbert.cli import main

    hf, dirs = saved
    other = hf_model("BertForTokenClassification", initializer_range=0.5)
    other.save_pretrained(tmp_path / "other", max_shard_size="20KB")
    model = tmp_path / "model"
    shutil.copytree(dirs["safetensors"], model)  # model.safetensors: hf's weights
    shutil.copytree(tmp_path / "other", model, ignore=shutil.ignore_patterns("*.json"), dirs_exist_ok=True)
    shutil.copy(tmp_path / "other" / "model.safetensors.index.json", model / "other.safetensors.index.json")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "transformers_weights": "other.safetensors.index.json"}))
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertForTokenClassification.from_pretrained(model).eval()
    feed = padded_batch(0)
    expected = torch_run(other, feed).logits.numpy()
    assert_close(torch_run(reference, feed).logits.numpy(), expected, "transformers itself")
    assert_close(jaxbert.load(model)(**feed).logits, expected, "named weights", atol=1e-4)
    assert main(["convert", str(model), str(tmp_path / "jax")]) == 0  # its own weights: the name is not kept
    assert "transformers_weights" not in (tmp_path / "jax" / "config.json").read_text()
    assert_close(jaxbert.load(tmp_path / "jax")(**feed).logits, expected, "converted", atol=1e-4)
    refused = (
        ("../model.safetensors", "outside the checkpoint"),
        ("pytorch_model.bin", "is not a .safetensors"),
        ("sub/other.safetensors.index.json", "an index outside the root"),
    )
    for name, error in refused:
        (model / "config.json").write_text(json.dumps({**config, "transformers_weights": name}))
        with pytest.raises(ValueError, match=error):
            jaxbert.load(model)


def test_missing_files_are_named(tmp_path, saved):
    _, dirs = saved
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        jaxbert.load(tmp_path)
    (tmp_path / "config.json").write_text(open(os.path.join(dirs["safetensors"], "config.json")).read())
    with pytest.raises(FileNotFoundError, match=r"no weights file found \(looked for model\.safetensors"):
        jaxbert.load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{truncated")
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        jaxbert.load(tmp_path)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_malicious_pickle_is_refused_without_running(tmp_path, saved, writer):
    _, dirs = saved
    (tmp_path / "config.json").write_text(json.dumps(json.load(open(os.path.join(dirs["bin"], "config.json")))))
    payload = {"embeddings.word_embeddings.weight": _Exploit()}
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        torch.save(payload, f) if writer == "torch.save" else pickle.dump(payload, f, protocol=2)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ValueError, match=r"pytorch_model\.bin: refused or unreadable PyTorch checkpoint"):
            jaxbert.load(tmp_path)
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "pwned").exists()
