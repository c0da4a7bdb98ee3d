"""Multi-process runs fail together. A process that fails alone (an error, a Ctrl-C before the first step) would
leave the others blocked in their next collective until JAX's shutdown barrier gives up minutes later. So it
posts its error in the coordination service's key-value store (`fail_together`), and a watcher thread in every
process (`watch`, started by distributed.initialize) stops that process at once, naming the process that failed
and why. A process killed outright cannot post anything: JAX's heartbeat timeout stops the others then.
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

_failing = False  # this process posted the run's failure (its own error ends it: see failing())
_closing = False  # the interpreter is exiting: the watcher stops
_following = threading.Lock()  # held by the thread that leaves after another process's failure (_follow)
_POLL_MS = 500  # the watcher's wait for a failure before it checks _closing (at most this is added to an exit)
_FAILED, _STOPPING, _REPORTED = "jaxbert/failed", "jaxbert/stopping/{}", "jaxbert/reported"
_GRACE_MS = 10_000  # how long a failing process waits for the others to stop, and they for its error to print
_LAST_OUT_S = 2.0  # how long process 0 lets the others leave before it does (see _exit)


def watch() -> None:
    """Start this process's watcher (a multi-process run, once, after jax.distributed.initialize)."""
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


def post_setting(key: str, value: str) -> None:
    """Put `key` in the run's key-value store (multi-process runs only)."""
    _client().key_value_set(key, value)


def read_setting(key: str) -> str:
    return _client().key_value_try_get(key)


def await_failure(seconds: float) -> None:
    """Leave as another process's failure says (see _follow), once it is posted; return if none is in `seconds`."""
    try:
        posted = json.loads(_client().blocking_key_value_get(_FAILED, int(seconds * 1000)))
    except Exception:
        return
    _follow(_client(), posted)


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
        if jax.process_count() > 1:
            _post_failure(e)
        raise


def _post_failure(e: BaseException) -> None:
    """Post this process's failure, then wait (briefly) until every other process stops or fails itself."""
    global _failing
    from jaxbert.files import EXPECTED_ERRORS, one_line

    me, client = jax.process_index(), _client()
    interrupted = isinstance(e, KeyboardInterrupt)
    error = "interrupted" if interrupted else one_line(e)
    if not isinstance(e, (*EXPECTED_ERRORS, KeyboardInterrupt)):
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
