"""Literal twin of ``TransformerConv`` (PyG's; Shi et al. 2021, UniMP): forward and backward.

Never optimised: it exists so the vectorised
:class:`refimpl.nn.transformer.transformer_conv.TransformerConv` has an independent
formulation to agree with, and so a reader can put it beside the equations. NumPy on
the host, float64, per-edge einsums and loops over targets and edges; it shares no
code with ``refimpl.nn.transformer.transformer_conv`` beyond the parameter names
(``conv`` is read for its configuration only).

For each head ``h`` (``C`` channels) and edge ``e = (u -> v)``, as in the
massive-activations supplement (Eq. 3-13, ``d_k = C``) with PyG's biases::

    F1  q_v = W_q x_v + b_q,  k_u = W_k x_u + b_k,  val_u = W_v x_u + b_v       supp. Eq. 3-5
    F2  ef_e = W_e e_e                                   (with edge_dim)       supp. Eq. 12-13
    F3  k_e = k_u + ef_e,  val_e = val_u + ef_e          (one W_e for both)    supp. Eq. 12-13
    F4  raw_e = q_v . k_e
    F5  s_e = raw_e / sqrt(C)                                                   supp. Eq. 6
    F5' s_e = clip(raw_e / D_v, -1, 1),  D_v = max{u a, u w, a w},          LipschitzNorm Eq. 19
        u = ||q_v||, a = max_{e into v} ||k_e||, w = max_{e into v} ||val_e||
    F6  alpha_e = exp(s_e) / sum_{e' into v} exp(s_e')                      supp. Eq. 6-7
    F7  alpha'_e = alpha_e keep_e / (1 - p)              (attention dropout)
    F8  agg_v = sum_{e into v} alpha'_e val_e                                  supp. Eq. 8, 13
    F9  m_v = [agg_v1, ..., agg_vH] (concat) or (1/H) sum_h agg_vh (mean)
    F10 r_v = W_skip x_v + b_skip                        (root_weight)
    F11 out_v = m_v + r_v, or with beta: b_v = sigmoid(w_beta . [m_v, r_v, m_v - r_v]),
        out_v = b_v r_v + (1 - b_v) m_v

Conventions (those of the production layer): the graph is used as given (no
self-loops added); duplicate edges each get their own coefficient; a target with
no incoming edge aggregates to zero. LipschitzNorm (``lipschitz_norm="paper"``):
the clip only guards against rounding and is differentiated as the identity;
``D_v`` is differentiated through the first maximiser of ``[ua, uw, aw]`` and
``a``, ``w`` through the lowest-index longest edge; a norm at a zero vector has
the zero subgradient; where ``D_v = 0`` (then every raw score into ``v`` is 0)
the divisor is 1 and no gradient flows through ``D_v``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refimpl.naive.segment import items_of, segment_softmax, segment_softmax_backward

__all__ = [
    "Steps",
    "transformer_conv_backward",
    "transformer_conv_forward",
    "transformer_conv_steps",
]


class Steps(NamedTuple):
    """The forward's intermediates, each named by the equations in the module docstring."""

    src: np.ndarray  # (E,) u of each edge
    dst: np.ndarray  # (E,) v of each edge
    q: np.ndarray  # (N, H, C) F1
    k: np.ndarray  # (N, H, C) F1
    val: np.ndarray  # (N, H, C) F1
    k_edges: np.ndarray  # (E, H, C) F3 k_e
    val_edges: np.ndarray  # (E, H, C) F3 val_e
    raw: np.ndarray  # (E, H) F4
    divisor: np.ndarray  # (N, H) F5 sqrt(C), or F5' D_v (1 where it vanishes)
    lipschitz: dict | None  # F5' per (v, h) with D_v > 0: (u, a, w, branch, key edge, value edge)
    alpha: np.ndarray  # (E, H) F6
    keep: np.ndarray  # (E, H) F7 keep_e / (1 - p), ones without dropout
    alpha_dropped: np.ndarray  # (E, H) F7
    messages: np.ndarray  # (N, F) F9
    skip: np.ndarray | None  # (N, F) F10
    gate: np.ndarray | None  # (N,) F11 b_v


def _linear(params: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    """``W_name x (+ b_name)`` for one vector ``(in,)`` or for rows ``(N, in)``."""
    out = np.einsum("oi,...i->...o", params[f"W_{name}"], x)  # (..., out)
    if f"b_{name}" in params:
        out = out + params[f"b_{name}"]
    return out


def _linear_backward(
    params: dict[str, np.ndarray], name: str, x: np.ndarray, d_y: np.ndarray, d_params: dict
) -> np.ndarray:
    """Adjoint of ``y = x W^T + b`` for rows: fills ``d_params``, returns ``d_x`` (N, in)."""
    d_params[f"W_{name}"] = np.einsum("no,ni->oi", d_y, x)  # (out, in)
    if f"b_{name}" in params:
        d_params[f"b_{name}"] = d_y.sum(axis=0)  # (out,)
    return np.einsum("no,oi->ni", d_y, params[f"W_{name}"])  # (N, in)


def _lipschitz_divisor(
    q: np.ndarray, k_edges: np.ndarray, val_edges: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, dict]:
    """F5' LipschitzNorm Eq. 19 per target ``v`` and head ``h``: ``D_v = max{ua, uw, aw}``.

    Returns ``D`` (N, H), 1 where it vanishes, and per ``(v, h)`` with ``D_v > 0`` what
    the backward differentiates through: ``(u, a, w, branch, key edge, value edge)``.
    """
    n, heads = q.shape[:2]
    divisor, choices = np.ones((n, heads)), {}
    for v in range(n):
        incoming = items_of(dst, v)
        for h in range(heads if incoming else 0):
            u = float(np.linalg.norm(q[v, h]))
            # Python's max keeps the first maximal item: the lowest edge index at a tie
            key_edge = max(incoming, key=lambda e, h=h: float(np.linalg.norm(k_edges[e, h])))
            value_edge = max(incoming, key=lambda e, h=h: float(np.linalg.norm(val_edges[e, h])))
            a = float(np.linalg.norm(k_edges[key_edge, h]))
            w = float(np.linalg.norm(val_edges[value_edge, h]))
            products = [u * a, u * w, a * w]
            branch = products.index(max(products))  # the first maximiser
            if products[branch] > 0:
                divisor[v, h] = products[branch]
                choices[v, h] = (u, a, w, branch, key_edge, value_edge)
    return divisor, choices


def _forward_steps(
    conv: Any,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    edge_index: np.ndarray,
    edge_attr: np.ndarray | None,
    attn_keep: np.ndarray | None,
) -> tuple[np.ndarray, Steps]:
    """F1-F11 of the module docstring: ``(out, steps)``. ``x`` one array, or the pair
    ``(x_src, x_dst)`` of a bipartite graph: queries and the skip read ``x_dst``, keys and
    values ``x_src``."""
    x_src, x_dst = x if isinstance(x, tuple) else (x, x)
    n, heads, channels = x_dst.shape[0], conv.heads, conv.out_channels
    src, dst = np.asarray(edge_index, dtype=np.int64).reshape(2, -1)
    # F1 queries (N_dst, H, C), keys and values (N_src, H, C)
    q = _linear(params, "q", x_dst).reshape(n, heads, channels)
    k, val = (_linear(params, name, x_src).reshape(len(x_src), heads, channels) for name in "kv")
    # F2, F3 per-edge keys and values, with the edge term (E, H, C)
    k_edges, val_edges = k[src], val[src]
    if conv.edge_dim is not None:
        ef = np.einsum("oi,ei->eo", params["W_e"], edge_attr).reshape(-1, heads, channels)
        k_edges, val_edges = k_edges + ef, val_edges + ef
    # F4 raw_e = q_v . k_e (E, H)
    raw = np.einsum("ehc,ehc->eh", q[dst], k_edges)
    # F5 / F5' the divisor per target and head (N, H), and the scores (E, H)
    lipschitz = None
    if conv.lipschitz_norm == "paper":
        divisor, lipschitz = _lipschitz_divisor(q, k_edges, val_edges, dst)
        scores = np.clip(raw / divisor[dst], -1.0, 1.0)  # rounding guard: |s| <= 1 exactly
    else:
        divisor = np.full((n, heads), math.sqrt(channels))
        scores = raw / divisor[dst]
    # F6 softmax per target (E, H)
    alpha = segment_softmax(scores, dst, n)  # F6 (E, H), per target (refimpl.naive.segment)
    # F7 attention dropout, inverted scaling (E, H)
    keep = np.ones_like(alpha) if attn_keep is None else attn_keep / (1.0 - conv.dropout)
    alpha_dropped = alpha * keep
    # F8 aggregate per edge (N, H, C)
    aggregated = np.zeros((n, heads, channels))
    for e in range(len(dst)):
        aggregated[dst[e]] += alpha_dropped[e][:, None] * val_edges[e]
    # F9 combine heads (N, F)
    messages = aggregated.reshape(n, -1) if conv.concat else aggregated.mean(axis=1)
    out, skip, gate = messages, None, None
    if conv.root_weight:
        skip = _linear(params, "skip", x_dst)  # F10 (N, F)
        if conv.beta:  # F11 gated
            stacked = np.concatenate([messages, skip, messages - skip], axis=1)  # (N, 3F)
            z = np.einsum("f,nf->n", params["w_beta"][0], stacked)  # (N,)
            gate = 0.5 * (1.0 + np.tanh(z / 2))  # the logistic sigmoid, without overflow
            out = gate[:, None] * skip + (1 - gate[:, None]) * messages
        else:  # F11 sum
            out = messages + skip
    steps = Steps(
        src, dst, q, k, val, k_edges, val_edges, raw, divisor, lipschitz,
        alpha, keep, alpha_dropped, messages, skip, gate,
    )  # fmt: skip
    return out, steps


def transformer_conv_forward(
    conv: Any,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    edge_index: np.ndarray,
    edge_attr: np.ndarray | None = None,
    attn_keep: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output ``(N, H*C)`` or ``(N, C)``, alpha ``(E, H)`` and score terms ``(E, H, C)``.

    ``conv`` is a ``TransformerConv`` (read for its configuration only).
    ``attn_keep`` is an ``(E, H)`` 0/1 keep-mask, applied with the
    inverted-dropout scale ``1 / (1 - p)``. The score terms are
    ``q_v[c] * k_uv[c] / divisor`` (their sum over ``c`` is the score, before the
    LipschitzNorm clip). The forward's other intermediates: :func:`transformer_conv_steps`.
    """
    out, steps = _forward_steps(conv, params, x, edge_index, edge_attr, attn_keep)
    terms = steps.q[steps.dst] * steps.k_edges / steps.divisor[steps.dst][..., None]  # (E, H, C)
    return out, steps.alpha, terms


def transformer_conv_steps(
    conv: Any,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    edge_index: np.ndarray,
    edge_attr: np.ndarray | None = None,
    attn_keep: np.ndarray | None = None,
) -> tuple[np.ndarray, Steps]:
    """``(out, steps)``: the output and every intermediate F1-F11 (see :class:`Steps`)."""
    return _forward_steps(conv, params, x, edge_index, edge_attr, attn_keep)


def _gate_backward(
    conv: Any, params: dict[str, np.ndarray], steps: Steps, d_out: np.ndarray, d_params: dict
) -> tuple[np.ndarray, np.ndarray | None]:
    """B11 (of F11): ``(d_messages (N, F), d_skip (N, F) or None)``; fills ``d_params``."""
    if not conv.root_weight:
        return d_out, None
    if not conv.beta:
        return d_out, d_out  # out = m + r
    m, r, b = steps.messages, steps.skip, steps.gate[:, None]  # (N, F), (N, F), (N, 1)
    # out = b r + (1 - b) m: d b = <d_out, r - m>; b = sigmoid(z): db/dz = b (1 - b)
    d_z = np.einsum("nf,nf->n", d_out, r - m) * steps.gate * (1 - steps.gate)  # (N,)
    stacked = np.concatenate([m, r, m - r], axis=1)  # (N, 3F)
    d_params["w_beta"] = np.einsum("n,nf->f", d_z, stacked)[None, :]  # (1, 3F)
    d_stacked = np.einsum("n,f->nf", d_z, params["w_beta"][0])  # (N, 3F)
    d_m, d_r, d_diff = np.split(d_stacked, 3, axis=1)  # (N, F) each
    return d_out * (1 - b) + d_m + d_diff, d_out * b + d_r - d_diff


def _lipschitz_backward(
    steps: Steps, d_scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B5' (of F5') through ``D_v`` only: ``(d_q (N, H, C), d_k_edges, d_val_edges (E, H, C))``."""
    d_q = np.zeros_like(steps.q)
    d_k_edges, d_val_edges = np.zeros_like(steps.k_edges), np.zeros_like(steps.val_edges)
    for (v, h), (u, a, w, branch, key_edge, value_edge) in steps.lipschitz.items():
        d = steps.divisor[v, h]
        # s_e = raw_e / D: ds_e/dD = -raw_e / D^2 (the clip as the identity)
        d_d = -sum(d_scores[e, h] * steps.raw[e, h] for e in items_of(steps.dst, v)) / d**2
        # D is the chosen product only (0: ua, 1: uw, 2: aw), d(xy) = y dx + x dy
        by_branch = [(d_d * a, d_d * u, 0.0), (d_d * w, 0.0, d_d * u), (0.0, d_d * w, d_d * a)]
        d_u, d_a, d_w = by_branch[branch]
        # d||y||/dy = y / ||y||, the zero subgradient at y = 0; a, w through one edge each
        if u > 0:
            d_q[v, h] += d_u * steps.q[v, h] / u
        if a > 0:
            d_k_edges[key_edge, h] += d_a * steps.k_edges[key_edge, h] / a
        if w > 0:
            d_val_edges[value_edge, h] += d_w * steps.val_edges[value_edge, h] / w
    return d_q, d_k_edges, d_val_edges


def transformer_conv_backward(
    conv: Any,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    edge_index: np.ndarray,
    d_out: np.ndarray,
    edge_attr: np.ndarray | None = None,
    attn_keep: np.ndarray | None = None,
) -> tuple[Any, dict[str, np.ndarray]]:
    """Gradients of ``<d_out, out>``: ``(d_inputs, d_params keyed like params)``.

    Recomputes the forward (same arguments); ``d_inputs`` is ``d_x (N, in)``
    without ``edge_dim``, else ``(d_x, d_edge_attr (E, edge_dim))``, as the layer's.
    """
    _, st = _forward_steps(conv, params, x, edge_index, edge_attr, attn_keep)
    x_src, x_dst = x if isinstance(x, tuple) else (x, x)
    n, heads, channels = st.q.shape
    d_params: dict[str, np.ndarray] = {}
    # B11 (of F11)
    d_messages, d_skip = _gate_backward(conv, params, st, d_out, d_params)
    d_x_dst = np.zeros_like(x_dst)
    if d_skip is not None:  # B10 (of F10) the root weight
        d_x_dst = _linear_backward(params, "skip", x_dst, d_skip, d_params)
    # B9 (of F9) heads: reshape back, or 1/H of the mean's gradient to each head (N, H, C)
    if conv.concat:
        d_aggregated = d_messages.reshape(n, heads, channels)
    else:
        d_aggregated = np.repeat(d_messages[:, None, :] / heads, heads, axis=1)
    # B8 (of F8) per edge (E, H) and (E, H, C)
    d_alpha_dropped = np.einsum("ehc,ehc->eh", d_aggregated[st.dst], st.val_edges)
    d_val_edges = st.alpha_dropped[..., None] * d_aggregated[st.dst]
    # B7 (of F7), B6 (of F6) (E, H)
    d_scores = segment_softmax_backward(st.alpha, d_alpha_dropped * st.keep, st.dst, n)
    # B5 (of F5 / F5') the quotient by the divisor (E, H); with F5', also through D_v
    d_raw = d_scores / st.divisor[st.dst]
    d_q, d_k_edges = np.zeros_like(st.q), np.zeros_like(st.k_edges)
    if st.lipschitz is not None:
        d_q, d_k_edges, d_val_through_d = _lipschitz_backward(st, d_scores)
        d_val_edges = d_val_edges + d_val_through_d
    # B4 (of F4) raw_e = q_v . k_e (E, H, C)
    d_q_edges = d_raw[..., None] * st.k_edges
    d_k_edges = d_k_edges + d_raw[..., None] * st.q[st.dst]
    # B3 (of F3) per edge back to the nodes (N, H, C); ef_e enters both k_e and val_e
    d_k, d_val = np.zeros_like(st.k), np.zeros_like(st.val)
    for e in range(len(st.dst)):
        d_q[st.dst[e]] += d_q_edges[e]
        d_k[st.src[e]] += d_k_edges[e]
        d_val[st.src[e]] += d_val_edges[e]
    d_ef = (d_k_edges + d_val_edges).reshape(len(st.dst), heads * channels)  # (E, H*C)
    # B2 (of F2) ef = W_e e
    if conv.edge_dim is not None:
        d_params["W_e"] = np.einsum("eo,ei->oi", d_ef, edge_attr)  # (H*C, edge_dim)
        d_edge_attr = np.einsum("eo,oi->ei", d_ef, params["W_e"])  # (E, edge_dim)
    # B1 (of F1) the three projections: the query's into x_dst, the key's and value's x_src
    hc = heads * channels
    d_x_dst = d_x_dst + _linear_backward(params, "q", x_dst, d_q.reshape(n, hc), d_params)
    d_x_src = sum(
        _linear_backward(params, name, x_src, d_y.reshape(len(x_src), hc), d_params)
        for name, d_y in (("k", d_k), ("v", d_val))
    )
    d_x = (d_x_src, d_x_dst) if isinstance(x, tuple) else d_x_src + d_x_dst
    d_params = {name: d_params[name] for name in params}
    if conv.edge_dim is None:
        return d_x, d_params
    return (d_x, d_edge_attr), d_params
