"""Counting host <-> device array transfers, to prove a training step makes none it should not.

``with count_transfers("strict") as log: ...`` records every explicit transfer the
block makes on the backend (the strict stand-in on a CPU, or CuPy on a GPU):

- **to the device**: ``xp.asarray`` / ``xp.array`` of host data (a NumPy array,
  list or tuple, or a NumPy scalar array) with more than one element;
- **to the host**: ``xp.asnumpy`` and, on the strict stand-in, ``ndarray.get``;

each with its shape and the caller's file and line, so a failing test says where the
transfer happened. Host scalars going in (a Python float turned into a 0-d array)
and size-1 reads coming out (``float(loss)``) are synchronisation points, not array
transfers, and are not counted. Implicit conversions need no counting: the strict
stand-in refuses them (``StrictConversionError``), and so does CuPy.

On CuPy, ``cupy.ndarray.get`` is a method of an extension type that cannot be
wrapped; the library reaches the host only through :func:`refimpl.backend.to_numpy`,
which calls ``cupy.asnumpy``, and that is counted.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Transfer", "TransferLog", "count_transfers"]


@dataclass(frozen=True)
class Transfer:
    """One array transfer."""

    direction: str  # "to device" or "to host"
    shape: tuple[int, ...]
    where: str  # file:line of the call into the backend


@dataclass
class TransferLog:
    """The transfers of one ``count_transfers`` block."""

    transfers: list[Transfer] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.transfers)

    def report(self) -> str:
        if not self.transfers:
            return "no array transfers"
        return "\n".join(f"{t.direction} {t.shape} at {t.where}" for t in self.transfers)


def _caller() -> str:
    """The first frame outside this module and the backend modules: who asked for the copy."""
    from refimpl import backend
    from refimpl.testing import strict

    skipped = {__file__, strict.__file__, backend.__file__}
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in skipped:
        frame = frame.f_back
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _host_size(obj: Any) -> int | None:
    """The element count of host data, or None for device arrays and Python scalars."""
    if isinstance(obj, np.ndarray):
        return obj.size
    if isinstance(obj, (list, tuple)):
        return np.asarray(obj).size
    return None


@contextlib.contextmanager
def count_transfers(backend: str) -> Iterator[TransferLog]:
    """Record the array transfers made on ``backend`` ("strict" or "cupy") inside the block."""
    if backend not in ("strict", "cupy"):
        raise ValueError(
            f"count_transfers needs a device backend ('strict' or 'cupy'), got {backend!r}"
        )
    module = importlib.import_module("refimpl.testing.strict" if backend == "strict" else "cupy")
    log = TransferLog()
    originals: dict[tuple[Any, str], Any] = {}

    def wrap_in(name: str) -> None:
        original = getattr(module, name)

        def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
            size = _host_size(obj)
            if size is not None and size > 1:
                log.transfers.append(Transfer("to device", np.shape(obj), _caller()))
            return original(obj, *args, **kwargs)

        originals[(module, name)] = original
        setattr(module, name, counted)

    def wrap_out(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(obj, "size", 0) > 1 and _host_size(obj) is None:
                log.transfers.append(Transfer("to host", tuple(obj.shape), _caller()))
            return original(obj, *args, **kwargs)

        originals[(owner, name)] = original
        setattr(owner, name, counted)

    wrap_in("asarray")
    wrap_in("array")
    wrap_out(module, "asnumpy")
    if backend == "strict":
        wrap_out(module.StrictArray, "get")
    try:
        yield log
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
