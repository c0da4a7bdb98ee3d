"""oneDNN inside XLA:CPU: float32 matmuls of large calls (onednn_jit), and bfloat16 matmuls on the CPU's matrix units
with oneDNN's bfloat16 math mode (bf16_matmuls).

Float32: on a Sapphire Rapids-class Xeon (AMX) oneDNN's float32 kernels beat XLA:CPU's own by about 10% at a
thousand tokens a call and more (bert-base inference 8 x 128 and 8 x 512, the bert-base MLM step 8 x 128), and
lose below (1 x 128: 0.88x), so a jitted entry point compiles its large calls with XLA's per-compilation options
for oneDNN and keeps XLA's kernels for the small ones (figures at ONEDNN_MIN_TOKENS). On an AMD EPYC Zen 4 the
oneDNN path left float32's rate unchanged; there, and on CPUs not measured, XLA's kernels stay.

XLA:CPU's own bfloat16 matmuls (its YNNPACK path: bfloat16 operands, float32 sums, about 790 GFLOP/s at
1024 x 768 x 3072 on two Sapphire Rapids cores, against about 230 for float32) carry jaxbert's bfloat16 training
(ops.matmul; the weight gradients through ops._transposed_copy). The float32 matmuls left in a bfloat16 step
(attention's products, whose softmax is float32) can go to the oneDNN library that the jaxlib wheel carries,
behind two XLA flags: when oneDNN's default math mode is BF16 it computes float32 matmuls with bfloat16 inputs
and float32 accumulation on AMX tiles. A bert-base MLM step (8 x 128, bfloat16) takes 1.27 s with it, 1.34 s
without (before the weight gradients ran in bfloat16 it was the other way round in size: 1.78 s with, 2.1
without).

The switch is process-wide (every float32 matmul of the process then rounds its inputs to bfloat16), and both
settings are read once, when JAX starts its CPU backend. So it is never turned on behind a float32 run: `jaxbert
train --dtype bfloat16` turns it on; library users call `bf16_matmuls()` before their first JAX computation.
Training only: in inference the weights are constants, and oneDNN would repack them on every call (XLA keeps no
packed copy), which cost more than it saved in one measurement here (bert-base 8 x 128 bfloat16: about 27
sequences/s with every matmul through oneDNN, 36 through XLA's own kernels).
JAXBERT_ONEDNN=0 in the environment keeps XLA's own kernels (for float32 too: onednn_jit).

AMX only: on a CPU with AVX-512 BF16 but no AMX (an AMD EPYC, Zen 4, here) the same flags and mode leave float32
matmuls exactly as they were, in value and in speed (1024 x 768 x 3072: 215 GFLOP/s either way), so there the
mode is not turned on and a run's log does not claim it.
"""

from __future__ import annotations

import os
import warnings

FLAGS = ("--xla_cpu_use_onednn=true", "--xla_cpu_experimental_onednn_fusion_type=dot")
MATH_MODE = ("ONEDNN_DEFAULT_FPMATH_MODE", "BF16")


# The instructions that make a dtype's matmuls faster than float32's in XLA:CPU (its YNNPACK and oneDNN kernels).
UNITS = {"bfloat16": ("amx_bf16", "avx512_bf16"), "int8": ("amx_int8", "avx512_vnni", "avx_vnni")}
NAMES = {  # /proc/cpuinfo's flags as their makers write them
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_bf16": "AVX-512 BF16",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
}


class SlowDtypeWarning(UserWarning):
    """A reduced precision that this CPU computes no faster than float32 (see slow_dtype)."""


class RoundedFloat32Warning(UserWarning):
    """A model with float32 matmuls loaded in a process whose float32 matmuls run in bfloat16 (see rounded_float32)."""


def _cpu_flags() -> set[str] | None:
    """The x86 instruction-set flags of /proc/cpuinfo; None where it cannot tell (not Linux, not x86)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def has_amx_bf16() -> bool:
    """Whether this CPU has AMX bfloat16 tiles, where oneDNN's bfloat16 math mode computes float32 matmuls."""
    return "amx_bf16" in (_cpu_flags() or set())


def has_bf16_units() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX tiles, or AVX-512 BF16 dot products)."""
    return bool(set(UNITS["bfloat16"]) & (_cpu_flags() or set()))


def instruction_sets() -> str:
    """The vector and matrix instruction sets of this CPU that XLA:CPU's kernels use (a benchmark's machine)."""
    flags = _cpu_flags()
    if flags is None:
        return "instruction sets unknown"
    return ", ".join(name for flag, name in NAMES.items() if flag in flags) or "no AVX2"


def slow_dtype(dtype: str | None) -> str | None:
    """Why `dtype` will likely run slower than float32 (int8: than bfloat16) on this CPU, in one sentence; None
    when it will not, or when this CPU's instructions are unknown. Without the instructions of UNITS, XLA:CPU's
    bfloat16 matmuls run below its float32 rate and its int8 ones at about that rate (an AVX2-only AMD EPYC, 1024
    x 768 x 3072: 47 and 63 against 73 GFLOP/s), so the conversions around them are a loss (bert-base 8 x 128
    there: bfloat16 inference 0.71x float32, int8 0.89x, bfloat16 fine-tuning 0.76x).

    With bfloat16 units but no AMX-INT8 tiles, int8 beats float32 but not bfloat16: on an AMD EPYC (Zen 4: AVX-512
    BF16 and VNNI) XLA:CPU's int8 matmuls (signed by signed, which VNNI does not multiply directly) ran at 300 GOPS
    against 370 GFLOP/s in bfloat16, and bert-base 8 x 128 int8 inference at 0.77x bfloat16's speed."""
    flags = _cpu_flags()
    if dtype not in UNITS or flags is None:
        return None
    if dtype == "int8" and "amx_int8" not in flags and set(UNITS["bfloat16"]) & flags:
        return (
            "this CPU has bfloat16 units but no AMX-INT8 tiles: bfloat16 will likely run faster than int8 here, "
            "though int8 stores the layers' weights in half of bfloat16's bytes"
        )
    if set(UNITS[dtype]) & flags:
        return None
    wanted = " / ".join(NAMES[f] for f in UNITS[dtype])
    saving = ", though it still stores the layers' weights in a quarter of the bytes" if dtype == "int8" else ""
    return f"this CPU has no {wanted} instructions: {dtype} will likely run slower than float32{saving}"


def _backend_started() -> bool:
    try:
        from jax._src import xla_bridge

        return xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # a JAX without it: assume the worst (the flags may be ignored)
        return True


def active() -> bool:
    """Whether float32 matmuls of this process go to oneDNN in bfloat16 (set before the backend started)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return os.environ.get(MATH_MODE[0]) == MATH_MODE[1] and all(f in flags for f in FLAGS)


def rounded_float32() -> str | None:
    """Why this process's float32 matmuls are not float32, in one sentence; None when they are. The mode is
    process-wide and inherited through the environment: a program that ran `jaxbert.cli.main(["train", ...,
    "--dtype", "bfloat16"])` first, or any process it starts, computes a float32 model's matmuls with bfloat16
    inputs (MiniLM's last_hidden_state 1.2e-2 from PyTorch's instead of 3e-6), which nothing else would say."""
    if not active():
        return None
    return (
        f"this process computes float32 matmuls in bfloat16 (oneDNN's bfloat16 math mode: XLA_FLAGS has "
        f"{' '.join(FLAGS)} and {MATH_MODE[0]}={MATH_MODE[1]}, as `jaxbert train --dtype bfloat16` sets them for "
        f"itself and the processes it starts): float32 outputs are rounded to bfloat16's precision"
    )


def bf16_matmuls() -> bool:
    """Turn on oneDNN bfloat16 matmuls for this process, if it can still be done and is worth it: the CPU has
    AMX bfloat16 tiles, JAX's CPU backend has not started, JAX runs on the CPU, JAXBERT_ONEDNN is not 0. Returns
    whether the mode is on."""
    if active():
        return True
    first_platform = (os.environ.get("JAX_PLATFORMS") or "cpu").split(",")[0]
    if (
        os.environ.get("JAXBERT_ONEDNN", "1") == "0"
        or first_platform != "cpu"
        or not has_amx_bf16()
        or _backend_started()
    ):
        return False
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *FLAGS]).strip()
    os.environ[MATH_MODE[0]] = MATH_MODE[1]
    return True


def label(dtype: str) -> str:
    """A run's dtype for its log line: bfloat16 says whether oneDNN computes it, or that this CPU cannot."""
    if slow_dtype(dtype):
        return f"{dtype} (emulated: this CPU has no {dtype} instructions, float32 would be faster)"
    return f"{dtype} (oneDNN matmuls)" if dtype == "bfloat16" and active() else dtype


# Float32 matmuls of one program through oneDNN, asked per compilation (XLA's debug options as compiler options),
# so nothing else of the process changes; oneDNN's default math mode is exact float32.
ONEDNN_F32 = {"xla_cpu_use_onednn": True, "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
# Below about this many tokens a call, oneDNN's float32 kernels lose to XLA's (they repack the weights each call):
# bert-base inference 1 x 128 0.88x, 4 x 128 1.03x, 8 x 128 and more 1.09-1.12x; a bert-base MLM step 2 x 128
# 0.94x, 4 x 128 1.04x, 8 x 128 1.10x; MiniLM 1 x 128 0.84x, 8 x 128 1.03-1.05x (inference, training).
ONEDNN_MIN_TOKENS = 1024


def onednn_f32() -> dict:
    """ONEDNN_F32 where it has been measured to win: JAX on a CPU with AMX tiles (a Sapphire Rapids-class Xeon;
    elsewhere unmeasured, so XLA's own kernels stay), JAXBERT_ONEDNN not 0, and oneDNN's math mode exact (under
    bf16_matmuls it is BF16 and these options would round float32 inputs; that mode routes them anyway). {} else."""
    import jax

    if (
        os.environ.get("JAXBERT_ONEDNN", "1") == "0"
        or os.environ.get(MATH_MODE[0], "STRICT").upper() != "STRICT"
        or not has_amx_bf16()
        or jax.default_backend() != "cpu"
    ):
        return {}
    return dict(ONEDNN_F32)


def onednn_jit(fn, tokens, enabled: bool = True, **jit_kwargs):
    """jax.jit(fn, **jit_kwargs), except that calls of ONEDNN_MIN_TOKENS or more tokens (`tokens(*args)`, from the
    arguments' shapes, so every process of a run picks the same program) run one compiled with onednn_f32()'s
    options (none where it gives {} or `enabled` is false). `.pick(*args)` is the jitted function a call runs;
    `.lower(*args)` lowers it."""
    import jax

    small = jax.jit(fn, **jit_kwargs)
    options = onednn_f32() if enabled else {}
    if options:  # XLA cannot serialize these programs yet: JAX's persistent cache keeps none, without a warning
        warnings.filterwarnings("ignore", "Error writing persistent compilation cache entry .*onednn", UserWarning)
    large = jax.jit(fn, compiler_options=options, **jit_kwargs) if options else small

    def pick(*args):
        return large if tokens(*args) >= ONEDNN_MIN_TOKENS else small

    def call(*args, **kwargs):
        return pick(*args)(*args, **kwargs)

    call.pick = pick
    call.lower = lambda *args, **kwargs: pick(*args).lower(*args, **kwargs)  # as jax.jit's (AOT, HLO inspection)
    return call


def batch_tokens(params, batch, *_) -> int:
    """onednn_jit's `tokens` for functions of (params, batch holding "input_ids", ...): the batch's positions."""
    return int(batch["input_ids"].size)
