"""Deliberately naive segment reductions: Python loops over segments, items and features.

These are the references the vectorised primitives of :mod:`refimpl.ops.segment`
are tested against. They are written to be obviously right, never fast: each
segment is found by scanning every item, each feature entry is reduced on its
own, in item order, with Python floats (float64). Do not optimise them; a test
that compares two clever implementations proves much less than one that
compares a clever one with this.

They take NumPy arrays only (host data) and a plain index array instead of a
:class:`refimpl.ops.segment.Segments`, so they share no code with what they check.

Conventions (the same as the vectorised versions): ``index`` (E,) gives the
segment of each item; an empty segment sums to 0, has max 0 and argmax -1, and
has no softmax entries; ties in the max go to the lowest item index.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "dense_masked_softmax",
    "segment_max",
    "segment_softmax",
    "segment_sum",
]


def _items_of(index: np.ndarray, segment: int) -> list[int]:
    """Item ids of one segment, in increasing order (a full scan, on purpose)."""
    return [e for e in range(len(index)) if int(index[e]) == segment]


def segment_sum(values: np.ndarray, index: np.ndarray, num_segments: int) -> np.ndarray:
    """``out[n] = sum_{e : index[e] = n} values[e]``, (E, *F) -> (N, *F), summed in item order."""
    feature_shape = values.shape[1:]
    out = np.zeros((num_segments, *feature_shape), dtype=values.dtype)
    for n in range(num_segments):
        items = _items_of(index, n)
        for f in np.ndindex(*feature_shape):
            total = 0.0
            for e in items:
                total += float(values[(e, *f)])
            out[(n, *f)] = total
    return out


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
        items = _items_of(index, n)
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


def segment_softmax(scores: np.ndarray, index: np.ndarray, num_segments: int) -> np.ndarray:
    """Softmax of the scores within each segment, (E, *F) -> (E, *F).

    ``alpha_e = exp(s_e - m) / sum_{e' in seg(e)} exp(s_e' - m)``, ``m`` the
    segment maximum (the textbook stable form), one segment and feature at a time.
    """
    feature_shape = scores.shape[1:]
    alpha = np.zeros(scores.shape, dtype=scores.dtype)
    for n in range(num_segments):
        items = _items_of(index, n)
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
