"""Multi-process runs on JAX's own SPMD runtime: `jax.distributed.initialize` (explicit flags or the scheduler's
environment), CPU collectives over gloo, and the few questions the training loop asks (am I process 0? wait for
everyone; did any process get Ctrl-C? the parameters, on process 0 only). With one process all of this is a no-op.
A process that fails alone stops the others too (failures.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from jaxbert import failures

# Environment variables by which JAX's own cluster detection recognizes a multi-process launch.
_SCHEDULERS = (("SLURM_NTASKS", "Slurm"), ("OMPI_COMM_WORLD_SIZE", "Open MPI"), ("TPU_WORKER_HOSTNAMES", "TPU pod"))
_watching = False  # failures.watch() runs in this process
JOIN_TIMEOUT = 300  # seconds jax.distributed.initialize waits for every process (its default)


def _scheduler() -> str | None:
    """The scheduler that launched several processes, from its environment (None: a single process)."""
    for var, name in _SCHEDULERS:
        value = os.environ.get(var, "")
        count = len(value.split(",")) if var == "TPU_WORKER_HOSTNAMES" else int(value) if value.isdigit() else 0
        if count > 1:
            return name
    return None


def initialize(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Join the run's processes when asked by flags or by a scheduler's environment (unless the caller joined
    them already); must come before anything touches a device. Idempotent within a process."""
    global _watching
    if not jax.distributed.is_initialized():
        if coordinator_address is None and _scheduler() is None:
            return
        # JAX waits silently for every process (an unreachable coordinator: minutes, then an abort with a C++
        # trace), so each process says first what it waits for.
        where = (
            f"at {coordinator_address} as process {process_id} of {num_processes}"
            if coordinator_address is not None
            else f"as {_scheduler()} launched them"
        )
        print(
            f"jaxbert: joining the run's processes {where} (waiting up to {JOIN_TIMEOUT} s for all of them)",
            file=sys.stderr,
            flush=True,
        )
        if coordinator_address is not None:
            _check_coordinator(coordinator_address, process_id)
        # CPU devices of different processes talk over gloo (the default CPU client has no collectives); GPU and
        # TPU clients are unaffected by this setting.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if coordinator_address is None:
            jax.distributed.initialize(initialization_timeout=JOIN_TIMEOUT)  # auto-detection (Slurm, MPI, TPU pods)
        else:
            jax.distributed.initialize(
                coordinator_address,
                num_processes=num_processes,
                process_id=process_id,
                initialization_timeout=JOIN_TIMEOUT,
            )
    if not _watching and jax.process_count() > 1:
        _watching = True
        failures.watch()


def _check_coordinator(address: str, process_id: int) -> None:
    """What JAX would otherwise end with an abort and a C++ trace, said in one line: a host that does not resolve;
    on process 0, a port it cannot listen on (JAX's coordination service listens there on every interface); on the
    others, an address where nothing answers within JOIN_TIMEOUT (process 0 not started, a wrong host or port, a
    firewall), tried every second while process 0 starts."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")  # an IPv6 literal: [::1]:1234
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ConnectionError(f"--coordinator-address {address}: cannot resolve host {host!r} ({e})") from None
    if process_id == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(("::" if ":" in host else "", int(port)))
            except OSError as e:
                raise ConnectionError(
                    f"--coordinator-address {address}: process 0 cannot listen on port {port} ({e.strerror}; "
                    "another run's coordinator?)"
                ) from None
        return
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"--coordinator-address {address}: nothing answered there in {JOIN_TIMEOUT} s ({e.strerror or e}); "
                    "start process 0 with the same address, reachable from this machine"
                ) from None
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def is_primary() -> bool:
    """Process 0 writes what a run leaves besides its checkpoints (metrics, plots, OUT/final, the lock)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches `name` (nothing with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def say(message: str) -> None:
    """A log line, printed by process 0 only: the others run the same steps (their errors still print)."""
    if is_primary():
        tqdm.write(message)


def any_process(flag: bool) -> bool:
    """Whether `flag` is true on any process. A collective: every process asks at the same point of the run."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(multihost_utils.process_allgather(np.asarray(flag)).any())


def same_everywhere(settings: dict) -> None:
    """Refuse a multi-process run whose processes disagree on `settings` (JSON values: the training data's digest,
    the model config, the batch, schedule and optimizer options). Each would read its rows of other data, or
    update its share of the parameters otherwise, and the run would end as if nothing were wrong. A collective."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    text = json.dumps(settings, sort_keys=True)
    if is_primary():  # posted before the gather: every process can read it after
        failures.post_setting("jaxbert/settings", text)
    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
    digests = multihost_utils.process_allgather(digest)
    differ = [i for i, d in enumerate(digests) if not np.array_equal(d, digests[0])]
    if not differ:
        return
    if jax.process_index() not in differ:  # process 0, and any that agree with it: a differing process names what
        # differs (they have nothing to name), and these follow it
        failures.await_failure(10.0)
        raise ValueError(f"process {differ[0]} runs with other options or data than process 0")
    mine, first = json.loads(text), json.loads(failures.read_setting("jaxbert/settings"))
    key = next(k for k in sorted(set(mine) | set(first)) if mine.get(k) != first.get(k))
    raise ValueError(
        f"process {jax.process_index()} has {key}={mine.get(key)!r}, process 0 has {first.get(key)!r}: every process "
        "must run with the same options and data"
    )


def from_primary(values: list[float] | None, n: int) -> list[float]:
    """Process 0's `n` numbers on every process (None elsewhere), bit for bit (float64 sent as integers: without
    x64 JAX would round them to float32). A collective."""
    if jax.process_count() == 1:
        return list(values)
    from jax.experimental import multihost_utils

    bits = np.asarray(values if is_primary() else [0.0] * n, np.float64).view(np.uint32)
    return np.asarray(multihost_utils.broadcast_one_to_all(bits), np.uint32).view(np.float64).tolist()


def to_primary(tree):
    """numpy copies of a (sharded, possibly multi-process) tree on process 0, which writes it; None elsewhere.
    Every process must call it (some leaves take a collective)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    copies = [_leaf_to_primary(x) for x in leaves]
    return jax.tree_util.tree_unflatten(treedef, copies) if is_primary() else None


def _leaf_to_primary(x):
    if not isinstance(x, jax.Array):
        return np.asarray(x) if is_primary() else None
    if not _held_by_primary(x):
        # JAX gathers only onto every device of the mesh, so all processes join; one leaf at a time (at most one
        # extra leaf on the devices), and only process 0 copies it to the host.
        x = jax.jit(_identity, out_shardings=NamedSharding(x.sharding.mesh, P()))(x)
    if not is_primary():
        return None
    whole = np.empty(x.shape, x.dtype)
    # Process 0's devices hold every part now: put them together, each part once (replicas hold the same).
    for shard in {_block(s.index): s for s in x.addressable_shards}.values():
        whole[shard.index] = np.asarray(shard.data)
    return whole


def _held_by_primary(x) -> bool:
    """Whether process 0's devices hold every part of x (replicated, or split only among them): known from the
    sharding alone, so every process gives the same answer and joins the same collectives."""
    blocks = x.sharding.devices_indices_map(x.shape)
    return {_block(i) for d, i in blocks.items() if d.process_index == 0} == {_block(i) for i in blocks.values()}


def _block(index) -> tuple:
    return tuple((s.start, s.stop) for s in index)


def _identity(tree):
    return tree
