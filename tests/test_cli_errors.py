"""Every expected error of convert / export / info: one line on stderr naming the problem, exit status 1,
no traceback, and nothing left on disk (neither DST nor a partial temporary directory)."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import cli_fails as fails
from conftest import hf_model
from safetensors.numpy import load_file, save_file

from jaxbert.cli import main

torch = pytest.importorskip("torch")


@pytest.fixture
def src(tmp_path):
    """A valid transformers BertForMaskedLM directory to break in various ways."""
    model = hf_model("BertForMaskedLM")
    model.save_pretrained(tmp_path / "src")
    return tmp_path / "src"


def _rewrite(src, change):
    state = load_file(src / "model.safetensors")
    change(state)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})


def test_src_missing(tmp_path, capsys):
    fails(capsys, tmp_path, "convert", tmp_path / "nowhere", match="nowhere: no such directory")


def test_config_missing_or_invalid(src, tmp_path, capsys):
    (src / "config.json").write_text("{oops")
    fails(capsys, tmp_path, "convert", src, match="config.json: invalid JSON")
    (src / "config.json").write_text('{"hidden_size": ' + "7" * 5000 + "}")  # past Python's int digits limit
    fails(capsys, tmp_path, "convert", src, match="config.json: unreadable JSON (Exceeds the limit (4300 digits)")
    (src / "config.json").unlink()
    fails(capsys, tmp_path, "convert", src, match="config.json: config.json not found")


def test_no_weights_file_lists_what_was_looked_for(src, tmp_path, capsys):
    (src / "model.safetensors").unlink()
    fails(
        capsys,
        tmp_path,
        "convert",
        src,
        match="no weights file found (looked for model.safetensors, model.safetensors.index.json, pytorch_model.bin",
    )


def test_truncated_safetensors_leaves_no_dst(src, tmp_path, capsys):
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    fails(capsys, tmp_path, "convert", src, match="model.safetensors: not a readable safetensors file")


def test_corrupt_msgpack(src, tmp_path, capsys):
    assert main(["convert", str(src), str(tmp_path / "jax")]) == 0
    path = tmp_path / "jax" / "flax_model.msgpack"
    path.write_bytes(path.read_bytes()[:5000])
    capsys.readouterr()
    fails(capsys, tmp_path, "export", tmp_path / "jax", match="flax_model.msgpack: not a readable flax msgpack file")
    fails(capsys, tmp_path, "info", tmp_path / "jax", match="flax_model.msgpack: not a readable flax msgpack file")


def test_shape_mismatch_names_key_and_both_shapes(src, tmp_path, capsys):
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    fails(
        capsys,
        tmp_path,
        "convert",
        src,
        match="bert.encoder.layer.0.intermediate.dense.bias: shape (44,) in the checkpoint, expected (48,)",
    )


def test_unknown_and_missing_keys_are_named(src, tmp_path, capsys):
    _rewrite(src, lambda s: s.update({"bert.encoder.layer.0.attention.self.rotary.weight": np.zeros(2, np.float32)}))
    fails(capsys, tmp_path, "convert", src, match="unknown key 'bert.encoder.layer.0.attention.self.rotary.weight'")
    _rewrite(
        src,
        lambda s: (
            s.pop("bert.encoder.layer.0.attention.self.rotary.weight"),
            s.pop("bert.encoder.layer.2.output.LayerNorm.weight"),
        ),
    )
    fails(
        capsys,
        tmp_path,
        "convert",
        src,
        match="missing keys for BertForMaskedLM: bert.encoder.layer.2.output.LayerNorm.weight",
    )


def test_other_model_type_is_not_supported_yet(src, tmp_path, capsys):
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    fails(capsys, tmp_path, "convert", src, match="model_type='roberta': only 'bert' is supported yet")


def test_existing_dst_is_refused_unless_forced(src, tmp_path, capsys):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("mine")
    assert main(["convert", str(src), str(tmp_path / "dst")]) == 1
    assert "already exists (use --force to replace it)" in capsys.readouterr().err
    assert (tmp_path / "dst" / "keep.txt").read_text() == "mine"
    assert main(["convert", str(src), str(tmp_path / "dst"), "--force"]) == 0
    assert sorted(os.listdir(tmp_path / "dst")) == ["config.json", "flax_model.msgpack"]
    assert main(["export", str(tmp_path / "dst"), str(tmp_path / "dst")]) == 1


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_malicious_pickle_is_refused_and_nothing_runs(src, tmp_path, capsys, monkeypatch):
    (src / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": _Exploit()}, src / "pytorch_model.bin")
    monkeypatch.chdir(tmp_path)
    fails(capsys, tmp_path, "convert", src, match="pytorch_model.bin: refused or unreadable PyTorch checkpoint")
    assert not (tmp_path / "pwned").exists()
    with open(src / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": _Exploit()}, f)
    fails(capsys, tmp_path, "convert", src, match="refused or unreadable PyTorch checkpoint")
    assert not (tmp_path / "pwned").exists()


def _run(*args, block_torch=False):
    code = (
        "import sys; sys.modules['torch'] = None; " if block_torch else ""
    ) + "from jaxbert.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", "import sys\n" + code, *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_bin_without_torch_names_the_extra(src, tmp_path):
    model = hf_model("BertForMaskedLM")
    (src / "model.safetensors").unlink()
    torch.save(model.state_dict(), src / "pytorch_model.bin")
    proc = _run("convert", src, tmp_path / "dst", block_torch=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"jaxbert convert: error: {src / 'pytorch_model.bin'}: reading .bin checkpoints "
        "needs torch: pip install 'jaxbert[torch]'"
    )
    assert not (tmp_path / "dst").exists()


def test_module_entry_point_exit_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jaxbert", "info", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "config.json not found" in proc.stderr


def test_sigterm_during_convert_exits_143_and_leaves_nothing(src, tmp_path, capsys, monkeypatch):
    """SIGTERM (`kill`, `timeout`, `docker stop`) while DST is being written: the temporary directory is removed as
    for Ctrl-C, one line, exit 128 + 15; the process's SIGTERM handler is what it was before."""
    import jaxbert.transfer

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs here
        raise AssertionError("SIGTERM did not stop the write")

    monkeypatch.setattr(jaxbert.transfer, "write_msgpack", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["convert", str(src), str(tmp_path / "dst")]) == 143
    assert capsys.readouterr().err == "jaxbert convert: terminated\n"
    assert os.listdir(tmp_path) == ["src"]  # neither DST nor .dst.*.partial
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(
    "change, match",
    [
        # transformers 5's strict config fields, and its reading of dtype as a torch attribute
        (
            {"use_cache": "yes"},
            "refuses {src}/config.json (StrictDataclassFieldValidationError: Validation error for "
            "field 'use_cache': TypeError: Field 'use_cache' expected bool",
        ),
        ({"dtype": "auto"}, "refuses {src}/config.json (AttributeError: module 'torch' has no attribute 'auto')"),
        ({"dtype": 5}, "cannot load {src} (AttributeError: 'int' object has no attribute 'is_floating_point')"),
        # taken unchecked, failing in the forward
        ({"output_hidden_states": "x"}, "'s BertForMaskedLM fails to run {src} (TypeError: '<=' not supported"),
    ],
)
def test_verify_names_what_transformers_refuses(src, tmp_path, capsys, change, match):
    """convert --verify printed a traceback (and exited through it) where transformers refused the source's config or
    could not build or run the model: it is one line naming transformers' reason, and DST is not written."""
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    transformers = pytest.importorskip("transformers")
    line = fails(capsys, tmp_path, "convert", src, "--verify", match=match.format(src=src))
    assert line.startswith(f"jaxbert convert: error: --verify: transformers {transformers.__version__}")


def test_verify_names_a_transformers_that_fails_to_import(src, tmp_path, capsys, monkeypatch):
    """transformers installed but failing on import (e.g. built for another torch) was a traceback; missing, it
    already named the extra."""
    import builtins

    real = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "transformers":
            raise RuntimeError("Failed to import transformers.modeling_utils")
        return real(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "transformers")
    monkeypatch.setattr(builtins, "__import__", broken)
    fails(
        capsys,
        tmp_path,
        "convert",
        src,
        "--verify",
        match="--verify needs torch and transformers, and importing them failed (RuntimeError: Failed to import "
        "transformers.modeling_utils)",
    )
    monkeypatch.setattr(builtins, "__import__", real)
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    fails(capsys, tmp_path, "convert", src, "--verify", match="--verify needs torch and transformers: pip install")
