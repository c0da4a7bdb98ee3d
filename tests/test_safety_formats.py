"""Malformed files end in one line naming the file and the problem, never a traceback: `.bin` files that are not
a tensor dict, tensors numpy cannot hold (float8, sparse, meta), safetensors headers declaring huge unknown or
misshapen tensors (refused before any data is read), deeply nested JSON, a msgpack that is not a map, broken
tokenizer files, a config declaring far more layers than the weights hold, control characters in names, and an
interrupted command."""

import json
import os
import struct

import numpy as np
import pytest
from conftest import bert2bert_dir, cli_fails, model_dir
from safetensors.numpy import load_file, save_file

from jaxbert.cli import main
from jaxbert.files import MAX_MESSAGE

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
KEY = "encoder.layer.1.attention.self.query.weight"  # [32, 32] in conftest's sizes


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


@pytest.mark.parametrize(
    "make,why",
    [
        (lambda t: t.to(torch.float8_e4m3fn), "has unsupported dtype float8_e4m3fn (parameters must be float16, "),
        (lambda t: t.to(torch.complex64), "has unsupported dtype complex64"),
        (lambda t: t.to_sparse(), "is a torch.sparse_coo tensor, not a dense one"),
        (lambda t: torch.empty(t.shape, device="meta"), "is a meta tensor: it holds no data"),
    ],
)
def test_a_bin_tensor_numpy_cannot_hold_is_named(src, tmp_path, capsys, make, why):
    state = safetensors_torch.load_file(src / "model.safetensors")
    state[KEY] = make(state[KEY])
    _as_bin(src, state)
    cli_fails(capsys, tmp_path, "convert", src, match=f"pytorch_model.bin: {KEY!r} {why}")


def _declare(path, key, dtype, shape, nbytes):
    """One more tensor in a safetensors header, its data a hole at the end of a sparse file: a header may declare
    gigabytes that cost no disk."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, size = json.loads(raw[8 : 8 + n]), len(raw) - 8 - n
    header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [size, size + nbytes]}
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + raw[8 + n :])
        f.truncate(8 + len(head) + size + nbytes)


def _refuse_reads(monkeypatch, refused=lambda key: True):
    """safetensors files whose tensors named by `refused` cannot be read: what fails must fail from the header."""
    import safetensors

    real = safetensors.safe_open

    class Guarded:
        def __init__(self, *args, **kwargs):
            self.file = real(*args, **kwargs)

        def __enter__(self):
            self.opened = self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def keys(self):
            return self.opened.keys()

        def get_slice(self, key):
            return self.opened.get_slice(key)

        def get_tensor(self, key):
            assert not refused(key), f"{key!r} read before the header was checked"
            return self.opened.get_tensor(key)

    monkeypatch.setattr(safetensors, "safe_open", Guarded)


@pytest.fixture
def header_only(monkeypatch):
    _refuse_reads(monkeypatch)


def _without(path, key):
    state = safetensors_torch.load_file(path)
    del state[key]
    safetensors_torch.save_file(state, path, metadata={"format": "pt"})


@pytest.mark.parametrize(
    "dtype,nbytes",
    [("F8_E4M3", 1024), ("F8_E5M2", 1024), ("F8_E8M0", 1024), ("F6_E2M3", 768), ("F4", 512), ("C64", 8192)],
)
def test_a_safetensors_dtype_numpy_cannot_hold_is_named(src, tmp_path, capsys, header_only, dtype, nbytes):
    _without(src / "model.safetensors", KEY)
    _declare(src / "model.safetensors", KEY, dtype, (32, 32), nbytes)
    why = f"model.safetensors: {KEY!r} has unsupported dtype {dtype} (parameters must be F16, BF16, F32 or F64)"
    cli_fails(capsys, tmp_path, "convert", src, match=why)


@pytest.mark.parametrize("command", ["info", "convert"])
@pytest.mark.parametrize(
    "key,why",
    [
        ("zzz.unknown", "unknown key 'zzz.unknown': not a parameter of BertModel with this config"),
        (KEY, f"{KEY}: shape (1048576, 1024) in the checkpoint, expected (32, 32) from the config"),
    ],
)
def test_a_huge_declared_tensor_is_refused_from_the_header(src, tmp_path, capsys, header_only, command, key, why):
    if key == KEY:
        _without(src / "model.safetensors", KEY)
    _declare(src / "model.safetensors", key, "F32", (2**20, 2**10), 2**32)  # 4 GiB, none of it on disk
    cli_fails(capsys, tmp_path, command, src, match=why)


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


def test_two_msgpack_leaves_for_one_parameter_are_refused(src, tmp_path, capsys):
    """A LayerNorm holding a stray `kernel` beside its `scale` (both are `LayerNorm.weight` once renamed) loaded
    with whichever came last, the stray one's values as the scale, without a word; FlaxBert reads the scale."""
    from jaxbert import load
    from jaxbert.checkpoint import read_msgpack, write_msgpack

    assert main(["convert", str(src), str(tmp_path / "jax")]) == 0
    capsys.readouterr()
    path = tmp_path / "jax" / "flax_model.msgpack"
    tree = read_msgpack(str(path))
    norm = tree["embeddings"]["LayerNorm"]
    norm["kernel"] = np.full_like(norm["scale"], 7.0)
    with open(path, "wb") as f:
        write_msgpack(tree, f)
    why = "duplicate parameter 'embeddings/LayerNorm/kernel': maps to 'embeddings.LayerNorm.weight' like "
    cli_fails(capsys, tmp_path, "info", tmp_path / "jax", match=why + "'embeddings/LayerNorm/scale'")
    with pytest.raises(ValueError, match="duplicate parameter"):
        load(tmp_path / "jax")


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


def test_a_bert2bert_projection_is_refused_from_the_header(tmp_path, capsys, monkeypatch):
    """enc_to_dec_proj's shape is checked before its data is read (it was read whole first, whatever it declared)."""
    src = tmp_path / "s2s"
    bert2bert_dir(src)
    capsys.readouterr()  # transformers' progress bars
    key = "enc_to_dec_proj.weight"
    _without(src / "model.safetensors", key)
    _declare(src / "model.safetensors", key, "F32", (2**20, 2**10), 2**32)  # 4 GiB, none of it on disk
    _refuse_reads(monkeypatch, lambda name: name == key)  # the rest reads as usual
    cli_fails(capsys, tmp_path, "convert", src, match=f"{key}: shape (1048576, 1024), expected (24, 32)")


def test_a_bin_unpacking_to_more_than_its_size_is_refused_before_loading(src, tmp_path, capsys, monkeypatch):
    """A deflated record (torch.save stores them plain) declares 64 MiB in a file of kilobytes: torch.load would
    allocate all of it (a few MB of file, many GB of memory); refused before torch reads any tensor."""
    import zipfile

    _as_bin(src, {"zzz.unknown": torch.zeros(2**24)})
    plain = src / "pytorch_model.bin"
    with zipfile.ZipFile(plain) as old, zipfile.ZipFile(tmp_path / "bomb.bin", "w") as new:
        for info in old.infolist():
            new.writestr(info.filename, old.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp_path / "bomb.bin", plain)
    assert plain.stat().st_size < 2**20
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load ran"))
    cli_fails(capsys, tmp_path, "convert", src, match="pytorch_model.bin: its records unpack to 67,")
