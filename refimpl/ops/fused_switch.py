"""The per-thread switch of the fused device kernels (:func:`fused_kernels`).

Kept on the operations' floor so that the operations with a fused kernel (the softmax
cross-entropy of :mod:`refimpl.ops.losses`, dropout's keep-and-scale) and the GAT layers
(:mod:`refimpl.nn.gat.fused_path`, which re-exports both names) read the one switch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from refimpl.backend import backend_name
from refimpl.fields import check_bool

__all__ = ["fused_kernels", "fused_kernels_on", "runs_fused_kernels"]

_SWITCH = threading.local()  # per thread: another thread's block does not switch this one


@contextlib.contextmanager
def fused_kernels(enabled: bool = True) -> Iterator[None]:
    """Run the fused device kernels inside the block, on a device backend
    (:mod:`refimpl.nn.gat.fused_path`).

    Parameters
    ----------
    enabled : bool, default True
        False runs the literal path inside the block (an inner block may switch back).
    """
    enabled = check_bool(enabled, "fused_kernels enabled")
    before = fused_kernels_on()
    _SWITCH.on = enabled
    try:
        yield
    finally:
        _SWITCH.on = before


def fused_kernels_on() -> bool:
    """Whether this thread is inside a ``fused_kernels()`` block (:func:`fused_kernels`)."""
    return getattr(_SWITCH, "on", False)


def runs_fused_kernels(xp: Any) -> bool:
    """Whether an operation on ``xp``'s backend runs its fused kernel: inside
    :func:`fused_kernels`, on a device backend (CuPy or the strict stand-in), never on NumPy.

    Parameters
    ----------
    xp : module
        The array module of the operation's inputs (``get_array_module``).

    Returns
    -------
    bool
        True where the fused kernel runs.
    """
    return fused_kernels_on() and backend_name(xp) != "numpy"
