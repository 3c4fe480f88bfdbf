"""Deliberately naive GAT pieces: the forward loop over targets and the twins' shared helpers.

Never optimised; they exist so the vectorised ``GATConv`` has an independent
formulation to agree with. :func:`gat_forward` re-derives the whole forward from
the equations (GAT-balance Eq. 1-2; Velickovic et al. 2018 for v1) one target at
a time. The literal forward/backward twins live one per variant beside it
(:mod:`refimpl.naive.gat_v1`, :mod:`refimpl.naive.gat_v2`) and read the small
helpers below: the edges attended (self-loops as PyG adds them), LeakyReLU and
its derivative, and the aggregation both versions share (softmax over each target's
incoming edges, with its Jacobian written out, from :mod:`refimpl.naive.segment`). All of
it is NumPy on the host, shares no code with ``refimpl.nn.gat.conv`` beyond the parameter
names, and is never clever.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refimpl.graph import Graph
from refimpl.naive.loop_fill import loop_fill_backward, loop_fill_forward
from refimpl.naive.segment import segment_softmax, segment_softmax_backward

__all__ = [
    "Attended",
    "EdgeFeatures",
    "Sides",
    "attend",
    "attend_backward",
    "attended_edges",
    "edge_features",
    "edge_features_backward",
    "gat_forward",
    "leaky_relu",
    "leaky_relu_derivative",
    "sides",
    "sides_backward",
]


# -- helpers shared by the twins (gat_v1.py, gat_v2.py) -------------------------------------


def attended_edges(edge_index: np.ndarray, num_nodes: int, add_self_loops: bool) -> np.ndarray:
    """The edges a layer attends over, ``(E, 2)`` rows ``(u, v)``, in the order PyG uses.

    With ``add_self_loops`` every existing loop is dropped and one loop per node is
    appended (original non-loop edges first, then ``(0, 0) .. (N-1, N-1)``);
    duplicate edges stay, each its own edge.
    """
    edges = [(int(u), int(v)) for u, v in np.asarray(edge_index).T]
    if add_self_loops:
        edges = [(u, v) for u, v in edges if u != v] + [(v, v) for v in range(num_nodes)]
    return np.array(edges, dtype=np.int64).reshape(-1, 2)


class Sides(NamedTuple):
    """F1 of both sides: the sources' and the targets' features and transforms."""

    x_src: np.ndarray  # (N_src, F_src)
    x_dst: np.ndarray  # (N_dst, F_dst): x_src itself when one x was given
    h_src: np.ndarray  # (N_src, H, C) W_src x_u (+ b_src)
    h_dst: np.ndarray  # (N_dst, H, C) W_dst x_v (+ b_dst)
    maps: tuple  # ((W_src, b_src), (W_dst, b_dst)) parameter names, a bias None if absent


def sides(conv: Any, params: dict[str, np.ndarray], x: Any) -> Sides:
    """F1 for one ``x`` (both sides read it) or a pair ``(x_src, x_dst)``: v1 ``W`` on both
    (``W_s``, ``W_t`` for a pair ``in_channels``, PyG's ``lin_src``/``lin_dst``), v2 ``W_s
    (+ b_s)`` and ``W_t (+ b_t)`` (``W_s (+ b_s)`` on both with ``share_weights``)."""
    x_src, x_dst = x if isinstance(x, tuple) else (x, x)
    if conv.version == "v1":
        pair = isinstance(conv.in_channels, tuple)
        maps = (("W_s", None), ("W_t", None)) if pair else (("W", None), ("W", None))
    else:
        b_s, b_t = ("b_s", "b_t") if conv.projection_bias else (None, None)
        maps = (("W_s", b_s), ("W_s", b_s) if conv.share_weights else ("W_t", b_t))
    h = [_affine(params, weight, bias, side, conv.heads)
         for (weight, bias), side in zip(maps, (x_src, x_dst), strict=True)]  # fmt: skip
    return Sides(x_src, x_dst, h[0], h[1], maps)


def sides_backward(
    conv: Any,
    params: dict[str, np.ndarray],
    f1: Sides,
    d_h_src: np.ndarray,
    d_h_dst: np.ndarray,
    d_params: dict[str, np.ndarray],
    d_x_skip: np.ndarray,
) -> Any:
    """B1 of :func:`sides`: adds each map's gradient to ``d_params`` (a map both sides read
    gets both terms); returns ``d_x``, or ``(d_x_src, d_x_dst)`` for a pair, with
    ``d_x_skip``, the residual's share (B8'), added to the targets' features."""
    d_xs = []
    for (weight, bias), x_side, d_h in zip(f1.maps, (f1.x_src, f1.x_dst), (d_h_src, d_h_dst),
                                           strict=True):  # fmt: skip
        w = params[weight].reshape(conv.heads, conv.out_channels, -1)  # (H, C, F)
        d_w = np.einsum("nhc,nf->hcf", d_h, x_side).reshape(w.shape[0] * w.shape[1], -1)
        d_params[weight] = d_params.get(weight, 0) + d_w
        if bias is not None:
            d_params[bias] = d_params.get(bias, 0) + d_h.sum(axis=0).reshape(-1)
        d_xs.append(np.einsum("nhc,hcf->nf", d_h, w))
    if f1.x_dst is f1.x_src:  # one x read by both sides
        return d_xs[0] + d_xs[1] + d_x_skip
    return d_xs[0], d_xs[1] + d_x_skip


def _affine(params: dict, weight: str, bias: str | None, x: np.ndarray, heads: int) -> np.ndarray:
    """``W x_k (+ b)`` per node ``(N, H, C)``."""
    w = params[weight].reshape(heads, -1, x.shape[1])  # (H, C, in)
    h = np.einsum("hcf,nf->nhc", w, x)
    if bias is not None:
        h = h + params[bias].reshape(heads, -1)
    return h


class EdgeFeatures(NamedTuple):
    """The edge features over the attended edges and their projection."""

    attended: np.ndarray  # (E, D) one row per attended edge, the added loops' filled
    h_edge: np.ndarray  # (E, H, C) W_e a_e


def edge_features(
    conv: Any, params: dict[str, np.ndarray], edge_attr: np.ndarray, graph: Graph
) -> EdgeFeatures:
    """F1': the features of every attended edge (:mod:`refimpl.naive.loop_fill` for the
    added loops) and ``W_e a_e`` per edge and head."""
    attended = edge_attr
    loops = min(graph.num_nodes, graph.num_dst_nodes)  # PyG's, bipartite graphs included
    if conv.add_self_loops:
        attended = loop_fill_forward(edge_attr, graph.edge_index, loops, conv.fill_value)
    w_e = params["W_e"].reshape(conv.heads, conv.out_channels, -1)  # (H, C, D)
    return EdgeFeatures(attended, np.einsum("hcd,ed->ehc", w_e, attended))


def edge_features_backward(
    conv: Any,
    params: dict[str, np.ndarray],
    features: EdgeFeatures,
    edge_attr: np.ndarray,
    graph: Graph,
    d_h_edge: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """B1' of :func:`edge_features`: ``(d_W_e (H*C, D), d_edge_attr (E, D))`` from
    ``d_h_edge (E, H, C)``, through the loops' fill back to the graph's own edges."""
    w_e = params["W_e"].reshape(conv.heads, conv.out_channels, -1)  # (H, C, D)
    d_w_e = np.einsum("ehc,ed->hcd", d_h_edge, features.attended).reshape(
        w_e.shape[0] * w_e.shape[1], -1
    )
    d_attended = np.einsum("ehc,hcd->ed", d_h_edge, w_e)
    if not conv.add_self_loops:
        return d_w_e, d_attended
    loops = min(graph.num_nodes, graph.num_dst_nodes)
    d_edge_attr = loop_fill_backward(d_attended, edge_attr, graph.edge_index, loops,
                                     conv.fill_value)  # fmt: skip
    return d_w_e, d_edge_attr


def leaky_relu(pre: np.ndarray, slope: float) -> np.ndarray:
    """``pre`` where ``pre > 0``, else ``slope * pre``."""
    return np.where(pre > 0, pre, slope * pre)


def leaky_relu_derivative(pre: np.ndarray, slope: float) -> np.ndarray:
    """1 where ``pre > 0``, else ``slope``: at exactly 0 the slope (PyTorch's convention)."""
    return np.where(pre > 0, 1.0, slope)


class Attended(NamedTuple):
    """What :func:`attend` computed, for :func:`attend_backward`."""

    alpha: np.ndarray  # (E, H) F5
    keep: np.ndarray  # (E, H) F6, keep_uv / (1 - p), or ones without dropout
    alpha_dropped: np.ndarray  # (E, H) F6


def attend(
    conv: Any,
    params: dict[str, np.ndarray],
    scores: np.ndarray,
    h_src: np.ndarray,
    edges: np.ndarray,
    attn_dropout_mask: np.ndarray | None,
    x: np.ndarray,
) -> tuple[np.ndarray, Attended]:
    """F5-F9, the same for both versions (GAT-balance Eq. 1-2): softmax, dropout, the sum
    over each target's incoming edges, heads, PyG's residual ``x W_res^T`` and bias.
    ``scores`` (E, H), ``h_src`` (N_src, H, C), ``x`` the targets' features (N, in) ->
    ``out`` (N, H*C) or (N, C)."""
    n, (_, heads, channels) = x.shape[0], h_src.shape
    # F5 softmax over each target's incoming edges (E, H)
    alpha = segment_softmax(scores, edges[:, 1], n)
    # F6 attention dropout (E, H)
    keep = np.ones_like(alpha)
    if attn_dropout_mask is not None:
        keep = attn_dropout_mask / (1.0 - conv.dropout)
    alpha_dropped = alpha * keep
    # F7 out_v = sum over incoming edges of alpha_uv W_s h_u (N, H, C)
    aggregated = np.zeros((n, heads, channels))
    for e, (u, v) in enumerate(edges):
        aggregated[v] += alpha_dropped[e][:, None] * h_src[u]
    # F8 heads, F8' residual (PyG's res: a linear skip without bias), F9 bias
    out = aggregated.reshape(n, heads * channels) if conv.concat else aggregated.mean(axis=1)
    if conv.residual:
        out = out + np.einsum("of,nf->no", params["W_res"], x)
    if conv.bias:
        out = out + params["bias"]
    return out, Attended(alpha, keep, alpha_dropped)


def attend_backward(
    conv: Any,
    params: dict[str, np.ndarray],
    attended: Attended,
    h_src: np.ndarray,
    edges: np.ndarray,
    x: np.ndarray,
    d_out: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """B9-B5 of :func:`attend`: ``(d_scores (E, H), d_h_src (N_src, H, C), d_x (N, in)`` (the
    targets') through the residual (zeros without), ``{"bias", "W_res"} or fewer)``."""
    n, (_, heads, channels) = x.shape[0], h_src.shape
    d_params = {}
    # B9 (of F9) bias
    if conv.bias:
        d_params["bias"] = d_out.sum(axis=0)
    # B8' (of F8') residual: out_no += W_res[o, f] x[n, f]
    d_x = np.zeros_like(x)
    if conv.residual:
        d_params["W_res"] = np.einsum("no,nf->of", d_out, x)
        d_x = np.einsum("no,of->nf", d_out, params["W_res"])
    # B8 (of F8) heads (N, H, C)
    if conv.concat:
        d_aggregated = d_out.reshape(n, heads, channels)
    else:
        d_aggregated = np.repeat(d_out[:, None, :] / heads, heads, axis=1)
    # B7 (of F7) per edge: into the message W_s h_u and into its coefficient
    d_h_src = np.zeros_like(h_src)
    d_alpha_dropped = np.zeros_like(attended.alpha)
    for e, (u, v) in enumerate(edges):
        d_h_src[u] += attended.alpha_dropped[e][:, None] * d_aggregated[v]
        d_alpha_dropped[e] = np.einsum("hc,hc->h", d_aggregated[v], h_src[u])
    # B6 (of F6) dropout, B5 (of F5) softmax Jacobian per target (E, H)
    d_alpha = d_alpha_dropped * attended.keep
    d_scores = segment_softmax_backward(attended.alpha, d_alpha, edges[:, 1], n)
    return d_scores, d_h_src, d_x, d_params


def _v1_denominator(
    mode: str,
    params: dict[str, np.ndarray],
    h: list[np.ndarray],
    incoming: list[tuple[int, int]],
    u: int,
    v: int,
    head: int,
) -> float:
    """GATv1 LipschitzNorm denominator for the edge ``u -> v``
    (see ``refimpl.nn.lipschitz.neighbourhood_norm``).

    "paper": ``||[a_src; a_dst]|| * max_k ||[W h_k; W h_v]||``; "reference-code":
    ``4 ||[a_src; a_dst]|| * sqrt(max_k ||W h_k||^2 + ||W h_u||^2) + 1e-12``.
    A vanished denominator (then the raw score is 0 too) divides by 1.
    """
    att = np.concatenate([params["att_src"][head], params["att_dst"][head]])
    largest = max(float(h[k][head] @ h[k][head]) for _, k in incoming)
    if mode == "paper":
        denominator = np.linalg.norm(att) * math.sqrt(largest + float(h[v][head] @ h[v][head]))
    else:
        own = float(h[u][head] @ h[u][head])
        denominator = 4 * np.linalg.norm(att) * math.sqrt(largest + own) + 1e-12
    return denominator if denominator > 0 else 1.0


def gat_forward(
    conv: object,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    edge_index: np.ndarray,
    attn_keep: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output ``(N, H*C)`` or ``(N, C)``, the edges attended ``(2, E)``, and alpha ``(E, H)``.

    ``conv`` is a ``GATConv`` (read for its configuration only). ``edge_index``
    is the raw graph; self-loops are handled here as PyG does. ``attn_keep`` is
    an ``(E, H)`` 0/1 keep-mask over the handled edges, applied with the
    inverted-dropout scale ``1 / (1 - p)``.
    """
    n = x.shape[0]
    heads, channels, slope = conv.heads, conv.out_channels, conv.negative_slope
    edges = [(int(u), int(v)) for u, v in np.asarray(edge_index).T]
    if conv.add_self_loops:
        edges = [(u, v) for u, v in edges if u != v] + [(v, v) for v in range(n)]
    if conv.version == "v1":
        w_src = w_dst = params["W"]
    else:
        w_src = params["W_s"]
        w_dst = params["W_s"] if conv.share_weights else params["W_t"]
    h_src = [(w_src @ x[u]).reshape(heads, channels) for u in range(n)]
    h_dst = [(w_dst @ x[v]).reshape(heads, channels) for v in range(n)]

    out = np.zeros((n, heads, channels))
    attention = np.zeros((len(edges), heads))
    lipschitz = getattr(conv, "lipschitz_norm", None)
    for v in range(n):
        incoming = [(k, u) for k, (u, target) in enumerate(edges) if target == v]
        for head in range(heads):
            scores = []
            for _, u in incoming:
                if conv.version == "v1":
                    raw = (
                        params["att_src"][head] @ h_src[u][head]
                        + params["att_dst"][head] @ h_dst[v][head]
                    )
                    if lipschitz is not None:
                        raw = raw / _v1_denominator(lipschitz, params, h_src, incoming, u, v, head)
                    scores.append(float(leaky_relu(raw, slope)))
                else:
                    hidden = leaky_relu(h_src[u][head] + h_dst[v][head], slope)
                    score = float(params["att"][head] @ hidden)
                    if lipschitz is not None:
                        # LipschitzNorm Sec. 5: ||a|| * max over the neighbourhood of ||x_kv||
                        radius = max(
                            np.linalg.norm(h_src[k][head] + h_dst[v][head]) for _, k in incoming
                        )
                        denominator = np.linalg.norm(params["att"][head]) * radius
                        score = score / denominator if denominator > 0 else 0.0
                    scores.append(score)
            if not scores:
                continue
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for (k, u), weight in zip(incoming, weights, strict=True):
                alpha = weight / total
                attention[k, head] = alpha
                if attn_keep is not None:
                    alpha = alpha * attn_keep[k, head] / (1.0 - conv.dropout)
                out[v, head] += alpha * h_src[u][head]
    result = out.reshape(n, heads * channels) if conv.concat else out.mean(axis=1)
    if conv.bias:
        result = result + params["bias"]
    return result, np.array(edges, dtype=np.int64).reshape(-1, 2).T, attention
