"""What jaxbert reads from a model directory, attacked: configs and generation configs whose values are wrong or odd,
models whose tables are smaller than a tokenizer's output. Each case ends as transformers would end it or in one
line naming the file, key and problem, with nothing written (the tests the other test_safety_*.py files hold are not
repeated here)."""

import json

import pytest
from conftest import bert2bert_dir, cli_fails, model_dir

from jaxbert.cli import main

torch = pytest.importorskip("torch")


def _cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return rc, out, err


@pytest.mark.parametrize("sizes", [{"type_vocab_size": 1}, {"max_position_embeddings": 8}])
def test_verify_runs_models_whose_tables_the_tokenized_pairs_do_not_fit(tmp_path, capsys, sizes):
    """convert --verify fed PyTorch's reference the tokenizer's sentence pairs as they came: token type 1 for a
    model with one token type (IndexError in the reference's embedding), 18 positions for a model with 8
    (RuntimeError), a traceback either way and no conversion. Such a model is verified on the deterministic random
    batch, as one whose vocabulary the tokenizer overruns already was."""
    src = model_dir(tmp_path / "src", num_hidden_layers=1, **sizes)
    rc, out, err = _cli(capsys, "convert", src, tmp_path / "dst", "--verify")
    assert rc == 0, err
    assert "verify last_hidden_state" in out and "verify pooler_output" in out
    assert all(line.endswith(" ok") for line in out.splitlines() if line.strip().startswith("verify ")), out
    assert json.loads((tmp_path / "dst" / "config.json").read_text())[next(iter(sizes))] == next(iter(sizes.values()))


def _edit(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("value", ["EncoderDecoderModel", 5, [5]])
def test_a_bert2bert_s_architectures_must_be_a_list_of_class_names(tmp_path, capsys, value):
    """A bert2bert config.json's architectures "EncoderDecoderModel" (a string, which transformers keeps as it is)
    was taken apart: convert wrote ["E", "n", "c", ...] into the new config.json; 5 failed as "'int' object is not
    iterable" and [5] was written back. Refused as BertConfig refuses them, naming the file and key."""
    src = tmp_path / "src"
    bert2bert_dir(src)
    _edit(src / "config.json", architectures=value)
    capsys.readouterr()  # transformers' progress bars
    why = f"config.json: EncoderDecoderConfig.architectures={value!r}: must be a list of class names"
    cli_fails(capsys, tmp_path, "convert", src, match=why)
    cli_fails(capsys, tmp_path, "info", src, match=why)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("lm"), "BertLMHeadModel", is_decoder=True, num_hidden_layers=1)


@pytest.mark.parametrize(
    "settings,why",
    [
        ({"num_beams": 0}, "num_beams 0: must be ≥ 1"),
        ({"num_beams": "2"}, "num_beams must be an integer, got str '2'"),
        ({"do_sample": True, "temperature": float("nan")}, "temperature nan: must be in (0.0, inf)"),
        ({"eos_token_id": [7, 10**6]}, "eos_token_id [7, 1000000]: token ids must be integers in [0, vocab_size="),
        ({"max_new_tokens": -3}, "max_new_tokens -3: must be ≥ 1"),
    ],
)
def test_a_generation_config_s_bad_value_is_named_with_its_file(lm, tmp_path, capsys, settings, why):
    """A bad value of generation_config.json was reported as "num_beams 0: must be ≥ 1", as if an argument had set
    it: no argument had, and the message did not say which file had. It now starts with the file; the same value
    given as an argument is reported as before, without the file."""
    import shutil

    directory = tmp_path / "lm"
    shutil.copytree(lm, directory)
    (directory / "generation_config.json").write_text(json.dumps(settings))
    path = directory / "generation_config.json"
    key, value = next((k, v) for k, v in settings.items() if k != "do_sample")
    length = [] if key == "max_new_tokens" else ["--max-new-tokens=2"]
    cli_fails(capsys, tmp_path, "generate", directory, "hello", *length, match=f"{path}: {why}")
    if key in ("num_beams", "max_new_tokens") and isinstance(value, int):
        (directory / "generation_config.json").write_text("{}")
        flag = f"--{key.replace('_', '-')}={value}"
        line = cli_fails(capsys, tmp_path, "generate", directory, "hello", *length, flag, match=why)
        assert str(path) not in line


def test_a_generation_config_s_max_length_beyond_the_positions_is_named(lm, tmp_path, capsys):
    """max_length 10**9 (generation_config.json) was reported as "max_new_tokens 999999998 ... exceeds
    max_position_embeddings 40", a setting no one gave."""
    import shutil

    directory = tmp_path / "lm"
    shutil.copytree(lm, directory)
    (directory / "generation_config.json").write_text(json.dumps({"max_length": 10**9}))
    why = "max_length 1000000000 (generation_config.json, else config.json) exceeds max_position_embeddings 40"
    cli_fails(capsys, tmp_path, "generate", directory, "hello", match=why)
