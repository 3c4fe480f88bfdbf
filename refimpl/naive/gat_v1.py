"""Literal twin of ``GATConv(version="v1")``: per-edge forward and the chain rule per edge.

GAT-balance Eq. 1-2 with the GATv1 score (Velickovic et al. 2018), per head ``h``
and edge ``e = u -> v`` of the attended graph:

    F1  W h_k      = W x_k  (of a pair (x_src, x_dst): W_s x_u, W_t x_v)  (N, H, C)
    F1' W_e a_e    (edge features, ``edge_dim``; loops filled)    (E, H, C)
    F2  raw_e      = att_src . W h_u + att_dst . W h_v            (E, H)
                     (+ att_edge . W_e a_e)
    F3  (LipschitzNorm) raw_e <- raw_e / D_e                      (E, H), LipschitzNorm Eq. 17
    F4  e_uv       = LeakyReLU(raw_e)                             (E, H)
    F5  alpha_uv   = softmax over u in N(v) of e_uv               (E, H), GAT-balance Eq. 2
    F6  (attention dropout) alpha_uv * keep_uv / (1 - p)          (E, H)
    F7  out_v      = sum_{u in N(v)} alpha_uv W h_u               (N, H, C), GAT-balance Eq. 1
    F8  heads concatenated (N, H*C) or averaged (N, C);  F8' + x W_res^T (PyG's residual);
    F9  + bias

Edges as PyG: with ``add_self_loops`` existing loops are replaced by one per node;
duplicates are separate edges; a node with no incoming edge outputs the bias. The
LeakyReLU derivative at exactly 0 is the slope. F3 is :mod:`refimpl.naive.lipschitz_norm`,
divided before the LeakyReLU as the layer and the released code do (LeakyReLU is
positively homogeneous, so it equals dividing after). NumPy on the host, float64, no
code shared with ``refimpl.nn.gat.conv``.
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
    gat_v1_lipschitz_backward,
    gat_v1_lipschitz_forward,
)

__all__ = ["GATv1Twin", "gat_v1_backward", "gat_v1_forward"]


class GATv1Twin(NamedTuple):
    """The forward's named quantities."""

    f1: Sides  # F1: the inputs and W h of both sides
    edges: np.ndarray  # (E, 2) rows (u, v), self-loops handled
    raw: np.ndarray  # (E, H) F2/F3, the LeakyReLU's input
    lipschitz: LipschitzTwinCache | None  # F3
    attended: Attended  # F5-F6: alpha, the dropout keep factors, alpha after dropout
    graph: Graph  # as given
    edge_attr: np.ndarray | None  # (E_graph, D) as given
    features: EdgeFeatures | None  # F1'


def gat_v1_forward(
    conv: Any,
    params: dict[str, np.ndarray],
    x: Any,
    graph: Graph,
    attn_dropout_mask: np.ndarray | None = None,
    edge_attr: np.ndarray | None = None,
) -> tuple[np.ndarray, GATv1Twin]:
    """``(out (N, H*C) or (N, C), cache)``; ``conv`` is read for its configuration only.

    ``attn_dropout_mask`` (E, H) bool (True = keep) over the attended edges, or None
    for no dropout (evaluation, or ``p = 0``, where the layer ignores any mask).
    """
    loops = min(graph.num_nodes, graph.num_dst_nodes)  # PyG's, bipartite graphs included
    edges = attended_edges(graph.edge_index, loops, conv.add_self_loops)  # (E, 2)
    src, dst = edges[:, 0], edges[:, 1]
    # F1 W x per node, each side (N, H, C)
    f1 = sides(conv, params, x)
    h = f1.h_src  # one node set (LipschitzNorm): the same as f1.h_dst
    # F2 raw_e = att_src . W h_u + att_dst . W h_v (E, H)
    raw = np.einsum("ehc,hc->eh", f1.h_src[src], params["att_src"]) + np.einsum(
        "ehc,hc->eh", f1.h_dst[dst], params["att_dst"]
    )
    # F1' and the edge's own term (E, H)
    features = None
    if edge_attr is not None:
        features = edge_features(conv, params, edge_attr, graph)
        raw = raw + np.einsum("ehc,hc->eh", features.h_edge, params["att_edge"])
    # F3 LipschitzNorm, before the LeakyReLU (E, H)
    lipschitz = None
    if conv.lipschitz_norm is not None:
        raw, lipschitz = gat_v1_lipschitz_forward(
            raw, conv.lipschitz_norm, params["att_src"], params["att_dst"], h, edges
        )
    # F4 e = LeakyReLU(raw) (E, H)
    scores = leaky_relu(raw, conv.negative_slope)
    # F5-F9 softmax, dropout, out_v = sum of alpha_uv W h_u over N(v), heads, residual, bias
    out, attended = attend(conv, params, scores, f1.h_src, edges, attn_dropout_mask, f1.x_dst)
    return out, GATv1Twin(f1, edges, raw, lipschitz, attended, graph, edge_attr, features)


def gat_v1_backward(
    conv: Any, params: dict[str, np.ndarray], cache: GATv1Twin, d_out: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(d_x (N, in), d_params keyed like params)`` for the cotangent ``d_out``; with
    edge features ``((d_x, d_edge_attr (E_graph, D)), d_params)``."""
    f1, edges = cache.f1, cache.edges
    h = f1.h_src
    # B9-B5 (of F9-F5) bias, residual, heads, the sum (into W h_u and alpha), dropout, softmax
    d_scores, d_h, d_x_skip, d_params = attend_backward(
        conv, params, cache.attended, f1.h_src, edges, f1.x_dst, d_out
    )
    d_h_dst = np.zeros_like(f1.h_dst)
    # B4 (of F4) LeakyReLU (E, H)
    d_raw = d_scores * leaky_relu_derivative(cache.raw, conv.negative_slope)
    # B3 (of F3) LipschitzNorm: the quotient, and its denominator into W h and the att vectors
    d_att_src, d_att_dst = np.zeros_like(params["att_src"]), np.zeros_like(params["att_dst"])
    if cache.lipschitz is not None:
        d_raw, d_h_norm, d_att_src, d_att_dst = gat_v1_lipschitz_backward(
            cache.lipschitz,
            d_raw,
            conv.lipschitz_norm,
            params["att_src"],
            params["att_dst"],
            h,
            edges,
        )
        d_h += d_h_norm
    # B2 (of F2) per edge: raw_e reads att_src, att_dst, W h_u and W h_v
    for e, (u, v) in enumerate(edges):
        d_att_src += d_raw[e][:, None] * f1.h_src[u]
        d_att_dst += d_raw[e][:, None] * f1.h_dst[v]
        d_h[u] += d_raw[e][:, None] * params["att_src"]
        d_h_dst[v] += d_raw[e][:, None] * params["att_dst"]
    d_params["att_src"], d_params["att_dst"] = d_att_src, d_att_dst
    # B1' (of F1') the edge's term: att_edge, and W_e a_e back into W_e and the features
    d_edge_attr = None
    if cache.features is not None:
        d_params["att_edge"] = np.einsum("eh,ehc->hc", d_raw, cache.features.h_edge)
        d_h_edge = d_raw[:, :, None] * params["att_edge"]
        d_params["W_e"], d_edge_attr = edge_features_backward(
            conv, params, cache.features, cache.edge_attr, cache.graph, d_h_edge
        )
    # B1 (of F1) W h = W x, each side; B8' the residual's share of the targets' d_x
    d_x = sides_backward(conv, params, f1, d_h, d_h_dst, d_params, d_x_skip)
    d_params = {name: d_params[name] for name in params}
    return (d_x if d_edge_attr is None else (d_x, d_edge_attr)), d_params
