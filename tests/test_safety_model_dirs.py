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
