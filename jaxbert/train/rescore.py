"""Resuming, under --label-smoothing, a checkpoint whose validations used the plain loss. jaxbert now validates
with the smoothed loss there (as transformers' Trainer: eval_loss goes through its LabelSmoother) and checkpoints
record it (checkpoints.EVAL_SMOOTHING); earlier ones validated with the plain loss and do not say so. OUT/best by
loss and early stopping compare eval_loss across the run: plain values before the resume against smoothed ones
after would decide them on mixed numbers (the smoothed loss is the higher: no later step would ever be better).

So the best evaluation is measured again with the smoothed loss, on its own checkpoint's weights (those OUT/best
was written from), and logged as a metrics.jsonl record that `Best` reads on any later resume; the evaluations
after it were judged against it on one measure, so early stopping's count stands. Where its checkpoint is gone,
the resume is refused, naming the way out."""

from __future__ import annotations

from jaxbert import distributed
from jaxbert.train import checkpoints
from jaxbert.train.best import RESCORED

LOSS_KEYS = ("eval_loss", "eval_perplexity")  # what smoothing changes (perplexity is the loss's exp)


def plan(run, best, source, step: int) -> int | None:
    """Before anything compiles: the step whose checkpoint `rescore` restores, None when there is nothing to
    rescore (the run does not smooth, the checkpoint validated as this run does, or the best model is not chosen
    by the loss: then one line says what metrics.jsonl holds)."""
    if not run.cfg.label_smoothing or checkpoints.EVAL_SMOOTHING in checkpoints.read_meta(source, step):
        return None
    where = f"checkpoint {checkpoints.step_dir(source, step)}"
    if best.key not in LOSS_KEYS or best.step is None:
        kept = f"OUT/best is kept by {best.key}, which smoothing does not change" if best.key else "no best model"
        kept = "no best evaluation yet to compare with" if best.key in LOSS_KEYS else kept
        run.say(
            f"resume: {where} validated with the plain loss (an earlier jaxbert): metrics.jsonl's eval_loss is "
            f"the plain loss up to step {step}, the smoothed one (--label-smoothing {run.cfg.label_smoothing}) after; "
            f"{kept}"
        )
        return None
    try:
        if best.step not in source.all_steps():
            raise checkpoints.DamagedCheckpoint("its checkpoint is gone")
        checkpoints.verify(checkpoints.step_dir(source, best.step))
    except checkpoints.DamagedCheckpoint as e:
        raise ValueError(
            f"--resume: {where} validated with the plain loss (an earlier jaxbert) and --label-smoothing "
            f"{run.cfg.label_smoothing} validates with the smoothed one, so OUT/best (step {best.step}, {best.key} "
            f"{best.value:.4f}) must be measured again, and cannot be ({e}): continue the run with the jaxbert that "
            f"wrote it, or continue its weights as a new run: --resume {checkpoints.step_dir(source, step)} "
            "--output-dir NEW"
        ) from None
    return best.step


def rescore(run, best, source, abstract, eval_fn, start: int) -> dict:
    """Measure the best evaluation again with this run's validation (`eval_fn`) on its checkpoint's weights;
    `best` takes the value. -> the metrics.jsonl record of it (at the resumed step), for `record`."""
    params = checkpoints.restore_state(source, best.step, abstract).params
    value = float(run.evaluate(params, eval_fn)[best.key])
    del params
    was, best.value = best.value, value
    run.say(
        f"resume: checkpoint {start} validated with the plain loss (an earlier jaxbert); OUT/best's step "
        f"{best.step} measured again with the smoothed one: {best.key} {was:.4f} -> {value:.4f}, which this "
        "run's validations are compared with"
    )
    return {"step": start, RESCORED: {"step": best.step, "metric": best.key, "value": value, "plain": was}}


def record(run, best, metrics, rescored: dict) -> None:
    """Once the resumed state is restored (a failed restore leaves OUT's records as they were): metrics.jsonl
    holds the rescored value, for `Best` on a later resume, and OUT/best.json holds it."""
    metrics.add(rescored)
    if distributed.is_primary():
        best.write_record(run)
