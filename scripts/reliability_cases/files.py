"""Damaged files: the same table for every file a surface reads (data, checkpoints,
crosscheck files, logs), and the table of damaged ``.npz`` members.

A file case writes a valid file into a fresh folder, damages it, and calls the reader.
The valid file's own case checks the reader's result against a reference; a damage that
leaves a valid file (a Fortran-ordered member) must give the same result.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from reliability_cases.corruptions import FLOAT_ARRAY, INDEX_ARRAY, Corruption, applies
from reliability_cases.outcomes import Case, difference


def _replace(path: Path, content: bytes) -> None:
    path.unlink()
    path.write_bytes(content)


def _huge_claim(path: Path) -> None:
    """An ``.npz`` whose one member's header claims 10**12 float64 (8 TB) over a few bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 64)


def _pickled(path: Path) -> None:
    np.savez(path, x=np.array([{"a": 1}], dtype=object))


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _missing(path: Path) -> None:
    path.unlink()


def _loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path)


def _random(path: Path) -> None:
    size = max(path.stat().st_size, 64)
    _replace(path, np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes())


# name -> how to damage the file at a path
FILE_DAMAGE: dict[str, Callable[[Path], None]] = {
    "file: missing": _missing,
    "file: empty": lambda p: _replace(p, b""),
    "file: truncated to half": lambda p: _replace(p, p.read_bytes()[: p.stat().st_size // 2]),
    "file: last byte cut": lambda p: _replace(p, p.read_bytes()[:-1]),
    "file: text": lambda p: _replace(p, b"this is not the file you are looking for\n"),
    "file: random bytes": _random,
    "file: zero bytes": lambda p: _replace(p, b"\0" * max(p.stat().st_size, 64)),
    "file: a folder": _directory,
    "file: symlink to itself": _loop,
}
# damages that only an .npz reader meets in the wild
NPZ_DAMAGE: dict[str, Callable[[Path], None]] = {
    "npz: member claims 10**12 entries": lambda p: (p.unlink(), _huge_claim(p)),
    "npz: pickled object member": lambda p: (p.unlink(), _pickled(p)),
    "npz: a bare .npy": lambda p: _replace(p, _npy_bytes(np.arange(3.0))),
    "npz: a zip of text": lambda p: (p.unlink(), _text_zip(p)),
}


def _npy_bytes(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def _text_zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "no arrays here")


# corruptions an .npz member can carry (layouts and views are not stored)
_STORED = (
    "type: nested list",
    "type: Python float",
    "type: None",
    "type: str",
    "type: 0-d array",
    "layout: Fortran order",
)


def member_corruptions(value: np.ndarray) -> tuple[Corruption, ...]:
    table = INDEX_ARRAY if value.dtype.kind in "iu" else FLOAT_ARRAY
    return tuple(
        c for c in table if not c.name.startswith(("type:", "layout:")) or c.name in _STORED
    )


def in_scratch(function: Callable[[Path], Any]) -> Any:
    """``function(folder)`` in a fresh folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="reliability-file-"))
    try:
        return function(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def file_cases(
    label: str,
    write: Callable[[Path], Path],
    read: Callable[[Path], Any],
    reference: Callable[[], Any],
    npz: bool = False,
    mentions: tuple[str, ...] = (),
) -> list[Case]:
    """The valid file, and every damage of :data:`FILE_DAMAGE` (and :data:`NPZ_DAMAGE`):
    ``write(folder)`` writes the valid file and returns the path ``read`` reads."""
    damages = {**FILE_DAMAGE, **(NPZ_DAMAGE if npz else {})}

    def run(damage: Callable[[Path], None] | None) -> Any:
        def inside(folder: Path) -> Any:
            path = write(folder)
            if damage is not None:
                damage(path)
            return read(path)

        return in_scratch(inside)

    cases = [
        Case(
            f"{label} | valid file",
            lambda: run(None),
            lambda value: difference(value, reference(), 0.0),
        )
    ]
    cases += [
        Case(f"{label} | {name}", lambda d=damage: run(d), None, mentions)
        for name, damage in damages.items()
    ]
    return cases


def member_cases(
    label: str,
    arrays: Callable[[], dict[str, np.ndarray]],
    read: Callable[[Path], Any],
    reference: Callable[[dict[str, np.ndarray]], Any],
    skip: tuple[str, ...] = (),
    as_stored: Callable[[str, Corruption | None], bool] = lambda key, c: False,
) -> list[Case]:
    """Every member of an ``.npz`` (``arrays()``) damaged in turn, and each removed, and one
    added: ``read(path)`` must refuse, or agree with ``reference(repaired arrays)``.

    ``as_stored(key, corruption)`` (``None``: the member removed) says which damages leave a
    valid file of other data (another feature width, a checkpoint of another model): the
    reference is then read from the arrays as stored."""
    clean = arrays()

    def run(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
        def inside(folder: Path) -> Any:
            path = folder / "file.npz"
            np.savez(path, **change(arrays()))
            return read(path)

        return in_scratch(inside)

    def agrees(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Any], Any]:
        stored = lambda: {k: np.asarray(v) for k, v in change(arrays()).items()}  # noqa: E731
        return lambda value: difference(value, reference(stored()), 0.0)

    cases = []
    for key, value in clean.items():
        if key in skip:
            continue
        mentions = (key, key.split("/")[-1])
        for c in member_corruptions(value):
            if not applies(c, value):
                continue
            damaged = lambda a, k=key, c=c: {**a, k: c.apply(a[k])}  # noqa: E731
            check = None
            if as_stored(key, c):
                check = agrees(damaged)
            elif c.repair is not None:
                check = agrees(lambda a, k=key, c=c: {**a, k: c.repair(a[k])})
            cases.append(
                Case(
                    f"{label} | {key} | {c.name}",
                    lambda d=damaged: run(d),
                    check,
                    () if check else mentions,
                )
            )
        removed = lambda a, k=key: {n: v for n, v in a.items() if n != k}  # noqa: E731
        check = agrees(removed) if as_stored(key, None) else None
        cases.append(
            Case(
                f"{label} | {key} | key missing",
                lambda r=removed: run(r),
                check,
                () if check else mentions,
            )
        )
    cases.append(
        Case(
            f"{label} | an unknown key added",
            lambda: run(lambda a: {**a, "extra": np.zeros(2)}),
            None,
            ("extra", "unexpected", "unknown"),
        )
    )
    return cases
