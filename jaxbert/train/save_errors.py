"""A checkpoint write that fails (a full disk, a file-size limit) as one OSError, with nothing left of the step.

orbax writes through tensorstore's threads. When a write fails, the save does raise, but as a ValueError whose
text is tensorstore's ("OUT_OF_RANGE: Error writing ... [os_error_code='28']"), and before and after it the
failure is reported again and again on the console: orbax logs each failed thread with its traceback (logger
"absl"), tensorstore's callbacks find orbax's event loop closed (an unraisable RuntimeError each, dozens), and
asyncio logs every future nobody awaited when it is collected, and Python warns of each coroutine never run. A
full disk printed some 800 lines before the run's own error line, and left STEP.orbax-checkpoint-tmp behind.

`writing(directory)` keeps those reports of *this* step off the console (records naming its directory, the
closed-loop errors) while the step is written, and for the rest of the process once it has failed (the run is
ending: stray callbacks still arrive); it turns the error into OSError(errno) and removes the partial step.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import os
import re
import shutil
import sys
import time
import types

from jaxbert import distributed

_OS_ERROR = re.compile(r"os_error_code='(\d+)'")
LOGGERS = ("absl", "asyncio")  # orbax's threads log through absl; asyncio reports futures never awaited


def os_error(e: BaseException) -> OSError | None:
    """The OSError an orbax / tensorstore write error stands for (tensorstore names the errno), else None."""
    if isinstance(e, OSError):
        return e
    match = _OS_ERROR.search(str(e))
    if match is None:
        return None
    code = int(match.group(1))
    return OSError(code, os.strerror(code))


class _Quiet(logging.Filter):
    def __init__(self, directory: str):
        super().__init__()
        self.directory = directory
        self.previous_hook = sys.unraisablehook

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep a record unless it is about this step: it names the directory, or carries a write error (orbax's
        metadata writes raise plain OSErrors, which name no file)."""
        error = record.exc_info[1] if record.exc_info else None
        return self.directory not in record.getMessage() and (error is None or os_error(error) is None)

    def unraisable(self, u) -> None:
        if not (isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"):
            self.previous_hook(u)

    def install(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self)
        sys.unraisablehook = self.unraisable

    def remove(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self)
        if sys.unraisablehook == self.unraisable:
            sys.unraisablehook = self.previous_hook


def _remove_partial(directory: str) -> None:
    """orbax's temporary of the step (and the step itself, if it was renamed before its digests failed)."""
    if not distributed.is_primary():  # one process removes; a shared directory is the same for all
        return
    parent, name = os.path.split(directory)

    def partial() -> list[str]:
        entries = os.listdir(parent) if os.path.isdir(parent) else ()
        return [e for e in entries if e == name or e.startswith(name + ".orbax-checkpoint-tmp")]

    # The failed write's other threads may still be adding files: a removal racing one of them leaves a non-empty
    # directory behind (seen under load), so remove until the step is gone and stays gone, for at most 10 s.
    deadline, gone = time.monotonic() + 10.0, 0
    while gone < 2 and time.monotonic() < deadline:
        left = partial()
        for entry in left:
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        gone = 0 if left else gone + 1
        time.sleep(0.05)


def _close_unstarted() -> None:
    """Close the failed write's coroutines that never ran (orbax's, created for a gather that failed first): Python
    warns of each one never awaited when it is collected, some at the process's end."""
    for obj in gc.get_objects():
        if (
            type(obj) is types.CoroutineType  # type(), not isinstance: a proxy's __class__ may warn (torch's do)
            and inspect.getcoroutinestate(obj) == inspect.CORO_CREATED
            and f"{os.sep}orbax{os.sep}" in obj.cr_code.co_filename
        ):
            obj.close()


@contextlib.contextmanager
def writing(directory: str):
    """Around the write of one checkpoint step into `directory` (see the module docstring)."""
    quiet = _Quiet(directory)
    quiet.install()
    failed = False
    try:
        yield
    except (OSError, ValueError) as e:
        error = os_error(e)
        if error is None:
            raise
        failed = True  # `quiet` stays: the failed write's threads still report it until the process ends
        _remove_partial(directory)
        _close_unstarted()
        raise error from None
    finally:
        if not failed:
            quiet.remove()
