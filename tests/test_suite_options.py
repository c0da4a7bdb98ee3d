"""The suite's XLA compile options (tests/conftest.py): its programs compile with XLA:CPU's LLVM IR emitters, in
this process and in the child processes that set flags of their own; an `optimized` test compiles with the caller's
options, in process and in its children."""

import os
import subprocess
import sys

import conftest
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import xla_flags
from jax._src import compiler

DEVICES = "--xla_force_host_platform_device_count=4"
FLAG = "--xla_cpu_use_fusion_emitters=false"


def _child_flags(env: dict) -> list[str]:
    """XLA_FLAGS as a child process started with `env` sees them."""
    code = "import os; print(os.environ.get('XLA_FLAGS', ''))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return proc.stdout.split()


def _overrides() -> dict:
    return dict(compiler.get_compile_options(num_replicas=1, num_partitions=1).env_option_overrides)


@pytest.fixture
def fast():
    if not conftest._FAST:
        pytest.skip("the caller's XLA_FLAGS name the option, or JAX_DISABLE_MOST_OPTIMIZATIONS is off")


def test_the_suite_and_its_children_compile_with_llvm_ir_emitters(fast):
    assert FLAG in os.environ["XLA_FLAGS"].split()
    assert _overrides() == {}  # the process's flags apply as XLA read them
    flags = _child_flags({**os.environ, "XLA_FLAGS": xla_flags(DEVICES)})
    assert FLAG in flags and DEVICES in flags
    # The caller's flags come first: a flag given again by the suite or a test is the one XLA keeps.
    assert flags[: len(conftest.CALLER_XLA_FLAGS.split())] == conftest.CALLER_XLA_FLAGS.split()


@pytest.mark.optimized
def test_an_optimized_test_compiles_with_the_callers_options(fast):
    assert os.environ.get("XLA_FLAGS", "") == conftest.CALLER_XLA_FLAGS
    flags = _child_flags({**os.environ, "XLA_FLAGS": xla_flags(DEVICES)})
    assert flags == [*conftest.CALLER_XLA_FLAGS.split(), DEVICES]
    # In process XLA read FLAG when the backend started: each compilation sets XLA's default back...
    assert _overrides() == {"xla_cpu_use_fusion_emitters": True}
    # ...unless jax.jit's compiler_options name it.
    options = compiler.get_compile_options(1, 1, env_options_overrides={"xla_cpu_use_fusion_emitters": False})
    assert dict(options.env_option_overrides) == {"xla_cpu_use_fusion_emitters": False}
    # And programs compile and run with it (the library's own compiler_options pass through).
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(jax.jit(lambda a: jnp.tanh(a * 2 + 1).sum(0))(x), np.tanh(x * 2 + 1).sum(0), rtol=1e-6)
