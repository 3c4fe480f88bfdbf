"""A deliberately naive GAT forward: a Python loop over targets, explicit neighbour sums.

Never optimised; it exists so the vectorised ``GATConv`` has an independent
formulation to agree with. It re-derives every step from the equations
(GAT-balance Eq. 1-2; Velickovic et al. 2018 for v1) with NumPy on the host and
shares no code with ``refimpl.nn.gat`` beyond the parameter names.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["gat_forward"]


def _leaky_relu(value: np.ndarray | float, slope: float) -> np.ndarray | float:
    return np.where(np.asarray(value) > 0, value, slope * np.asarray(value))


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
                    scores.append(float(_leaky_relu(raw, slope)))
                else:
                    hidden = _leaky_relu(h_src[u][head] + h_dst[v][head], slope)
                    scores.append(float(params["att"][head] @ hidden))
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
