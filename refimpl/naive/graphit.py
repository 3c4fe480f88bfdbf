"""Literal twin of ``GraphiTAttention`` (the released GraphiT-GT ``MultiHeadAttentionLayer``):
forward and backward, pair by pair.

Never optimised: NumPy on the host, float64, a loop over the pairs and one over the nodes,
the chain rule written out; it shares no code with
:mod:`refimpl.nn.transformer.graphit_attention` (``att`` is read for its configuration only).
For head ``h`` (``d`` channels) and pair ``p = (u -> v)``::

    F1  q_v = W_Q x_v + b_Q, k_u = W_K x_u + b_K, val_u = W_V x_u + b_V, f_p = W_E e_p + b_E
        (non-real pairs: W_Q_2, W_K_2, W_E_2; explicit bias: val_u += v_bias)
    F2  t_p = k_u * q_v / sqrt(d) * f_p            explicit: + (q_v . k_bias / sqrt(d)) e_bias
    F3  s_p = sum_c t_p[c]                         explicit: s_p = q_v . k_bias / sqrt(d)
    F4  w_p = exp(clamp(s_p, -5, 5)) kappa_p       (kappa_p = 1 without the kernel)
    F5  wV_v = sum_{p into v} w_p val_u,  z_v = sum_{p into v} w_p
    F6  out_v = wV_v / (z_v + 1e-6)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refimpl.graph import Graph

__all__ = ["graphit_attention_backward", "graphit_attention_forward"]


def _lin(params: dict, name: str, x: np.ndarray, bias: bool) -> np.ndarray:
    y = params[f"W_{name}"] @ x
    return y + params[f"b_{name}"] if bias else y


def graphit_attention_forward(
    att: Any, params: dict, h: np.ndarray, graph: Graph, e: np.ndarray, kernel: Any, real: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``(out (N, D), scores (P, D))`` of :class:`GraphiTAttention` ``att``, literally."""
    heads, d = att.heads, att.channels // att.heads
    n, num_pairs = h.shape[0], graph.num_edges
    src, dst = graph.edge_index
    real = np.ones(num_pairs, bool) if real is None else np.asarray(real)
    out = np.zeros((n, heads, d))
    scores = np.zeros((num_pairs, heads, d))
    wv, z = np.zeros((n, heads, d)), np.zeros((n, heads))
    for p in range(num_pairs):
        u, v = src[p], dst[p]
        suffix = "" if real[p] else "_2"
        q = _lin(params, "Q" + suffix, h[v], att.bias).reshape(heads, d)
        k = _lin(params, "K" + suffix, h[u], att.bias).reshape(heads, d)
        f = _lin(params, "E" + suffix, e[p], att.bias).reshape(heads, d)
        val = _lin(params, "V", h[u], att.bias).reshape(heads, d)
        for hd in range(heads):
            t = k[hd] * q[hd] / math.sqrt(d) * f[hd]
            s = t.sum()
            if att.explicit_bias:
                b = q[hd] @ params["k_bias"][hd] / math.sqrt(d)
                t = t + b * params["e_bias"][hd]
                s = b
                val_h = val[hd] + params["v_bias"][hd]
            else:
                val_h = val[hd]
            scores[p, hd] = t
            w = math.exp(min(max(s, -5.0), 5.0))
            if att.reads_kernel:
                w *= float(kernel[p])
            wv[v, hd] += w * val_h
            z[v, hd] += w
    for v in range(n):
        for hd in range(heads):
            out[v, hd] = wv[v, hd] / (z[v, hd] + 1e-6)
    return out.reshape(n, att.channels), scores.reshape(num_pairs, att.channels)


def graphit_attention_backward(
    att: Any,
    params: dict,
    h: np.ndarray,
    graph: Graph,
    e: np.ndarray,
    kernel: Any,
    real: Any,
    d_out: np.ndarray,
    d_scores: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(d_h, d_e, d_params)`` of ``<d_out, out> + <d_scores, scores>``: the forward again,
    then the chain rule per pair, B6 to B1."""
    heads, d = att.heads, att.channels // att.heads
    n, num_pairs = h.shape[0], graph.num_edges
    src, dst = graph.edge_index
    real = np.ones(num_pairs, bool) if real is None else np.asarray(real)
    out, _ = graphit_attention_forward(att, params, h, graph, e, kernel, real)
    out = out.reshape(n, heads, d)
    d_out = d_out.reshape(n, heads, d)
    d_scores = d_scores.reshape(num_pairs, heads, d)
    d_params = {name: np.zeros_like(value) for name, value in params.items()}
    d_h, d_e = np.zeros_like(h), np.zeros_like(e)
    # z_v again, for B6
    z = np.zeros((n, heads))
    pair_values = []
    for p in range(num_pairs):
        u, v = src[p], dst[p]
        suffix = "" if real[p] else "_2"
        q = _lin(params, "Q" + suffix, h[v], att.bias).reshape(heads, d)
        k = _lin(params, "K" + suffix, h[u], att.bias).reshape(heads, d)
        f = _lin(params, "E" + suffix, e[p], att.bias).reshape(heads, d)
        val = _lin(params, "V", h[u], att.bias).reshape(heads, d)
        if att.explicit_bias:
            val = val + params["v_bias"]
            s = np.array([q[i] @ params["k_bias"][i] / math.sqrt(d) for i in range(heads)])
        else:
            s = np.array([(k[i] * q[i] / math.sqrt(d) * f[i]).sum() for i in range(heads)])
        w = np.exp(np.clip(s, -5.0, 5.0)) * (float(kernel[p]) if att.reads_kernel else 1.0)
        z[v] += w
        pair_values.append((u, v, suffix, q, k, f, val, s, w))
    for p, (u, v, suffix, q, k, f, val, s, w) in enumerate(pair_values):
        d_q, d_k, d_f, d_val = (np.zeros((heads, d)) for _ in range(4))
        for i in range(heads):
            # B6: out_v = wV_v / (z_v + eps)
            d_wv = d_out[v, i] / (z[v, i] + 1e-6)
            d_z = -(d_out[v, i] @ out[v, i]) / (z[v, i] + 1e-6)
            # B5: wV_v += w val_u, z_v += w
            d_w = d_wv @ val[i] + d_z
            d_val[i] = w[i] * d_wv
            # B4: w = exp(clamp(s)) kappa
            d_s = d_w * w[i] if -5.0 < s[i] < 5.0 else 0.0  # torch.clamp: 0 on the boundary
            d_t = d_scores[p, i].copy()
            if att.explicit_bias:
                # B3', B2': s = b, t = k q f / sqrt(d) + b e_bias, b = q . k_bias / sqrt(d)
                b = s[i]
                d_b = d_s + d_t @ params["e_bias"][i]
                d_params["e_bias"][i] += d_t * b
                d_params["k_bias"][i] += d_b * q[i] / math.sqrt(d)
                d_params["v_bias"][i] += d_val[i]
                d_q[i] += d_b * params["k_bias"][i] / math.sqrt(d)
            else:
                d_t = d_t + d_s  # B3: s = sum_c t
            d_q[i] += d_t * k[i] * f[i] / math.sqrt(d)
            d_k[i] += d_t * q[i] * f[i] / math.sqrt(d)
            d_f[i] += d_t * q[i] * k[i] / math.sqrt(d)
        # B1: the affine maps
        for name, grad, x, into in (
            ("Q" + suffix, d_q, h[v], ("h", v)),
            ("K" + suffix, d_k, h[u], ("h", u)),
            ("E" + suffix, d_f, e[p], ("e", p)),
            ("V", d_val, h[u], ("h", u)),
        ):
            g = grad.reshape(-1)
            d_params[f"W_{name}"] += np.outer(g, x)
            if att.bias:
                d_params[f"b_{name}"] += g
            target = d_h if into[0] == "h" else d_e
            target[into[1]] += params[f"W_{name}"].T @ g
    return d_h, d_e, d_params
