"""The checks behind :class:`~refimpl.data.graph_dataset.GraphDataset`'s validation.

Dtype checks of the float and int64 arrays, the pointer-array check (``node_ptr``,
``edge_ptr``: the layout in :mod:`refimpl.data.graph_dataset`), and the check of a
selection of graphs (indices or a boolean mask) for
:meth:`~refimpl.data.graph_dataset.GraphDataset.subset`. Each message names the fix.
Package-private: only :mod:`refimpl.data.graph_dataset` imports them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__: list[str] = []


def _check_float(value: Any, key: str) -> None:
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        raise TypeError(
            f"{key} must be a floating-point NumPy array, got "
            f"{getattr(value, 'dtype', type(value).__name__)}; convert with "
            f"np.asarray({key}, dtype=np.float64)"
        )


def _check_int64(value: Any, key: str) -> None:
    if not isinstance(value, np.ndarray) or value.dtype != np.int64:
        raise TypeError(
            f"{key} must be an int64 NumPy array, got "
            f"{getattr(value, 'dtype', type(value).__name__)}; convert with "
            f"np.asarray({key}).astype(np.int64) (after checking the values are whole)"
        )


def _check_ptr(ptr: np.ndarray, key: str, total: int, what: str, *, empty: bool = True) -> None:
    """``ptr`` (G+1,) starts at 0, ends at ``total``, never decreases (strictly increases
    when ``empty`` is False: every graph has a node)."""
    if ptr.ndim != 1 or ptr.shape[0] < 1:
        raise ValueError(f"{key} must have shape (G + 1,), got {ptr.shape}")
    if ptr[0] != 0 or ptr[-1] != total:
        raise ValueError(
            f"{key} must start at 0 and end at {what} ({total}), got {key}[0] = {int(ptr[0])}, "
            f"{key}[-1] = {int(ptr[-1])}; build it with np.concatenate([[0], np.cumsum(counts)])"
        )
    steps = np.diff(ptr)
    bad = np.flatnonzero(steps < (0 if empty else 1))
    if bad.size:
        g = int(bad[0])
        need = "never decrease" if empty else "increase: every graph needs at least one node"
        raise ValueError(f"{key} must {need}; graph {g} has {key}[{g}+1] - {key}[{g}] = {steps[g]}")


def _check_indices(indices: Any, num_graphs: int) -> np.ndarray:
    chosen = np.asarray(indices)
    if chosen.dtype == np.bool_:
        if chosen.shape != (num_graphs,):
            raise ValueError(
                f"a boolean mask of graphs must have shape (G,) = ({num_graphs},), "
                f"got {chosen.shape}"
            )
        return np.flatnonzero(chosen)
    if chosen.size == 0:
        return np.zeros(0, dtype=np.int64)
    if chosen.ndim != 1 or chosen.dtype.kind not in "iu":
        raise TypeError(
            f"graph indices must be a 1-D integer array (or a (G,) bool mask), got "
            f"{chosen.dtype}{chosen.shape}"
        )
    if int(chosen.min()) < 0 or int(chosen.max()) >= num_graphs:
        raise ValueError(
            f"graph indices must lie in [0, {num_graphs}), got values in "
            f"[{int(chosen.min())}, {int(chosen.max())}]"
        )
    return chosen.astype(np.int64, copy=False)
