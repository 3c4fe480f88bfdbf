"""The largest count refimpl takes, and its check.

Every count (nodes, edges, graphs, channels, heads, layers) is at most :data:`MAX_COUNT`,
``2**31 - 1``: off NumPy the segments' CSR structure
(:meth:`refimpl.kernels.segment.Segments.csr_structure`) and the sparse matrices (CuPy's
hold int32 indices only) index with int32, so a larger count is not computable on every
backend, and one bound for all keeps a run's limits the same on each. It is checked where
counts enter: :class:`refimpl.Graph` (its node, target and edge counts) and
:func:`refimpl.fields.check_positive_int` (every size a layer or model is built with, and a
model's ``num_graphs``), so that ``2**62`` is refused in one line instead of reaching NumPy's
"array is too big", a ``MemoryError``, or a loop over ``2**62`` layers.
"""

from __future__ import annotations

__all__ = ["MAX_COUNT", "check_count"]

MAX_COUNT = 2**31 - 1  # the largest int32


def check_count(value: int, name: str) -> None:
    """``value`` is at most :data:`MAX_COUNT`, else a ``ValueError`` that names ``name`` and
    says the bound and why.

    Parameters
    ----------
    value : int
        A count (its type checked by the caller).
    name : str
        What it counts, for the message (e.g. ``"the number of items (edges)"``).
    """
    if value > MAX_COUNT:
        raise ValueError(
            f"{name} must be at most 2**31 - 1, got {value}: refimpl bounds every count by the "
            "int32 its device kernels index with (CuPy's sparse matrices, the segments' CSR "
            "structure)"
        )
