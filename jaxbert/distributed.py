"""Multi-process runs on JAX's own SPMD runtime: `jax.distributed.initialize` (explicit flags or the scheduler's
environment), CPU collectives over gloo, and the few questions the training loop asks (am I process 0? wait for
everyone). With one process all of this is a no-op.
"""

from __future__ import annotations

import os

import jax

# Environment variables by which JAX's own cluster detection recognizes a multi-process launch.
_SCHEDULERS = (("SLURM_NTASKS", "Slurm"), ("OMPI_COMM_WORLD_SIZE", "Open MPI"), ("TPU_WORKER_HOSTNAMES", "TPU pod"))
_started = False


def _scheduler() -> str | None:
    """The scheduler that launched several processes, from its environment (None: a single process)."""
    for var, name in _SCHEDULERS:
        value = os.environ.get(var, "")
        count = len(value.split(",")) if var == "TPU_WORKER_HOSTNAMES" else int(value) if value.isdigit() else 0
        if count > 1:
            return name
    return None


def initialize(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Join the run's processes when asked by flags or by a scheduler's environment; must come before anything
    touches a device. Idempotent within a process."""
    global _started
    if _started or jax.distributed.is_initialized():
        return
    if coordinator_address is None and _scheduler() is None:
        return
    # CPU devices of different processes talk over gloo (the default CPU client has no collectives); GPU and TPU
    # clients are unaffected by this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator_address is None:
        jax.distributed.initialize()  # JAX's auto-detection (Slurm, Open MPI, TPU pods)
    else:
        jax.distributed.initialize(coordinator_address, num_processes=num_processes, process_id=process_id)
    _started = True


def is_primary() -> bool:
    """Process 0 writes what a run leaves besides its checkpoints (metrics, plots, OUT/final, the lock)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches `name` (nothing with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
