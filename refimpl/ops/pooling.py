"""``GlobalPool``: one vector per graph from its nodes' vectors, mean or sum (readout).

The graph-level output of the massive-activations supplement (Sec. 2, Output
Layer: ``y_graph = MLP(Pool(H^(L)))``) pools the final node states of each
graph. With the nodes grouped by graph (``Segments`` over the batch vector,
``GraphBatch.batch_segments``; ``G`` segments, ``n_g`` nodes in graph ``g``)::

    sum:   out_g = sum_{v in g} x_v                      (G, F)
    mean:  out_g = (1 / n_g) sum_{v in g} x_v

Forward and backward are the adjoint pair ``segment_sum`` / ``gather``
(:mod:`refimpl.kernels.segment`): every node of graph ``g`` receives ``d_out_g``
(sum) or ``d_out_g / n_g`` (mean).

Empty graphs (a segment with no node): both reductions give 0 (the mean divides
by ``max(n_g, 1)``), and no gradient flows anywhere from their row. PyTorch
Geometric's ``global_add_pool`` / ``global_mean_pool`` (with ``size=G``) agree,
empty graphs included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.kernels.segment import Segments, gather, segment_sum
from refimpl.validation import check_cotangent, check_input

__all__ = ["POOL_REDUCTIONS", "GlobalPool", "GlobalPoolCache"]

POOL_REDUCTIONS = ("mean", "sum")


class GlobalPoolCache(NamedTuple):
    """What :meth:`GlobalPool.backward` reads."""

    segments: Segments  # the nodes grouped by graph
    counts: Any  # (G, 1) max(n_g, 1) in x's dtype (mean), or None (sum)
    num_features: int  # F, for the cotangent check
    dtype: Any  # x's dtype, for the cotangent check


@dataclass(frozen=True)
class GlobalPool:
    """Per-graph mean or sum of node features: ``(N, F) -> (G, F)``.

    ``forward(params, x (N, F), segments)`` with ``params = {}`` (no
    parameters) and ``segments`` the :class:`~refimpl.kernels.segment.Segments`
    of the nodes by graph (``N`` items, ``G`` segments, on ``x``'s backend);
    ``backward(params, cache, d_out (G, F)) -> (d_x (N, F), {})``.

    Cache: :class:`GlobalPoolCache`. See the module docstring for empty graphs
    and PyG parity.
    """

    reduce: str = "mean"  # "mean" | "sum"; PyG global_mean_pool / global_add_pool

    def __post_init__(self) -> None:
        if self.reduce not in POOL_REDUCTIONS:
            raise ValueError(
                f"GlobalPool reduce must be one of {POOL_REDUCTIONS}, got {self.reduce!r}"
            )

    def forward(
        self, params: dict[str, Any], x: Any, segments: Segments
    ) -> tuple[Any, GlobalPoolCache]:
        xp = check_input(x, "x", ndim=2)
        if params:
            raise ValueError(f"GlobalPool has no parameters; pass {{}}, got keys {sorted(params)}")
        if not isinstance(segments, Segments):
            raise TypeError(
                "segments must be refimpl.kernels.segment.Segments "
                f"(GraphBatch.batch_segments(xp)), got {type(segments).__name__}"
            )
        if segments.num_items != x.shape[0]:
            raise ValueError(
                f"segments group {segments.num_items} nodes but x has {x.shape[0]} rows; pass the "
                "segments of this batch's nodes (one item per row of x)"
            )
        get_array_module(x, segments.index)  # TypeError if they live on two backends
        # F1 sum over the nodes of each graph
        sums = segment_sum(x, segments)  # (G, F)
        if self.reduce == "sum":
            return sums, GlobalPoolCache(segments, None, x.shape[1], x.dtype)
        # F2 divide by the node count (1 for empty graphs, whose sum is 0)
        counts = xp.maximum(segments.counts(), 1).astype(x.dtype)[:, None]  # (G, 1)
        return sums / counts, GlobalPoolCache(segments, counts, x.shape[1], x.dtype)

    def backward(
        self, params: dict[str, Any], cache: GlobalPoolCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        segments = cache.segments
        shape = (segments.num_segments, cache.num_features)
        check_cotangent(d_out, shape, cache.dtype, segments.index, name="d_out")
        d_sums = d_out
        if cache.counts is not None:
            # B2 (of F2)
            d_sums = d_out / cache.counts  # (G, F)
        # B1 (of F1) the adjoint of segment_sum: every node gets its graph's row
        return gather(d_sums, segments), {}  # (N, F)
