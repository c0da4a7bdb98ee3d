"""A persistent XLA compilation cache for the command line: compiled programs kept on disk between runs.

Every `jaxbert` command starts a new process, and JAX compiles each program shape afresh in each: `jaxbert embed`
of 2,000 texts of mixed lengths runs 8 programs (packed rows of several lengths and batch sizes), each about half a
second to compile for MiniLM int8 on two Sapphire Rapids cores, beside 3.4 s of computing. With JAX's persistent
cache the next run loads them (a tenth of a second or two each, mostly JAX tracing the program again to find its
key): 11.8 s from the shell the first time, 6.9 s after. The command line turns it on (`enable`, from cli.main);
library users who want it call `jaxbert.compile_cache.enable()` before their first computation.

Where: $JAXBERT_COMPILE_CACHE, else $XDG_CACHE_HOME/jaxbert/xla, else ~/.cache/jaxbert/xla; JAXBERT_COMPILE_CACHE=0
turns it off. A JAX cache the caller set up (JAX_COMPILATION_CACHE_DIR, or jax.config) is left as it is.

XLA:CPU compiles for the CPU it runs on, and its loader only logs when a cached program asks for instructions the
CPU lacks ("This could lead to execution errors such as SIGILL"), so programs are kept in one directory per CPU
(its model and instruction-set flags): a home directory shared by machines of several kinds never hands one
machine another's code. The cache is bounded (least recently used entries go past CACHE_BYTES) and is only a
speed-up: a directory that cannot be written, or an entry that cannot be read, means compiling as without it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings

ENV = "JAXBERT_COMPILE_CACHE"
CACHE_BYTES = 1 << 30
# Programs that compile faster than this are not written (JAX's default, 1 s, would keep none of a MiniLM's:
# they compile in about half a second each); reading one back takes a few milliseconds.
MIN_COMPILE_SECONDS = 0.1
# JAX warns when an entry cannot be written or read; either way the program is compiled, so the run is unaffected.
_HARMLESS = r"Error (writing|reading) persistent compilation cache entry"


def machine_tag(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This CPU's kind: the architecture and a hash of its model name and instruction-set flags (`cpuinfo`'s
    first processor; the platform's processor string where there is none)."""
    described = platform.processor()
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            fields = {}
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        described = "\n".join(fields.get(k, "") for k in ("vendor_id", "model name", "flags", "Features", "CPU part"))
    except OSError:
        pass
    return f"{platform.machine() or 'cpu'}-{hashlib.sha256(described.encode()).hexdigest()[:12]}"


def default_directory() -> str | None:
    """The cache's root for this user (None: turned off by JAXBERT_COMPILE_CACHE=0)."""
    chosen = os.environ.get(ENV)
    if chosen is not None:
        return None if chosen.strip() in ("", "0") else os.path.expanduser(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxbert", "xla")


def enable(directory: str | os.PathLike | None = None) -> str | None:
    """Keep compiled programs in `directory` (default: default_directory()), in this CPU's subdirectory; returns
    that directory, or None where nothing changed: JAX's cache already set up by the caller, turned off, or a
    directory that cannot be made or written. Call it before the process's first computation."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return None
    root = default_directory() if directory is None else os.fspath(directory)
    if root is None:
        return None
    path = os.path.join(root, machine_tag())
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    if not os.access(path, os.W_OK | os.X_OK):
        return None
    warnings.filterwarnings("ignore", _HARMLESS)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ and _can_evict():
        jax.config.update("jax_compilation_cache_max_size", CACHE_BYTES)
    jax.config.update("jax_compilation_cache_dir", path)
    return path


def _can_evict() -> bool:
    """JAX bounds its cache only with the filelock package (huggingface_hub's dependency, so normally there)."""
    try:
        import filelock  # noqa: F401
    except ImportError:
        return False
    return True
