"""`jaxbert train --task seq2seq --predict-with-generate` (run_summarization.py's flags through Seq2SeqTrainer):
each validation also generates for the validation sources with the weights being trained and logs ROUGE and
gen_len, the numbers `jaxbert evaluate --predict-with-generate` gives for the model written at that step; OUT/best
is kept by them when asked; the flags are refused where they would change nothing, and a resume that changes them
is refused as any change of the validation is."""

import json

import pytest
from conftest import bert2bert_dir, cli_fails, cli_on_devices, train_args
from test_train_seq2seq import _pairs, _write

from jaxbert.cli import main

pytest.importorskip("transformers")
pytest.importorskip("rouge_score")

GENERATED = ("rouge1", "rouge2", "rougeL", "rougeLsum", "gen_len")


def _model(tmp_path) -> str:
    model = bert2bert_dir(tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    json.dump({**config, "pad_token_id": 0, "eos_token_id": 102}, open(tmp_path / "model" / "config.json", "w"))
    return model


def _log(out) -> list[dict]:
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def _evaluate(directory, data, scored, *flags) -> dict:
    args = ["evaluate", directory, "--task", "seq2seq", "--file", data, "--output", scored, *flags]
    assert main([str(a) for a in args]) == 0
    return json.load(open(scored))


def test_each_validation_scores_its_generations_as_evaluate_does_and_keeps_the_best_by_rouge(
    tmp_path, capsys, monkeypatch
):
    """Targets a few steps teach (two fixed words, then the source's first): ROUGE climbs while the run trains,
    so the scores are of the weights being trained, and OUT/best (the best rougeL) is not the lowest loss's. The
    search is traced once per shape (the validation's two batches), however many validations run: the weights are
    its argument, not the constants of a new program each time."""
    from jaxbert.inference_seq2seq import EncoderDecoder

    traced, search = [], EncoderDecoder._generate_impl
    counted = lambda self, *a, **k: traced.append(1) or search(self, *a, **k)  # noqa: E731
    monkeypatch.setattr(EncoderDecoder, "_generate_impl", counted)
    model = _model(tmp_path)
    records = [{**r, "target": f"the quick {r['source'].split()[0]}"} for r in _pairs(6, seed=3)]
    data = _write(tmp_path / "data.jsonl", records)
    out = tmp_path / "out"
    lengths = ["--max-source-length", 12, "--max-target-length", 8]
    generate = ["--predict-with-generate", "--num-beams", 2, "--val-max-target-length", 6]
    flags = [*lengths, *generate, "--global-batch-size", 4, "--max-steps", 4, "--eval-steps", 1]
    flags += ["--learning-rate", 1e-2, "--metric-for-best-model", "rougeL", "--save-steps", 2]
    assert main(train_args("seq2seq", model, data, out, *flags)) == 0, capsys.readouterr().err
    assert "rougeL" in capsys.readouterr().out  # the log line names them
    evals = [r for r in _log(out) if "eval_loss" in r]
    assert [r["step"] for r in evals] == [0, 1, 2, 3, 4]
    assert all(all(f"eval_{k}" in r for k in GENERATED) for r in evals)
    assert len({r["eval_rougeL"] for r in evals}) > 2 and 0 < evals[-1]["eval_rougeL"] < 100
    candidates = evals[1:]  # step 0 is a baseline, not a candidate (best.py)
    chosen = max(candidates, key=lambda r: r["eval_rougeL"])  # the first of the highest: greater is better
    best = json.load(open(out / "best.json"))
    assert (best["step"], best["metric"], best["value"]) == (chosen["step"], "eval_rougeL", chosen["eval_rougeL"])
    assert chosen is not min(candidates, key=lambda r: r["eval_loss"])
    assert len(traced) <= 2  # 6 sources in batches of 4 and 2, at 5 validations

    # OUT/final's validation cut is evaluate's default (OUT/best's given here): the log's numbers without the flag.
    again = ["--num-beams", 2, "--predict-with-generate", "--batch-size", 4]
    for directory, flags in ((out / "final", again), (out / "best", [*again, "--val-max-target-length", 6])):
        record = evals[-1] if directory.name == "final" else chosen
        found = _evaluate(directory, data, tmp_path / "eval.json", *flags)
        assert {k: found[k] for k in GENERATED} == {k: record[f"eval_{k}"] for k in GENERATED}, directory
        assert abs(found["loss"] - record["eval_loss"]) <= 1e-5 * record["eval_loss"]


def test_four_devices_equal_one(tmp_path, capsys):
    model = _model(tmp_path)
    data = _write(tmp_path / "data.jsonl", _pairs(8, seed=3, target_words=6))
    flags = ["--max-seq-length", 12, "--predict-with-generate", "--global-batch-size", 4, "--max-steps", 2]
    assert main(train_args("seq2seq", model, data, tmp_path / "one", *flags)) == 0
    cli_on_devices(train_args("seq2seq", model, data, tmp_path / "four", *flags))
    one, four = (_log(tmp_path / name)[-1] for name in ("one", "four"))
    assert {k: four[f"eval_{k}"] for k in GENERATED} == {k: one[f"eval_{k}"] for k in GENERATED}


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--num-beams", 2], "--num-beams: the beams of --predict-with-generate's search; pass that too"),
        (
            ["--metric-for-best-model", "rougeL"],
            "--metric-for-best-model rougeL: scored on the generations of --predict-with-generate; pass that too",
        ),
        (["--metric-for-best-model", "eval_gen_len"], "--metric-for-best-model gen_len: scored on the generations"),
        (["--task", "causal-lm", "--predict-with-generate"], "--predict-with-generate applies to --task seq2seq only"),
        (["--task", "causal-lm", "--val-max-target-length", 8], "--val-max-target-length applies to --task seq2seq"),
        (["--predict-with-generate", "--num-beams", 0], "--num-beams 0: must be at least 1"),
        (["--val-max-target-length", 2], "--val-max-target-length 2: must be at least 3"),
        (
            ["--val-max-target-length", 41],
            "--val-max-target-length 41 exceeds the decoder's max_position_embeddings 40",
        ),
        (["--predict-with-generate", "--metric-for-best-model", "bleu"], "--metric-for-best-model bleu: not a metric"),
    ],
)
def test_bad_generation_flags_are_one_line(flags, match, tmp_path, capsys):
    model = _model(tmp_path)
    capsys.readouterr()
    data = _write(tmp_path / "data.jsonl", [{"source": "a b", "target": "b", "text": "a"}] * 4)
    args = train_args("seq2seq", model, data, tmp_path / "out", "--max-seq-length", 16, *flags)
    cli_fails(capsys, tmp_path, *args, match=match)
    assert not (tmp_path / "out").exists()


def test_a_missing_rouge_package_is_named_before_any_work(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "rouge_score", None)
    model = _model(tmp_path)
    capsys.readouterr()
    data = _write(tmp_path / "data.jsonl", _pairs(4))
    args = train_args("seq2seq", model, data, tmp_path / "out", "--max-seq-length", 16, "--predict-with-generate")
    cli_fails(capsys, tmp_path, *args, match="ROUGE needs the rouge-score package: pip install 'jaxbert[rouge]'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "first, then, match",
    [
        ([], ["--predict-with-generate"], "was made with predict_with_generate=False, this run has True"),
        (["--predict-with-generate"], [], "was made with predict_with_generate=True, this run has False"),
        (["--predict-with-generate"], ["--predict-with-generate", "--num-beams", 2], "num_beams=None, this run has 2"),
        ([], ["--val-max-target-length", 6], "was made with val_max_target_length=None, this run has 6"),
        (
            ["--predict-with-generate"],
            ["--predict-with-generate", "--metric-for-best-model", "rouge1"],
            "was made with metric_for_best_model='loss', this run has 'rouge1'",
        ),
        (["--predict-with-generate", "--num-beams", 2], ["--predict-with-generate", "--num-beams", 2], None),
    ],
)
def test_a_resume_that_changes_the_validation_is_refused(first, then, match, tmp_path, capsys):
    """As any option that changes what the validation scores (QA's post-processing, the metric): OUT/best
    compares evaluations across the run, and a checkpoint of an earlier version validated without generating."""
    model = _model(tmp_path)
    data = _write(tmp_path / "data.jsonl", _pairs(4, seed=3, target_words=6))
    flags = ["--max-seq-length", 12, "--global-batch-size", 4, "--max-steps", 1]
    assert main(train_args("seq2seq", model, data, tmp_path / "out", *flags, *first)) == 0
    capsys.readouterr()
    again = train_args("seq2seq", model, data, tmp_path / "out", *flags, "--resume", "auto", *then)
    if match is None:
        assert main(again) == 0, capsys.readouterr().err
        assert "restored step 1" in capsys.readouterr().out
    else:
        cli_fails(capsys, tmp_path, *again, match=match)


def test_a_checkpoint_from_before_the_flags_validated_without_generating():
    """Its meta has none of the three keys: it resumes as it ran, and a resume that would generate is refused."""
    from jaxbert.train import checkpoints

    earlier = {"step": 3, "model_config": {}, "seed": 42}
    run = {"step": 3, "model_config": {}, "seed": 42, "predict_with_generate": False, "num_beams": None}
    checkpoints.check_meta(earlier, {**run, "val_max_target_length": None}, "a checkpoint")
    with pytest.raises(ValueError, match="was made with predict_with_generate=False, this run has True"):
        checkpoints.check_meta(earlier, {**run, "predict_with_generate": True}, "a checkpoint")
    with pytest.raises(ValueError, match="was made with val_max_target_length=None, this run has 6"):
        checkpoints.check_meta(earlier, {**run, "val_max_target_length": 6}, "a checkpoint")


def test_evaluate_cuts_the_targets_where_the_runs_validation_did():
    from jaxbert.config import BertConfig
    from jaxbert.train.task_table import COLUMNS_KEY, trained_sides

    saved = {"max_source_length": 12, "max_target_length": 8}
    assert trained_sides(BertConfig(extra={COLUMNS_KEY: saved})) == (12, 8)
    assert trained_sides(BertConfig(extra={COLUMNS_KEY: {**saved, "val_max_target_length": 6}})) == (12, 6)
