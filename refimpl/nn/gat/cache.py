"""``GATCache``: what :class:`refimpl.nn.gat.conv.GATConv`'s backward reads from its forward."""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.graph import Graph
from refimpl.nn.gat import v1, v2
from refimpl.nn.gat.fused_path import FusedScoreCache, FusedV2ScoreCache
from refimpl.ops.loop_fill import LoopFillCache

__all__ = ["GATCache"]


class GATCache(NamedTuple):
    r"""What ``GATConv.backward`` reads (``E`` counts the self-loops when added).

    Attributes
    ----------
    x : array, (N, F)
        The input features; of a bipartite input ``(x_src, x_dst)``, ``x_src``.
    graph : Graph
        The graph attended over (self-loops handled).
    h_src : array, (N_s, H, C)
        The sources' transform (:mod:`refimpl.nn.gat.transform`).
    h_dst : array, (N_t, H, C)
        The targets'; the same array as ``h_src`` where one map reads one ``x``.
    score : v1.ScoreCache, v2.ScoreCache, FusedScoreCache or FusedV2ScoreCache
        The version's score: its input, LeakyReLU's branch, LipschitzNorm's cache; on the
        fused path (:mod:`refimpl.nn.gat.fused_path`) GATv1's per-node score halves alone,
        or GATv2's mark (whether both ends share one map: its kernels recompute the rest).
    alpha : array, (E, H)
        The attention coefficients, before dropout.
    dropout_cache : object
        The attention dropout's cache (its mask, or None outside training).
    alpha_dropped : array, (E, H) or None
        The coefficients the aggregation used; None on the fused path (the kernel applies
        ``dropout_cache``'s mask inside).
    edge_attr : array, (E, D) or None
        The edge features over the attended edges (loops filled), or None.
    h_edge : array, (E, H, C) or None
        Their projection $\mathbf{W}_e \mathbf{a}_{uv}$, or None.
    loop_fill : LoopFillCache or None
        The added loops' features (:mod:`refimpl.ops.loop_fill`), with ``edge_dim``.
    x_dst : array, (N_t, F_t) or None
        The targets' features of a bipartite input, or None.
    flat_edge_attr : bool
        ``edge_attr`` came as ``(E,)`` (``edge_dim=1``), so ``d_edge_attr`` is returned so.
    """

    x: Any
    graph: Graph
    h_src: Any
    h_dst: Any
    score: v1.ScoreCache | v2.ScoreCache | FusedScoreCache | FusedV2ScoreCache
    alpha: Any
    dropout_cache: Any
    alpha_dropped: Any
    edge_attr: Any = None
    h_edge: Any = None
    loop_fill: LoopFillCache | None = None
    x_dst: Any = None
    flat_edge_attr: bool = False
