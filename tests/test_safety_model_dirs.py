"""What jaxbert reads from a model directory, attacked: config.json and generation_config.json values that are wrong
or odd, a shard index naming one file two ways, broken files that convert copies verbatim (a tokenizer in an older
sentence-transformers layout, the generation config, the sentence-transformers files), models whose tables are
smaller than convert --verify's batch. Each case ends as transformers would end it or in one line naming the file,
key and problem, with nothing written (what the other test_safety_*.py files test is not repeated here)."""

import json
import os
import shutil

import pytest
from conftest import bert2bert_dir, cli_fails, cli_refuses, legacy_layout, model_dir
from safetensors.numpy import load_file, save_file

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
    directory = shutil.copytree(lm, tmp_path / "lm")
    (directory / "generation_config.json").write_text(json.dumps(settings))
    path = directory / "generation_config.json"
    key, value = next((k, v) for k, v in settings.items() if k != "do_sample")
    length = [] if key == "max_new_tokens" else ["--max-new-tokens=2"]
    cli_fails(capsys, tmp_path, "generate", directory, "hello", *length, match=f"{path}: {why}")
    if key in ("num_beams", "max_new_tokens") and isinstance(value, int):  # as flags: argparse's bounds
        (directory / "generation_config.json").write_text("{}")
        flag = f"--{key.replace('_', '-')}"
        line = cli_refuses(capsys, "generate", directory, "hello", *length, f"{flag}={value}", match=flag)
        assert line.endswith(f"argument {flag}: must be at least 1, got {value}") and str(path) not in line


def test_a_generation_config_s_max_length_beyond_the_positions_is_named(lm, tmp_path, capsys):
    """max_length 10**9 (generation_config.json) was reported as "max_new_tokens 999999998 ... exceeds
    max_position_embeddings 40", a setting no one gave."""
    directory = shutil.copytree(lm, tmp_path / "lm")
    (directory / "generation_config.json").write_text(json.dumps({"max_length": 10**9}))
    why = "max_length 1000000000 (generation_config.json, else config.json) exceeds max_position_embeddings 40"
    cli_fails(capsys, tmp_path, "generate", directory, "hello", match=why)


def test_a_shard_index_naming_one_file_two_ways_loads_as_in_transformers(tmp_path, capsys):
    """An index whose weight_map names one shard as "model-1.safetensors" for some keys and "./model-1.safetensors"
    for others (transformers loads it) was refused: "key ... is also in shard ./model-1.safetensors", the same file
    read twice. A key that two files hold is still refused."""
    src = tmp_path / "src"
    model_dir(src, num_hidden_layers=1)
    state = load_file(src / "model.safetensors")
    os.remove(src / "model.safetensors")
    keys = sorted(state)
    halves = {"model-1.safetensors": keys[::2], "model-2.safetensors": keys[1::2]}
    for name, part in halves.items():
        save_file({k: state[k] for k in part}, src / name, metadata={"format": "pt"})
    weight_map = {k: f"./{name}" if i % 2 else name for name, part in halves.items() for i, k in enumerate(part)}
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    reference = pytest.importorskip("transformers").BertModel.from_pretrained(src).state_dict()
    rc, out, err = _cli(capsys, "convert", src, tmp_path / "jax")
    assert rc == 0, err
    exported = tmp_path / "exported"
    assert _cli(capsys, "export", tmp_path / "jax", exported)[0] == 0
    for key, value in load_file(exported / "model.safetensors").items():
        assert (value == reference[key].numpy()).all(), key
    second = {k: state[k] for k in [keys[0], *halves["model-2.safetensors"]]}  # the first key in both files
    save_file(second, src / "model-2.safetensors", metadata={"format": "pt"})
    cli_fails(capsys, tmp_path, "info", src, match=f"key {keys[0]!r} is also in shard")


def _sentence_dir(directory) -> str:
    """A sentence-transformers directory of a one-layer random BERT: the Transformer at the root, mean pooling."""
    model_dir(directory, num_hidden_layers=1)
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    return str(directory)


@pytest.mark.parametrize(
    "name,content,why",
    [
        ("tokenizer.json", '{"version": "1.0", "model": 7}', "tokenizer.json: not a readable tokenizer file"),
        ("tokenizer_config.json", '{"model_max_length": 0}', "tokenizer_config.json: model_max_length=0 must be"),
    ],
)
def test_convert_checks_the_tokenizer_of_an_older_sentence_transformers_layout(tmp_path, capsys, name, content, why):
    """convert checks the tokenizer it copies (a corrupt one fails there, not at the user's first call), but looked
    for it at the directory's root: a 0_Transformer/ folder's corrupt tokenizer.json was copied, the conversion
    reported as done, and the converted directory's first embed failed on it."""
    legacy = legacy_layout(_sentence_dir(tmp_path / "st"), tmp_path / "legacy")
    with open(os.path.join(legacy, "0_Transformer", name), "w") as f:
        f.write(content)
    capsys.readouterr()  # transformers' progress bars
    cli_fails(capsys, tmp_path, "convert", legacy, match=f"0_Transformer/{why}")


@pytest.mark.parametrize("content,why", [("{broken", "invalid JSON"), ("[1]", "expected a JSON object, got array")])
def test_convert_refuses_a_generation_config_it_cannot_read(lm, tmp_path, capsys, content, why):
    """convert copies generation_config.json verbatim; an unreadable one was copied and the conversion reported as
    done (modules.json or a tokenizer file as broken is refused there), and the converted directory's generate
    failed on it. transformers' generate would not run on it either (GenerationConfig.from_pretrained refuses it)."""
    src = shutil.copytree(lm, tmp_path / "src")
    (src / "generation_config.json").write_text(content)
    cli_fails(capsys, tmp_path, "convert", src, match=f"generation_config.json: {why}")


@pytest.mark.parametrize(
    "name,content,why",
    [
        ("1_Pooling/config.json", "{broken", "1_Pooling/config.json: invalid JSON"),
        ("sentence_bert_config.json", "{broken", "sentence_bert_config.json: invalid JSON"),
        ("config_sentence_transformers.json", "[1]", "config_sentence_transformers.json: expected a JSON object"),
        ("sentence_bert_config.json", '{"max_seq_length": -1}', "max_seq_length -1 is not a positive integer"),
    ],
)
def test_convert_refuses_sentence_transformers_files_it_cannot_read(tmp_path, capsys, name, content, why):
    """convert copies a sentence-transformers directory's files verbatim; a broken Pooling config, settings file or
    prompts file was copied with the conversion reported as done (a broken modules.json was refused there), and
    the converted directory's embed (and SentenceTransformer) failed on it."""
    src = tmp_path / "st"
    _sentence_dir(src)
    (src / name).write_text(content)
    capsys.readouterr()  # transformers' progress bars
    cli_fails(capsys, tmp_path, "convert", src, match=why)


def test_verify_runs_a_bert2bert_whose_decoder_has_fewer_positions_than_its_prompt(tmp_path, capsys):
    """convert --verify fed a bert2bert's reference 5 decoder tokens (the start token and 4 of the input): a decoder
    of 4 positions failed in PyTorch (RuntimeError, a traceback) though the checkpoint is valid. It now reads as
    many as the decoder holds."""
    transformers = pytest.importorskip("transformers")
    src = model_dir(tmp_path / "src")  # the tokenizer files; the weights are replaced below
    sizes = dict(vocab_size=30522, num_hidden_layers=1, intermediate_size=37)
    enc = transformers.BertConfig(hidden_size=32, num_attention_heads=4, max_position_embeddings=40, **sizes)
    dec = transformers.BertConfig(
        hidden_size=24, num_attention_heads=3, is_decoder=True, add_cross_attention=True, max_position_embeddings=4,
        **sizes,
    )  # fmt: skip
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(enc, dec, decoder_start_token_id=101)
    transformers.EncoderDecoderModel(config=config).save_pretrained(src)
    capsys.readouterr()
    rc, out, err = _cli(capsys, "convert", src, tmp_path / "dst", "--verify")
    assert rc == 0, err
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("verify ")]
    assert [line.split()[1] for line in lines] == ["logits", "greedy"] and all(x.endswith(" ok") for x in lines), out


def test_a_vocab_txt_with_a_byte_order_mark_is_named(tmp_path, capsys):
    """A vocab.txt saved with a UTF-8 byte order mark: transformers' BertTokenizer keeps the mark as part of the
    first token ("\\ufeff[PAD]"), so [PAD] is no token of it; jaxbert's refusal named special_tokens_map.json's
    [PAD], not the mark. It names the mark and the file."""
    from transformers import BertTokenizer

    src = tmp_path / "src"
    model_dir(src, num_hidden_layers=1)
    (src / "tokenizer.json").unlink()  # the vocab.txt path
    vocab = src / "vocab.txt"
    vocab.write_bytes(b"\xef\xbb\xbf" + vocab.read_bytes())
    theirs = BertTokenizer(str(vocab))
    assert theirs.convert_tokens_to_ids("\ufeff[PAD]") == 0 and theirs.convert_tokens_to_ids("[PAD]") != 0
    capsys.readouterr()
    why = "vocab.txt: starts with a UTF-8 byte order mark, which would be part of its first token ('[PAD]')"
    cli_fails(capsys, tmp_path, "convert", src, match=why)
