"""Literal twin of ``TransformerStream`` (:mod:`refimpl.nn.transformer.stream`): forward and
backward, row by row.

Never optimised: NumPy on the host, float64, the released ``GraphTransformerLayer.forward``
(GT's ``graph_transformer_edge_layer.py``; ``GraphiT_GT_Layer`` and ``SAN_GT_Layer`` share the
stream) one step at a time: a loop over the ``M`` rows for every step that acts on a row alone
(dropout, the linears, ReLU, LayerNorm), and BatchNorm, which couples the rows, channel by
channel through its own twin (:mod:`refimpl.naive.batchnorm`). The backward recomputes the
forward from the inputs (no cache) and walks the chain rule back step by step. It shares no
code with the layer; ``stream`` is read for its configuration only (``channels``,
``ffn_channels``, ``dropout``, ``norm``, ``residual``), and the norms take torch's defaults
(``eps = 1e-5``, ``momentum = 0.1``), as ``nn.LayerNorm(D)`` and ``nn.BatchNorm1d(D)``.

Row ``i`` (``p`` the drop probability; the keep-masks ``keep1``, ``keep2`` the layer's
``cache.noise``, applied in training only)::

    F1  a_i = a_i * keep1_i / (1 - p)                      F.dropout
    F2  a_i = W_O a_i + b_O                                O_h
    F3  r_i = x_i + a_i            (r_i = a_i without the residual)
    F4  z = Norm_1(r)              each norm in turn: LayerNorm row by row, BatchNorm
                                   channel by channel over the rows (none on zero rows)
    F5  g_i = W_1 z_i + b_1;  f_i = max(g_i, 0)            FFN_h_layer1, F.relu
    F6  f_i = f_i * keep2_i / (1 - p)                      F.dropout
    F7  f_i = W_2 f_i + b_2                                FFN_h_layer2
    F8  y_i = z_i + f_i            (y_i = f_i without the residual)
    F9  out = Norm_2(y)

    B9  (of F9) each norm's backward, last applied first
    B8  (of F8) d_z = d_y (the residual), d_f = d_y
    B7  (of F7) d_W_2 += d_f_i f_i^T;  d_b_2 += d_f_i;  d_f_i = W_2^T d_f_i
    B6  (of F6) d_f_i = d_f_i * keep2_i / (1 - p)
    B5  (of F5) d_g_i = d_f_i [g_i > 0];  d_W_1 += d_g_i z_i^T;  d_b_1 += d_g_i;
        d_z_i += W_1^T d_g_i
    B4  (of F4) the norms' backward, last applied first
    B3  (of F3) d_x_i = d_r_i (zero without the residual), d_a_i = d_r_i
    B2  (of F2) d_W_O += d_a_i a_i^T;  d_b_O += d_a_i;  d_a_i = W_O^T d_a_i
    B1  (of F1) d_a_i = d_a_i * keep1_i / (1 - p)

LayerNorm of one row ``v`` of ``D`` entries (Ba, Kiros & Hinton 2016, Eq. 4, with torch's
``eps`` inside the root), and its chain rule as Ioffe & Szegedy (2015, Sec. 3) print it for
BatchNorm, over the row's entries instead of a channel's rows::

    mu = (1/D) sum_c v_c;  var = (1/D) sum_c (v_c - mu)^2;  xhat_c = (v_c - mu) / sqrt(var + eps)
    y_c = weight_c xhat_c + bias_c

    d_weight_c += d_y_c xhat_c;  d_bias_c += d_y_c;  d_xhat_c = d_y_c weight_c
    d_var = sum_c d_xhat_c (v_c - mu) (-1/2) (var + eps)^(-3/2)
    d_mu = sum_c -d_xhat_c / sqrt(var + eps) + d_var (1/D) sum_c -2 (v_c - mu)
    d_v_c = d_xhat_c / sqrt(var + eps) + d_var 2 (v_c - mu) / D + d_mu / D
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refimpl.naive.batchnorm import batchnorm_backward, batchnorm_forward

__all__ = ["layernorm_backward", "layernorm_forward", "stream_backward", "stream_forward"]

EPS = 1e-5  # torch.nn.LayerNorm's and BatchNorm1d's default
MOMENTUM = 0.1  # torch.nn.BatchNorm1d's default


def layernorm_forward(v: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``y (D,)``: torch's LayerNorm of one row ``v (D,)`` (module docstring)."""
    entries = [float(x) for x in v]
    width = len(entries)
    mu = math.fsum(entries) / width
    var = math.fsum((x - mu) ** 2 for x in entries) / width
    root = math.sqrt(var + EPS)
    return np.array([weight[c] * (entries[c] - mu) / root + bias[c] for c in range(width)])


def layernorm_backward(
    v: np.ndarray, weight: np.ndarray, d_y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(d_v (D,), d_weight (D,), d_bias (D,))`` of ``<d_y, LayerNorm(v)>``, recomputed from
    the row ``v`` and written as printed (module docstring)."""
    entries = [float(x) for x in v]
    width = len(entries)
    mu = math.fsum(entries) / width
    var = math.fsum((x - mu) ** 2 for x in entries) / width
    root = math.sqrt(var + EPS)
    xhat = [(x - mu) / root for x in entries]
    d_weight = np.array([d_y[c] * xhat[c] for c in range(width)])
    d_bias = np.array([float(d_y[c]) for c in range(width)])
    d_xhat = [d_y[c] * weight[c] for c in range(width)]
    d_var = math.fsum(d_xhat[c] * (entries[c] - mu) for c in range(width)) * -0.5 * root**-3
    # both paths into mu, the second zero in exact arithmetic, written as printed
    d_mu = (
        math.fsum(-d_xhat[c] / root for c in range(width))
        + d_var * math.fsum(-2 * (x - mu) for x in entries) / width
    )
    d_v = np.array(
        [
            d_xhat[c] / root + d_var * 2 * (entries[c] - mu) / width + d_mu / width
            for c in range(width)
        ]
    )
    return d_v, d_weight, d_bias


def _norms_of(stream: Any, step: int) -> list[tuple[str, str]]:
    """``(kind, parameter prefix)`` of F4's (``step`` 1) or F9's (2) norms, in the order the
    released layer applies them (``layer_norm`` before ``batch_norm``)."""
    kinds = {"batch": ["batch"], "layer": ["layer"], "none": [], "layer+batch": ["layer", "batch"]}
    chosen = kinds[stream.norm]
    if len(chosen) == 1:
        return [(chosen[0], f"norm{step}")]
    return [(kind, f"{kind}_norm{step}") for kind in chosen]


def _affine(w: np.ndarray, b: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``W x_i + b`` for every row ``x_i`` (an ``nn.Linear``), one row at a time."""
    out = np.zeros((rows.shape[0], w.shape[0]))
    for i in range(rows.shape[0]):
        out[i] = w @ rows[i] + b
    return out


def _affine_backward(
    w: np.ndarray, rows: np.ndarray, d_out: np.ndarray, prefix: str, d_params: dict
) -> np.ndarray:
    """Accumulate ``d_W += d_i x_i^T`` and ``d_b += d_i`` row by row; return ``W^T d_i``."""
    d_rows = np.zeros_like(rows)
    for i in range(rows.shape[0]):
        d_params[f"{prefix}.W"] += np.outer(d_out[i], rows[i])
        d_params[f"{prefix}.b"] += d_out[i]
        d_rows[i] = w.T @ d_out[i]
    return d_rows


def _drop(stream: Any, key: str, rows: np.ndarray, training: bool, noise: dict) -> np.ndarray:
    """F1 / F6 (and B1 / B6: the same map): ``rows * keep / (1 - p)`` row by row in training
    with ``p > 0``, else ``rows``."""
    if not training or stream.dropout == 0:
        return rows
    out = np.zeros_like(rows)
    for i in range(rows.shape[0]):
        out[i] = rows[i] * noise[key][i] / (1.0 - stream.dropout)
    return out


def _norms_forward(
    stream: Any,
    step: int,
    params: dict,
    x: np.ndarray,
    training: bool,
    state: dict,
    new_state: dict,
    inputs: list,
) -> np.ndarray:
    """F4 / F9: each norm in turn; its input goes to ``inputs``, BatchNorm's updated running
    statistics to ``new_state``."""
    for kind, prefix in _norms_of(stream, step):
        inputs.append(x)
        weight, bias = params[f"{prefix}.weight"], params[f"{prefix}.bias"]
        if kind == "layer":
            x = np.array([layernorm_forward(x[i], weight, bias) for i in range(x.shape[0])])
            x = x.reshape(-1, stream.channels)
        elif x.shape[0]:  # BatchNorm on no rows: the identity, statistics untouched
            mean, var = state[f"{prefix}.running_mean"], state[f"{prefix}.running_var"]
            x, new_mean, new_var = batchnorm_forward(
                x, weight, bias, mean, var, training, MOMENTUM, EPS
            )
            new_state[f"{prefix}.running_mean"] = new_mean
            new_state[f"{prefix}.running_var"] = new_var
    return x


def _norms_backward(
    stream: Any,
    step: int,
    params: dict,
    inputs: list,
    d_x: np.ndarray,
    training: bool,
    state: dict,
    d_params: dict,
) -> np.ndarray:
    """B4 / B9: each norm's backward, last applied first, from its recorded input."""
    for (kind, prefix), x in reversed(list(zip(_norms_of(stream, step), inputs, strict=True))):
        weight = params[f"{prefix}.weight"]
        if kind == "layer":
            d_in = np.zeros_like(x)
            for i in range(x.shape[0]):
                d_in[i], d_w, d_b = layernorm_backward(x[i], weight, d_x[i])
                d_params[f"{prefix}.weight"] += d_w
                d_params[f"{prefix}.bias"] += d_b
            d_x = d_in
        elif x.shape[0]:
            mean, var = state[f"{prefix}.running_mean"], state[f"{prefix}.running_var"]
            d_x, d_w, d_b = batchnorm_backward(x, weight, mean, var, training, EPS, d_x)
            d_params[f"{prefix}.weight"] += d_w
            d_params[f"{prefix}.bias"] += d_b
    return d_x


def _steps(
    stream: Any,
    params: dict,
    a: np.ndarray,
    x: np.ndarray,
    training: bool,
    state: dict,
    noise: dict,
) -> dict[str, Any]:
    """F1-F9, every intermediate by the name the module docstring gives it."""
    new_state = dict(state)
    s: dict[str, Any] = {"norm1_inputs": [], "norm2_inputs": [], "state": new_state}
    s["a1"] = _drop(stream, "dropout1", a, training, noise)  # F1
    s["a2"] = _affine(params["output.W"], params["output.b"], s["a1"])  # F2
    s["r"] = x + s["a2"] if stream.residual else s["a2"]  # F3
    s["z"] = _norms_forward(
        stream, 1, params, s["r"], training, state, new_state, s["norm1_inputs"]
    )  # F4
    s["g"] = _affine(params["ffn1.W"], params["ffn1.b"], s["z"])  # F5
    s["f1"] = np.zeros_like(s["g"])
    for i in range(s["g"].shape[0]):
        s["f1"][i] = np.maximum(s["g"][i], 0.0)
    s["f2"] = _drop(stream, "dropout2", s["f1"], training, noise)  # F6
    s["f3"] = _affine(params["ffn2.W"], params["ffn2.b"], s["f2"])  # F7
    s["y"] = s["z"] + s["f3"] if stream.residual else s["f3"]  # F8
    s["out"] = _norms_forward(
        stream, 2, params, s["y"], training, state, new_state, s["norm2_inputs"]
    )  # F9
    return s


def stream_forward(
    stream: Any,
    params: dict,
    attn_out: np.ndarray,
    residual_in: np.ndarray,
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[np.ndarray, dict]:
    """``(out (M, D), state after the call)`` of :class:`TransformerStream` ``stream``,
    literally; ``state`` its running statistics by the layer's names (``{}`` without batch
    norm), ``noise`` the keep-masks the layer used (its ``cache.noise``)."""
    steps = _steps(stream, params, attn_out, residual_in, training, state or {}, noise or {})
    return steps["out"], steps["state"]


def stream_backward(
    stream: Any,
    params: dict,
    attn_out: np.ndarray,
    residual_in: np.ndarray,
    d_out: np.ndarray,
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
    """``((d_attn_out, d_residual_in), d_params)`` of ``<d_out, out>``: the forward again,
    then B9 to B1 (module docstring)."""
    state, noise = state or {}, noise or {}
    s = _steps(stream, params, attn_out, residual_in, training, state, noise)
    d_params = {name: np.zeros_like(value) for name, value in params.items()}
    # B9 (of F9)
    d_y = _norms_backward(stream, 2, params, s["norm2_inputs"], d_out, training, state, d_params)
    # B8 (of F8) d_f = d_y, and d_y reaches z through the residual (added below); B7 (of F7)
    d_f = _affine_backward(params["ffn2.W"], s["f2"], d_y, "ffn2", d_params)
    # B6 (of F6)
    d_f = _drop(stream, "dropout2", d_f, training, noise)
    # B5 (of F5)
    d_g = np.zeros_like(d_f)
    for i in range(d_f.shape[0]):
        d_g[i] = d_f[i] * (s["g"][i] > 0)
    d_z = _affine_backward(params["ffn1.W"], s["z"], d_g, "ffn1", d_params)
    if stream.residual:  # B8's share
        d_z = d_z + d_y
    # B4 (of F4)
    d_r = _norms_backward(stream, 1, params, s["norm1_inputs"], d_z, training, state, d_params)
    # B3 (of F3)
    d_residual_in = d_r.copy() if stream.residual else np.zeros_like(residual_in)
    # B2 (of F2), B1 (of F1)
    d_a = _affine_backward(params["output.W"], s["a1"], d_r, "output", d_params)
    d_a = _drop(stream, "dropout1", d_a, training, noise)
    return (d_a, d_residual_in), d_params
