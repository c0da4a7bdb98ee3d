"""The command line's persistent compilation cache (compile_cache.py): a second run loads what the first compiled
and computes the same, one directory per kind of CPU, and a cache that is off or cannot be written changes
nothing but the time."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import model_dir

from jaxbert import compile_cache

TEXTS = ["the capital of france is paris.", "a river runs through the old town", "hello", "one two three four five"]


def embed(tmp_path, directory, out, **env):
    """`python -m jaxbert embed` in a fresh process without the suite's own JAX cache, JAX logging its compiles
    (a persistent-cache hit is then a warning line)."""
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", compile_cache.ENV)}
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    return subprocess.run(
        [sys.executable, "-m", "jaxbert", "embed", directory, "--input", str(texts), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**base, "JAX_LOG_COMPILES": "1", **env},
    )


def entries(path) -> set[str]:
    """The cached programs in `path` (JAX's LRU cache keeps a -atime file beside each, and a .lockfile)."""
    return {name for name in os.listdir(path) if name.endswith("-cache")} if os.path.isdir(path) else set()


def test_a_second_run_loads_the_programs_the_first_compiled(tmp_path):
    directory = model_dir(tmp_path / "model")
    xdg = tmp_path / "xdg"
    first = embed(tmp_path, directory, tmp_path / "a.npy", XDG_CACHE_HOME=str(xdg))
    assert first.returncode == 0, first.stderr
    cache = xdg / "jaxbert" / "xla" / compile_cache.machine_tag()  # the default place, this CPU's directory
    written = entries(cache)
    assert written, f"nothing cached in {cache}: {sorted(os.listdir(xdg))}"
    assert "Persistent compilation cache hit" not in first.stderr
    second = embed(tmp_path, directory, tmp_path / "b.npy", XDG_CACHE_HOME=str(xdg))
    assert second.returncode == 0, second.stderr
    # every program of the first run is loaded, none compiled again
    assert second.stderr.count("Persistent compilation cache hit") == len(written), second.stderr
    assert "PERSISTENT COMPILATION CACHE MISS" not in second.stderr.upper(), second.stderr
    assert entries(cache) == written
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


@pytest.mark.parametrize("setting", ["0", "not-a-directory"])
def test_a_cache_turned_off_or_unwritable_only_costs_the_compile(tmp_path, setting):
    directory = model_dir(tmp_path / "model")
    blocker = tmp_path / "file"
    blocker.write_text("a file, so no directory can be made under it")
    chosen = "0" if setting == "0" else str(blocker / "cache")
    xdg = tmp_path / "xdg"
    run = embed(tmp_path, directory, tmp_path / "a.npy", XDG_CACHE_HOME=str(xdg), JAXBERT_COMPILE_CACHE=chosen)
    assert run.returncode == 0, run.stderr
    assert not xdg.exists() and blocker.read_text().startswith("a file")
    assert "Traceback" not in run.stderr and "Warning" not in run.stderr, run.stderr
    assert np.load(tmp_path / "a.npy").shape[0] == len(TEXTS)


def test_each_kind_of_cpu_has_its_own_directory(tmp_path):
    def cpuinfo(name, flags):
        path = tmp_path / name
        block = f"processor\t: {{}}\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\nflags\t\t: {flags}\n\n"
        path.write_text(block.format(0) + block.format(1).replace(flags, "fpu"))  # only the first block counts
        return str(path)

    amx = compile_cache.machine_tag(cpuinfo("amx", "fpu avx2 avx512f amx_bf16"))
    assert amx == compile_cache.machine_tag(cpuinfo("amx-again", "fpu avx2 avx512f amx_bf16"))
    assert amx != compile_cache.machine_tag(cpuinfo("avx2", "fpu avx2"))
    assert amx.split("-")[0] == compile_cache.machine_tag().split("-")[0]  # the architecture, then the hash


def test_a_cache_the_caller_set_up_is_left_as_it_is(tmp_path, monkeypatch):
    import jax

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path))
    before = jax.config.jax_compilation_cache_dir
    assert compile_cache.enable(tmp_path / "elsewhere") is None
    assert jax.config.jax_compilation_cache_dir == before
    assert not (tmp_path / "elsewhere").exists()
