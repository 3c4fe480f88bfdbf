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


def _v1_denominator(
    mode: str,
    params: dict[str, np.ndarray],
    h: list[np.ndarray],
    incoming: list[tuple[int, int]],
    u: int,
    v: int,
    head: int,
) -> float:
    """GATv1 LipschitzNorm denominator for the edge ``u -> v`` (see ``refimpl.nn.lipschitz_norm``).

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
                    scores.append(float(_leaky_relu(raw, slope)))
                else:
                    hidden = _leaky_relu(h_src[u][head] + h_dst[v][head], slope)
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
