"""Literal twin of ``GTAttention`` (Dwivedi & Bresson's GT attention as released in the
massive-activation study's ``graph_transformer_edge_layer.py``): forward and backward.

Never optimised: a loop over the edges, one edge and head at a time, written as the released
``propagate_attention`` / ``propagate_attention_explicit_bias`` read. NumPy on the host,
float64; it shares no code with :mod:`refimpl.nn.transformer.gt_attention` beyond the
parameter names (``attention`` is read for its configuration only). For an edge ``u -> v``,
head ``h`` (``d`` channels)::

    F1  q_v = W_q h_v + b_q,  k_u = W_k h_u + b_k,  val_u = W_v h_u + b_v,  P = W_e e_uv + b_e
    F2  a_c = k_u,c q_v,c / sqrt(d);              F2' b = q_v . k_bias / sqrt(d)
    F3  s_c = a_c P_c  [+ b e_bias_c]             (ones without edge features)
    F4  w = exp(clamp(sum_c s_c, -5, 5))
    F5  z_v += w;  m_v += w (val_u [+ v_bias])
    F6  h_out_v = m_v / (z_v + 1e-6);  e_out_uv = s
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = ["GTSteps", "gt_attention_backward", "gt_attention_forward"]


class GTSteps(NamedTuple):
    """The forward's intermediates, named by the equations in the module docstring."""

    src: np.ndarray  # (E,)
    dst: np.ndarray  # (E,)
    q: np.ndarray  # (N, H, d) F1
    k: np.ndarray  # (N, H, d)
    val: np.ndarray  # (N, H, d)
    proj: np.ndarray  # (E, H, d) F1 (ones without edge features)
    a: np.ndarray  # (E, H, d) F2
    b: np.ndarray  # (E, H) F2' (zeros without the explicit bias)
    t: np.ndarray  # (E, H) sum_c s, before the clamp
    w: np.ndarray  # (E, H) F4
    z: np.ndarray  # (N, H) F5
    m: np.ndarray  # (N, H, d) F5
    h_out: np.ndarray  # (N, H, d) F6
    s: np.ndarray  # (E, H, d) F3


def _linear(params: dict, name: str, x: np.ndarray) -> np.ndarray:
    y = x @ params[f"W_{name}"].T
    return y + params[f"b_{name}"] if f"b_{name}" in params else y


def gt_attention_forward(
    attention: Any, params: dict, h: np.ndarray, edge_index: np.ndarray, e: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, GTSteps]:
    """``(h_out (N, D), e_out (E, D) or None, steps)``."""
    n, heads, d = h.shape[0], attention.heads, attention.out_channels // attention.heads
    src, dst = np.asarray(edge_index[0]), np.asarray(edge_index[1])
    num_edges = src.shape[0]
    edges = e is not None
    q = _linear(params, "q", h).reshape(n, heads, d)
    k = _linear(params, "k", h).reshape(n, heads, d)
    val = _linear(params, "v", h).reshape(n, heads, d)
    proj = _linear(params, "e", e).reshape(num_edges, heads, d) if edges else None
    a, s = np.zeros((num_edges, heads, d)), np.zeros((num_edges, heads, d))
    b, t, w = (
        np.zeros((num_edges, heads)),
        np.zeros((num_edges, heads)),
        np.zeros((num_edges, heads)),
    )
    z, m = np.zeros((n, heads)), np.zeros((n, heads, d))
    for i in range(num_edges):
        u, v = src[i], dst[i]
        for hd in range(heads):
            a[i, hd] = k[u, hd] * q[v, hd] / math.sqrt(d)  # F2
            if attention.explicit_bias:
                b[i, hd] = q[v, hd] @ params["k_bias"][hd, :, 0] / math.sqrt(d)  # F2'
            if edges:  # F3 (F3' with the explicit bias)
                s[i, hd] = a[i, hd] * proj[i, hd]
                if attention.explicit_bias:
                    s[i, hd] += b[i, hd] * params["e_bias"][hd, 0]
            else:
                s[i, hd] = 1.0
            t[i, hd] = s[i, hd].sum()
            w[i, hd] = math.exp(min(max(t[i, hd], -5.0), 5.0))  # F4
            message = val[u, hd] + (params["v_bias"][hd, 0] if attention.explicit_bias else 0)
            z[v, hd] += w[i, hd]  # F5
            m[v, hd] += w[i, hd] * message
    h_out = m / (z[:, :, None] + 1e-6)  # F6
    steps = GTSteps(src, dst, q, k, val, proj, a, b, t, w, z, m, h_out, s)
    return h_out.reshape(n, heads * d), (s.reshape(num_edges, heads * d) if edges else None), steps


def gt_attention_backward(
    attention: Any,
    params: dict,
    h: np.ndarray,
    e: np.ndarray | None,
    steps: GTSteps,
    d_h_out: np.ndarray,
    d_e_out: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """``(d_h, d_e or None, d_params)`` of ``<d_h_out, h_out> + <d_e_out, e_out>``."""
    st = steps
    n, heads = h.shape[0], attention.heads
    d = attention.out_channels // heads
    num_edges = st.src.shape[0]
    edges = e is not None
    g = d_h_out.reshape(n, heads, d)
    g_e = np.zeros((num_edges, heads, d)) if d_e_out is None else d_e_out.reshape(-1, heads, d)
    d_q, d_k, d_val = np.zeros((n, heads, d)), np.zeros((n, heads, d)), np.zeros((n, heads, d))
    d_proj = np.zeros((num_edges, heads, d))
    d_bias = {name: np.zeros_like(params[name]) for name in ("k_bias", "e_bias", "v_bias")
              if name in params}  # fmt: skip
    # B6 (of F6) per target
    d_m = g / (st.z[:, :, None] + 1e-6)
    d_z = -(g * st.m).sum(-1) / (st.z + 1e-6) ** 2
    for i in range(num_edges):
        u, v = st.src[i], st.dst[i]
        for hd in range(heads):
            # B5 (of F5)
            message = st.val[u, hd] + (params["v_bias"][hd, 0] if attention.explicit_bias else 0)
            d_w = d_m[v, hd] @ message + d_z[v, hd]
            d_val[u, hd] += st.w[i, hd] * d_m[v, hd]
            if attention.explicit_bias:
                d_bias["v_bias"][hd, 0] += st.w[i, hd] * d_m[v, hd]
            if not edges:  # the scores were constant ones
                continue
            # B4 (of F4): torch's clamp passes the gradient strictly inside (-5, 5)
            d_t = d_w * st.w[i, hd] if -5.0 < st.t[i, hd] < 5.0 else 0.0
            # B3 (of F3)
            d_s = d_t + g_e[i, hd]  # (d,)
            d_proj[i, hd] = d_s * st.a[i, hd]
            d_a = d_s * st.proj[i, hd]
            if attention.explicit_bias:
                d_b = d_s @ params["e_bias"][hd, 0]
                d_bias["e_bias"][hd, 0] += d_s * st.b[i, hd]
                # B2 (of F2')
                d_bias["k_bias"][hd, :, 0] += d_b * st.q[v, hd] / math.sqrt(d)
                d_q[v, hd] += d_b * params["k_bias"][hd, :, 0] / math.sqrt(d)
            # B2 (of F2)
            d_k[u, hd] += d_a * st.q[v, hd] / math.sqrt(d)
            d_q[v, hd] += d_a * st.k[u, hd] / math.sqrt(d)
    # B1 (of F1) the linear maps
    d_params = dict(d_bias)
    d_h = np.zeros_like(h)
    for name, grad, x in (("q", d_q, h), ("k", d_k, h), ("v", d_val, h), ("e", d_proj, e)):
        if f"W_{name}" not in params:
            continue
        flat = grad.reshape(x.shape[0], heads * d)
        d_params[f"W_{name}"] = flat.T @ x
        if f"b_{name}" in params:
            d_params[f"b_{name}"] = flat.sum(0)
        if name != "e":
            d_h += flat @ params[f"W_{name}"]
    d_e = d_proj.reshape(num_edges, heads * d) @ params["W_e"] if edges else None
    return d_h, d_e, {name: d_params[name] for name in params}
