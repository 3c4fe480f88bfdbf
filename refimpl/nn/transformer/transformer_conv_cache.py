"""``TransformerConvCache``: what :class:`~refimpl.nn.transformer.transformer_conv.TransformerConv`
keeps from its forward for its backward (a module of its own so that the layer's file holds its
documentation within the project's module size)."""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.graph import Graph
from refimpl.nn.lipschitz.neighbourhood_norm import TransformerLipschitzCache

__all__ = ["TransformerConvCache"]


class TransformerConvCache(NamedTuple):
    """What ``TransformerConv.backward`` reads.

    Attributes
    ----------
    x : (N, in) array
        The input; of a bipartite input ``(x_src, x_dst)``, ``x_src``.
    graph : Graph
        The graph the layer ran on.
    edge_attr : (E, edge_dim) array or None
        The edge features (None without ``edge_dim``).
    q : (N, H, C) array
        Queries.
    k : (N, H, C) array
        Node keys, without the edge term.
    val : (N, H, C) array
        Node values, without the edge term.
    edge_features : (E, H, C) array or None
        ``ef = W_e e_uv`` (None without ``edge_dim``).
    alpha : (E, H) array
        Attention coefficients, before dropout.
    dropout_cache : DropoutCache
        The attention dropout's cache (its mask, or None outside training).
    alpha_dropped : (E, H) array
        The coefficients used in the aggregation (after dropout).
    lipschitz : TransformerLipschitzCache or None
        LipschitzNorm's cache, with ``lipschitz_norm="paper"``.
    messages : (N, F) array
        Heads combined, before the root weight.
    skip : (N, F) array or None
        ``x_r = W_skip x + b_skip`` (None without ``root_weight``).
    gate : (N, 1) array or None
        ``b = sigmoid(...)`` with ``beta``, else None.
    x_dst : (N_dst, F_dst) array or None, default None
        The targets' features of a bipartite input, else None.
    """

    x: Any
    graph: Graph
    edge_attr: Any
    q: Any
    k: Any
    val: Any
    edge_features: Any
    alpha: Any
    dropout_cache: Any
    alpha_dropped: Any
    lipschitz: TransformerLipschitzCache | None
    messages: Any
    skip: Any
    gate: Any
    x_dst: Any = None
