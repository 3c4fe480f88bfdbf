"""Deliberately naive segment reductions: Python loops over segments, items and features.

These are the references the vectorised primitives of :mod:`refimpl.kernels.segment`
are tested against. They are written to be obviously right, never fast: each
segment is found by scanning every item, each feature entry is reduced on its
own, in item order, with Python floats (float64). Do not optimise them; a test
that compares two clever implementations proves much less than one that
compares a clever one with this.

They take NumPy arrays only (host data) and a plain index array instead of a
:class:`refimpl.kernels.segment.Segments`, so they share no code with what they check.

Conventions (the same as the vectorised versions): ``index`` (E,) gives the
segment of each item; an empty segment sums to 0, has max 0 and argmax -1, and
has no softmax entries; ties in the max go to the lowest item index.

Each forward has its literal backward (the adjoint, written from the derivative,
never from the production code): a segment sum's is "every item receives its
segment's gradient" (times its weight, with weights); a max's routes the gradient
to the argmax item; a softmax's applies the Jacobian ``diag(alpha) - alpha alpha^T``
of each segment, built as a matrix.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "dense_masked_softmax",
    "items_of",
    "segment_max",
    "segment_max_backward",
    "segment_softmax",
    "segment_softmax_backward",
    "segment_sum",
    "segment_sum_backward",
    "segment_sum_pair",
    "segment_sum_pair_backward",
    "segment_sum_weights_backward",
]


def items_of(index: np.ndarray, segment: int) -> list[int]:
    """Item ids of one segment, in increasing order (a full scan, on purpose)."""
    return [e for e in range(len(index)) if int(index[e]) == segment]


def segment_sum(
    values: np.ndarray, index: np.ndarray, num_segments: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """``out[n] = sum_{e : index[e] = n} values[e]``, (E, *F) -> (N, *F), summed in item order.

    ``weights`` (E, H), optional: ``out[n, h] = sum_e weights[e, h] values[e, h]``
    (``values`` then (E, H, *F'), possibly a boolean mask read as 0/1; the result
    has the weights' dtype).
    """
    feature_shape = values.shape[1:]
    dtype = values.dtype if weights is None else weights.dtype
    out = np.zeros((num_segments, *feature_shape), dtype=dtype)
    for n in range(num_segments):
        items = items_of(index, n)
        for f in np.ndindex(*feature_shape):
            total = 0.0
            for e in items:
                weight = 1.0 if weights is None else float(weights[e, f[0]])
                total += weight * float(values[(e, *f)])
            out[(n, *f)] = total
    return out


def segment_sum_backward(
    d_out: np.ndarray, index: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Adjoint of :func:`segment_sum` in ``values``: ``d_values[e] = (weights[e]) d_out[index[e]]``.

    (N, *F) -> (E, *F): item ``e`` enters only its own segment's sum, with its weight.
    """
    d_values = np.zeros((len(index), *d_out.shape[1:]), dtype=d_out.dtype)
    for e in range(len(index)):
        for f in np.ndindex(*d_out.shape[1:]):
            weight = 1.0 if weights is None else float(weights[e, f[0]])
            d_values[(e, *f)] = weight * float(d_out[(int(index[e]), *f)])
    return d_values


def segment_sum_weights_backward(
    values: np.ndarray, d_out: np.ndarray, index: np.ndarray
) -> np.ndarray:
    """Adjoint of the weighted :func:`segment_sum` in ``weights`` (E, H).

    ``d_weights[e, h] = sum_{f'} values[e, h, f'] d_out[index[e], h, f']``.
    """
    d_weights = np.zeros((len(index), d_out.shape[1]), dtype=d_out.dtype)
    for e in range(len(index)):
        for f in np.ndindex(*d_out.shape[1:]):
            d_weights[e, f[0]] += float(values[(e, *f)]) * float(d_out[(int(index[e]), *f)])
    return d_weights


def segment_sum_pair(
    values: np.ndarray,
    first: np.ndarray,
    second: np.ndarray,
    num_segments: int,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """``segment_sum`` by ``first`` plus ``segment_sum`` by ``second`` (two index arrays (E,)).

    The adjoint of reading one node array at both ends of every edge.
    """
    by_first = segment_sum(values, first, num_segments, weights)
    by_second = segment_sum(values, second, num_segments, weights)
    return by_first + by_second


def segment_sum_pair_backward(
    d_out: np.ndarray, first: np.ndarray, second: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Adjoint of :func:`segment_sum_pair` in ``values``: each item receives both its segments'
    gradients, ``d_values[e] = (weights[e]) (d_out[first[e]] + d_out[second[e]])``."""
    return segment_sum_backward(d_out, first, weights) + segment_sum_backward(
        d_out, second, weights
    )


def segment_max(
    values: np.ndarray, index: np.ndarray, num_segments: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-segment maximum and the lowest item index attaining it, both (N, *F).

    Empty segments give ``max = 0`` and ``argmax = -1``.
    """
    feature_shape = values.shape[1:]
    maxima = np.zeros((num_segments, *feature_shape), dtype=values.dtype)
    argmax = np.full((num_segments, *feature_shape), -1, dtype=np.int64)
    for n in range(num_segments):
        items = items_of(index, n)
        for f in np.ndindex(*feature_shape):
            best_item, best_value = -1, 0.0
            for e in items:
                value = float(values[(e, *f)])
                # Strict ">" keeps the first (lowest-index) item among equal values.
                if best_item == -1 or value > best_value:
                    best_item, best_value = e, value
            maxima[(n, *f)] = best_value
            argmax[(n, *f)] = best_item
    return maxima, argmax


def segment_max_backward(d_out: np.ndarray, argmax: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Adjoint of :func:`segment_max`, (N, *F) -> (E, *F): ``d_out`` to the argmax item, else 0.

    The subgradient of the max through the one item it reports (the lowest index at
    a tie); an empty segment (argmax -1) sends nothing.
    """
    d_values = np.zeros((len(index), *d_out.shape[1:]), dtype=d_out.dtype)
    for n in range(d_out.shape[0]):
        for f in np.ndindex(*d_out.shape[1:]):
            item = int(argmax[(n, *f)])
            if item >= 0:
                d_values[(item, *f)] += float(d_out[(n, *f)])
    return d_values


def segment_softmax(scores: np.ndarray, index: np.ndarray, num_segments: int) -> np.ndarray:
    """Softmax of the scores within each segment, (E, *F) -> (E, *F).

    ``alpha_e = exp(s_e - m) / sum_{e' in seg(e)} exp(s_e' - m)``, ``m`` the
    segment maximum (the textbook stable form), one segment and feature at a time.
    """
    feature_shape = scores.shape[1:]
    alpha = np.zeros(scores.shape, dtype=scores.dtype)
    for n in range(num_segments):
        items = items_of(index, n)
        for f in np.ndindex(*feature_shape):
            segment_scores = [float(scores[(e, *f)]) for e in items]
            if not segment_scores:
                continue
            top = max(segment_scores)
            exponentials = [math.exp(s - top) for s in segment_scores]
            total = sum(exponentials)
            for e, x in zip(items, exponentials, strict=True):
                alpha[(e, *f)] = x / total
    return alpha


def segment_softmax_backward(
    alpha: np.ndarray, d_alpha: np.ndarray, index: np.ndarray, num_segments: int
) -> np.ndarray:
    """Adjoint of :func:`segment_softmax` from its output ``alpha``, (E, *F) -> (E, *F).

    Per segment and feature, the Jacobian ``J[i, j] = d alpha_i / d s_j =
    alpha_i (delta_ij - alpha_j)`` as a matrix, and ``d_scores = J^T d_alpha``.
    """
    d_scores = np.zeros(alpha.shape, dtype=alpha.dtype)
    for n in range(num_segments):
        items = items_of(index, n)
        for f in np.ndindex(*alpha.shape[1:]):
            a = [float(alpha[(e, *f)]) for e in items]
            jacobian = [
                [a[i] * ((1.0 if i == j else 0.0) - a[j]) for j in range(len(items))]
                for i in range(len(items))
            ]
            for j, e in enumerate(items):
                d_scores[(e, *f)] = sum(
                    jacobian[i][j] * float(d_alpha[(items[i], *f)]) for i in range(len(items))
                )
    return d_scores


def dense_masked_softmax(scores: np.ndarray, adjacency: np.ndarray) -> np.ndarray:
    """Softmax over the sources of each target on a dense count adjacency, (N, N, *F).

    ``scores[u, v]`` is the score of the edge ``u -> v`` and ``adjacency[u, v]``
    the number of such edges (:meth:`refimpl.Graph.to_dense_adjacency`). For
    every target ``v``, over the sources ``u`` with ``adjacency[u, v] > 0``::

        alpha[u, v] = A[u, v] exp(s[u, v] - m_v) / sum_u' A[u', v] exp(s[u', v] - m_v)

    so ``alpha[u, v]`` is the *total* weight of the edges ``u -> v``: a pair
    with ``k`` parallel edges of equal score counts ``k`` times, as in the
    per-edge softmax where each of them gets ``alpha[u, v] / k``. Entries with
    no edge are 0, and a column with no incoming edge is all 0.
    """
    num_nodes = adjacency.shape[0]
    feature_shape = scores.shape[2:]
    alpha = np.zeros(scores.shape, dtype=scores.dtype)
    for v in range(num_nodes):
        sources = [u for u in range(num_nodes) if adjacency[u, v] > 0]
        if not sources:
            continue
        for f in np.ndindex(*feature_shape):
            top = max(float(scores[(u, v, *f)]) for u in sources)
            weights = {
                u: int(adjacency[u, v]) * math.exp(float(scores[(u, v, *f)]) - top) for u in sources
            }
            total = sum(weights.values())
            for u in sources:
                alpha[(u, v, *f)] = weights[u] / total
    return alpha
