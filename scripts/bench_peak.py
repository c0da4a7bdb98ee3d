"""The CPU's arithmetic peak, measured: benchmark.py's `CPU peak` rows, the ceiling no matmul kernel passes.

A few lines of C, compiled here by the system's C compiler with -march=native, run twelve independent chains of
one multiply-add instruction on every core the process may use (float32 FMA; bfloat16 dot product, AVX-512 BF16;
unsigned-by-signed int8 dot product, VNNI) and count the operations per second. A kernel's rate over it is how
much of the machine it uses: on a 2-core AMD EPYC Zen 4 the probe gives about 200-230 GFLOP/s float32, 460
bfloat16 and 890 GOPS int8, and XLA:CPU's own dots reach about 210, 400-425 and 270 (its int8 dots are signed by
signed, which VNNI does not multiply in one instruction). Returns a note instead where there is no compiler or
the CPU lacks the instruction.
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

_PROGRAM = """
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }}
static volatile int sink;

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

int main(int argc, char **argv) {{
  int threads = atoi(argv[1]);
  pthread_t t[256];
  double rate[256], total = 0;
  for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, run, &rate[i]);
  for (int i = 0; i < threads; i++) {{ pthread_join(t[i], 0); total += rate[i]; }}
  printf("%.6e\\n", total);
  return 0;
}}
"""


def _source(vector: str, init: str, operand: str, instruction: str) -> str:
    names = [f"a{i}" for i in range(CHAINS)]
    return _PROGRAM.format(
        vector=vector,
        declare=", ".join(f"{n} = {init.format(i=i)}" for i, n in enumerate(names)),
        operand_type="__m512bh" if operand.startswith("(__m512bh)") else vector,
        operand=operand,
        step=" ".join(f"{n} = {instruction}({n}, x, y);" for n in names),
        chains=CHAINS,
        total=" + ".join(names),
    )


def cpu_peak(dtype: str) -> dict:
    """{"gflops": operations/s / 1e9 over every core this process may use, "instruction", "threads"}, or
    {"note": why not}. The best of three runs of about 0.4 s each."""
    flags = _cpu_flags() or set()
    choice = next((k for k in KINDS[dtype] if set(k[0]) <= flags), None)
    if choice is None:
        return {"note": f"no {dtype} multiply-add instruction this probe knows on this CPU"}
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return {"note": "no C compiler (cc): CPU peak not measured"}
    _, vector, init, operand, instruction, ops = choice
    threads = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak")
        with open(source, "w") as f:
            f.write(_source(vector, init, operand, instruction))
        build = subprocess.run(
            [compiler, "-O2", "-march=native", "-pthread", source, "-o", binary], capture_output=True, text=True
        )
        if build.returncode:
            return {"note": f"the {instruction} probe did not compile: {build.stderr.strip().splitlines()[-1:]}"}
        rate = max(
            float(subprocess.run([binary, str(threads)], capture_output=True, text=True, check=True).stdout)
            for _ in range(3)
        )
    return {"gflops": rate * ops / 1e9, "instruction": instruction, "threads": threads}
