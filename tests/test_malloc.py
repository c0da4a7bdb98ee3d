"""Masked-LM training re-runs itself with glibc malloc's transparent huge pages (jaxbert/malloc.py): when, how,
and never from Python callers of cli.main."""

import os
import subprocess
import sys

import pytest
from conftest import model_dir

from jaxbert import cli, malloc

CORPUS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")


@pytest.fixture
def capable(monkeypatch):
    """A glibc with the tunable and the kernel's huge pages on madvise, whatever this machine has."""
    monkeypatch.setattr(malloc, "_glibc_version", lambda: (2, 39))
    monkeypatch.setattr(malloc, "_thp_mode", lambda: "madvise")


def test_environment_adds_the_tunable_only_when_it_changes_something(capable, monkeypatch):
    assert malloc.environment({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    other = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert malloc.environment(other)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert malloc.environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None  # the user's choice stands
    assert malloc.environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) is None  # the re-run process
    assert malloc.environment({"JAXBERT_HUGEPAGES": "0"}) is None
    monkeypatch.setattr(malloc, "_thp_mode", lambda: "never")
    assert malloc.environment({}) is None
    monkeypatch.setattr(malloc, "_thp_mode", lambda: "always")
    assert malloc.environment({}) is not None
    monkeypatch.setattr(malloc, "_glibc_version", lambda: (2, 34))
    assert malloc.environment({}) is None
    monkeypatch.setattr(malloc, "_glibc_version", lambda: None)  # musl, macOS
    assert malloc.environment({}) is None


def test_thp_mode_reads_the_bracketed_choice(tmp_path, monkeypatch):
    path = tmp_path / "enabled"
    monkeypatch.setattr(malloc, "_THP", str(path))
    assert malloc._thp_mode() is None  # no such file
    for text, mode in (("always [madvise] never\n", "madvise"), ("[always] madvise never", "always")):
        path.write_text(text)
        assert malloc._thp_mode() == mode


class Exec(Exception):
    pass


def _record_exec(monkeypatch):
    calls = []

    def execve(path, argv, env):
        calls.append((path, argv, env))
        raise Exec

    monkeypatch.setattr(os, "execve", execve)
    return calls


def test_mlm_command_line_reruns_itself_and_python_callers_do_not(capable, monkeypatch, tmp_path):
    calls = _record_exec(monkeypatch)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("JAXBERT_HUGEPAGES", raising=False)
    argv = ["jaxbert", "train", "--task", "mlm", "--model", str(tmp_path / "none"), "--train-file", CORPUS]
    monkeypatch.setattr(sys, "argv", [*argv, "--output-dir", str(tmp_path / "out")])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "jaxbert", *sys.argv[1:]])
    with pytest.raises(Exec):
        cli.main()
    ((path, rerun, env),) = calls
    assert path == sys.executable and rerun == sys.orig_argv
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and env["PATH"] == os.environ["PATH"]
    # the same arguments given from Python: no re-run (it would replace the caller's process), just the error
    assert cli.main(sys.argv[1:]) == 1 and len(calls) == 1
    assert cli.main(["embed", str(tmp_path / "none"), "--input", CORPUS, "--output", str(tmp_path / "e.npy")]) == 1
    monkeypatch.setattr(sys, "argv", [a.replace("mlm", "sequence-classification") for a in sys.argv])
    assert cli.main() == 1 and len(calls) == 1  # task fine-tuning: not re-run (see malloc.py)
    monkeypatch.setattr(sys, "argv", ["jaxbert", "train-mlm", *sys.argv[4:]])
    with pytest.raises(Exec):
        cli.main()
    monkeypatch.setenv("JAXBERT_HUGEPAGES", "0")
    assert cli.main() == 1 and len(calls) == 2  # opted out: runs (and fails on the missing model) as it is


def test_rerun_process_trains_with_huge_pages(tmp_path):
    """The real thing: `python -m jaxbert train-mlm` replaces itself, trains, and says so in its plan line;
    with JAXBERT_HUGEPAGES=0 it does not."""
    model = model_dir(tmp_path / "tiny", max_position_embeddings=64, num_hidden_layers=1)
    # The corpus's first 600 lines: one step of 2 reads a few, and each run tokenized the whole corpus and
    # validated its 5% split (49 sequences through the 30522-word MLM head).
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(open(CORPUS).readlines()[:600]))
    expect = malloc.environment({k: v for k, v in os.environ.items() if k != "JAXBERT_HUGEPAGES"}) is not None
    for opt_out in ("1", "0"):
        out = tmp_path / f"out{opt_out}"
        args = ("train-mlm", "--model", model, "--train-file", corpus, "--output-dir", out, "--max-steps", "1")
        flags = ("--max-seq-length", "32", "--global-batch-size", "2", "--no-progress", "--eval-steps", "5")
        env = {**os.environ, "JAXBERT_HUGEPAGES": opt_out}
        env.pop("GLIBC_TUNABLES", None)
        proc = subprocess.run(
            [sys.executable, "-m", "jaxbert", *map(str, args + flags)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        plan = next(line for line in proc.stdout.splitlines() if "plan:" in line)
        assert ("malloc in huge pages" in plan) == (expect and opt_out == "1"), plan
        assert (out / "final").is_dir()
