"""The file-system rules every reader and writer shares: files named by a checkpoint stay inside it, writers
never touch their source, outputs appear whole or not at all, JSON is read with its failures named.

Symlink policy: a checkpoint file may be a symlink only if its target resolves inside the checkpoint
directory, or, when the directory is a Hugging Face cache snapshot (`…/models--ORG--NAME/snapshots/REV`, whose
files link to `../../blobs/HASH`), inside that model's cache entry (`…/models--ORG--NAME`). Anything else
(an absolute path, `..` out of the directory, a link elsewhere) is refused, naming the file and its target.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import time

# Errors a command expects (bad input, a missing file or extra): reported in one line, without a traceback.
EXPECTED_ERRORS = (ValueError, OSError, ImportError, TypeError)
MAX_MESSAGE = 600  # characters of an error line; longer ones are cut (a file can name a million keys)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # ANSI escapes start with \x1b: shown, not obeyed


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def allowed_roots(directory: str) -> tuple[str, ...]:
    """Where files of `directory` may resolve: the directory itself, and its HF cache entry if it is a snapshot or
    a folder of one (a sentence-transformers model's 0_Transformer/, whose files link to ../../../blobs/HASH)."""
    real = os.path.realpath(directory)
    parts = real.split(os.sep)
    for i in range(len(parts) - 2, 0, -1):  # parts[i + 1] is the revision
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--") and parts[i + 1]:
            return real, os.sep.join(parts[:i])
    return (real,)


def checkpoint_file(directory: str, name: str) -> str:
    """`directory/name` after checking that `name` (read from a file, e.g. a shard index) and the file it leads
    to through any symlinks stay inside the checkpoint (see the policy above). Existence is not checked."""
    if not isinstance(name, str) or not name or os.path.isabs(name) or "\0" in name:
        raise ValueError(f"{directory}: file name {name!r} is not a relative path inside the checkpoint")
    path = os.path.join(directory, name)
    if os.path.normpath(name).split(os.sep)[0] == os.pardir:
        raise ValueError(f"{path}: names a file outside the checkpoint directory")
    target = os.path.realpath(path)
    if not any(_within(target, root) for root in allowed_roots(directory)):
        raise ValueError(
            f"{path}: resolves to {target}, outside the checkpoint directory (symlinks must stay "
            "inside it, or inside the model's Hugging Face cache entry)"
        )
    return path


def existing_file(directory: str, name: str) -> str | None:
    """The checked path of `name` in `directory` if it is a file there, else None."""
    path = checkpoint_file(directory, name)
    return path if os.path.isfile(path) else None


def read_json(path: str, expect: type = dict):
    """A JSON file's value, which must be of type `expect`; every failure is a ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None
    except ValueError as e:  # Python's own limits, e.g. an integer of more than 4,300 digits
        raise ValueError(f"{path}: unreadable JSON ({e})") from None
    if not isinstance(value, expect):
        raise ValueError(
            f"{path}: expected a JSON {_JSON_NAMES.get(expect, expect.__name__)}, "
            f"got {_JSON_NAMES.get(type(value), type(value).__name__)}"
        )
    return value


def json_line(line: str, where: str):
    """One JSON Lines record's value; every failure a ValueError starting with `where` (file:line). An object
    holding a key twice is refused, naming it: Python's json keeps the last value without a word, and pyarrow's
    reader (behind `datasets`) refuses it too."""
    try:
        return json.loads(line, object_pairs_hook=_once_each)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: invalid JSON ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply") from None
    except _RepeatedKey as e:
        raise ValueError(f"{where}: the key {e.args[0]!r} appears twice in one object") from None
    except ValueError as e:  # Python's own limits, e.g. an integer of more than 4,300 digits
        raise ValueError(f"{where}: unreadable JSON ({e})") from None


class _RepeatedKey(Exception):
    pass


def _once_each(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


_JSON_NAMES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def check_disjoint(src: str, dst: str) -> None:
    """Refuse a destination that is the source, lies inside it, or contains it (replacing it would delete the
    source): writers never write into, over or above what they read. Symlinks are resolved first; a Hugging Face
    cache snapshot's files are its entry's blobs, so the whole entry counts as the source."""
    a, b = os.path.realpath(src), os.path.realpath(dst)
    if a == b:
        raise ValueError(f"{dst}: is the source {src} itself; choose another destination")
    if _within(b, a):
        raise ValueError(f"{dst}: lies inside the source {src}; choose a destination outside it")
    if _within(a, b):
        raise ValueError(f"{dst}: contains the source {src}; choose a destination that does not")
    for entry in allowed_roots(src)[1:]:
        if _within(b, entry):
            raise ValueError(f"{dst}: lies inside {entry}, the cache entry whose blobs {src} reads; choose another")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


@contextlib.contextmanager
def atomic_directory(dst: str, force: bool = False, sources: tuple[str, ...] = ()):
    """Yield a temporary directory beside `dst`; rename it to `dst` only if the block succeeds.

    Any failure removes the temporary directory, so `dst` is either complete or untouched. With `force`, an
    existing `dst` (directory, file or symlink; never one of `sources`) is replaced and then removed.
    """
    for src in sources:
        check_disjoint(src, dst)
    dst = os.path.abspath(dst)
    if os.path.lexists(dst) and not force:
        raise FileExistsError(f"{dst}: already exists (use --force to replace it)")
    parent = os.path.dirname(dst)
    made = _new_parents(parent)
    os.makedirs(parent, exist_ok=True)
    sweep_partials(dst)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.", suffix=".partial", dir=parent)
    held = _hold(tmp)
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would keep DST from everyone else
        yield tmp
        if os.path.lexists(dst) and not force:  # made meanwhile by another writer: theirs, replaced only by --force
            raise FileExistsError(
                f"{dst}: already exists (written meanwhile by another process; use --force to replace it)"
            )
        if os.path.lexists(dst):  # --force: swap, then drop the old one
            old = tmp + ".old"
            os.rename(dst, old)
            try:
                os.rename(tmp, dst)
            except BaseException:
                os.rename(old, dst)
                raise
            _remove(old)
        else:
            os.rename(tmp, dst)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for path in made:  # deepest first; one that another writer has filled meanwhile stays
            with contextlib.suppress(OSError):
                os.rmdir(path)
        _raise_named(e, dst)
    finally:
        _release(held)


def _new_parents(parent: str) -> list[str]:
    """The directories that os.makedirs(parent) will create, deepest first: a failed write removes them again."""
    made = []
    while not os.path.lexists(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    return made


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask can only set it, and setting
    it to read it races with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _raise_named(e: BaseException, path: str):
    """Re-raise `e`; an OSError that does not say which output failed (a full disk: "[Errno 28] No space left
    on device", numpy's "N requested and M written") gets the path."""
    if isinstance(e, OSError) and e.filename is None and path not in str(e):
        raise OSError(f"{path}: writing failed ({e.strerror or e})") from None
    raise e


def check_output_file(path: str) -> None:
    """An output file can be written at `path` (checked before the work that produces it)."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{path}: no such directory {parent}")


def _entry(path: str) -> str:
    """The directory entry `path` names, its parent directories resolved: what a writer's os.replace replaces
    (a symlink itself, not its target)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def check_not_read(output: str, inputs) -> None:
    """Refuse an output file that would replace a file the command reads (`inputs`: its input file, its model's
    files): `predict --output` its own --input lost the rows, `evaluate --output MODEL/config.json` the model."""
    for path in inputs:
        if os.path.lexists(path) and _entry(output) in (_entry(path), os.path.realpath(path)):
            raise ValueError(f"{output}: would replace {path}, which this command reads; choose another output")


@contextlib.contextmanager
def atomic_file(path: str, suffix: str = ""):
    """Yield a temporary path beside `path` (ending in `suffix`, e.g. ".npy" for np.save); it replaces `path`
    only if the block succeeds, and is removed on any failure (a full disk included)."""
    check_output_file(path)
    parent = os.path.dirname(os.path.abspath(path))
    sweep_partials(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial" + suffix, dir=parent)
    held = _hold(tmp, fd)
    try:
        # mkstemp's 0600 would keep the output from everyone else: a replaced file's own mode, else the umask's.
        os.chmod(tmp, os.stat(path).st_mode & 0o7777 if os.path.isfile(path) else 0o666 & ~_umask())
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _raise_named(e, path)
    finally:
        _release(held)


# A writer's temporary beside its output: `.NAME.` + tempfile's 8 random characters + `.partial` (+ a suffix such as
# `.npy`). Not `.partial.old`: the output being replaced, moved aside for an instant (atomic_directory; _settle_swaps).
_PARTIAL = r"\.{}\.[a-z0-9_]{{8}}\.partial(\.(?!old$)[^.]+)?"
STALE_SECONDS = 60  # a writer locks its temporary right after creating it: younger ones are never touched


def _hold(path: str, fd: int | None = None) -> int | None:
    """An exclusive lock on the temporary `path` for as long as the returned descriptor is open (closed by
    _release; by the kernel when the process dies, however it dies). None where the file system has no locks."""
    fd = os.open(path, os.O_RDONLY) if fd is None else fd
    if _locked(fd):
        return fd
    os.close(fd)
    return None


def _locked(fd: int) -> bool:
    """Whether this process now holds the exclusive lock of `fd` (False: another process holds it, or the file
    system has no locks)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def sweep_partials(output: str) -> list[str]:
    """Remove the temporaries that writers of `output` left when they were killed outright (kill -9, the OOM
    killer, a power cut: no handler runs); Ctrl-C and SIGTERM remove their own. A temporary is a dead writer's
    when no process holds its lock and it is older than STALE_SECONDS; a live writer's (another process writing
    the same output) stays. Returns the paths removed."""
    parent, name = os.path.split(os.path.abspath(output))
    pattern = re.compile(_PARTIAL.format(re.escape(name)))
    try:
        _settle_swaps(os.path.join(parent, name))
        with os.scandir(parent) as entries:
            stale = [e.path for e in entries if pattern.fullmatch(e.name) and not e.is_symlink() and _dead(e)]
    except OSError:  # an unreadable directory: the write itself will say what is wrong
        return []
    for path in stale:
        with contextlib.suppress(OSError):  # another sweeper was first
            _remove(path)
    return stale


def _settle_swaps(output: str) -> None:
    """A `.partial.old` is the complete `output` that atomic_directory moved aside to swap the new one in; a writer
    killed between its two renames leaves no `output` at all, one killed while removing it a half-deleted copy.
    Once no live writer holds the swap (its lock: on the temporary before the second rename, on `output` after),
    the old one is put back where `output` is missing (it was complete; its temporary, the new one, is swept as
    any dead writer's), else removed."""
    parent, name = os.path.split(output)
    pattern = re.compile(rf"\.{re.escape(name)}\.[a-z0-9_]{{8}}\.partial\.old")
    with os.scandir(parent) as entries:
        swaps = [e.path for e in entries if pattern.fullmatch(e.name) and not e.is_symlink()]
    for old in swaps:
        if any(_held(path) for path in (old.removesuffix(".old"), output)):
            continue  # a live writer's swap
        with contextlib.suppress(OSError):  # another sweeper was first
            if os.path.lexists(output):
                _remove(old)
            else:
                os.rename(old, output)


def _held(path: str) -> bool:
    """Whether another process holds the lock of `path` (False where it is missing; True where the file system
    has no locks, which cannot tell)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return not _locked(fd)
    finally:
        os.close(fd)


def _dead(entry: os.DirEntry) -> bool:
    try:
        if time.time() - entry.stat(follow_symlinks=False).st_mtime < STALE_SECONDS:
            return False
        fd = os.open(entry.path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return _locked(fd)  # taken: nobody holds it (released when fd closes); else a live writer's, left alone
    finally:
        os.close(fd)


def one_line(message: str) -> str:
    """An error message fit for one terminal line: control characters (ANSI escapes included) made visible,
    newlines folded, and cut at MAX_MESSAGE characters."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], " ".join(str(message).split("\n")))
    if len(text) > MAX_MESSAGE:
        text = f"{text[:MAX_MESSAGE]}… ({len(text) - MAX_MESSAGE:,} more characters)"
    return text
