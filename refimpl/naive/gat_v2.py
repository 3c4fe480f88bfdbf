"""Literal twin of ``GATConv(version="v2")``: per-edge forward and the chain rule per edge.

GAT-balance Eq. 1-2 with the GATv2 score (Brody et al. 2022), per head ``h`` and
edge ``e = u -> v`` of the attended graph (``W_t = W_s`` with ``share_weights``):

    F1  W_s x_k (+ b_s), W_t x_k (+ b_t)  (of a pair: x_src, x_dst)  (N, H, C) each
    F1' W_e a_e    (edge features, ``edge_dim``; loops filled)    (E, H, C)
    F2  x_uv       = W_s h_u + W_t h_v (+ W_e a_e)                (E, H, C)
    F3  LeakyReLU(x_uv)                                           (E, H, C)
    F4  e_uv       = att . LeakyReLU(x_uv)                        (E, H), GAT-balance Eq. 2
    F4' (LipschitzNorm) e_uv <- e_uv / D_e                        (E, H), LipschitzNorm Eq. 17
    F5  alpha_uv   = softmax over u in N(v) of e_uv               (E, H)
    F6  (attention dropout) alpha_uv * keep_uv / (1 - p)          (E, H)
    F7  out_v      = sum_{u in N(v)} alpha_uv W_s h_u             (N, H, C), GAT-balance Eq. 1
    F8  heads concatenated (N, H*C) or averaged (N, C);  F8' + x W_res^T (PyG's residual);
    F9  + bias

Edges as PyG: with ``add_self_loops`` existing loops are replaced by one per node;
duplicates are separate edges; a node with no incoming edge outputs the bias. The
LeakyReLU derivative at exactly 0 is the slope. The score is the literal
``att . LeakyReLU(x_uv)`` (the layer splits it into a ReLU part and per-node halves).
F4' is :mod:`refimpl.naive.lipschitz_norm`. NumPy on the host, float64, no code shared
with ``refimpl.nn.gat.conv``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refimpl.graph import Graph
from refimpl.naive.gat import (
    Attended,
    EdgeFeatures,
    Sides,
    attend,
    attend_backward,
    attended_edges,
    edge_features,
    edge_features_backward,
    leaky_relu,
    leaky_relu_derivative,
    sides,
    sides_backward,
)
from refimpl.naive.lipschitz_norm import (
    LipschitzTwinCache,
    gat_v2_lipschitz_backward,
    gat_v2_lipschitz_forward,
)

__all__ = ["GATv2Twin", "gat_v2_backward", "gat_v2_forward"]


class GATv2Twin(NamedTuple):
    """The forward's named quantities."""

    f1: Sides  # F1: the inputs and the transforms of both sides
    edges: np.ndarray  # (E, 2) rows (u, v), self-loops handled
    pre: np.ndarray  # (E, H, C) F2 x_uv
    hidden: np.ndarray  # (E, H, C) F3 LeakyReLU(x_uv)
    lipschitz: LipschitzTwinCache | None  # F4'
    attended: Attended  # F5-F6: alpha, the dropout keep factors, alpha after dropout
    graph: Graph  # as given
    edge_attr: np.ndarray | None  # (E_graph, D) as given
    features: EdgeFeatures | None  # F1'


def gat_v2_forward(
    conv: Any,
    params: dict[str, np.ndarray],
    x: Any,
    graph: Graph,
    attn_dropout_mask: np.ndarray | None = None,
    edge_attr: np.ndarray | None = None,
) -> tuple[np.ndarray, GATv2Twin]:
    """``(out (N, H*C) or (N, C), cache)``; ``conv`` is read for its configuration only.

    ``attn_dropout_mask`` (E, H) bool (True = keep) over the attended edges, or None
    for no dropout (evaluation, or ``p = 0``, where the layer ignores any mask).
    """
    loops = min(graph.num_nodes, graph.num_dst_nodes)  # PyG's, bipartite graphs included
    edges = attended_edges(graph.edge_index, loops, conv.add_self_loops)  # (E, 2)
    src, dst = edges[:, 0], edges[:, 1]
    # F1 W_s x (+ b_s), W_t x (+ b_t) per node (N, H, C); one map with shared weights
    f1 = sides(conv, params, x)
    h_src, h_dst = f1.h_src, f1.h_dst
    # F2 x_uv = W_s h_u + W_t h_v (E, H, C), F1' (+ W_e a_e)
    pre = h_src[src] + h_dst[dst]
    features = None
    if edge_attr is not None:
        features = edge_features(conv, params, edge_attr, graph)
        pre = pre + features.h_edge
    # F3 LeakyReLU (E, H, C), F4 e = att . LeakyReLU(x_uv) (E, H)
    hidden = leaky_relu(pre, conv.negative_slope)
    scores = np.einsum("ehc,hc->eh", hidden, params["att"])
    # F4' LipschitzNorm of the score (E, H)
    lipschitz = None
    if conv.lipschitz_norm is not None:
        scores, lipschitz = gat_v2_lipschitz_forward(scores, params["att"], pre, edges)
    # F5-F9 softmax, dropout, out_v = sum of alpha_uv W_s h_u over N(v), heads, residual, bias
    out, attended = attend(conv, params, scores, h_src, edges, attn_dropout_mask, f1.x_dst)
    return out, GATv2Twin(f1, edges, pre, hidden, lipschitz, attended, graph, edge_attr, features)


def gat_v2_backward(
    conv: Any, params: dict[str, np.ndarray], cache: GATv2Twin, d_out: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(d_x (N, in), d_params keyed like params)`` for the cotangent ``d_out``; with
    edge features ``((d_x, d_edge_attr (E_graph, D)), d_params)``."""
    f1, edges = cache.f1, cache.edges
    # B9-B5 (of F9-F5) bias, residual, heads, the sum (into W_s h_u and alpha), dropout, softmax
    d_scores, d_h_src, d_x_skip, d_params = attend_backward(
        conv, params, cache.attended, f1.h_src, edges, f1.x_dst, d_out
    )
    d_h_dst = np.zeros_like(f1.h_dst)
    # B4' (of F4') LipschitzNorm: the quotient, and its denominator into x_uv and att
    d_pre = np.zeros_like(cache.pre)
    d_params["att"] = np.zeros_like(params["att"])
    if cache.lipschitz is not None:
        d_scores, d_pre, d_params["att"] = gat_v2_lipschitz_backward(
            cache.lipschitz, d_scores, params["att"], cache.pre
        )
    # B4 (of F4) e = att . hidden: into att and hidden (E, H, C)
    d_params["att"] = d_params["att"] + np.einsum("eh,ehc->hc", d_scores, cache.hidden)
    d_hidden = d_scores[:, :, None] * params["att"]
    # B3 (of F3) LeakyReLU (E, H, C)
    d_pre = d_pre + d_hidden * leaky_relu_derivative(cache.pre, conv.negative_slope)
    # B2 (of F2) per edge: x_uv reads W_s h_u and W_t h_v
    for e, (u, v) in enumerate(edges):
        d_h_src[u] += d_pre[e]
        d_h_dst[v] += d_pre[e]
    # B1' (of F1') W_e a_e: into W_e and the features
    d_edge_attr = None
    if cache.features is not None:
        d_params["W_e"], d_edge_attr = edge_features_backward(
            conv, params, cache.features, cache.edge_attr, cache.graph, d_pre
        )
    # B1 (of F1) W_s x (+ b_s) and W_t x (+ b_t); a shared W (and b) receives both;
    # B8' the residual's share of the targets' d_x
    d_x = sides_backward(conv, params, f1, d_h_src, d_h_dst, d_params, d_x_skip)
    d_params = {name: d_params[name] for name in params}
    return (d_x if d_edge_attr is None else (d_x, d_edge_attr)), d_params
