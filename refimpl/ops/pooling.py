"""``GlobalPool``: one vector per graph from its nodes' vectors, mean, sum or max (readout).

The graph-level output of the massive-activations supplement (Sec. 2, Output
Layer: ``y_graph = MLP(Pool(H^(L)))``) pools the final node states of each
graph; the study's GT, GraphiT and SAN code offers mean, sum and max readouts. With
the nodes grouped by graph (``Segments`` over the batch vector,
``GraphBatch.batch_segments``; ``G`` segments, ``n_g`` nodes in graph ``g``)::

    sum:   out_g = sum_{v in g} x_v                      (G, F)
    mean:  out_g = (1 / n_g) sum_{v in g} x_v
    max:   out_gf = max_{v in g} x_vf                     (per channel f)

Sum and mean: forward and backward are the adjoint pair ``segment_sum`` / ``gather``
(:mod:`refimpl.kernels.segment`): every node of graph ``g`` receives ``d_out_g``
(sum) or ``d_out_g / n_g`` (mean).

Max: node ``v`` receives ``d_out_gf`` in channel ``f`` where it attains the maximum.
Ties (``t`` nodes of graph ``g`` equal to ``out_gf``) share it evenly, ``d_out_gf / t``
each: PyTorch's ``scatter_reduce(reduce="amax")`` backward, which PyG's
``global_max_pool`` runs on the CPU (and on a GPU without the ``torch-scatter``
package; with it, torch-scatter sends the whole gradient to one of the tied nodes).
Both are valid subgradients; the even split is also the one symmetric in the tied nodes.
One exception: where the maximum is exactly 0, PyTorch's backward also counts the zeros
PyG starts from (excluded from the forward by ``include_self=False``) as a tied entry,
so ``t`` tied nodes get ``d_out_gf / (t + 1)`` each there and one share is lost;
refimpl gives ``d_out_gf / t``, whose shares add up to ``d_out_gf``. The study's released
code reads out with DGL's ``dgl.max_nodes``, whose segment max records one arg-max per
graph and channel (another valid subgradient at ties; not run here, DGL being absent).

Empty graphs (a segment with no node): all three reductions give 0 (the mean divides
by ``max(n_g, 1)``; the max is 0, not ``-inf``), and no gradient flows anywhere from
their row. PyTorch Geometric's ``global_add_pool`` / ``global_mean_pool`` /
``global_max_pool`` (with ``size=G``) agree, empty graphs included (PyG's max starts
from zeros and leaves empty rows there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.kernels.segment import Segments, gather, segment_max, segment_sum
from refimpl.validation import check_cotangent, check_input

__all__ = ["POOL_REDUCTIONS", "GlobalPool", "GlobalPoolCache"]

POOL_REDUCTIONS = ("mean", "sum", "max")


class GlobalPoolCache(NamedTuple):
    """What :meth:`GlobalPool.backward` reads.

    Attributes
    ----------
    segments : Segments
        The nodes grouped by graph.
    counts : array or None
        Mean: ``(G, 1)``, ``max(n_g, 1)`` in ``x``'s dtype; None for sum and max.
    share : array or None
        Max: ``(N, F)``, ``1/t`` where the node ties ``t`` ways for its graph's max, else 0.
    num_features : int
        ``F``, for the cotangent check.
    dtype : dtype
        ``x``'s dtype, for the cotangent check.
    """

    segments: Segments
    counts: Any
    share: Any
    num_features: int
    dtype: Any


@dataclass(frozen=True)
class GlobalPool:
    """Per-graph mean, sum or max of node features: ``(N, F) -> (G, F)``.

    ``forward(params, x (N, F), segments)`` with ``params = {}`` (no
    parameters) and ``segments`` the :class:`~refimpl.kernels.segment.Segments`
    of the nodes by graph (``N`` items, ``G`` segments, on ``x``'s backend);
    ``backward(params, cache, d_out (G, F)) -> (d_x (N, F), {})``.

    Cache: :class:`GlobalPoolCache`. See the module docstring for the equations,
    ties of the max, empty graphs and PyG parity.

    Parameters
    ----------
    reduce : str
        ``"mean"`` (default), ``"sum"`` or ``"max"``: PyG's ``global_mean_pool``,
        ``global_add_pool``, ``global_max_pool``.

    Shapes
    ------
    - ``x``: ``(N, F)``; ``segments``: ``N`` items in ``G`` segments.
    - output: ``(G, F)``, ``x``'s dtype.
    """

    reduce: str = "mean"  # "mean" | "sum" | "max"; PyG global_mean/add/max_pool

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
        if self.reduce == "max":
            # F1' per-channel maximum over the nodes of each graph, 0 for an empty graph
            maxima, _ = segment_max(x, segments)  # (G, F)
            # which nodes attain it, and how many share each (graph, channel): >= 1 there
            attains = (x == gather(maxima, segments)).astype(x.dtype)  # (N, F)
            ties = segment_sum(attains, segments)  # (G, F)
            share = attains / gather(xp.maximum(ties, 1), segments)  # (N, F)
            return maxima, GlobalPoolCache(segments, None, share, x.shape[1], x.dtype)
        # F1 sum over the nodes of each graph
        sums = segment_sum(x, segments)  # (G, F)
        if self.reduce == "sum":
            return sums, GlobalPoolCache(segments, None, None, x.shape[1], x.dtype)
        # F2 divide by the node count (1 for empty graphs, whose sum is 0)
        counts = xp.maximum(segments.counts(), 1).astype(x.dtype)[:, None]  # (G, 1)
        return sums / counts, GlobalPoolCache(segments, counts, None, x.shape[1], x.dtype)

    def backward(
        self, params: dict[str, Any], cache: GlobalPoolCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        segments = cache.segments
        shape = (segments.num_segments, cache.num_features)
        check_cotangent(d_out, shape, cache.dtype, segments.index, name="d_out")
        if cache.share is not None:
            # B1' (of F1') each attaining node gets its share of its graph's cotangent
            return cache.share * gather(d_out, segments), {}  # (N, F)
        d_sums = d_out
        if cache.counts is not None:
            # B2 (of F2)
            d_sums = d_out / cache.counts  # (G, F)
        # B1 (of F1) the adjoint of segment_sum: every node gets its graph's row
        return gather(d_sums, segments), {}  # (N, F)
