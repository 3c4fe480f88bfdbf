"""Atomic file writes (a crash or an error mid-write never leaves half a file behind) and the
one reader of ``.npz`` archives of plain arrays.

Every writer of results (checkpoints, ``final.npz``, graph datasets, golden vectors) goes
through :func:`atomic_write`: the content goes to a temporary file in the target's
folder (so the final ``os.replace`` is a rename within one file system), is flushed
and fsynced, gets the permissions a plain ``open`` would give (``0o666`` less the
umask; ``mkstemp`` creates ``0o600``), and only then replaces the target. On any
error the temporary file is removed and the previous file, if any, is untouched.

Every reader of an ``.npz`` of named arrays written by hand or by another framework
(``refimpl crosscheck`` files, golden vectors) goes through :func:`read_npz`: plain arrays
only (``allow_pickle=False``: loading never runs code), every array read at once (a file
is closed before the caller sees its content), and a message instead of a traceback for a
missing file, an empty one, a bare ``.npy`` or anything else that is not an ``.npz``.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

__all__ = ["atomic_write", "read_npz"]


# what np.load and NpzFile raise for a file that is not an .npz of plain arrays
_UNREADABLE = (ValueError, OSError, EOFError, zipfile.BadZipFile)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Create or replace ``path`` with what ``write(stream)`` writes to a binary stream."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (reading it means setting it: set it back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_npz(
    path: str | os.PathLike,
    error_type: type[Exception] = ValueError,
    fix_hint: str = "write it with numpy.savez",
    *,
    what: str = "file",
) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` archive at ``path``, by key, in the archive's order.

    Raises ``FileNotFoundError`` (``"no {what} at {path}"``) when there is no such file and
    ``error_type`` when the file is not an ``.npz`` of plain arrays: empty, a bare ``.npy``
    (a single array, no names), not a zip archive, or holding pickled objects. Each message
    names the file, says what is wrong and ends with ``fix_hint``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}")
    if path.stat().st_size == 0:
        raise error_type(f"{path} is empty, not an .npz archive of plain arrays; {fix_hint}")
    try:
        archive = np.load(path, allow_pickle=False)
    except _UNREADABLE as err:
        raise error_type(_unreadable(path, err, fix_hint)) from err
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise error_type(
            f"{path} holds a single array (.npy), not an .npz archive of named arrays; {fix_hint}"
        )
    try:
        with archive:  # arrays are read lazily: read them all while the file is open
            return {key: archive[key] for key in archive.files}
    except _UNREADABLE as err:  # a corrupt member, or one holding pickled objects
        raise error_type(_unreadable(path, err, fix_hint)) from err


def _unreadable(path: Path, err: Exception, fix_hint: str) -> str:
    return f"{path} is not a readable .npz of plain arrays ({err}); {fix_hint}"
