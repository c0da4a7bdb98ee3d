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
from conftest import cli_refuses, hf_model, model_dir
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


@pytest.mark.parametrize(
    "args, match",
    [
        (
            ("embed", "D", "--input", "x.txt", "--output", "x.npy", "--batch-size", 0),
            "--batch-size: must be at least 1, got 0",
        ),
        (
            ("embed", "D", "--input", "x.txt", "--output", "x.npy", "--batch-size", "8.5"),
            "--batch-size: must be an integer, got '8.5'",
        ),
        (
            ("embed", "D", "--input", "x.txt", "--output", "x.npy", "--max-length", -1),
            "--max-length: must be at least 1, got -1",
        ),
        (("fill-mask", "D", "a [MASK]", "--top-k", 0), "--top-k: must be at least 1, got 0"),
        (("answer", "D", "--question", "q", "--context", "c", "--top-k", -2), "--top-k: must be at least 1, got -2"),
        (("generate", "D", "p", "--max-new-tokens", 0), "--max-new-tokens: must be at least 1, got 0"),
        (("generate", "D", "p", "--num-beams", 0), "--num-beams: must be at least 1, got 0"),
        (("generate", "D", "p", "--num-return-sequences", 0), "--num-return-sequences: must be at least 1, got 0"),
        (
            ("generate", "D", "p", "--do-sample", "--temperature", 0),
            "--temperature: must be a finite number > 0, got 0",
        ),
        (
            ("generate", "D", "p", "--do-sample", "--temperature", "nan"),
            "--temperature: must be a finite number > 0, got nan",
        ),
        (("generate", "D", "p", "--do-sample", "--top-k", -1), "--top-k: must be at least 0, got -1"),
        (("generate", "D", "p", "--do-sample", "--top-p", 0), "--top-p: must be a finite number in (0, 1], got 0"),
        (("generate", "D", "p", "--do-sample", "--seed", -1), "--seed: must be in [0, 4294967295], got -1"),
        (("generate", "D", "p", "--do-sample", "--seed", 2**32), "--seed: must be in [0, 4294967295], got 4294967296"),
        (("generate", "D", "p", "--min-new-tokens", -1), "--min-new-tokens: must be at least 0, got -1"),
        (("generate", "D", "p", "--no-repeat-ngram-size", -1), "--no-repeat-ngram-size: must be at least 0, got -1"),
        (
            ("generate", "D", "p", "--repetition-penalty", -1),
            "--repetition-penalty: must be a finite number > 0, got -1",
        ),
        (
            ("generate", "D", "p", "--num-beams", 2, "--length-penalty", "inf"),
            "--length-penalty: must be a finite number, got inf",
        ),
        (
            ("predict", "D", "--input", "x.txt", "--output", "x.jsonl", "--batch-size", 0),
            "--batch-size: must be at least 1, got 0",
        ),
        (
            ("evaluate", "D", "--task", "seq2seq", "--file", "x.jsonl", "--batch-size", 0),
            "--batch-size: must be at least 1, got 0",
        ),
        (
            ("evaluate", "D", "--task", "seq2seq", "--file", "x.jsonl", "--num-beams", 0),
            "--num-beams: must be at least 1, got 0",
        ),
    ],
)
def test_flags_out_of_fixed_bounds_are_refused_by_argparse(capsys, args, match):
    """The inference subcommands passed --batch-size 0, --top-k 0, --max-new-tokens 0, ... to the library, whose
    error named its argument ('batch_size 0: must be ≥ 1'), not the flag typed; a bound that does not depend on the
    model is argparse's now, before the model loads (D need not exist)."""
    cli_refuses(capsys, *args, match=f"argument {match}")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_flags")
    heads = {"BertForMaskedLM": {}, "BertForQuestionAnswering": {"num_labels": 2}, "BertForSequenceClassification": {}}
    dirs = {head: model_dir(root / head, head, max_position_embeddings=64, **kw) for head, kw in heads.items()}
    dirs["lm"] = model_dir(root / "lm", "BertLMHeadModel", is_decoder=True, num_hidden_layers=1)
    (root / "in.txt").write_text("a text\nanother text\n")
    return root, dirs


def test_bounds_of_the_model_are_named_by_their_flag(models, capsys, tmp_path):
    """Bounds the model sets (its positions, its vocabulary, the beams) and the library's other errors about an
    argument spoke in its Python names ('max_length 999: must be in [1, 64]', 'question must be a non-empty
    string', 'do_sample=True with num_beams=2'); they name the flag now."""
    root, d = models
    embed = ("embed", d["BertForMaskedLM"], "--input", root / "in.txt", "--output", tmp_path / "out.npy")
    fails(capsys, tmp_path, *embed, "--max-length", 999, match="error: --max-length 999: must be in [1, 64]")
    fails(capsys, tmp_path, *embed, "--max-length", 1, match="error: --max-length 1: too short for the 2 special")
    assert not (tmp_path / "out.npy").exists()
    mlm = ("fill-mask", d["BertForMaskedLM"])
    fails(capsys, tmp_path, *mlm, "a [MASK]", "--top-k", 99999, match="error: --top-k 99999: must be in [1, 30522]")
    # numbered as the output's "text N:" headers, from 1
    fails(capsys, tmp_path, *mlm, "a [MASK]", "no mask", match="error: no [MASK] in text 2: 'no mask'")
    qa = ("answer", d["BertForQuestionAnswering"])
    fails(capsys, tmp_path, *qa, "--question", " ", "--context", "c", match="error: --question must be a non-empty")
    fails(capsys, tmp_path, *qa, "--question", "q", "--context", "", match="error: --context must be a non-empty")
    fails(capsys, tmp_path, *qa, "--question", "q\udcff", "--context", "c", match="error: --question 'q\\udcff': not")
    lm = ("generate", d["lm"], "hello")
    fails(
        capsys,
        tmp_path,
        *lm,
        "--num-beams",
        2,
        "--num-return-sequences",
        3,
        match="error: --num-return-sequences 3: must be in [1, 2]",
    )
    fails(capsys, tmp_path, *lm, "--num-return-sequences", 2, match="error: --num-return-sequences 2: greedy search")
    fails(capsys, tmp_path, *lm, "--do-sample", "--num-beams", 2, match="error: --do-sample with --num-beams 2: beam")
    predict = ("predict", d["BertForSequenceClassification"], "--input", root / "in.txt")
    predict += ("--output", tmp_path / "out.jsonl")
    fails(capsys, tmp_path, *predict, "--max-seq-length", 1, match="error: --max-seq-length 1: too short for the 2")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_users_text_quoted_in_an_error_keeps_its_words(models, capsys, tmp_path):
    """The flags were found in the library's message by regular expression: a text quoted in it that mentions an
    argument with the flag's value was re-worded too ('no [MASK] in text: 'keep --top-k 5 words'', fill-mask's
    --top-k being 5 by default). The flag now replaces the argument the error names, never the text."""
    _, d = models
    mlm = ("fill-mask", d["BertForMaskedLM"])
    fails(capsys, tmp_path, *mlm, "keep top_k 5 words", match="error: no [MASK] in text: 'keep top_k 5 words'")
    fails(capsys, tmp_path, *mlm, "a [MASK]", "top_k 5 here", match="error: no [MASK] in text 2: 'top_k 5 here'")
    qa = ("answer", d["BertForQuestionAnswering"], "--context", "c")
    match = "error: --question 'top_k 1 \\udcff': not valid Unicode"  # --top-k is 1 by default
    fails(capsys, tmp_path, *qa, "--question", "top_k 1 \udcff", match=match)
    # fill-mask's "text N" (from 1) and answer's windows were re-worded by regular expression too
    fails(capsys, tmp_path, *mlm, "a [MASK]", "see text[0]", match="error: no [MASK] in text 2: 'see text[0]'")
    window = "in max_seq_len 5 with doc_stride 3 \udcff"
    match = "error: --question 'in max_seq_len 5 with doc_stride 3 \\udcff': not valid Unicode"
    fails(capsys, tmp_path, *qa, "--question", window, match=match)


def test_only_the_flags_own_values_are_reworded():
    """A value a file set keeps its words (the flag did not set it); a flag's value and the advice to pass an
    argument name the flag."""
    from argparse import Namespace

    from jaxbert.cli_flags import as_flags
    from jaxbert.config import BertConfig
    from jaxbert.generate_options import FileSettings, resolve
    from jaxbert.inputs import Arg, ArgumentError

    flags = {"max_new_tokens": "--max-new-tokens", "num_beams": "--num-beams", "top_k": "--top-k"}
    args = Namespace(max_new_tokens=None, num_beams=2, top_k=5)

    def reworded(*parts):
        with pytest.raises(ArgumentError) as e, as_flags(args, flags):
            raise ArgumentError(*parts)
        return str(e.value)

    unset = "max_new_tokens: unset, so transformers' default 20, but the prompt 30 + 20 exceeds 40; pass max_new_tokens"
    why = ": unset, so transformers' default 20, but the prompt 30 + 20 exceeds 40; pass "
    flagged = unset.replace("max_new_tokens", "--max-new-tokens")
    assert reworded(Arg("max_new_tokens"), why, Arg("max_new_tokens")) == flagged
    settings = FileSettings(num_beams=0)  # a value from generation_config.json: named by the file
    settings.path = "dir/generation_config.json"
    with pytest.raises(ArgumentError) as e, as_flags(args, flags):
        resolve(BertConfig(), settings, {})
    assert str(e.value) == "dir/generation_config.json: num_beams 0: must be ≥ 1"
    assert reworded(Arg.showing("num_beams", 3), ": must be in [1, 2]") == "num_beams 3: must be in [1, 2]"  # not 2
    assert reworded(Arg.showing("top_k", 50), ": must be in [1, 40]") == "top_k 50: must be in [1, 40]"
    assert reworded(Arg.showing("top_k", 5), ": must be in [1, 4]") == "--top-k 5: must be in [1, 4]"


def test_answer_names_its_windows_without_flags_it_does_not_have(models, capsys, tmp_path):
    """A question leaving the context no room was 'question (N tokens ...) ... in max_seq_len 64 with doc_stride 32':
    arguments of Bert.answer that `jaxbert answer` has no flags for."""
    _, d = models
    line = fails(
        capsys,
        tmp_path,
        "answer",
        d["BertForQuestionAnswering"],
        "--question",
        "who " * 70,
        "--context",
        "me " * 80,
        match="error: --question (72 tokens with [CLS] and [SEP]) leaves too little room for the context in windows of "
        "64 tokens, stride 32 (room for 0 context tokens",
    )
    assert "max_seq_len" not in line and "doc_stride" not in line


def test_verify_refuses_relative_positions_only_where_transformers_dropped_them(tmp_path, capsys, monkeypatch):
    """relative_key was refused whatever transformers was installed, naming transformers 5's removal even under
    transformers 4.57, which runs it (and pruned heads): the refusal is transformers 5's only."""
    import jaxbert.verify

    transformers = pytest.importorskip("transformers")
    golden = os.path.join(os.path.dirname(__file__), "fixtures", "golden", "relative_key")
    if int(transformers.__version__.split(".")[0]) >= 5:
        fails(capsys, tmp_path, "convert", golden, "--verify", match="relative position embeddings / pruned heads")
    reached = "the reference was built"

    def reference(*args):
        raise ValueError(reached)

    monkeypatch.setattr(transformers, "__version__", "4.57.6")
    monkeypatch.setattr(jaxbert.verify, "_reference", reference)
    fails(capsys, tmp_path, "convert", golden, "--verify", match=reached)
