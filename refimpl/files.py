"""Atomic file writes (a crash or an error mid-write never leaves half a file behind), the
clean-up of what a killed write leaves, and the one reader of ``.npz`` archives of plain arrays.

Every writer of results (checkpoints, ``final.npz``, graph datasets, golden vectors) goes
through :func:`atomic_write`: the content goes to a temporary file ``.{name}.XXXXXXXX.tmp``
in the target's folder (so the final ``os.replace`` is a rename within one file system), is
flushed and fsynced, gets the permissions a plain ``open`` would give (``0o666`` less the
umask; ``mkstemp`` creates ``0o600``), and only then replaces the target. On any error the
temporary file is removed and the previous file, if any, is untouched; a process killed
mid-write leaves its temporary file behind, which :func:`remove_stale_temporaries` removes.

Every reader of an ``.npz`` of named arrays written by hand or by another framework
(``refimpl crosscheck`` files, golden vectors, dataset archives) goes through :func:`read_npz`:
plain arrays only (``allow_pickle=False``: loading never runs code), every array read at once
(a file is closed before the caller sees its content), and a message instead of a traceback
for a missing file, an empty one, a bare ``.npy`` or anything else that is not an ``.npz``.
Nothing is allocated on a header's word: every member's ``.npy`` header is read first, and an
array whose shape and dtype claim more bytes than its member holds, or a member claiming more
bytes than deflate can make of its compressed size, is refused before any array is read. So is
an archive whose arrays claim more bytes in all than a limit (:func:`npz_limit`): deflate turns
a byte of zeros into about 1030, so a 33 MB archive of honest members may hold 32 GiB, more
than the machine has. The limit is half the machine's physical memory unless the environment
variable ``REFIMPL_NPZ_LIMIT`` sets another (bytes, or a number with ``K``, ``M``, ``G`` or
``T``: ``REFIMPL_NPZ_LIMIT=64G``); a caller that knows its files may pass a tighter one.

Text read from a file and put into a message (a member's name) goes through :func:`printable`:
a terminal shows it, never obeys it.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import tokenize
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

__all__ = [
    "atomic_write",
    "check_output_file",
    "npz_limit",
    "printable",
    "read_npz",
    "remove_stale_temporaries",
]


# what zipfile and numpy.lib.format raise for a file that is not an .npz of plain arrays
# (zlib.error: a corrupt deflate stream; BadZipFile: a CRC mismatch, a truncated member;
# NotImplementedError: a zip version or flag zipfile does not read; TokenError: a .npy
# header whose brackets never close, which NumPy tokenizes before parsing)
_UNREADABLE = (
    ValueError,
    OSError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    tokenize.TokenError,
)
# deflate emits at most about 1032 bytes per compressed byte (a 258-byte match in 2 bits)
_MAX_DEFLATE_RATIO = 1100
_COMPRESSIONS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}  # the two numpy.savez* write
# what tempfile.mkstemp puts between atomic_write's prefix and suffix (8 of these characters)
_TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
LIMIT_VARIABLE = "REFIMPL_NPZ_LIMIT"
# where os.sysconf cannot tell the machine's memory (Windows): the limit of a 16 GiB machine
_UNKNOWN_MEMORY_LIMIT = 8 * 2**30
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_LIMIT_TEXT = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Create or replace ``path`` with what ``write(stream)`` writes to a binary stream.

    Parameters
    ----------
    path : str or os.PathLike
        The file to create or replace; missing folders are created.
    write : callable
        ``write(stream)`` writes the whole content to the binary stream it is given.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    # the name matches _TEMPORARY: remove_stale_temporaries finds what a killed write left
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


def check_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """``path`` as a ``Path``, checked to be writable by :func:`atomic_write` before any work
    that ends by writing it: its folder exists and is writable, and it is not a folder.

    Raises ``FileNotFoundError`` for a missing folder (a typo is refused, not created) and
    ``ValueError`` for a folder given as the file or a folder that cannot be written, each
    message naming ``what`` and the path.

    Parameters
    ----------
    path : str or os.PathLike
        The file a later :func:`atomic_write` will create or replace.
    what : str, default "output file"
        What the file is, for the messages (e.g. ``"checkpoint"``).

    Returns
    -------
    pathlib.Path
        ``path`` as a ``Path``.
    """
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give a file name, e.g. {path / 'out.json'}")
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder {folder} for the {what} {path}; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write the {what} {path}: its folder {folder} is not writable")
    return path


def _umask() -> int:
    """The process's umask (reading it means setting it: set it back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of :func:`atomic_write` (``.{name}.XXXXXXXX.tmp``) that a
    killed process left in ``folder`` itself (not its subfolders); returns them, sorted.

    Only regular files of exactly that pattern go; everything else (other dot-files,
    symlinks, folders, ``.tmp`` files of other tools with other names) is left alone. The
    caller owns ``folder``: a write in progress in it from another process would lose its
    temporary file and fail, so call this before writing, never beside a live writer.

    Parameters
    ----------
    folder : str or os.PathLike
        The folder to clean (not its subfolders).

    Returns
    -------
    list of pathlib.Path
        The files removed, sorted.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder at {folder} to clean of temporary files")
    removed = []
    for entry in sorted(folder.iterdir()):
        if _TEMPORARY.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)  # gone already: another clean-up got there first
            removed.append(entry)
    return removed


def read_npz(
    path: str | os.PathLike,
    error_type: type[Exception] = ValueError,
    fix_hint: str = "write it with numpy.savez",
    *,
    what: str = "file",
    max_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` archive at ``path``, by key, in the archive's order.

    ``max_bytes`` bounds the bytes all its arrays may hold together; ``None`` takes
    :func:`npz_limit` (half the machine's memory, or ``REFIMPL_NPZ_LIMIT``).

    Raises ``FileNotFoundError`` (``"no {what} at {path}"``) when there is no such file and
    ``error_type`` when the file is not an ``.npz`` of plain arrays: empty, a bare ``.npy``
    (a single array, no names), not a zip archive, a member that is not an ``.npy`` array,
    holding pickled objects, compressed otherwise than ``numpy.savez_compressed`` does,
    encrypted, or with a header that claims more data than its member holds; and when its
    arrays claim more than ``max_bytes`` in all. All of it is checked on every member before
    any array is read, so a forged header or a compression bomb cannot make it allocate. Each
    message names the file, says what is wrong and ends with ``fix_hint``.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` archive to read.
    error_type : type of Exception, default ValueError
        The exception raised for a file that is not an ``.npz`` of plain arrays.
    fix_hint : str, default "write it with numpy.savez"
        The end of every such message: how to make a readable file.
    what : str, default "file"
        What the file is, for the messages (e.g. ``"checkpoint"``).
    max_bytes : int or None, default None
        The most bytes all its arrays may hold together; ``None`` takes :func:`npz_limit`.

    Returns
    -------
    dict of str to numpy.ndarray
        Every array of the archive, by key, in the archive's order.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}")
    size = path.stat().st_size
    if size == 0:
        raise error_type(f"{path} is empty, not an .npz archive of plain arrays; {fix_hint}")
    with path.open("rb") as stream:
        if stream.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX:
            raise error_type(
                f"{path} holds a single array (.npy), not an .npz archive of named arrays; "
                f"{fix_hint}"
            )
    given = max_bytes is not None
    limit, source = (max_bytes, f"the limit for a {what}") if given else npz_limit()
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            problem, claimed = _check_members(archive, members, size)
            arrays = {} if problem or claimed > limit else _read_members(archive, members)
    except _UNREADABLE as err:  # not a zip archive, a corrupt member, a malformed header
        raise error_type(_unreadable(path, printable(str(err)), fix_hint)) from err
    if problem:
        raise error_type(_unreadable(path, problem, fix_hint))
    if claimed > limit:
        # a caller's own limit comes with its own advice (fix_hint); the default's is ours
        advice = f"if the file is genuine and fits in memory, set {LIMIT_VARIABLE} higher"
        advice = fix_hint if given else f"{advice} (bytes, or a size such as 64G); else {fix_hint}"
        raise error_type(
            f"{path} holds arrays of {_bytes(claimed)} in all, more than {source} "
            f"({_bytes(limit)}): a compression bomb, or data too big for this machine; {advice}"
        )
    return arrays


def npz_limit() -> tuple[int, str]:
    """The bytes :func:`read_npz` lets an archive's arrays hold in all, and whence it comes:
    ``REFIMPL_NPZ_LIMIT`` when set (bytes, or a number with ``K``, ``M``, ``G``, ``T``: powers
    of 1024), else half the physical memory ``os.sysconf`` reports (8 GiB where it reports
    none). Raises ``ValueError`` for a ``REFIMPL_NPZ_LIMIT`` that is not such a size."""
    text = os.environ.get(LIMIT_VARIABLE)
    if text is not None:
        match = _LIMIT_TEXT.fullmatch(text)
        limit = int(float(match[1]) * _UNITS[match[2].upper()]) if match else 0
        if limit < 1:
            raise ValueError(
                f"{LIMIT_VARIABLE}={text!r} is not a size: give bytes (8000000000) or a number "
                "with K, M, G or T (8G)"
            )
        return limit, f"the limit {LIMIT_VARIABLE}={text.strip()}"
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        memory = -1
    if memory <= 0:
        return _UNKNOWN_MEMORY_LIMIT, "the limit used where the memory size is unknown"
    return memory // 2, f"half this machine's memory of {_bytes(memory)}"


def printable(text: str) -> str:
    r"""``text`` with every character a terminal would not print as itself (control
    characters, escape sequences, line breaks) written as its Python escape, as ``repr``
    does: the string ``"a\x1b[2Jb"`` (with an ESC character) comes back as the text
    ``a\x1b[2Jb`` (with a backslash). Plain text comes back unchanged.

    Parameters
    ----------
    text : str
        Text from outside (a file name, a key in a user's file) to be shown in a message.

    Returns
    -------
    str
        The text safe to print on one line.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _bytes(count: int) -> str:
    """``count`` bytes as people read them: ``512 bytes``, ``1.5 MiB``, ``32.0 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _read_members(
    archive: zipfile.ZipFile, members: list[zipfile.ZipInfo]
) -> dict[str, np.ndarray]:
    """Every member's array, keyed by its name without ``.npy`` (as ``numpy.load`` does)."""
    arrays = {}
    for info in members:
        with archive.open(info) as member:
            key = info.filename.removesuffix(".npy")
            arrays[key] = np.lib.format.read_array(member, allow_pickle=False)
    return arrays


def _check_members(
    archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], size: int
) -> tuple[str, int]:
    """What is wrong with the archive's members ("" when nothing) and the bytes their arrays
    claim in all, read from the zip directory and each member's ``.npy`` header only: no
    array data is read or allocated."""
    if sum(info.compress_size for info in members) > size:
        return f"its zip directory claims more compressed data than the file's {size} bytes", 0
    total = 0
    for info in members:
        problem, claimed = _check_member(archive, info)
        if problem:
            return problem, total
        total += claimed
    return "", total


def _check_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[str, int]:
    """What is wrong with one member ("" when nothing) and the bytes its array claims."""
    name = printable(info.filename)
    if info.flag_bits & 0x1:
        return f"member {name} is encrypted", 0
    if info.compress_type not in _COMPRESSIONS:
        return f"member {name} uses zip compression method {info.compress_type}, not deflate", 0
    if info.file_size > _MAX_DEFLATE_RATIO * max(info.compress_size, 1):
        return (
            f"member {name} claims {info.file_size} bytes from {info.compress_size} "
            "compressed, more than deflate can produce"
        ), 0
    with archive.open(info) as member:
        if member.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
            return f"member {name} is not a .npy array", 0
        member.seek(0)
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member)
        else:  # 3.0: structured dtypes with non-Latin-1 field names, never a plain array
            return f"member {name} uses .npy format version {version[0]}.{version[1]}", 0
        held = info.file_size - member.tell()
    if dtype.hasobject:
        return f"member {name} holds pickled Python objects", 0
    if any(extent < 0 for extent in shape):
        return f"member {name} has a negative extent in its shape {shape}", 0
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > held:
        return (
            f"member {name} claims shape {shape} of {dtype} ({claimed} bytes) but holds "
            f"{held} bytes of data"
        ), 0
    return "", claimed


def _unreadable(path: Path, reason: str, fix_hint: str) -> str:
    return f"{path} is not a readable .npz of plain arrays ({reason}); {fix_hint}"
