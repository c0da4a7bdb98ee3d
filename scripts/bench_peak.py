"""The CPU's arithmetic peak, measured: benchmark.py's `CPU peak` rows, the ceiling no matmul kernel passes.

A few lines of C, compiled here by the system's C compiler with -march=native, run twelve independent chains of
one multiply-add instruction on every core the process may use (float32 FMA; bfloat16 dot product, AVX-512 BF16;
unsigned-by-signed int8 dot product, VNNI) and count the operations per second. A kernel's rate over it is how
much of the machine it uses: on a 2-core AMD EPYC Zen 4 the probe gives about 200-230 GFLOP/s float32, 460
bfloat16 and 890 GOPS int8, and XLA:CPU's own dots reach about 210, 400-425 and 270 (its int8 dots are signed by
signed, which VNNI does not multiply in one instruction).

Where the CPU has AMX tiles (Intel Xeon since Sapphire Rapids) bfloat16 and int8 are measured on them instead, the
units oneDNN's and OpenVINO's kernels use there: four accumulating tiles, each instruction a 16 x 16 x 32 (bfloat16)
or 16 x 16 x 64 (int8) product. On a 2-core Xeon VM: 7,500 GFLOP/s bfloat16 and 15,200 GOPS int8, against 246 and
1,820 from the vector instructions (float32 FMA: 480). Returns a note instead where there is no compiler or the CPU
lacks the instruction.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from jaxbert.cpu import _cpu_flags  # /proc/cpuinfo's flags (None where unknown)

CHAINS = 12  # independent accumulators: more than latency x issue width of the multiply-add units

# dtype -> choices, widest first: (/proc/cpuinfo flags needed, C vector type, its set1 / operands, the instruction,
# operations per instruction: 2 x multiply-adds)
KINDS = {
    "float32": (
        (("avx512f",), "__m512", "_mm512_set1_ps(1e-3f * {i})", "_mm512_set1_ps(0.5f)", "_mm512_fmadd_ps", 32),
        (("avx2", "fma"), "__m256", "_mm256_set1_ps(1e-3f * {i})", "_mm256_set1_ps(0.5f)", "_mm256_fmadd_ps", 16),
    ),
    "bfloat16": (
        (
            ("avx512_bf16",),
            "__m512",
            "_mm512_set1_ps(1e-3f * {i})",
            "(__m512bh)_mm512_set1_epi16(0x3f00)",
            "_mm512_dpbf16_ps",
            64,
        ),
    ),
    "int8": (
        (("avx512_vnni",), "__m512i", "_mm512_set1_epi32({i})", "_mm512_set1_epi8(1)", "_mm512_dpbusd_epi32", 128),
        (("avx_vnni",), "__m256i", "_mm256_set1_epi32({i})", "_mm256_set1_epi8(1)", "_mm256_dpbusd_avx_epi32", 64),
    ),
}

# dtype -> (/proc/cpuinfo flag, the tile instruction, operations per instruction: 2 x 16 x 16 x pairs / quads)
AMX = {
    "bfloat16": ("amx_bf16", "_tile_dpbf16ps", 2 * 16 * 16 * 32),
    "int8": ("amx_int8", "_tile_dpbusd", 2 * 16 * 16 * 64),
}

# Both probes: the header, a timer, and main() running `run` on every thread and printing the summed rate (or nan
# where `{grant}`, the AMX probe's request for the tile state, fails).
_COMMON = """
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }}
static volatile int sink;
static void *run(void *out);

int main(int argc, char **argv) {{
  if (!({grant})) {{ printf("nan\\n"); return 0; }}
  int threads = atoi(argv[1]);
  pthread_t t[256];
  double rate[256], total = 0;
  for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, run, &rate[i]);
  for (int i = 0; i < threads; i++) {{ pthread_join(t[i], 0); total += rate[i]; }}
  printf("%.6e\\n", total);
  return 0;
}}
"""

_VECTOR = """
static void *run(void *out) {{
  {vector} {declare};
  const {operand_type} x = {operand}, y = {operand};
  long chunks = 0;
  double start = now();
  do {{
    for (int n = 0; n < 100000; n++) {{ {step} }}
    chunks++;
  }} while (now() - start < 0.4);
  *(double *)out = chunks * 100000.0 * {chains} / (now() - start);
  {vector} all = {total};  /* every chain feeds the result, so none is dead code */
  sink = ((volatile char *)&all)[0];
  return 0;
}}
"""

# Tiles 0-3 accumulate (four independent chains cover the instruction's latency: six measured the same), 4-5 and
# 6-7 are the operands. Linux hands out the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, 0x1023, for
# XFEATURE_XTILEDATA, 18); where it refuses, the probe prints nan and the vector probe is used instead.
_AMX_GRANT = "syscall(SYS_arch_prctl, 0x1023, 18) == 0"
_AMX = """
static void *run(void *out) {{
  struct __attribute__((packed)) {{
    unsigned char palette, start, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
  }} cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) {{ cfg.colsb[i] = 64; cfg.rows[i] = 16; }}
  _tile_loadconfig(&cfg);
  static __attribute__((aligned(64))) char operand[16 * 64];
  __attribute__((aligned(64))) char result[16 * 64];
  memset(operand, 1, sizeof operand);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, operand, 64); _tile_loadd(5, operand, 64); _tile_loadd(6, operand, 64); _tile_loadd(7, operand, 64);
  long chunks = 0;
  double start = now();
  do {{
    for (int n = 0; n < 10000; n++) {{ {op}(0, 4, 6); {op}(1, 4, 7); {op}(2, 5, 6); {op}(3, 5, 7); }}
    chunks++;
  }} while (now() - start < 0.4);
  *(double *)out = chunks * 10000.0 * 4 / (now() - start);
  _tile_stored(0, result, 64);  /* the accumulators feed the result, so none is dead code */
  sink = result[0];
  _tile_release();
  return 0;
}}
"""


def _amx_source(instruction: str) -> str:
    return _COMMON.format(grant=_AMX_GRANT) + _AMX.format(op=instruction)


def _source(vector: str, init: str, operand: str, instruction: str) -> str:
    names = [f"a{i}" for i in range(CHAINS)]
    return _COMMON.format(grant=1) + _VECTOR.format(
        vector=vector,
        declare=", ".join(f"{n} = {init.format(i=i)}" for i, n in enumerate(names)),
        operand_type="__m512bh" if operand.startswith("(__m512bh)") else vector,
        operand=operand,
        step=" ".join(f"{n} = {instruction}({n}, x, y);" for n in names),
        chains=CHAINS,
        total=" + ".join(names),
    )


def _measure(source: str, name: str, threads: int) -> float | str:
    """Operations per second on `threads` threads of the probe in `source` (the best of three runs of about 0.4 s
    each; nan where the kernel refused it), or a note why it did not run."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return "no C compiler (cc): CPU peak not measured"
    with tempfile.TemporaryDirectory() as tmp:
        path, binary = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak")
        with open(path, "w") as f:
            f.write(source)
        build = subprocess.run(
            [compiler, "-O2", "-march=native", "-pthread", path, "-o", binary], capture_output=True, text=True
        )
        if build.returncode:
            return f"the {name} probe did not compile: {build.stderr.strip().splitlines()[-1:]}"
        return max(
            float(subprocess.run([binary, str(threads)], capture_output=True, text=True, check=True).stdout)
            for _ in range(3)
        )


def _probes(dtype: str, flags: set) -> list[tuple[str, str, int]]:
    """(C source, instruction, operations per instruction) this CPU can run for `dtype`, best first: AMX tiles,
    then the widest vector multiply-add."""
    probes = []
    if dtype in AMX and {"amx_tile", AMX[dtype][0]} <= flags:
        _, instruction, ops = AMX[dtype]
        probes.append((_amx_source(instruction), instruction, ops))
    vector = next((k for k in KINDS[dtype] if set(k[0]) <= flags), None)
    if vector is not None:
        _, kind, init, operand, instruction, ops = vector
        probes.append((_source(kind, init, operand, instruction), instruction, ops))
    return probes


def cpu_peak(dtype: str) -> dict:
    """{"gflops": operations/s / 1e9 over every core this process may use, "instruction", "threads"}, or
    {"note": why not}: AMX tiles where the CPU has them for `dtype` (and Linux grants them), else the widest
    vector multiply-add."""
    threads = len(os.sched_getaffinity(0))
    note = f"no {dtype} multiply-add instruction this probe knows on this CPU"
    for source, instruction, ops in _probes(dtype, _cpu_flags() or set()):
        rate = _measure(source, instruction, threads)
        if isinstance(rate, str):
            note = rate
        elif rate == rate:  # not nan: the instruction ran (the tiles were granted)
            return {"gflops": rate * ops / 1e9, "instruction": instruction, "threads": threads}
    return {"note": note}
