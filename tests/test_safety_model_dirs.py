"""What jaxbert reads from a model directory, attacked: configs and generation configs whose values are wrong or odd,
models whose tables are smaller than a tokenizer's output. Each case ends as transformers would end it or in one
line naming the file, key and problem, with nothing written (the tests the other test_safety_*.py files hold are not
repeated here)."""

import json

import pytest
from conftest import model_dir

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
