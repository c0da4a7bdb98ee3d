"""Ctrl-C or SIGTERM (what `kill`, `timeout`, a scheduler's preemption or `docker stop` send) during training: the
first one asks the loop to stop after the step it is in (so no checkpoint or metrics line is cut short); a second
one interrupts at once. The handlers exist only while the loop runs. With several processes the request is this
process's own: the loop shares it with the others at every step boundary (distributed.any_process), so all of
them stop after the same step, whichever got the signal."""

from __future__ import annotations

import contextlib
import signal
import threading


class StopRequest:
    requested: bool = False
    signum: int = signal.SIGINT  # the signal that asked


@contextlib.contextmanager
def deferred_sigint():
    """Yield a StopRequest whose `requested` the first SIGINT or SIGTERM sets; the previous handlers come back
    afterwards. Outside the main thread (no signals there) nothing changes, nor for a signal that is ignored (a
    background job's SIGINT)."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested, stop.signum = True, signum
        # stdout (stderr is left to the command's one closing line); no tqdm lock taken inside a handler.
        print(f"\n{signal.Signals(signum).name}: stopping after the current step (again to stop at once)", flush=True)

    for s, old in previous.items():
        if old is not signal.SIG_IGN:
            signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, old in previous.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
