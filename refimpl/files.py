"""Atomic file writes: a crash or an error mid-write never leaves half a file behind.

Every writer of results (checkpoints, ``final.npz``, graph datasets, golden vectors) goes
through :func:`atomic_write`: the content goes to a temporary file in the target's
folder (so the final ``os.replace`` is a rename within one file system), is flushed
and fsynced, gets the permissions a plain ``open`` would give (``0o666`` less the
umask; ``mkstemp`` creates ``0o600``), and only then replaces the target. On any
error the temporary file is removed and the previous file, if any, is untouched.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write"]


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
