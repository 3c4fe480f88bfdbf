"""A deliberately naive TransformerConv forward: a Python loop over targets and heads.

Never optimised; it exists so the vectorised ``TransformerConv`` has an
independent formulation to agree with. Every step is re-derived from the
equations (PyG's TransformerConv; LipschitzNorm Eq. 19 per target and head) with
NumPy on the host, one target node at a time, and shares no code with
``refimpl.nn.transformer_conv`` beyond the parameter names.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["transformer_conv_forward"]


def _linear(params: dict[str, np.ndarray], name: str, vector: np.ndarray) -> np.ndarray:
    """``W_name @ vector (+ b_name)`` for one node's feature vector."""
    out = params[f"W_{name}"] @ vector
    if f"b_{name}" in params:
        out = out + params[f"b_{name}"]
    return out


def transformer_conv_forward(
    conv: object,
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
    ``q_v[c] * k_uv[c] / scale`` (their sum over ``c`` is the score).
    """
    n = x.shape[0]
    heads, channels = conv.heads, conv.out_channels
    edges = [(int(u), int(v)) for u, v in np.asarray(edge_index).T]

    def split(vector: np.ndarray) -> list[np.ndarray]:
        return [vector[h * channels : (h + 1) * channels] for h in range(heads)]

    queries = [split(_linear(params, "q", x[v])) for v in range(n)]
    keys = [split(_linear(params, "k", x[u])) for u in range(n)]
    values = [split(_linear(params, "v", x[u])) for u in range(n)]

    out = np.zeros((n, heads, channels))
    attention = np.zeros((len(edges), heads))
    terms = np.zeros((len(edges), heads, channels))
    for v in range(n):
        incoming = [(e, u) for e, (u, target) in enumerate(edges) if target == v]
        for h in range(heads):
            edge_keys, edge_values = [], []
            for e, u in incoming:
                key, value = keys[u][h], values[u][h]
                if conv.edge_dim is not None:
                    edge_term = split(params["W_e"] @ edge_attr[e])[h]
                    key, value = key + edge_term, value + edge_term
                edge_keys.append(key)
                edge_values.append(value)
            if not incoming:
                continue  # no incoming edge: the aggregate stays zero
            query = queries[v][h]
            if conv.lipschitz_norm == "paper":
                # LipschitzNorm Eq. 19 with Q = q_v, K and V the keys and values into v
                q_norm = np.linalg.norm(query)
                k_norm = max(np.linalg.norm(key) for key in edge_keys)
                v_norm = max(np.linalg.norm(value) for value in edge_values)
                scale = max(q_norm * k_norm, q_norm * v_norm, k_norm * v_norm)
                if scale == 0:
                    scale = 1.0  # the raw scores are all 0 then; the score is defined as 0
            else:
                scale = math.sqrt(channels)
            scores = []
            for (e, _), key in zip(incoming, edge_keys, strict=True):
                terms[e, h] = query * key / scale
                scores.append(float(sum(query[c] * key[c] for c in range(channels)) / scale))
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for (e, _), weight, value in zip(incoming, weights, edge_values, strict=True):
                alpha = weight / total
                attention[e, h] = alpha
                if attn_keep is not None:
                    alpha = alpha * attn_keep[e, h] / (1.0 - conv.dropout)
                out[v, h] += alpha * value
    messages = out.reshape(n, heads * channels) if conv.concat else out.mean(axis=1)
    if not conv.root_weight:
        return messages, attention, terms
    result = np.zeros_like(messages)
    for v in range(n):
        skip = _linear(params, "skip", x[v])
        if conv.beta:
            z = float(params["w_beta"][0] @ np.concatenate([messages[v], skip, messages[v] - skip]))
            gate = 0.5 * (1.0 + math.tanh(z / 2))  # the logistic sigmoid
            result[v] = gate * skip + (1 - gate) * messages[v]
        else:
            result[v] = messages[v] + skip
    return result, attention, terms
