"""Literal twins of SAN's blocks, forward and backward: ``SANAttention`` pair by pair and
``LearnedLaplacianPE`` node by node and token by token.

Never optimised: NumPy on the host, float64, loops over pairs, nodes and tokens, written as the
released code reads (``gnn-lspe/layers/san_gt_layer.py``, ``SAN_NodeLPE.py`` with
``torch.nn.TransformerEncoderLayer``'s maths); the backward recomputes the forward and applies
the chain rule step by step. The blocks (``attention``, ``lpe``) are read for their
configuration only. Steps are numbered as in :mod:`refimpl.nn.transformer.san_attention` and
:mod:`refimpl.nn.transformer.san_lpe`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refimpl.naive.stream import layernorm_backward, layernorm_forward

__all__ = ["lpe_backward", "lpe_forward", "san_attention_backward", "san_attention_forward"]


def _heads(y: np.ndarray, heads: int) -> np.ndarray:
    """``(rows, H * d) -> (rows, H, d)``."""
    return y.reshape(len(y), heads, y.shape[1] // heads)


def _maps(attention: Any, params: dict, h: np.ndarray, e: np.ndarray) -> dict:
    """F1: every projection, ``(rows, H, d)``, by name (Q, K, V, Q_2, K_2 on h; E, E_2 on e)."""
    out = {}
    names = ("Q", "K", "E", "Q_2", "K_2", "E_2", "V") if attention.full_graph else "QKEV"
    for name in names:
        x = e if name.startswith("E") else h
        y = x @ params[f"W_{name}"].T
        if f"b_{name}" in params:
            y = y + params[f"b_{name}"]
        out[name] = _heads(y, attention.heads)
    return out


def _gamma(attention: Any, params: dict) -> float:
    if attention.learn_gamma:
        return min(max(float(params["gamma"][0]), 0.0), 1.0)
    return float(attention.gamma)


def _pair_terms(attention: Any, maps: dict, p: int, u: int, v: int, is_real: bool) -> tuple:
    """``(Q_v, K_u, E_p)`` of pair ``p``: the real edges' parameters or the others'."""
    suffix = "" if is_real else "_2"
    return maps["Q" + suffix][v], maps["K" + suffix][u], maps["E" + suffix][p]


def san_attention_forward(
    attention: Any,
    params: dict,
    h: np.ndarray,
    edge_index: np.ndarray,
    e: np.ndarray,
    real: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(out (N, D), t (P, H, d))`` of SANAttention, pair by pair."""
    n, heads = len(h), attention.heads
    d = attention.channels // heads
    real = np.ones(edge_index.shape[1], dtype=bool) if real is None else real
    maps, gamma = _maps(attention, params, h, e), _gamma(attention, params)
    weighted, z = np.zeros((n, heads, d)), np.zeros((n, heads))
    t = np.zeros((len(real), heads, d))
    for p, (u, v) in enumerate(edge_index.T.tolist()):
        q, k, ef = _pair_terms(attention, maps, p, u, v, bool(real[p]))
        # F2 t = K_u Q_v / sqrt(d) E_p; F3 s = sum_c t
        t[p] = k * q / math.sqrt(d) * ef
        for head in range(heads):
            s = float(t[p, head].sum())
            # F4 exp(clamp(s, -5, 5)), real pairs / (gamma + 1), others gamma / (gamma + 1)
            w = math.exp(min(max(s, -5.0), 5.0))
            if attention.full_graph:
                w *= 1.0 / (gamma + 1.0) if real[p] else gamma / (gamma + 1.0)
            # F5 wV and z
            weighted[v, head] += w * maps["V"][u, head]
            z[v, head] += w
    # F6 wV / (z + 1e-6), heads concatenated
    return (weighted / (z[..., None] + 1e-6)).reshape(n, -1), t


def san_attention_backward(
    attention: Any,
    params: dict,
    h: np.ndarray,
    edge_index: np.ndarray,
    e: np.ndarray,
    real: np.ndarray | None,
    d_out: np.ndarray,
) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
    """``((d_h, d_e), d_params)`` of ``<d_out, out>``, recomputing the forward pair by pair."""
    n, heads = len(h), attention.heads
    d = attention.channels // heads
    real = np.ones(edge_index.shape[1], dtype=bool) if real is None else real
    maps, gamma = _maps(attention, params, h, e), _gamma(attention, params)
    pairs = edge_index.T.tolist()
    # the forward, keeping each pair's weight and its exp
    weights, exps = np.zeros((len(pairs), heads)), np.zeros((len(pairs), heads))
    raw = np.zeros((len(pairs), heads))
    weighted, z = np.zeros((n, heads, d)), np.zeros((n, heads))
    for p, (u, v) in enumerate(pairs):
        q, k, ef = _pair_terms(attention, maps, p, u, v, bool(real[p]))
        for head in range(heads):
            raw[p, head] = float((k[head] * q[head] / math.sqrt(d) * ef[head]).sum())
            exps[p, head] = math.exp(min(max(raw[p, head], -5.0), 5.0))
            factor = 1.0
            if attention.full_graph:
                factor = 1.0 / (gamma + 1.0) if real[p] else gamma / (gamma + 1.0)
            weights[p, head] = exps[p, head] * factor
            weighted[v, head] += weights[p, head] * maps["V"][u, head]
            z[v, head] += weights[p, head]
    out = weighted / (z[..., None] + 1e-6)
    d_out = d_out.reshape(n, heads, d)
    grads = {name: np.zeros_like(value) for name, value in maps.items()}
    d_gamma = 0.0
    for p, (u, v) in enumerate(pairs):
        suffix = "" if real[p] else "_2"
        q, k, ef = _pair_terms(attention, maps, p, u, v, bool(real[p]))
        for head in range(heads):
            denominator = z[v, head] + 1e-6
            # B6, B5: out_v = wV_v / (z_v + eps) with both sums holding w_p
            d_w = float(d_out[v, head] @ (maps["V"][u, head] - out[v, head])) / denominator
            grads["V"][u, head] += weights[p, head] * d_out[v, head] / denominator
            # B4: the clamp passes the gradient strictly inside (-5, 5), as torch.clamp; gamma
            # through the factor
            d_s = d_w * weights[p, head] if -5.0 < raw[p, head] < 5.0 else 0.0
            if attention.full_graph:
                slope = (-1.0 if real[p] else 1.0) / (1.0 + gamma) ** 2
                d_gamma += d_w * exps[p, head] * slope
            # B3, B2: t = K_u Q_v E_p / sqrt(d), each channel
            scale = d_s / math.sqrt(d)
            grads["Q" + suffix][v, head] += scale * k[head] * ef[head]
            grads["K" + suffix][u, head] += scale * q[head] * ef[head]
            grads["E" + suffix][p, head] += scale * q[head] * k[head]
    # B1: the projections
    d_params, d_h, d_e = {}, np.zeros_like(h), np.zeros_like(e)
    for name, grad in grads.items():
        flat = grad.reshape(len(grad), attention.channels)
        x = e if name.startswith("E") else h
        d_params[f"W_{name}"] = flat.T @ x
        if f"b_{name}" in params:
            d_params[f"b_{name}"] = flat.sum(axis=0)
        if name.startswith("E"):
            d_e += flat @ params[f"W_{name}"]
        else:
            d_h += flat @ params[f"W_{name}"]
    if attention.learn_gamma:
        inside = 0.0 < float(params["gamma"][0]) < 1.0
        d_params["gamma"] = np.array([d_gamma if inside else 0.0])
    return (d_h, d_e), {name: d_params[name] for name in params}


def lpe_forward(
    lpe: Any,
    params: dict,
    eigvecs: np.ndarray,
    eigvals: np.ndarray,
    valid: np.ndarray,
    keep: dict | None = None,
) -> np.ndarray:
    """``pe (N, d)`` of LearnedLaplacianPE node by node, token by token; ``keep`` the dropout
    keep-masks by the block's noise keys (None: evaluation)."""
    n, m = eigvecs.shape
    heads, d = lpe.heads, lpe.channels
    d_h = d // heads
    scale = 1.0 / (1.0 - lpe.dropout)

    def drop(key: str, node: int, value: np.ndarray, index: Any) -> np.ndarray:
        if keep is None or key not in keep:
            return value
        mask = keep[key].reshape(n, m, -1) if "attn" not in key else keep[key]
        return value * mask[node][index] * scale

    def p(name: str) -> np.ndarray:
        return params[name]

    out = np.zeros((n, d))
    for v in range(n):
        # F1, F2 one token per eigenpair, zero where padded, through linear_A
        x = [
            p("linear_A.W") @ (np.array([eigvecs[v, j], eigvals[v, j]]) * valid[v, j])
            + p("linear_A.b")
            for j in range(m)
        ]
        for i in range(lpe.layers):
            pre = f"layers.{i}."
            # F3 queries, keys and values per token (3d,)
            qkv = [p(pre + "in_proj.W") @ x[j] + p(pre + "in_proj.b") for j in range(m)]
            mixed = []
            for j in range(m):
                heads_out = []
                for head in range(heads):
                    cut = slice(head * d_h, (head + 1) * d_h)
                    q = qkv[j][:d][cut]
                    # F4 softmax over the valid keys of this node
                    scores = {
                        jj: float(q @ qkv[jj][d : 2 * d][cut]) / math.sqrt(d_h)
                        for jj in range(m)
                        if valid[v, jj]
                    }
                    top = max(scores.values())
                    total = sum(math.exp(s - top) for s in scores.values())
                    # F5 attention dropout, weighted values
                    acc = np.zeros(d_h)
                    for jj, s in scores.items():
                        a = math.exp(s - top) / total
                        a = float(drop(pre + "attn_dropout", v, np.array(a), (head, j, jj)))
                        acc += a * qkv[jj][2 * d :][cut]
                    heads_out.append(acc)
                # F6 out-projection, dropout1
                o = p(pre + "out_proj.W") @ np.concatenate(heads_out) + p(pre + "out_proj.b")
                o = drop(pre + "dropout1", v, o, j)
                # F7 residual, norm1
                y = layernorm_forward(x[j] + o, p(pre + "norm1.weight"), p(pre + "norm1.bias"))
                # F8 the FFN with its dropouts; F9 residual, norm2
                f = np.maximum(p(pre + "linear1.W") @ y + p(pre + "linear1.b"), 0.0)
                f = drop(pre + "dropout", v, f, j)
                f = drop(pre + "dropout2", v, p(pre + "linear2.W") @ f + p(pre + "linear2.b"), j)
                mixed.append(
                    layernorm_forward(y + f, p(pre + "norm2.weight"), p(pre + "norm2.bias"))
                )
            x = mixed
        # F10 the sum over the valid tokens
        out[v] = sum(x[j] for j in range(m) if valid[v, j])
    return out


def lpe_backward(
    lpe: Any,
    params: dict,
    eigvecs: np.ndarray,
    eigvals: np.ndarray,
    valid: np.ndarray,
    d_out: np.ndarray,
    keep: dict | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
    """``((d_eigvecs, d_eigvals), d_params)`` of ``<d_out, pe>``, node by node and token by
    token: each node's forward is recomputed with its intermediates, then walked back."""
    n, m = eigvecs.shape
    heads, d = lpe.heads, lpe.channels
    d_h, scale = d // heads, 1.0 / (1.0 - lpe.dropout)
    grads = {name: np.zeros_like(value) for name, value in params.items()}
    d_vecs, d_vals = np.zeros_like(eigvecs), np.zeros_like(eigvals)

    def factor(key: str, v: int, index: Any) -> Any:
        """The keep-mask times 1 / (1 - p) at ``index``, 1 without it."""
        if keep is None or key not in keep:
            return 1.0
        mask = keep[key] if "attn" in key else keep[key].reshape(n, m, -1)
        return mask[v][index] * scale

    def add_linear(name: str, d_y: np.ndarray, x: np.ndarray) -> np.ndarray:
        grads[name + ".W"] += np.outer(d_y, x)
        grads[name + ".b"] += d_y
        return params[name + ".W"].T @ d_y

    for v in range(n):
        tokens = [np.array([eigvecs[v, j], eigvals[v, j]]) * valid[v, j] for j in range(m)]
        x = [params["linear_A.W"] @ t + params["linear_A.b"] for t in tokens]
        steps = []  # per layer, the forward's intermediates
        for i in range(lpe.layers):
            pre = f"layers.{i}."
            w = {k: params[pre + k] for k in ("in_proj.W", "in_proj.b", "out_proj.W")}
            qkv = [w["in_proj.W"] @ x[j] + w["in_proj.b"] for j in range(m)]
            alpha = np.zeros((heads, m, m))
            concat = np.zeros((m, d))
            for head in range(heads):
                cut = slice(head * d_h, (head + 1) * d_h)
                for j in range(m):
                    keys = [jj for jj in range(m) if valid[v, jj]]
                    s = [
                        float(qkv[j][:d][cut] @ qkv[jj][d : 2 * d][cut]) / math.sqrt(d_h)
                        for jj in keys
                    ]
                    top = max(s)
                    total = sum(math.exp(si - top) for si in s)
                    for jj, si in zip(keys, s, strict=True):
                        alpha[head, j, jj] = math.exp(si - top) / total
                        a = alpha[head, j, jj] * factor(pre + "attn_dropout", v, (head, j, jj))
                        concat[j, cut] += a * qkv[jj][2 * d :][cut]
            o = [w["out_proj.W"] @ concat[j] + params[pre + "out_proj.b"] for j in range(m)]
            y_in = [x[j] + o[j] * factor(pre + "dropout1", v, j) for j in range(m)]
            y = [
                layernorm_forward(y_in[j], params[pre + "norm1.weight"], params[pre + "norm1.bias"])
                for j in range(m)
            ]
            hidden = [
                params[pre + "linear1.W"] @ y[j] + params[pre + "linear1.b"] for j in range(m)
            ]
            f = [np.maximum(hidden[j], 0.0) * factor(pre + "dropout", v, j) for j in range(m)]
            f2 = [params[pre + "linear2.W"] @ f[j] + params[pre + "linear2.b"] for j in range(m)]
            z_in = [y[j] + f2[j] * factor(pre + "dropout2", v, j) for j in range(m)]
            steps.append((x, qkv, alpha, concat, y_in, y, hidden, f, z_in))
            x = [
                layernorm_forward(z, params[pre + "norm2.weight"], params[pre + "norm2.bias"])
                for z in z_in
            ]
        # B10: the sum over valid tokens
        d_x = [d_out[v] * valid[v, j] for j in range(m)]
        for i in reversed(range(lpe.layers)):
            pre = f"layers.{i}."
            x_in, qkv, alpha, concat, y_in, y, hidden, f, z_in = steps[i]
            d_x_in = [np.zeros(d) for _ in range(m)]
            d_qkv = [np.zeros(3 * d) for _ in range(m)]
            for j in range(m):
                # B9 norm2; B8 the FFN with its dropouts; the residual into y
                d_z, d_w2, d_b2 = layernorm_backward(z_in[j], params[pre + "norm2.weight"], d_x[j])
                grads[pre + "norm2.weight"] += d_w2
                grads[pre + "norm2.bias"] += d_b2
                d_f = add_linear(pre + "linear2", d_z * factor(pre + "dropout2", v, j), f[j])
                d_hidden = d_f * factor(pre + "dropout", v, j) * (hidden[j] > 0)
                d_y = d_z + add_linear(pre + "linear1", d_hidden, y[j])
                # B7 norm1; the residual into x
                d_y_in, d_w1, d_b1 = layernorm_backward(y_in[j], params[pre + "norm1.weight"], d_y)
                grads[pre + "norm1.weight"] += d_w1
                grads[pre + "norm1.bias"] += d_b1
                d_x_in[j] += d_y_in
                # B6 dropout1 and out_proj; B5, B4 each head's weights and softmax
                d_concat = add_linear(
                    pre + "out_proj", d_y_in * factor(pre + "dropout1", v, j), concat[j]
                )
                for head in range(heads):
                    cut = slice(head * d_h, (head + 1) * d_h)
                    keys = [jj for jj in range(m) if valid[v, jj]]
                    d_a = {}
                    for jj in keys:
                        drop = factor(pre + "attn_dropout", v, (head, j, jj))
                        d_a[jj] = float(d_concat[cut] @ qkv[jj][2 * d :][cut]) * drop
                        d_qkv[jj][2 * d :][cut] += alpha[head, j, jj] * drop * d_concat[cut]
                    mean = sum(alpha[head, j, jj] * d_a[jj] for jj in keys)
                    for jj in keys:
                        d_s = alpha[head, j, jj] * (d_a[jj] - mean) / math.sqrt(d_h)
                        d_qkv[j][:d][cut] += d_s * qkv[jj][d : 2 * d][cut]
                        d_qkv[jj][d : 2 * d][cut] += d_s * qkv[j][:d][cut]
            # B3 the in-projection
            for j in range(m):
                d_x_in[j] += add_linear(pre + "in_proj", d_qkv[j], x_in[j])
            d_x = d_x_in
        # B2, B1 linear_A and the tokens (zero where padded)
        for j in range(m):
            d_token = add_linear("linear_A", d_x[j], tokens[j]) * valid[v, j]
            d_vecs[v, j], d_vals[v, j] = d_token
    return (d_vecs, d_vals), grads
