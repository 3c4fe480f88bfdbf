"""Deliberately naive dense attention (LipschitzNorm Eq. 3-5, 7, 15, 17, 19): Python loops.

Never optimised; it exists so the vectorised blocks of
:mod:`refimpl.nn.lipschitz.multi_head_attention`
have an independent formulation to agree with. Every score, norm, softmax and
output column is an explicit loop over entries, on the host, sharing no code
with ``refimpl.nn``. The spectral norm is taken as ``sqrt(max eig(Q^T Q))``
(``numpy.linalg.eigvalsh``), a different route from the blocks' SVD.
Zero denominators give zero scores, as in the blocks.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["attention_forward", "multi_head_attention_forward", "transformer_attention_forward"]


def _column_norm(x: np.ndarray, j: int) -> float:
    return math.sqrt(sum(float(x[i, j]) ** 2 for i in range(x.shape[0])))


def _max_column_norm(x: np.ndarray) -> float:
    """``||X^T||_(inf,2)``: the longest input vector."""
    return max(_column_norm(x, j) for j in range(x.shape[1]))


def _dot_columns(a: np.ndarray, i: int, b: np.ndarray, j: int) -> float:
    return sum(float(a[r, i]) * float(b[r, j]) for r in range(a.shape[0]))


def _softmax_row(row: list[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(value - top) for value in row]
    total = sum(exps)
    return [value / total for value in exps]


def _attend(values: np.ndarray, scores: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Output columns ``sum_j P_ij values_j`` (Eq. 2 per output) and ``P``."""
    probabilities = np.array([_softmax_row(row) for row in scores])
    out = np.zeros((values.shape[0], len(scores)))
    for i, weights in enumerate(probabilities):
        for j, weight in enumerate(weights):
            out[:, i] += weight * values[:, j]
    return out, probabilities


def attention_forward(
    x: np.ndarray, q: np.ndarray, normalization: str | None = None, alpha: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``Att(X) = X softmax(g)^T`` with ``g~ = Q^T X``: ``(out (d, m), scores, probabilities)``."""
    n, m = x.shape[1], q.shape[1]
    raw = [[_dot_columns(q, i, x, j) for j in range(n)] for i in range(m)]
    if normalization is None:
        denominator, factor = 1.0, 1.0
    elif normalization == "linear":  # Eq. 17
        q_frobenius = math.sqrt(sum(float(v) ** 2 for v in q.ravel()))
        denominator, factor = q_frobenius * _max_column_norm(x), 1.0
    elif normalization == "lipschitz":  # Eq. 15 with L = ||Q||_*
        two_inf = math.sqrt(sum(max(abs(v) for v in row) ** 2 for row in raw))
        spectral = math.sqrt(max(float(np.max(np.linalg.eigvalsh(q.T @ q))), 0.0))
        denominator, factor = max(two_inf, _max_column_norm(x) * spectral), alpha
    else:
        raise ValueError(f"unknown normalization {normalization!r}")
    scores = [
        [factor * value / denominator if denominator > 0 else 0.0 for value in row] for row in raw
    ]
    out, probabilities = _attend(x, scores)
    return out, np.array(scores), probabilities


def transformer_attention_forward(
    x: np.ndarray, dim: int, normalization: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``V softmax(g)^T`` for ``x = (Q||K||V)``: ``(out (d, n), scores, probabilities)``."""
    q, k, v = x[:dim], x[dim : 2 * dim], x[2 * dim :]
    n = x.shape[1]
    raw = [[_dot_columns(q, i, k, j) for j in range(n)] for i in range(n)]
    if normalization is None:  # Eq. 7
        denominator = math.sqrt(dim)
    elif normalization == "lipschitz":  # Eq. 19
        u = math.sqrt(sum(float(value) ** 2 for value in q.ravel()))
        v_norm, w = _max_column_norm(k), _max_column_norm(v)
        denominator = max(u * v_norm, u * w, v_norm * w)
    else:
        raise ValueError(f"unknown normalization {normalization!r}")
    scores = [[value / denominator if denominator > 0 else 0.0 for value in row] for row in raw]
    out, probabilities = _attend(v, scores)
    return out, np.array(scores), probabilities


def multi_head_attention_forward(mha: object, params: dict, x: np.ndarray) -> np.ndarray:
    """Eq. 5: ``W_O (Att(W_1 X) || ... || Att(W_h X))`` with a loop over heads and rows."""
    blocks = []
    for k in range(mha.heads):
        w_k = params["W_in"][k]
        projected = np.array(
            [[_dot_columns(w_k.T, r, x, j) for j in range(x.shape[1])] for r in range(len(w_k))]
        )
        if mha.kind == "transformer":
            out_k, _, _ = transformer_attention_forward(projected, mha.head_dim, mha.normalization)
        else:
            out_k, _, _ = attention_forward(projected, params["Q"][k], mha.normalization, mha.alpha)
        blocks.append(out_k)
    stacked = np.concatenate(blocks, axis=0)
    w_out = params["W_out"]
    return np.array(
        [
            [_dot_columns(w_out.T, r, stacked, j) for j in range(stacked.shape[1])]
            for r in range(len(w_out))
        ]
    )
