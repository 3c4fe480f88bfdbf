"""Pointer arrays of the flat graph layout (:mod:`refimpl.data.graph_dataset`).

A pointer array ``ptr`` (G+1,) says that graph ``i`` owns rows (or columns)
``ptr[i]:ptr[i+1]``. ``_pointers`` builds one from per-graph counts;
:func:`index_ranges` gathers the rows of chosen graphs without a Python loop.
"""

from __future__ import annotations

import numpy as np

__all__ = ["index_ranges"]


def index_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + l) for s, l in zip(starts, lengths)])`` without a loop."""
    ends = np.cumsum(lengths)  # (g,) end of each range in the output
    # Output position p of range j holds starts[j] + (p - (ends[j] - lengths[j])).
    return np.arange(int(ends[-1]) if ends.size else 0) + np.repeat(
        starts - ends + lengths, lengths
    )


def _pointers(counts: np.ndarray) -> np.ndarray:
    """``[0, c_0, c_0 + c_1, ...]`` as int64, (g + 1,)."""
    ptr = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr
