"""`jaxbert convert` / `export` / `info`: every head and format, the round trip, and every expected error."""

import json
import os

import jax
import numpy as np
import pytest
from conftest import SIZES, assert_close, hf_model, padded_batch, state_dict, torch_run
from flax import serialization
from safetensors.numpy import load_file, save_file

import jaxbert
from jaxbert.cli import main
from jaxbert.train.task_init import task_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden")


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _bf16(x) -> np.ndarray:
    """float32 `x` rounded to nearest bfloat16 (ties to even), as float32: what a bfloat16 convert keeps."""
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _hf(head):
    return hf_model(head, **({"num_labels": 2} if head == "BertForQuestionAnswering" else {}))


def _feed(head):
    feed = padded_batch(0)
    return {k: v[None] for k, v in feed.items()} if head == "BertForMultipleChoice" else feed


def _compare(bert, hf, head):
    expected = torch_run(hf, _feed(head))
    got = bert(**_feed(head))
    fields = [
        f
        for f in (
            "last_hidden_state",
            "pooler_output",
            "logits",
            "prediction_logits",
            "seq_relationship_logits",
            "start_logits",
            "end_logits",
        )
        if expected.get(f) is not None
    ]
    for field in fields:
        assert_close(got[field], expected[field].numpy(), field)
    return fields


@pytest.mark.parametrize("head", jaxbert.HEADS)
def test_convert_every_head_matches_transformers(head, tmp_path, capsys):
    hf = _hf(head)
    hf.save_pretrained(tmp_path / "src")
    rc, out, err = cli(capsys, "convert", tmp_path / "src", tmp_path / "dst")
    assert rc == 0, err
    assert f"head {head}" in out and "parameters stored as float32" in out
    assert {"config.json", "flax_model.msgpack"} <= set(os.listdir(tmp_path / "dst"))
    config = json.load(open(tmp_path / "dst" / "config.json"))
    assert config["architectures"] == [head] and config["dtype"] == "float32"
    assert _compare(jaxbert.load(tmp_path / "dst"), hf, head)


def _write_sharded_bin(sd, directory):
    os.makedirs(directory)
    keys = sorted(sd)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        name = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({k: torch.from_numpy(sd[k]) for k in part}, os.path.join(directory, name))
        weight_map.update({k: name for k in part})
    with open(os.path.join(directory, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


@pytest.mark.parametrize("fmt", ["bin", "sharded_safetensors", "sharded_bin"])
def test_convert_every_pytorch_format(fmt, tmp_path, capsys):
    hf = hf_model("BertForMaskedLM")
    hf.config.architectures = ["BertForMaskedLM"]  # as save_pretrained writes it
    src = tmp_path / "src"
    if fmt == "sharded_safetensors":
        hf.save_pretrained(src, max_shard_size="30KB")
        assert (src / "model.safetensors.index.json").exists()
    elif fmt == "sharded_bin":
        _write_sharded_bin(state_dict(hf), src)
        hf.config.save_pretrained(src)
    else:
        hf.config.save_pretrained(src)
        torch.save(hf.state_dict(), src / "pytorch_model.bin")
    rc, out, err = cli(capsys, "convert", src, tmp_path / "dst")
    assert rc == 0, err
    assert "absent: pooler" in out  # an MLM checkpoint has none
    _compare(jaxbert.load(tmp_path / "dst"), hf, "BertForMaskedLM")


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForPreTraining"])
def test_convert_transformers_4_flax_msgpack(head, tmp_path, capsys):
    src = os.path.join(GOLDEN, f"flax_{head}")
    rc, out, err = cli(capsys, "convert", src, tmp_path / "dst")
    assert rc == 0, err and "read flax_model.msgpack" in out
    data = np.load(os.path.join(src, "io.npz"))
    got = jaxbert.load(tmp_path / "dst")(**{k[3:]: data[k] for k in data.files if k.startswith("in.")})
    outputs = [k for k in data.files if k.startswith("out.")]
    assert outputs
    for key in outputs:
        assert_close(got[key[4:]], data[key], key)


def _paths_and_shapes(path):
    tree = serialization.msgpack_restore(open(path, "rb").read())
    return {jax.tree_util.keystr(p): np.shape(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_converted_msgpack_has_flaxberts_exact_tree(tmp_path, capsys):
    """Same paths and shapes as the msgpack transformers 4.57's FlaxBertForPreTraining wrote."""
    reference = os.path.join(GOLDEN, "flax_BertForPreTraining")
    hf = hf_model(
        "BertForPreTraining",
        **{
            k: v
            for k, v in json.load(open(os.path.join(reference, "config.json"))).items()
            if k
            in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
                "type_vocab_size",
            )
        },
    )
    hf.save_pretrained(tmp_path / "src")
    assert cli(capsys, "convert", tmp_path / "src", tmp_path / "dst")[0] == 0
    ours = _paths_and_shapes(tmp_path / "dst" / "flax_model.msgpack")
    assert ours == _paths_and_shapes(os.path.join(reference, "flax_model.msgpack"))


def test_convert_export_round_trip_equals_original(tmp_path, capsys):
    hf = hf_model("BertForPreTraining")
    hf.save_pretrained(tmp_path / "src")
    assert cli(capsys, "convert", tmp_path / "src", tmp_path / "jax")[0] == 0
    rc, out, err = cli(capsys, "export", tmp_path / "jax", tmp_path / "pt")
    assert rc == 0, err
    back, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "pt", output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    original = load_file(tmp_path / "src" / "model.safetensors")
    exported = load_file(tmp_path / "pt" / "model.safetensors")
    assert set(exported) == set(original)
    for key in original:
        assert np.array_equal(exported[key], original[key]), key
    feed = padded_batch(1)
    assert_close(torch_run(back.eval(), feed).prediction_logits.numpy(), torch_run(hf, feed).prediction_logits.numpy())


def test_an_mlm_tagged_pretraining_checkpoint_keeps_its_pooler_and_nsp(tmp_path, capsys):
    """bert-base-uncased's layout: BertForPreTraining's weights under architectures ["BertForMaskedLM"]. convert
    dropped the pooler and the NSP classifier, so a classifier fine-tuned from the converted directory started
    from a new pooler where transformers' from the original starts from the pretrained one."""
    hf = hf_model("BertForPreTraining")
    hf.save_pretrained(tmp_path / "src")
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    (tmp_path / "src" / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    rc, out, _ = cli(capsys, "convert", tmp_path / "src", tmp_path / "jax", "--dtype", "bfloat16")
    assert rc == 0 and "head BertForMaskedLM" in out
    assert "ignored bert.pooler.dense.weight: not used by BertForMaskedLM; kept in the output" in out
    tree = serialization.msgpack_restore((tmp_path / "jax" / "flax_model.msgpack").read_bytes())
    assert set(tree["cls"]) == {"predictions", "seq_relationship"} and "pooler" in tree["bert"]
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(tree)} == {"bfloat16"}
    # Read back as transformers reads the original: the MLM head by default, the pooler for a base model.
    assert jaxbert.load(str(tmp_path / "jax")).head == "BertForMaskedLM"
    base = jaxbert.load(str(tmp_path / "jax"), head="BertModel", dtype="float32")
    reference = transformers.BertModel.from_pretrained(tmp_path / "src", attn_implementation="eager").eval()
    with torch.no_grad():  # the weights the bfloat16 directory holds, computed in float32 as `base` computes them
        for p in reference.parameters():
            p.copy_(torch.from_numpy(_bf16(p.numpy())))
    expected = torch_run(reference, _feed(""))
    assert_close(base(**_feed(""))["pooler_output"], expected["pooler_output"].numpy())
    params, notes = task_params(
        str(tmp_path / "jax"),
        jaxbert.BertConfig.from_dict({**SIZES, "num_labels": 2}),
        "BertForSequenceClassification",
        seed=0,
    )
    assert not any("pooler" in note for note in notes)
    assert np.array_equal(
        np.asarray(params["bert"]["pooler"]["dense"]["bias"]),
        np.asarray(tree["bert"]["pooler"]["dense"]["bias"], np.float32),
    )
    assert cli(capsys, "export", tmp_path / "jax", tmp_path / "pt")[0] == 0
    exported = load_file(tmp_path / "pt" / "model.safetensors")
    original = load_file(tmp_path / "src" / "model.safetensors")
    assert set(exported) == set(original)
    for key in ("bert.pooler.dense.weight", "cls.seq_relationship.weight", "cls.seq_relationship.bias"):
        np.testing.assert_array_equal(np.asarray(exported[key], np.float32), _bf16(original[key]), err_msg=key)


def test_export_of_relative_positions_says_transformers_5_reads_them_wrong(tmp_path, capsys):
    """transformers 5 loads an exported relative-position model without a word (distance_embedding listed as
    unexpected) and attends absolutely: other outputs. export says so; an absolute model gets no note."""
    rc, out, err = cli(capsys, "export", os.path.join(GOLDEN, "relative_key"), tmp_path / "pt")
    assert rc == 0, err
    assert "note: position_embedding_type relative_key: transformers 5 has no relative position" in out, out
    io = np.load(os.path.join(GOLDEN, "relative_key", "io.npz"))
    feed = {k: io[f"in.{k}"] for k in ("input_ids", "attention_mask", "token_type_ids")}
    want = io["out.prediction_logits"]  # transformers 4.57's, which reads relative positions
    back = transformers.BertForPreTraining.from_pretrained(tmp_path / "pt", attn_implementation="eager").eval()
    assert np.abs(torch_run(back, feed).prediction_logits.numpy() - want).max() > 1e-2  # what the note warns of
    assert_close(np.asarray(jaxbert.load(tmp_path / "pt")(**feed).prediction_logits), want, atol=1e-4)
    hf_model("BertModel").save_pretrained(tmp_path / "abs")
    rc, out, err = cli(capsys, "export", tmp_path / "abs", tmp_path / "abs_pt")
    assert rc == 0 and "note:" not in out, out


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForPreTraining", "BertLMHeadModel"])
def test_an_untied_decoder_keeps_its_bias_through_export(head, tmp_path, capsys):
    """With tie_word_embeddings=false, transformers 5's decoder has a bias of its own (not tied to
    cls.predictions.bias): an export without cls.predictions.decoder.bias loaded with that bias zeroed."""
    hf = hf_model(head, tie_word_embeddings=False, is_decoder=head == "BertLMHeadModel")
    with torch.no_grad():
        hf.cls.predictions.bias.normal_()
        hf.cls.predictions.decoder.bias.copy_(hf.cls.predictions.bias)
    hf.save_pretrained(tmp_path / "src")
    assert cli(capsys, "convert", tmp_path / "src", tmp_path / "jax")[0] == 0
    assert cli(capsys, "export", tmp_path / "jax", tmp_path / "pt")[0] == 0
    back, info = getattr(transformers, head).from_pretrained(tmp_path / "pt", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    field = "prediction_logits" if head == "BertForPreTraining" else "logits"
    feed = padded_batch(1)
    assert_close(torch_run(back.eval(), feed)[field].numpy(), torch_run(hf, feed)[field].numpy())


def test_a_head_trained_untied_in_transformers_5_reads_its_decoders_bias(tmp_path, capsys):
    """transformers 5 trains an untied head's decoder bias and leaves cls.predictions.bias at its zeros; both are
    saved. jaxbert refused the directory ('duplicate key'); it now applies the decoder's, as transformers 5 does,
    through convert and export too."""
    hf = hf_model("BertForMaskedLM", tie_word_embeddings=False)
    with torch.no_grad():
        hf.cls.predictions.decoder.bias.normal_()
        hf.cls.predictions.bias.zero_()
    hf.save_pretrained(tmp_path / "src")
    stored = load_file(tmp_path / "src" / "model.safetensors")
    assert {"cls.predictions.bias", "cls.predictions.decoder.bias"} <= set(stored)
    feed = padded_batch(1)
    want = torch_run(hf, feed).logits.numpy()
    assert_close(np.asarray(jaxbert.load(tmp_path / "src")(**feed).logits), want)
    assert cli(capsys, "convert", tmp_path / "src", tmp_path / "jax")[0] == 0
    assert cli(capsys, "export", tmp_path / "jax", tmp_path / "pt")[0] == 0
    back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "pt").eval()
    assert_close(torch_run(back, feed).logits.numpy(), want)
    # Tied, transformers 4.x and 5 would read different biases: refused, naming both.
    config = json.load(open(tmp_path / "src" / "config.json"))
    json.dump({**config, "tie_word_embeddings": True}, open(tmp_path / "src" / "config.json", "w"))
    (tmp_path / "src" / "model.safetensors").unlink()
    save_file(
        {k: v for k, v in stored.items() if k != "cls.predictions.decoder.weight"},
        tmp_path / "src" / "model.safetensors",
    )
    rc, _, err = cli(capsys, "convert", tmp_path / "src", tmp_path / "tied")
    assert rc == 1 and "differ, and with tie_word_embeddings=true" in err and "cls.predictions.bias" in err, err


def test_bfloat16_convert_and_float32_export(tmp_path, capsys):
    hf = hf_model("BertForSequenceClassification")
    hf.save_pretrained(tmp_path / "src")
    rc, out, err = cli(capsys, "convert", tmp_path / "src", tmp_path / "bf", "--dtype", "bfloat16")
    assert rc == 0, err
    assert "cast to bfloat16" in out and "stored as bfloat16" in out
    tree = serialization.msgpack_restore(open(tmp_path / "bf" / "flax_model.msgpack", "rb").read())
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(tree)} == {"bfloat16"}
    assert json.load(open(tmp_path / "bf" / "config.json"))["dtype"] == "bfloat16"
    rc, out, _ = cli(capsys, "info", tmp_path / "bf")
    total = jaxbert.count_params(jaxbert.load(tmp_path / "src").params)["total"]
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["total"])
    assert row == ["total", f"{total:,}", f"{2 * total:,}"]  # bytes of bfloat16 storage
    assert cli(capsys, "export", tmp_path / "bf", tmp_path / "pt")[0] == 0
    assert {str(v.dtype) for v in load_file(tmp_path / "pt" / "model.safetensors").values()} == {"float32"}
    # The round trip loses exactly bfloat16's rounding: every exported weight is the original rounded to
    # nearest bfloat16, and the model reads back as transformers' model of those rounded weights.
    exported, original = load_file(tmp_path / "pt" / "model.safetensors"), state_dict(hf)
    assert {name for name, _ in hf.named_parameters()} <= set(exported) <= set(original)
    for key, value in exported.items():
        np.testing.assert_array_equal(value, _bf16(original[key]), err_msg=key)
    back = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "pt").eval()
    rounded = transformers.BertForSequenceClassification(hf.config).eval()
    rounded.load_state_dict({k: torch.from_numpy(_bf16(v)) for k, v in original.items()})
    feed = padded_batch(2)
    assert_close(torch_run(back, feed).logits.numpy(), torch_run(rounded, feed).logits.numpy())


def test_verify_reports_and_fails_beyond_tolerance(tmp_path, capsys, monkeypatch):
    hf = hf_model("BertForTokenClassification")
    hf.save_pretrained(tmp_path / "src")
    rc, out, err = cli(capsys, "convert", tmp_path / "src", tmp_path / "dst", "--verify")
    assert rc == 0, err
    assert "verify logits" in out and "ok" in out
    before = {p.name: p.read_bytes() for p in (tmp_path / "dst").iterdir()}
    monkeypatch.setitem(jaxbert.verify.TOLERANCE, "float32", 0.0)
    rc, out, err = cli(capsys, "convert", tmp_path / "src", tmp_path / "dst", "--verify", "--force")
    assert rc == 1 and "FAILED" in out and "differ from PyTorch beyond tolerance" in err
    assert f"{tmp_path / 'dst'} not written" in err
    # A conversion that fails its check is not left behind: --force keeps the old DST, a new DST is not made
    assert {p.name: p.read_bytes() for p in (tmp_path / "dst").iterdir()} == before
    rc, _, err = cli(capsys, "convert", tmp_path / "src", tmp_path / "new", "--verify")
    assert rc == 1 and "not written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_version_flag_and_info_name_the_versions_and_devices(tmp_path, capsys):
    import subprocess
    import sys

    for argv in (
        [sys.executable, "-m", "jaxbert", "--version"],
        [os.path.join(os.path.dirname(sys.executable), "jaxbert"), "--version"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == f"jaxbert {jaxbert.__version__}", done
    assert main(["info", os.path.join(GOLDEN, "pt_EncoderDecoder")]) == 0
    assert f"jaxbert {jaxbert.__version__}, jax {jax.__version__}, devices: cpu:0" in capsys.readouterr().out
