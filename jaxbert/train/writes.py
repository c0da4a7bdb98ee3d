"""What the training loop writes, and the checks before each write: OUT checked before anything is written (a
directory, apart from the model) and left as found by a run that fails before it has logged (_undone_on_failure),
checkpoints saved only while every parameter is finite, validations logged with OUT/best kept, OUT/final and
loss.png; the errors a run stops with (TrainingError, Interrupted), naming the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal

import jax
import jax.numpy as jnp

from jaxbert import distributed
from jaxbert.files import check_disjoint
from jaxbert.train import checkpoints, outputs
from jaxbert.train.best import write_model
from jaxbert.train.config import TrainConfig


class TrainingError(RuntimeError):
    """A run that cannot go on (e.g. a non-finite loss); the message names the step."""


class Interrupted(TrainingError):
    """Ctrl-C or SIGTERM: the run stopped between steps; the message names the step and the checkpoint to resume
    from, `signum` the signal."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


def _check_output_dir(cfg: TrainConfig) -> None:
    """Before anything is written: OUT must be a directory (or not exist) and apart from the model it reads."""
    try:
        check_disjoint(cfg.model, cfg.output_dir)
    except ValueError as e:
        raise ValueError(f"--output-dir {e}") from None
    if os.path.lexists(cfg.output_dir) and not os.path.isdir(cfg.output_dir):
        raise NotADirectoryError(f"--output-dir {cfg.output_dir}: exists and is not a directory")
    # Else the first checkpoint, --save-steps steps into the run, would be the first write to fail there.
    saved = os.path.join(cfg.output_dir, "checkpoints")
    if os.path.lexists(saved) and not os.path.isdir(saved):
        raise NotADirectoryError(f"{saved}: exists and is not a directory (the run's checkpoints go there)")


@contextlib.contextmanager
def _undone_on_failure(out: str):
    """A run that fails (or is stopped) before it has logged anything leaves OUT as it found it: the token cache
    entries and the empty checkpoint directory it made while checking its inputs go again (lock.hold then removes
    an OUT it created). Once it has logged to metrics.jsonl the run has a record, and everything it wrote stays.
    A resume refused before logging (its data changed) is such a run too: the earlier run's metrics.jsonl is
    there, as it was (its size), and the refused run's cache entries of the new data went with it no more."""
    cache, checkpoints, metrics = (os.path.join(out, name) for name in ("cache", "checkpoints", "metrics.jsonl"))
    had = {path: os.path.lexists(path) for path in (cache, checkpoints)}
    logged = lambda: os.path.getsize(metrics) if os.path.lexists(metrics) else None  # noqa: E731
    before = logged()
    cached = set(os.listdir(cache)) if os.path.isdir(cache) else set()
    try:
        yield
    except BaseException:
        if logged() == before:
            if os.path.isdir(cache) and not os.path.islink(cache):
                for name in set(os.listdir(cache)) - cached:  # the entries it made: the next run rebuilds them
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(cache, name))
                if not had[cache]:
                    with contextlib.suppress(OSError):
                        os.rmdir(cache)
            if not had[checkpoints]:  # only while empty: a run resumed from elsewhere may save before it logs
                with contextlib.suppress(OSError):
                    os.rmdir(checkpoints)
        raise


@jax.jit
def _all_finite(params) -> jax.Array:
    """One reduction over every parameter: cheap next to a step, and run only before something is written."""
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree_util.tree_leaves(params)]))


def _where(last_good, own) -> str:
    """The last verified checkpoint, and how to continue from it."""
    if last_good is None:
        return "none yet (a new run starts from the beginning)"
    step, root = last_good
    how = "--resume auto" if root == own.directory.as_posix() else f"--resume {os.path.join(root, str(step))}"
    return f"step {step} in {root} (continue with {how})"


def _save(run, meta, state, done, own, last_good):
    """Checkpoint `done`, unless a parameter is not finite: then stop, naming the last good checkpoint."""
    if not bool(_all_finite(state.params)):
        raise TrainingError(
            f"non-finite parameters after step {done}; stopped without saving them, last good "
            f"checkpoint: {_where(last_good, own)}"
        )
    try:
        checkpoints.save(own, done, state, meta(done), run.cfg.save_total_limit)
    except OSError as e:  # a full disk: what failed, and where to continue from
        raise TrainingError(
            f"writing checkpoint {done} in {own.directory.as_posix()} failed ({e.strerror or e}); last good "
            f"checkpoint: {_where(last_good, own)}"
        ) from None
    return done, own.directory.as_posix()


def evaluate(run, state, done: int, eval_fn, metrics, best) -> dict:
    """Validation metrics at step `done`, logged; OUT/best replaced when they are the best so far."""
    result = run.evaluate(state.params, eval_fn)
    metrics.add({"step": done, **result})
    run.say(f"step {done}: {run.describe(result)}")
    if best.update(done, result):
        params = distributed.to_primary(state.params)  # None but on process 0, which writes
        if distributed.is_primary():
            best.save(run, params)
        run.say(f"best {best.key} so far ({best.value:.4f}): wrote {os.path.join(run.cfg.output_dir, 'best')}")
    return result


def _finish(run, state, metrics, own, last_good, result) -> dict:
    if not bool(_all_finite(state.params)):
        raise TrainingError(
            f"non-finite parameters after step {int(state.step)}; OUT/final not written, last "
            f"good checkpoint: {_where(last_good, own)}"
        )
    params = distributed.to_primary(state.params)  # None but on process 0, which writes
    final_dir = os.path.join(run.cfg.output_dir, "final")
    if not distributed.is_primary():
        return result
    write_model(run, params, final_dir)
    problem = getattr(getattr(run, "labels", None), "problem_type", None)  # a sequence classifier's loss
    problem = run.cfg.loss if run.cfg.task == "embedding" and run.cfg.loss != "mnrl" else problem  # scored pairs
    loss = outputs.loss_name(run.cfg.task, problem)
    plotted = outputs.plot(metrics.records, os.path.join(run.cfg.output_dir, "loss.png"), run.metric, loss)
    run.say(
        f"wrote {final_dir} (jaxbert {run.head}), metrics.jsonl, "
        + ("loss.png" if plotted else "no loss.png (needs matplotlib: pip install 'jaxbert[plot]')")
    )
    return result


class _Unwritten:
    """Metrics of processes other than 0: kept in memory (early stopping reads them), never written."""

    def __init__(self, records: list[dict]):
        self.records = list(records)

    def add(self, record: dict) -> None:
        self.records.append(record)
