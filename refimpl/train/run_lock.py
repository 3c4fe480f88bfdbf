"""A run folder's lock: one command writes a run folder at a time.

Two commands on one folder would mix or lose a run: a second ``refimpl train --out R``
cleaning up the temporary files of killed writes deletes the live run's file in flight, two
runs started together interleave their logs, and ``--overwrite`` or ``--resume`` on a live
run replaces what it is writing. So every writer of a run folder (``refimpl train`` and
``sweep``, the reproduction scripts, :func:`refimpl.train.train_model` with ``out_dir``)
holds the folder's lock for the run's life, and a second command is refused in one line
naming the holder's PID (:class:`RunFolderBusy`).

The lock is an exclusive ``flock`` on ``R/.refimpl.lock``, so it is the operating system's:
a process killed by any signal releases it, and no stale lock is left to be removed by hand
(a killed holder leaves an unlocked file, which the next taker locks). The file holds the
holder's PID, host, command and start time (what the refusal prints). The holder removes it
before unlocking, so a finished run leaves none; a taker that locked a file removed under it
meanwhile sees that the path no longer names its file, and takes the lock anew.

Locks are per process and re-entrant within one: a command that holds its folder may train
into it through :func:`refimpl.train.train_model`, which takes the same lock again. A lock
taken outside :func:`lock_scope` is held until :func:`release_run_folder` or the process's
end. ``flock`` is POSIX (Linux, macOS; on NFS Linux maps it to a byte-range lock); where
``fcntl`` is missing, folders are not locked and a warning says so once.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no flock (module docstring)
    fcntl = None

__all__ = [
    "LOCK_FILE",
    "RunFolderBusy",
    "lock_run_folder",
    "lock_scope",
    "release_run_folder",
    "run_folder_lock",
]

LOCK_FILE = ".refimpl.lock"


class RunFolderBusy(FileExistsError):
    """Another process holds the run folder's lock (a command is writing the run)."""


class _Held:
    """One lock this process holds: the open lock file and how many takers share it."""

    def __init__(self, descriptor: int) -> None:
        self.descriptor = descriptor
        self.count = 1


_HELD: dict[Path, _Held] = {}  # by resolved folder
_SCOPES: list[list[Path]] = []  # the folders locked inside each open lock_scope


def _holder(command: str) -> bytes:
    """What the lock file says while held: who holds it, for the refusal's message."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command}
    return (json.dumps({**record, "since": since}) + "\n").encode()


def _describe_holder(path: Path, tries: int = 25) -> str:
    """The holder as its lock file names it, or what is known when it says nothing yet.

    A holder writes its record just after it locks: a refusal in between reads an empty
    file, so an unreadable record is read again for up to ``tries`` x 20 ms."""
    for attempt in range(tries):
        try:
            record = json.loads(path.read_text())
            return (
                f"PID {int(record['pid'])} ({record['command']} on {record['host']}, since "
                f"{record['since']})"
            )
        except (OSError, ValueError, TypeError, KeyError):  # taken an instant ago, or damaged
            if attempt + 1 < tries:
                time.sleep(0.02)
    return "another process (which has not written its PID yet)"


def lock_run_folder(folder: str | os.PathLike, command: str) -> Path:
    """Take ``folder``'s lock for ``command`` (its name in the refusal, e.g. "refimpl train"),
    creating the folder; returns the folder. Re-entrant within this process.

    Raises :class:`RunFolderBusy` when another process holds it, naming its PID, command,
    host and start time, and ``ValueError`` when ``folder`` is a file.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a run folder; pass a folder to --out")
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    if key in _HELD:
        _HELD[key].count += 1
    elif fcntl is None:
        warnings.warn(
            f"run folders are not locked on {sys.platform} (no fcntl): do not run two "
            "commands on one run folder at once",
            stacklevel=2,
        )
        return folder
    else:
        _HELD[key] = _Held(_take(folder, command))
    if _SCOPES:
        _SCOPES[-1].append(key)
    return folder


def _take(folder: Path, command: str) -> int:
    """Lock ``folder``'s lock file and write the holder into it; returns its descriptor."""
    path = folder / LOCK_FILE
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # never truncated unlocked
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:  # its holder removed it as we locked it
                current = None
            if current != os.fstat(descriptor).st_ino:  # a removed file: take the new one
                os.close(descriptor)
                continue
        except BlockingIOError:
            os.close(descriptor)
            raise RunFolderBusy(
                f"{folder} is in use by {_describe_holder(path)}: one command writes a run "
                "folder at a time; wait for it to end (or stop it), or pass another --out"
            ) from None
        except BaseException:
            os.close(descriptor)
            raise
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, _holder(command), 0)
        return descriptor


def release_run_folder(folder: str | os.PathLike, discard_empty: bool = False) -> None:
    """Give back one take of ``folder``'s lock; the last one removes the lock file and
    unlocks it. A folder this process does not hold is left alone.

    ``discard_empty``: a folder left empty (made by a run refused or failed before it wrote
    anything) is removed too, so it leaves no folder behind.
    """
    key = Path(folder).resolve()
    held = _HELD.get(key)
    if held is None:
        return
    held.count -= 1
    if held.count == 0:
        del _HELD[key]
        try:
            (key / LOCK_FILE).unlink(missing_ok=True)  # while still locked (module docstring)
        finally:
            os.close(held.descriptor)  # closing the last descriptor releases the flock
        if discard_empty:
            with contextlib.suppress(OSError):  # not empty: another run's files are there
                key.rmdir()


@contextlib.contextmanager
def run_folder_lock(folder: str | os.PathLike, command: str) -> Iterator[Path]:
    """:func:`lock_run_folder` for the ``with`` block; released at its end. A folder it made
    that is still empty when the block raises is removed."""
    created = not Path(folder).exists()
    lock_run_folder(folder, command)
    try:
        yield Path(folder)
    except BaseException:
        release_run_folder(folder, discard_empty=created)
        raise
    release_run_folder(folder)


@contextlib.contextmanager
def lock_scope() -> Iterator[None]:
    """Every run-folder lock taken inside the block (one command's) is released at its end,
    so a command run in-process (``refimpl.cli.main``, a script's ``main``) leaves none."""
    _SCOPES.append([])
    try:
        yield
    finally:
        for key in reversed(_SCOPES.pop()):
            release_run_folder(key)
