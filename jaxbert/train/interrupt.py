"""Ctrl-C during training: the first one asks the loop to stop after the step it is in (so no checkpoint or
metrics line is cut short); a second one interrupts at once. The handler exists only while the loop runs. With
several processes the request is this process's own: the loop shares it with the others at every step boundary
(distributed.any_process), so all of them stop after the same step, whichever got the Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import threading


class StopRequest:
    requested: bool = False


@contextlib.contextmanager
def deferred_sigint():
    """Yield a StopRequest whose `requested` the first SIGINT sets; the previous handler comes back afterwards.
    Outside the main thread (no signals there) or when SIGINT is ignored (a background job), nothing changes."""
    stop = StopRequest()
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield stop
        return

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True
        # stdout (stderr is left to the command's one closing line); no tqdm lock taken inside a handler.
        print("\ninterrupt: stopping after the current step (Ctrl-C again to stop at once)", flush=True)

    signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
