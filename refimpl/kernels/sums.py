"""Segment sums in one fixed order per segment: :func:`segment_sum` and :func:`segment_sum_pair`.

The engine under :mod:`refimpl.kernels.segment`, which exports both (its module docstring
says why the order is fixed and how each backend sums). ``segments`` here is a
:class:`~refimpl.kernels.segment.Segments` (typed ``Any``: that module imports this one).
"""

from __future__ import annotations

import math
from typing import Any

from refimpl.kernels.csr import csr_matmul, head_block_matmul
from refimpl.kernels.device_sums import row_sums_in_order

__all__ = ["pair_matrix", "segment_sum", "segment_sum_pair"]


def segment_sum(values: Any, segments: Any, weights: Any = None) -> Any:
    """Sum of the items of each segment, (E, *F) -> (N, *F); empty segments give 0.

    ``weights`` (E, H), optional: item ``e``'s head ``h`` is scaled by
    ``weights[e, h]`` first (``values`` then (E, H, *F')). ``values`` may then be
    boolean (a mask, read as 0/1 in ``weights``' dtype). On NumPy the weights
    become the sum matrix's entries instead of a pass over ``values``: one pass
    over the edges, not two (GATv2's backward sums a mask this way).

    Parameters
    ----------
    values : array
        ``(E, *F)``; with ``weights``, ``(E, H, *F')`` and possibly boolean.
    segments : Segments
        The items (edges) grouped by segment (node).
    weights : array or None, default None
        ``(E, H)``, a factor per item and head; None: unweighted.

    Returns
    -------
    array
        ``(N, *F)``, zero for an empty segment.
    """
    if segments.backend != "numpy":
        if weights is not None:
            values = _scaled(values, weights)
        flat = _flat(values, segments.num_items)  # (E, F)
        if flat.size == 0 or segments.num_segments == 0:  # nothing to launch
            out = segments.xp.zeros((segments.num_segments, flat.shape[1]), dtype=values.dtype)
        elif segments.backend == "cupy":
            out = row_sums_in_order(flat, *segments.csr_structure())  # (N, F)
        else:  # the strict stand-in: SciPy's CSR product sums each row in that same order
            out = segments.sum_matrix(values.dtype) @ flat  # (N, F)
        return out.reshape((segments.num_segments, *values.shape[1:]))
    if weights is None:
        return _sparse_sum(segments.sum_matrix(values.dtype), values, segments)
    return _weighted_sum(segments.head_sum_structure(weights.shape[1]), values, weights, segments)


def segment_sum_pair(values: Any, first: Any, second: Any, weights: Any = None) -> Any:
    """``segment_sum(values, first, weights) + segment_sum(values, second, weights)``.

    For the adjoint of gathering one array at both ends of every edge (GATv2 with
    shared weights: ``W h_u + W h_v``). ``first`` and ``second`` group the same
    ``E`` items into the same ``N`` segments. On NumPy one product with the sum of
    the two ``(N, E)`` matrices (a self-loop's item gets a 2) replaces two
    products and an addition: one pass over the edges and no temporary.

    Parameters
    ----------
    values : array
        ``(E, *F)``; with ``weights``, ``(E, H, *F')``.
    first, second : Segments
        Two groupings of the same items into the same segments (by target and by source).
    weights : array or None, default None
        ``(E, H)``, as in :func:`segment_sum`.

    Returns
    -------
    array
        ``(N, *F)``.
    """
    if first.backend != "numpy":
        return segment_sum(values, first, weights) + segment_sum(values, second, weights)
    if weights is None:
        return _sparse_sum(pair_matrix(first, second, values.dtype), values, first)
    structure = first.head_sum_structure(weights.shape[1], second)
    return _weighted_sum(structure, values, weights, first)


def pair_matrix(first: Any, second: Any, dtype: Any) -> Any:
    """NumPy: CSR ``(N, E)``, the sum of both segmentations' sum matrices, built once per dtype.

    Parameters
    ----------
    first, second : Segments
        Two groupings of the same items; the matrix is cached on ``first``.
    dtype : dtype
        The entries' dtype (the values').

    Returns
    -------
    scipy.sparse.csr_matrix
        ``(N, E)``, an item in the same segment of both stored as 2.
    """
    by_dtype = first._pair_sums.setdefault(second, {})
    if dtype not in by_dtype:
        both = first.sum_matrix(dtype) + second.sum_matrix(dtype)
        both.sort_indices()
        by_dtype[dtype] = both
    return by_dtype[dtype]


def _flat(values: Any, num_items: int) -> Any:
    # Explicit F, not -1: reshape cannot infer -1 for an empty array (E = 0).
    return values.reshape(num_items, math.prod(values.shape[1:]))  # (E, F)


def _scaled(values: Any, weights: Any) -> Any:
    """``values (E, H, *F) * weights (E, H)`` broadcast over ``F``."""
    return values * weights.reshape(weights.shape + (1,) * (values.ndim - weights.ndim))


def _sparse_sum(matrix: Any, values: Any, segments: Any) -> Any:
    """``matrix (N, E)`` times ``values`` (E, *F) -> (N, *F)."""
    out = csr_matmul(matrix, _flat(values, segments.num_items))  # (N, F)
    return out.reshape((segments.num_segments, *values.shape[1:]))


def _weighted_sum(structure: tuple, values: Any, weights: Any, segments: Any) -> Any:
    """The head-block sum matrix of ``structure`` (:meth:`Segments.head_sum_structure`), its
    entries ``weights[e, h]`` (times their multiplicity), times ``values (E, H, *F)``."""
    import scipy.sparse as sp

    multiplicity, column, indptr = structure
    heads = weights.shape[1]
    data = segments.xp.take(weights, column)  # (E H,): column e H + h is weights[e, h]'s flat index
    if multiplicity is not None:
        data *= multiplicity
    shape = (segments.num_segments * heads, segments.num_items * heads)
    matrix = sp.csr_matrix((data, column, indptr), shape=shape, copy=False)
    return head_block_matmul(matrix, values)  # (N, H, *F)
