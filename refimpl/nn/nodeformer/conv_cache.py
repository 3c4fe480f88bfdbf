"""``NodeFormerCache``: what :class:`refimpl.nn.nodeformer.conv.NodeFormerConv`'s backward and
the edge loss read from its forward."""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.graph import Graph

__all__ = ["NodeFormerCache"]


class NodeFormerCache(NamedTuple):
    """What :meth:`NodeFormerConv.backward` and the edge loss read.

    Attributes
    ----------
    x : array, (N, F)
        The input.
    graph : Graph
        ``prepare_graph(graph)``: the relational bias's first order and the edge loss's.
    q : array, (N, H, C)
        The queries ``s (W_q x + b_q)``, ``s`` the qk factor.
    k : array, (N, H, C)
        The keys ``s (W_k x + b_k)``.
    v : array, (N, H, C)
        The values ``W_v x + b_v``.
    attention : tuple of KernelizedSoftmaxCache
        Per head, its attention's cache.
    operators : tuple
        Per order, its ``refimpl.nn.nodeformer.relational_bias.Operator``; ``()`` without
        relational bias.
    heads : array, (N, H C)
        The heads concatenated, the input of ``W_o``.
    noise : dict
        The draws used: ``"projection"`` (m, C); ``"gumbel"`` (N, H, K) if drawn.
    """

    x: Any
    graph: Graph
    q: Any
    k: Any
    v: Any
    attention: tuple
    operators: tuple
    heads: Any
    noise: dict
