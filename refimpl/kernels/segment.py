"""Graph aggregation primitives: segment sum / max / softmax and gather, each with its backward.

A *segment* is the set of items (edges) that share an index value (their target
node, for message passing). With ``E`` items, ``N`` segments and any trailing
feature shape ``F`` (for example ``(H,)`` or ``(H, C)``):

| primitive                   | shapes             | adjoint (its backward)                       |
| --------------------------- | ------------------ | -------------------------------------------- |
| ``gather(x, seg)``          | (N, *F) -> (E, *F) | ``segment_sum`` (scatter-add)                |
| ``segment_sum(v, seg)``     | (E, *F) -> (N, *F) | ``gather`` (repeat per item)                 |
| ``segment_max(v, seg)``     | (E, *F) -> (N, *F) | route the gradient to the argmax             |
| ``segment_softmax(s, seg)`` | (E, *F) -> (E, *F) | ``alpha*(g - gather(segment_sum(alpha*g)))`` |

Empty segments (nodes with no incoming edge) give zeros from ``segment_sum``
and ``segment_max`` (and argmax ``-1``); ``segment_softmax`` has no output for
them, so a node without incoming edges aggregates to zero.

Implementation (``scripts/bench_segment.py`` times the candidates; figures in the
benchmark docs): ``segment_sum`` adds each segment's items in item order, one
segment at a time, over the segments' CSR structure (:meth:`Segments.csr_structure`,
built once per segmentation). On NumPy that is a product with a ``scipy.sparse``
``(N, E)`` matrix (one compiled pass over the edges, where ``numpy.add.at`` takes a
slow unbuffered path per item); on CuPy a kernel of ours
(:func:`refimpl.kernels.device_sums.row_sums_in_order`); on the strict stand-in
SciPy's product again, through :mod:`refimpl.testing.strict_sparse`. One fixed order
per segment makes a GPU run repeat bit for bit. ``add.at`` on a GPU sums in the
order its atomic additions land, which changes from run to run, and so does
cuSPARSE's CSR product on long rows (both measured on an H200: docs/benchmarks.md, GPU).

``segment_max`` is ``maximum.at`` on flattened indices (``ufunc.at``'s fast path is
for 1-D indices). On NumPy over the floats themselves; on the other backends over
integer keys that order as the floats do (:func:`order_keys`): CuPy 14's
``maximum.at`` rounds float64 through float32, and an integer maximum is exact and
does not depend on the order the updates land in.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

from refimpl.backend import backend_name, get_array_module, sparse_module
from refimpl.kernels.csr import head_blocks
from refimpl.kernels.limits import check_count
from refimpl.kernels.maxima import order_keys, running_maxima
from refimpl.kernels.sums import pair_matrix, segment_sum, segment_sum_pair

__all__ = [
    "CACHED_POSITIONS",
    "Segments",
    "gather",
    "gather_backward",
    "order_keys",  # defined in refimpl.kernels.maxima
    "scatter_add",
    "segment_max",
    "segment_max_backward",
    "segment_softmax",
    "segment_softmax_backward",
    "segment_sum",  # segment_sum and segment_sum_pair are defined in refimpl.kernels.sums
    "segment_sum_backward",
    "segment_sum_pair",
]


CACHED_POSITIONS = 1 << 21  # Segments.flat_positions kept up to this many entries (16 MB)


class Segments:
    """Items grouped by an integer index, with the per-backend structures reused across calls.

    Parameters
    ----------
    index : int array (E,)
        Segment of each item, ``0 <= index < num_segments`` (not re-validated
        here: :class:`refimpl.Graph` validates at its boundary).
    num_segments : int
        ``N``; segments no item points to are empty.
    """

    def __init__(self, index: Any, num_segments: int) -> None:
        self.index = index
        self.num_segments = int(num_segments)
        self.xp = get_array_module(index)
        self.backend = backend_name(self.xp)  # "numpy", "cupy" or "strict"
        self._csr: tuple[Any, Any] | None = None  # csr_structure()
        self._sum_matrices: dict[Any, Any] = {}  # dtype -> CSR (N, E); not on CuPy
        # NumPy only: per other segmentation, the CSR structure of the (N, N') matrices over
        # both (pair_structure) and segment_sum_pair's summed matrices (by dtype); weak keys,
        # so an entry goes when that segmentation (its graph) does
        self._structures: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._pair_sums: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # NumPy only: the head-block structures (head_blocks) of those matrices, by head count
        self._head_pairs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._head_sums: dict[tuple[Any, int], Any] = {}  # (None or second, H) -> structure
        self._positions: dict[int, Any] = {}  # F -> flat_positions(F), on small graphs

    @property
    def num_items(self) -> int:
        return int(self.index.shape[0])

    def counts(self) -> Any:
        """Number of items in each segment, ``(N,)`` (the in-degree for target segments)."""
        return self.xp.bincount(self.index, minlength=self.num_segments)

    def item_order(self) -> Any:
        """The items grouped by segment, in item order within each segment (E,): a stable
        sort of ``index``. A device sort need not be stable, so there the keys are made
        unique (``index * E + item``) and any sort gives this one order."""
        xp = self.xp
        if self.backend == "numpy":
            return xp.argsort(self.index, kind="stable")
        keys = self.index.astype(xp.int64) * self.num_items + xp.arange(self.num_items)
        return xp.argsort(keys)

    def csr_structure(self) -> tuple[Any, Any]:
        """``(item_order (E,), indptr (N + 1,))``: segment ``n``'s items are
        ``item_order[indptr[n]:indptr[n + 1]]``, in item order. Built once; int32 off NumPy
        (the device's sparse indices), int64 on NumPy."""
        if self._csr is None:
            xp = self.xp
            indptr = xp.zeros(self.num_segments + 1, dtype=xp.int64)  # (N + 1,)
            indptr[1:] = xp.cumsum(self.counts())
            order = self.item_order()  # (E,)
            if self.backend != "numpy":
                check_count(self.num_items, "the number of items (edges)")
                order, indptr = order.astype(xp.int32), indptr.astype(xp.int32)
            self._csr = (order, indptr)
        return self._csr

    def sum_matrix(self, dtype: Any) -> Any:
        """CSR ``(N, E)`` with a one at ``(index[e], e)`` (:meth:`csr_structure`), built once
        per dtype, with ``scipy.sparse`` (the strict stand-in's, off NumPy):
        ``segment_sum`` is a product with it (the dtype matches the values, so float32
        stays float32)."""
        if dtype not in self._sum_matrices:
            order, indptr = self.csr_structure()
            data = self.xp.ones(self.num_items, dtype=dtype)
            self._sum_matrices[dtype] = sparse_module(self.xp).csr_matrix(
                (data, order, indptr), shape=(self.num_segments, self.num_items)
            )
        return self._sum_matrices[dtype]

    def pair_structure(self, columns: Segments) -> tuple[Any, Any, Any]:
        """NumPy only: ``(item_order, column, indptr)``, the CSR structure of the ``(N, N')``
        matrices whose item ``e`` sits at ``(index[e], columns.index[e])``, built once per
        ``columns``: items grouped by this segmentation (:meth:`csr_structure`), their
        columns, and the row pointers. ``column`` and ``indptr`` are int32 where they fit, so
        SciPy takes them without scanning them for a narrower index type on every call."""
        cached = self._structures.get(columns)
        if cached is None:
            import numpy as np

            item_order, indptr = self.csr_structure()  # (E,), (N + 1,)
            fits = max(self.num_items, columns.num_segments) < 2**31
            index_type = np.int32 if fits else np.int64
            column = columns.index[item_order].astype(index_type)  # (E,) in CSR order
            cached = (item_order, column, indptr.astype(index_type))
            self._structures[columns] = cached
        return cached

    def flat_positions(self, num_features: int) -> Any:
        """``(E, F)``: the position of item ``e``'s feature ``f`` in a flattened ``(N F)`` array
        (where ``segment_max`` writes it). Kept per ``F`` up to :data:`CACHED_POSITIONS`
        entries: every softmax of a training step asks again, and on a small graph the
        arithmetic is a noticeable share of it."""
        positions = self._positions.get(num_features)
        if positions is None:
            positions = self.index[:, None] * num_features + self.xp.arange(num_features)
            if positions.size <= CACHED_POSITIONS:
                self._positions[num_features] = positions
        return positions

    def head_pair_structure(self, columns: Segments, heads: int) -> tuple[Any, Any, Any]:
        """NumPy only: :meth:`pair_structure` for ``heads`` heads in one matrix
        (:func:`~refimpl.kernels.csr.head_blocks`): ``(weight_index, column, indptr)`` of the
        ``(N H, N' H)`` matrix with item ``e``'s head ``h`` at ``(index[e] H + h,
        columns.index[e] H + h)``; ``weight_index`` (E H,) picks each stored entry from an
        ``(E, H)`` array's flat view. Built once per ``columns`` and head count."""
        if heads == 1:  # the pattern itself: no second copy of it
            return self.pair_structure(columns)
        by_heads = self._head_pairs.setdefault(columns, {})
        if heads not in by_heads:
            item_order, column, indptr = self.pair_structure(columns)
            source, column_h, indptr_h = head_blocks(indptr, column, heads, columns.num_segments)
            # int32 as the columns where they fit: half the memory, and a faster take
            weight_index = (item_order[source // heads] * heads + source % heads).astype(
                column_h.dtype
            )
            by_heads[heads] = (weight_index, column_h, indptr_h)
        return by_heads[heads]

    def head_sum_structure(self, heads: int, second: Segments | None = None) -> tuple:
        """NumPy only: ``(multiplicity, column, indptr)`` of the ``(N H, E H)`` matrix that sums
        item ``e``'s head ``h`` into ``index[e] H + h`` (and, with ``second``, also into
        ``second.index[e] H + h``: :func:`segment_sum_pair`'s matrix). The stored entry's
        column ``e H + h`` is also where its weight sits in an ``(E, H)`` array's flat view;
        ``multiplicity`` (int8, 2 for an item in the same segment of both) is None when every
        entry is one. Built once per head count (and ``second``)."""
        key = (second, heads)
        if key not in self._head_sums:
            import numpy as np

            if second is None:  # CSR (N, E); its columns are the items
                (item_order, indptr), counts = self.csr_structure(), None
            else:
                summed = pair_matrix(self, second, np.float32)
                item_order, indptr, counts = summed.indices, summed.indptr, summed.data
            source, column_h, indptr_h = head_blocks(indptr, item_order, heads, self.num_items)
            multiplicity = None
            if counts is not None:
                multiplicity = counts[source // heads].astype(np.int8)
            self._head_sums[key] = (multiplicity, column_h, indptr_h)
        return self._head_sums[key]

    def __repr__(self) -> str:
        return f"Segments(num_items={self.num_items}, num_segments={self.num_segments})"


def gather(x: Any, segments: Segments) -> Any:
    """Repeat each segment's row for every item in it: ``x[index]``.

    Parameters
    ----------
    x : array
        ``(N, *F)``, one row per segment.
    segments : Segments
        The items (edges) grouped by segment (node).

    Returns
    -------
    array
        ``(E, *F)``, one row per item.
    """
    return segments.xp.take(x, segments.index, axis=0)


def gather_backward(d_items: Any, segments: Segments) -> Any:
    """Adjoint of :func:`gather`: sum the item gradients per segment.

    Parameters
    ----------
    d_items : array
        ``(E, *F)``, the cotangent of :func:`gather`'s output.
    segments : Segments
        The items (edges) grouped by segment (node).

    Returns
    -------
    array
        ``(N, *F)``.
    """
    return segment_sum(d_items, segments)


def segment_sum_backward(d_out: Any, segments: Segments) -> Any:
    """Adjoint of :func:`segment_sum`: every item receives its segment's gradient.

    Parameters
    ----------
    d_out : array
        ``(N, *F)``, the cotangent of the sums.
    segments : Segments
        The items (edges) grouped by segment (node).

    Returns
    -------
    array
        ``(E, *F)``.
    """
    return gather(d_out, segments)


scatter_add = segment_sum  # the same operation, under the name used for gradients


def segment_max(values: Any, segments: Segments) -> tuple[Any, Any]:
    """Maximum over the items of each segment, with the item that attains it.

    Returns ``(max, argmax)``, both ``(N, *F)``. Empty segments give ``max = 0``
    and ``argmax = -1``. Ties pick the lowest item index, so the backward routes
    the gradient to exactly one item (a valid subgradient of the max).

    Parameters
    ----------
    values : array
        ``(E, *F)``, floating-point.
    segments : Segments
        The items (edges) grouped by segment (node).

    Returns
    -------
    tuple of array
        ``(max, argmax)``, both ``(N, *F)``: ``argmax`` the int64 item index, -1 where empty.
    """
    xp = segments.xp
    num_items, num_segments = segments.num_items, segments.num_segments
    maxima, flat, positions = running_maxima(values, segments)

    # Lowest item index among those equal to their segment's max.
    attains = flat == maxima[positions]  # (E, F)
    item_ids = xp.broadcast_to(xp.arange(num_items)[:, None], flat.shape)
    argmax = xp.full(maxima.shape[0], num_items, dtype=xp.int64)
    xp.minimum.at(argmax, positions[attains], item_ids[attains])

    empty = argmax == num_items
    maxima = xp.where(empty, 0, maxima).astype(values.dtype, copy=False)
    argmax = xp.where(empty, -1, argmax)
    shape = (num_segments, *values.shape[1:])
    return maxima.reshape(shape), argmax.reshape(shape)


def segment_max_backward(d_out: Any, argmax: Any, segments: Segments) -> Any:
    """Adjoint of :func:`segment_max`: ``d_out`` goes to the argmax item, zero elsewhere.

    Parameters
    ----------
    d_out : array
        ``(N, *F)``, the cotangent of the maxima.
    argmax : array
        ``(N, *F)``, as :func:`segment_max` returned it.
    segments : Segments
        The items (edges) grouped by segment (node).

    Returns
    -------
    array
        ``(E, *F)``.
    """
    xp = segments.xp
    num_features = math.prod(argmax.shape[1:])  # explicit F: -1 fails on empty arrays
    argmax_flat = argmax.reshape(segments.num_segments, num_features)  # (N, F)
    d_flat = d_out.reshape(segments.num_segments, num_features)  # (N, F)
    d_values = xp.zeros((segments.num_items, argmax_flat.shape[1]), dtype=d_out.dtype)
    rows, cols = xp.nonzero(argmax_flat >= 0)
    # Each (item, feature) is the argmax of at most one segment: plain assignment is exact.
    d_values[argmax_flat[rows, cols], cols] = d_flat[rows, cols]
    return d_values.reshape((segments.num_items, *d_out.shape[1:]))


def segment_softmax(scores: Any, segments: Segments) -> Any:
    """Softmax of the scores within each segment, (E, *F) -> (E, *F).

    ``alpha_e = exp(s_e - m) / sum_{e' in seg(e)} exp(s_e' - m)`` with ``m`` the
    segment maximum: subtracting it leaves the ratio unchanged and keeps every
    exponent <= 0, so nothing overflows and the denominator is >= 1. The max is
    a constant shift, so the backward does not differentiate through it.

    Parameters
    ----------
    scores : array
        ``(E, *F)``, floating-point.
    segments : Segments
        The items (edges) grouped by segment (node).

    Returns
    -------
    array
        ``alpha``, ``(E, *F)``: each segment's entries sum to 1.
    """
    # The max alone: the argmax of segment_max costs 4x more and is not needed here.
    maxima, _, _ = running_maxima(scores, segments)  # (N*F,)
    maxima = maxima.reshape((segments.num_segments, *scores.shape[1:]))  # (N, *F)
    shifted = scores - gather(maxima, segments)  # (E, *F), <= 0
    exponentials = segments.xp.exp(shifted)  # (E, *F), <= 1
    denominators = segment_sum(exponentials, segments)  # (N, *F), >= 1 where non-empty
    return exponentials / gather(denominators, segments)


def segment_softmax_backward(alpha: Any, d_alpha: Any, segments: Segments) -> Any:
    """Adjoint of :func:`segment_softmax` from its output: ``alpha * (g - sum_seg(alpha * g))``.

    Parameters
    ----------
    alpha : array
        ``(E, *F)``, the softmax's output.
    d_alpha : array
        ``(E, *F)``, its cotangent ``g``.
    segments : Segments
        The items (edges) grouped by segment (node).

    Returns
    -------
    array
        The cotangent of the scores, ``(E, *F)``.
    """
    weighted = segment_sum(alpha * d_alpha, segments)  # (N, *F)
    return alpha * (d_alpha - gather(weighted, segments))
