"""Malformed files end in one line naming the file and the problem, never a traceback: `.bin` files that are not
a tensor dict, deeply nested JSON, a msgpack that is not a map, broken tokenizer files, a config declaring far
more layers than the weights hold, control characters in names, and an interrupted command."""

import json
import os

import numpy as np
import pytest
from conftest import cli_fails, model_dir
from safetensors.numpy import load_file, save_file

from jaxbert.cli import main
from jaxbert.files import MAX_MESSAGE

torch = pytest.importorskip("torch")


@pytest.fixture
def src(tmp_path):
    directory = tmp_path / "src"
    model_dir(directory)
    return directory


def _as_bin(src, content):
    (src / "model.safetensors").unlink()
    torch.save(content, src / "pytorch_model.bin")


@pytest.mark.parametrize(
    "content,why",
    [
        ([torch.zeros(2)], "holds a list, not a dict of tensors"),
        (torch.zeros(2), "holds a Tensor, not a dict of tensors"),
        (
            {"state_dict": {"embeddings.word_embeddings.weight": torch.zeros(2)}},
            "'state_dict' is of type dict, not a tensor (a nested dict: save model.state_dict() itself)",
        ),
        ({0: torch.zeros(2)}, "key 0 is of type int, not a string"),
        ({"embeddings.word_embeddings.weight": 3}, "'embeddings.word_embeddings.weight' is of type int, not a tensor"),
    ],
)
def test_a_bin_that_is_not_a_dict_of_tensors(src, tmp_path, capsys, content, why):
    _as_bin(src, content)
    cli_fails(capsys, tmp_path, "convert", src, match=f"pytorch_model.bin: {why}")


def _deep(n=100_000):
    return "[" * n + "]" * n


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json", "tokenizer_config.json"])
def test_deeply_nested_json_is_one_line(src, tmp_path, capsys, name):
    if name == "model.safetensors.index.json":
        os.rename(src / "model.safetensors", src / "model-1.safetensors")
    (src / name).write_text(f'{{"weight_map": {_deep()}}}' if name.endswith("index.json") else _deep())
    cli_fails(capsys, tmp_path, "convert", src, match=f"{name}: JSON nested too deeply")


def test_deeply_nested_json_lines_are_one_line(src, tmp_path, capsys):
    (tmp_path / "texts.jsonl").write_text('{"text": "fine"}\n' + _deep() + "\n")
    cli_fails(
        capsys,
        tmp_path,
        "embed",
        src,
        "--input",
        tmp_path / "texts.jsonl",
        "--output",
        tmp_path / "e.npy",
        match="texts.jsonl:2: JSON nested too deeply",
    )


def test_json_of_the_wrong_shape(src, tmp_path, capsys):
    (src / "config.json").write_text("[1, 2]")
    cli_fails(capsys, tmp_path, "info", src, match="config.json: expected a JSON object, got array")
    (src / "config.json").write_bytes(b'{"a": "\xff"}')
    cli_fails(capsys, tmp_path, "info", src, match="config.json: not UTF-8 text")


def test_a_msgpack_whose_top_level_is_not_a_map(src, tmp_path, capsys):
    assert main(["convert", str(src), str(tmp_path / "jax")]) == 0
    capsys.readouterr()
    (tmp_path / "jax" / "flax_model.msgpack").write_bytes(b"\x93\x01\x02\x03")  # the array [1, 2, 3]
    cli_fails(capsys, tmp_path, "export", tmp_path / "jax", match="flax_model.msgpack: the top level is a list")


@pytest.mark.parametrize(
    "name,content,why",
    [
        ("tokenizer.json", b'{"version": "1.0", "model": 7}', "tokenizer.json: not a readable tokenizer file"),
        ("tokenizer_config.json", b'{"model_max_length": 0}', "model_max_length=0 must be positive"),
        ("tokenizer_config.json", b'{"model_max_length": "512"}', "model_max_length='512' has the wrong type"),
        ("tokenizer_config.json", b'{"do_lower_case": "yes"}', "do_lower_case='yes' has the wrong type"),
        ("tokenizer_config.json", b'["not", "an", "object"]', "tokenizer_config.json: expected a JSON object"),
        ("vocab.txt", bytes(range(256)) * 40, "vocab.txt: not a readable tokenizer file"),
    ],
)
def test_broken_tokenizer_files_are_named(src, tmp_path, capsys, name, content, why):
    if name != "tokenizer.json":
        (src / "tokenizer.json").unlink()  # so vocab.txt and tokenizer_config.json are what is read
    (src / name).write_bytes(content)
    cli_fails(capsys, tmp_path, "convert", src, match=why)
    (tmp_path / "texts.txt").write_text("hello\n")
    cli_fails(
        capsys, tmp_path, "embed", src, "--input", tmp_path / "texts.txt", "--output", tmp_path / "e.npy", match=why
    )


def test_a_config_declaring_a_million_layers_fails_at_once(src, tmp_path, capsys):
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))
    cli_fails(capsys, tmp_path, "info", src, match="num_hidden_layers=1000000 in the config, but the weights hold 3")


def test_long_messages_are_cut_and_control_characters_shown_not_obeyed(src, tmp_path, capsys):
    state = load_file(src / "model.safetensors")
    state["\x1b[31mred\x1b[0m" + "x" * 5000] = np.zeros(2, np.float32)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    line = cli_fails(capsys, tmp_path, "convert", src, match="unknown key '\\x1b[31mred")
    assert "\x1b" not in line and len(line) < MAX_MESSAGE + 100 and line.endswith("more characters)")


def test_an_interrupted_command_exits_130_in_one_line_and_leaves_nothing(src, tmp_path, capsys, monkeypatch):
    import jaxbert.transfer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jaxbert.transfer, "write_msgpack", interrupted)
    assert main(["convert", str(src), str(tmp_path / "dst")]) == 130
    assert capsys.readouterr().err == "jaxbert convert: interrupted\n"
    assert os.listdir(tmp_path) == ["src"]
