"""One writer per output directory: OUT/.jaxbert.lock, created atomically (O_CREAT | O_EXCL) and holding its
owner's pid, host and start time as JSON.

Without it, two runs on one OUT both "succeed" while overwriting each other's checkpoints and interleaving
metrics.jsonl. The lock is removed on every exit the process sees (success, error, Ctrl-C); after a kill -9
it stays behind, and a later run on the same host sees that its pid is gone (or is its own: a restarted
container's command runs as the same pid) and calls it stale. A lock from another host cannot be checked.
`--break-lock` takes over a stale or unverifiable lock, never one whose owner is running on this host.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time

LOCK_NAME = ".jaxbert.lock"
READ_TRIES = 10  # the owner creates the file, then writes it: give a just-created lock a moment to fill
_HELD: set[str] = set()  # the locks this process holds: a lock naming its pid that is not one of them is stale


class LockedError(ValueError):
    """OUT belongs to another run (or to an interrupted one: see the message)."""


@contextlib.contextmanager
def hold(directory: str, break_lock: bool = False):
    """Own `directory` for the duration of the block. A directory this call created, and that is still empty
    when the block ends (e.g. the run failed checking its inputs), is removed again."""
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        _acquire(path, mine, break_lock)  # failing (a full disk, another run's lock), it leaves no OUT it made
        _HELD.add(os.path.realpath(path))
        try:
            yield path
        finally:
            _HELD.discard(os.path.realpath(path))
            _release(path, mine)
    finally:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _create(path: str, mine: dict) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(mine) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:  # e.g. a full disk: an empty lock would read as "unreadable" to every later run
        os.unlink(path)
        if isinstance(e, OSError):  # "[Errno 28] No space left on device" names no file
            raise OSError(e.errno, f"{path}: writing failed ({e.strerror or e})") from None
        raise
    return True


def _acquire(path: str, mine: dict, break_lock: bool) -> None:
    taken_from = None
    for _ in range(3):  # a lock can vanish (its owner ended) or reappear (a newcomer) between the calls below
        if _create(path, mine):
            if taken_from is not None:
                print(f"lock: took over {path} from {_who(taken_from)} (--break-lock)", flush=True)
            return
        owner, state = read_owner(path)
        if state == "gone":
            continue
        if state == "running" or not break_lock:
            raise LockedError(_refusal(path, owner, state))
        with contextlib.suppress(FileNotFoundError):
            if read_owner(path)[0] == owner:  # still the lock judged above, not a newcomer's
                os.unlink(path)
                taken_from = owner
    raise LockedError(f"{os.path.dirname(path)}: could not take {path}: other runs keep taking it")


def read_owner(path: str) -> tuple[dict | None, str]:
    """(owner, state): state is "running", "stale" (same host, pid gone), "elsewhere" (another host: cannot
    tell), "unreadable" or "gone" (no lock file any more)."""
    owner = None
    for _ in range(READ_TRIES):
        try:
            with open(path, encoding="utf-8") as f:
                owner = json.loads(f.read())
            break
        except FileNotFoundError:
            return None, "gone"
        except (ValueError, OSError):
            time.sleep(0.05)
    if not (isinstance(owner, dict) and isinstance(owner.get("pid"), int) and isinstance(owner.get("host"), str)):
        return owner, "unreadable"
    if owner["host"] != socket.gethostname():
        return owner, "elsewhere"
    if owner["pid"] == os.getpid() and os.path.realpath(path) not in _HELD:
        # Our pid, not our lock: left by an earlier process that had the pid. A restarted container runs its
        # command as the same pid on the same host name, so after a kill -9 its lock read as live, forever.
        return owner, "stale"
    return owner, "running" if _alive(owner["pid"]) else "stale"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM  # exists, owned by someone else
    return True


def _who(owner) -> str:
    if not isinstance(owner, dict):
        return "an unknown owner"
    return f"pid {owner.get('pid')} on {owner.get('host')}" + (
        f" (started {owner['started']})" if owner.get("started") else ""
    )


def _refusal(path: str, owner, state: str) -> str:
    directory = os.path.dirname(path)
    if state == "running":
        return (
            f"{directory}: in use by another jaxbert run, {_who(owner)}; wait for it or choose another "
            f"--output-dir (lock file {path})"
        )
    if state == "stale":
        gone = "is not running"
        if owner["pid"] == os.getpid():
            gone = "is this process, which did not take it (an earlier one had its pid, as in a restarted container)"
        return (
            f"{directory}: locked, but pid {owner['pid']} on {owner['host']} {gone}: stale lock from "
            "an interrupted run; pass --break-lock to take it over"
        )
    if state == "elsewhere":
        return (
            f"{directory}: locked by {_who(owner)}, another host (cannot check whether it still runs); "
            f"pass --break-lock to take it over if it does not"
        )
    return f"{path}: unreadable lock file; pass --break-lock to take it over if no run uses {directory}"


def _release(path: str, mine: dict) -> None:
    """Remove the lock only while it is still ours (someone may have broken it meanwhile)."""
    try:
        with open(path, encoding="utf-8") as f:
            if json.loads(f.read()) != mine:
                return
        os.unlink(path)
    except (OSError, ValueError):
        pass
