"""Transparent huge pages for masked-LM training: the glibc malloc tunable, set by the command re-running itself.

XLA:CPU allocates a compiled step's temporaries at every execution and frees them at its end (bert-base MLM 8 x
128: 1.2 GB, the activations the backward pass reads and the gradients). glibc serves a block that size with
mmap and returns it with munmap, so every step the kernel hands out the same memory again as zeroed 4 KiB pages:
320,000 page faults and about 0.6 s of system time a step. With `glibc.malloc.hugetlb=1` malloc asks for
transparent huge pages (madvise), and the faults drop to under a thousand. Measured on a 2-core AMD EPYC (Zen 4):
the bert-base MLM step (8 x 128, one program) float32 4.05 -> 3.60 s, bfloat16 2.2-2.4 -> 2.06-2.11 s. Not a
universal win, so masked-LM training (`train-mlm`, `train --task mlm`) is the only command that sets it: task
fine-tuning (bucketed shapes, several programs and smaller temporaries) went both ways there (sequence
classification float32 208 -> 231 useful tokens/s, bfloat16 387-397 -> 347-364), and PyTorch's eager MLM step
ran slower with it (4.62 -> 4.87 s: its many mid-size tensors then cost whole 2 MiB pages to zero).

glibc reads tunables once, at process start, so the command line re-runs itself (os.execve: the same process id,
open files and arguments) with the tunable added. Only as a process's entry point (`jaxbert train ...`, `python
-m jaxbert train-mlm ...`), never when `cli.main` is called with arguments from Python. JAXBERT_HUGEPAGES=0 keeps
the process as it is; so does a GLIBC_TUNABLES that already sets the tunable either way.
"""

from __future__ import annotations

import os

TUNABLE = "glibc.malloc.hugetlb"
SETTING = f"{TUNABLE}=1"
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _glibc_version() -> tuple[int, ...] | None:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"; absent on musl, macOS
        return tuple(int(x) for x in version.split(".")[:2]) if name == "glibc" else None
    except (ValueError, OSError, AttributeError):
        return None


def _thp_mode() -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), None where unknown."""
    try:
        with open(_THP, encoding="ascii") as f:
            words = f.read().split()
    except OSError:
        return None
    return next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")), None)


def environment(env=None) -> dict[str, str] | None:
    """`env` (default os.environ) with the tunable added, or None when re-running would change nothing: opted out
    (JAXBERT_HUGEPAGES=0), the tunable already in GLIBC_TUNABLES, not glibc >= 2.35 (the first with it), or the
    kernel's transparent huge pages off."""
    env = dict(os.environ if env is None else env)
    tunables = env.get("GLIBC_TUNABLES", "")
    if env.get("JAXBERT_HUGEPAGES", "1") == "0" or TUNABLE + "=" in tunables:
        return None
    if (_glibc_version() or (0,)) < (2, 35) or _thp_mode() not in ("madvise", "always"):
        return None
    env["GLIBC_TUNABLES"] = f"{tunables}:{SETTING}" if tunables else SETTING
    return env


def label() -> str:
    """For a run's plan line: ", malloc in huge pages" when this process has the tunable on, else ""."""
    return ", malloc in huge pages" if SETTING in os.environ.get("GLIBC_TUNABLES", "").split(":") else ""


def rerun_with_huge_pages() -> None:
    """Replace this process by the same command line with the tunable, if that changes anything (see environment);
    returns only when it does not."""
    import sys

    env = environment()
    if env is None or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)
