"""Multi-process runs on JAX's own SPMD runtime: `jax.distributed.initialize` (explicit flags or the scheduler's
environment), CPU collectives over gloo, and the few questions the training loop asks (am I process 0? wait for
everyone; did any process get Ctrl-C? the parameters, on process 0 only). With one process all of this is a no-op.

A process that fails alone (an error, a Ctrl-C while compiling) would leave the others blocked in their next
collective until JAX's shutdown barrier gives up minutes later. So it posts its error in the coordination
service's key-value store (`fail_together`), and a watcher thread in every process stops that process at once,
naming the process that failed and why.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

# Environment variables by which JAX's own cluster detection recognizes a multi-process launch.
_SCHEDULERS = (("SLURM_NTASKS", "Slurm"), ("OMPI_COMM_WORLD_SIZE", "Open MPI"), ("TPU_WORKER_HOSTNAMES", "TPU pod"))
_started = False
_failing = False  # this process posted the run's failure (its own error ends it: see failing())
_closing = False  # the interpreter is exiting: the watcher stops
_following = threading.Lock()  # held by the thread that leaves after another process's failure (_follow)
_POLL_MS = 500  # the watcher's wait for a failure before it checks _closing (at most this is added to an exit)
_FAILED, _STOPPING, _REPORTED = "jaxbert/failed", "jaxbert/stopping/{}", "jaxbert/reported"
_GRACE_MS = 10_000  # how long a failing process waits for the others to stop, and they for its error to print
_LAST_OUT_S = 2.0  # how long process 0 lets the others leave before it does (see _exit)


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
    if jax.process_count() > 1:
        watcher = threading.Thread(target=_watch, args=(_client(),), name="jaxbert-failures", daemon=True)
        watcher.start()
        # Before JAX's own exit handler shuts the client down: a thread still blocked in it at interpreter exit
        # aborts the process.
        atexit.register(_stop_watching, watcher)


def _stop_watching(watcher: threading.Thread) -> None:
    global _closing
    _closing = True
    watcher.join(timeout=2 * _POLL_MS / 1000)


def _client():
    from jax._src import distributed as jd  # JAX has no public key-value API (orbax reads the client the same way)

    return jd.global_state.client


def _watch(client) -> None:
    """Until the run shuts down: when another process posts its failure, say so and leave with its exit code
    (this process may be blocked in a collective that will never complete)."""
    while not _closing:
        try:
            posted = json.loads(client.blocking_key_value_get(_FAILED, _POLL_MS))
        except Exception as e:  # a timeout: look again; anything else: the run is shutting down
            if "DEADLINE_EXCEEDED" in str(e):
                continue
            return
        if posted["process"] != jax.process_index():  # this process's own failure is its main thread's to report
            _follow(client, posted)
        return


def _follow(client, posted: dict) -> None:
    """Another process failed first: say so, tell it this one is stopping, let it print its error, then leave
    with its exit status. Never returns. Called by the watcher, or by the main thread when an error of its own
    (a collective whose peer left) turns out to follow another process's failure; whichever comes second waits
    for the first to end the process."""
    if not _following.acquire(blocking=False):
        while True:
            time.sleep(60)
    me = jax.process_index()
    what = "was interrupted" if posted["code"] == 130 else f"failed ({posted['error']})"
    print(f"jaxbert: error: process {posted['process']} {what}; process {me} stops too", file=sys.stderr, flush=True)
    _post(client, _STOPPING.format(me), "")
    with contextlib.suppress(Exception):  # let the failing process print its error before the service goes
        client.blocking_key_value_get(_REPORTED, _GRACE_MS)
    _exit(posted["code"])


def _post(client, key: str, value: str) -> None:
    with contextlib.suppress(Exception):  # already there: another process failed first
        client.key_value_set(key, value)


@contextlib.contextmanager
def fail_together(coordinated: tuple[type[BaseException], ...] = ()):
    """Run a multi-process job's body: an exception on this process alone (not one of `coordinated`, which every
    process raises at the same point) stops every other process too, instead of leaving it blocked."""
    try:
        yield
    except coordinated:
        raise
    except BaseException as e:
        if jax.process_count() > 1 and _started:
            _post_failure(e)
        raise


def _post_failure(e: BaseException) -> None:
    """Post this process's failure, then wait (briefly) until every other process stops or fails itself."""
    global _failing
    from jaxbert.files import one_line

    me, client = jax.process_index(), _client()
    interrupted = isinstance(e, KeyboardInterrupt)
    error = "interrupted" if interrupted else one_line(e)
    if not isinstance(e, (ValueError, OSError, ImportError, TypeError, KeyboardInterrupt)):
        error = f"{type(e).__name__}: {error}"  # an unexpected error: its type says more than its message
    _post(client, _FAILED, json.dumps({"process": me, "error": error, "code": 130 if interrupted else 1}))
    try:
        first = json.loads(client.key_value_try_get(_FAILED))
    except Exception:  # the service is gone: nobody else to tell
        first = {"process": me}
    if first["process"] != me:  # another process failed first (this error may be its consequence)
        _follow(client, first)
    _failing = True
    _post(client, _STOPPING.format(me), "")
    deadline = time.monotonic() + _GRACE_MS / 1000
    for other in range(jax.process_count()):
        with contextlib.suppress(Exception):
            client.blocking_key_value_get(_STOPPING.format(other), max(1, int((deadline - time.monotonic()) * 1000)))
    atexit.register(leave_failed, 1)  # a library caller's exit: the shutdown barrier would wait for the gone


def failing() -> bool:
    """Whether this process has posted its own failure (the others are stopping)."""
    return _failing


def leave_failed(code: int) -> None:
    """End a process that posted its failure, once its error is printed: the others wait for this before they
    go, and JAX's shutdown barrier (which would wait for them) is skipped."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _client() is not None:
        _post(_client(), _REPORTED, "")
    _exit(code)


def _exit(code: int) -> None:
    """Leave now. Process 0 hosts the coordination service and goes last: a process whose service vanishes is
    aborted by JAX's client (a fatal log instead of its own exit), while one whose peer left is not (until the
    heartbeat timeout, long after)."""
    if jax.process_index() == 0:
        time.sleep(_LAST_OUT_S)
    os._exit(code)


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
