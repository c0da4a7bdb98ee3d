"""Resuming, under --label-smoothing, a checkpoint of an earlier jaxbert, which validated with the plain loss where
this one validates with the smoothed one (as transformers' Trainer). OUT/best by loss and early stopping would
compare plain values from before the resume with smoothed ones after: the best evaluation is measured again with
the smoothed loss on its checkpoint's weights, so the run keeps the OUT/best an uninterrupted run keeps; without
that checkpoint the resume is refused, naming the way out. The "older" checkpoint is made as that version wrote
it: a run of this one stopped after step 2 of 4, its checkpoints' meta without the key that names the validation
loss, and the plain loss (`jaxbert evaluate`'s) in its best record."""

import json
import shutil

import pytest
from conftest import cli_fails, model_dir, train_args
from test_train_tasks import CASES, SMALL, _records

from jaxbert.cli import main
from jaxbert.train import checkpoints
from jaxbert.train.best import RESCORED, Best

pytest.importorskip("transformers")
TASK, HEAD, OVERRIDES, FLAGS = CASES["single"]


def _log(out) -> list[dict]:
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def _write_log(out, records) -> None:
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _as_older(out) -> None:
    """Each checkpoint's meta as an earlier jaxbert wrote it (no EVAL_SMOOTHING), sealed again."""
    for step in (out / "checkpoints").iterdir():
        path = step / "meta" / "metadata"
        meta = json.load(open(path))
        del meta[checkpoints.EVAL_SMOOTHING]
        path.write_text(json.dumps(meta))
        checkpoints.write_digests(str(step))


def _stopped(argv, after: int) -> None:
    """Run `argv` and stop it after step `after`, as a Ctrl-C there does: the schedule stays the whole run's."""
    asked = iter([False] * after + [True])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("jaxbert.train.loop.distributed.any_process", lambda flag: next(asked))
        assert main(argv) != 0


def _plain_loss(directory, data, tmp_path) -> float:
    scored = tmp_path / "plain.json"
    assert main(["evaluate", str(directory), "--task", TASK, "--file", str(data), "--output", str(scored)]) == 0
    return json.load(open(scored))["loss"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the data, its arguments, an uninterrupted 4-step run, a 2-step run made older)."""
    tmp = tmp_path_factory.mktemp("smoothing")
    model = model_dir(tmp / "model", HEAD, **SMALL, **OVERRIDES)
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records("single")))
    flags = ["--max-seq-length", 32, "--global-batch-size", 8, "--learning-rate", 1e-4, "--label-smoothing", 0.2]
    flags += ["--eval-steps", 1, "--save-steps", 1, "--metric-for-best-model", "loss", *FLAGS]
    args = lambda out, steps, *more: train_args(TASK, model, data, out, *flags, "--max-steps", steps, *more)  # noqa: E731
    assert main(args(tmp / "whole", 4)) == 0
    older = tmp / "older"
    _stopped(args(older, 4), after=2)
    smoothed = {r["step"]: r["eval_loss"] for r in _log(older) if "eval_loss" in r}
    assert json.load(open(older / "best.json"))["step"] == 2
    _as_older(older)
    plain = _plain_loss(older / "best", data, tmp)  # step 2's weights
    _write_log(older, [{**r, "eval_loss": plain} if r["step"] == 2 and "eval_loss" in r else r for r in _log(older)])
    (older / "best.json").write_text(json.dumps({"step": 2, "metric": "eval_loss", "value": plain}))
    return data, args, tmp / "whole", older, smoothed, plain


def test_the_best_is_measured_again_with_the_smoothed_loss_and_kept_as_uninterrupted(runs, tmp_path, capsys):
    _, args, whole, older, smoothed, plain = runs
    out = tmp_path / "out"
    shutil.copytree(older, out)
    whole_log = {r["step"]: r["eval_loss"] for r in _log(whole) if "eval_loss" in r}
    assert whole_log[2] == smoothed[2]  # the same run to step 2
    # What makes the test tell: the plain loss is below every later smoothed one, so a best kept at its plain value
    # would stay at step 2, where the uninterrupted run's best is a later step.
    expected = json.load(open(whole / "best.json"))
    assert expected["step"] > 2 and plain < min(whole_log[3], whole_log[4])
    capsys.readouterr()
    assert main(args(out, 4, "--resume", "auto")) == 0, capsys.readouterr().err
    found = json.load(open(out / "best.json"))
    assert (found["step"], found["metric"]) == (expected["step"], expected["metric"])
    assert abs(found["value"] - expected["value"]) <= 1e-6 * expected["value"]
    rescored = [r[RESCORED] for r in _log(out) if RESCORED in r]
    assert len(rescored) == 1 and rescored[0]["step"] == 2 and rescored[0]["plain"] == plain
    assert abs(rescored[0]["value"] - smoothed[2]) <= 1e-6 * smoothed[2]
    said = capsys.readouterr().out
    assert f"OUT/best's step 2 measured again with the smoothed one: eval_loss {plain:.4f} -> {smoothed[2]:.4f}" in said
    later = {r["step"]: r["eval_loss"] for r in _log(out) if "eval_loss" in r and r["step"] > 2}
    assert all(abs(later[s] - whole_log[s]) <= 1e-6 * whole_log[s] for s in (3, 4))
    # A later resume (checkpoints that record the smoothed loss) rebuilds the best from the log, the rescored
    # record read in place of step 2's plain value.
    rebuilt, reference = (Best("loss", None, _log(o)) for o in (out, whole))
    assert (rebuilt.step, rebuilt.bad) == (reference.step, reference.bad)
    assert abs(rebuilt.value - reference.value) <= 1e-6 * reference.value


def test_without_the_best_checkpoint_the_resume_is_refused_naming_the_way_out(runs, tmp_path, capsys):
    _, args, _, older, _, plain = runs
    out = tmp_path / "out"
    shutil.copytree(older, out)
    # The best at step 1 (a plain loss below step 2's), its checkpoint gone (as --save-total-limit 1 leaves it).
    _write_log(out, [{**r, "eval_loss": plain - 0.01} if r["step"] == 1 and "eval_loss" in r else r for r in _log(out)])
    shutil.rmtree(out / "checkpoints" / "1")
    before = (out / "metrics.jsonl").read_text()
    last = out / "checkpoints" / "2"
    cli_fails(
        capsys,
        tmp_path,
        *args(out, 4, "--resume", "auto"),
        match=f"--resume: checkpoint {last} validated with the plain loss (an earlier jaxbert) and --label-smoothing "
        f"0.2 validates with the smoothed one, so OUT/best (step 1, eval_loss {plain - 0.01:.4f}) must be measured "
        f"again, and cannot be (its checkpoint is gone): continue the run with the jaxbert that wrote it, or "
        f"continue its weights as a new run: --resume {last} --output-dir NEW",
    )
    assert (out / "metrics.jsonl").read_text() == before
    # The way out: a new run from its weights, whose own log has nothing to mix.
    assert main(args(tmp_path / "new", 4, "--resume", str(last))) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "the plain loss up to step 2, the smoothed one (--label-smoothing 0.2) after" in said
    assert [r["step"] for r in _log(tmp_path / "new") if "eval_loss" in r] == [3, 4]


def test_a_run_without_smoothing_resumes_an_older_checkpoint_as_before(tmp_path, capsys, runs):
    data, _, _, _, _, _ = runs
    model = model_dir(tmp_path / "model", HEAD, **SMALL, **OVERRIDES)
    flags = ["--max-seq-length", 32, "--global-batch-size", 8, "--eval-steps", 1, "--save-steps", 1, *FLAGS]
    out = tmp_path / "out"
    _stopped(train_args(TASK, model, data, out, *flags, "--max-steps", 2), after=1)
    _as_older(out)
    capsys.readouterr()
    assert main(train_args(TASK, model, data, out, *flags, "--max-steps", 2, "--resume", "auto")) == 0
    said = capsys.readouterr().out
    assert "restored step 1" in said and "plain loss" not in said, said
    assert not any(RESCORED in r for r in _log(out))
