"""Literal twin of :mod:`refimpl.ops.loop_fill`: the added self-loops' edge features, one
node and one edge at a time.

With ``add_self_loops`` a GAT layer drops the graph's self-loops with their features and
gives the loop ``(v, v)`` it appends the features ``fill[v]``, reduced over the features
``a_e`` of the remaining edges ``e`` into ``v`` (PyG ``add_self_loops(..., fill_value)``):
``"add"``/``"sum"`` their sum, ``"mean"`` their mean, ``"max"``/``"min"`` featurewise
extremes, ``"mul"`` featurewise products (0, 0, 0, 0 and 1 for a node with no such edge), a
number or ``D`` numbers as given, None ones. The backward differentiates each reduction as
written: the sum's and mean's ``1`` and ``1/|N(v)|`` per edge, the extreme's gradient shared
equally by the edges attaining it (torch's ``scatter_reduce`` convention), the product's
``prod_{e' != e} a_e'`` per edge, multiplied out. NumPy on the host, float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["loop_fill_backward", "loop_fill_forward"]


def _kept_edges(edge_index: np.ndarray) -> list[tuple[int, int]]:
    """``(e, v)`` for every edge ``e = u -> v`` that is not a self-loop, in order."""
    return [(e, int(v)) for e, (u, v) in enumerate(np.asarray(edge_index).T) if u != v]


def _incoming(kept: list[tuple[int, int]], v: int) -> list[int]:
    return [e for e, target in kept if target == v]


def loop_fill_forward(
    edge_attr: np.ndarray, edge_index: np.ndarray, num_nodes: int, fill_value: Any
) -> np.ndarray:
    """``(E' + N, D)``: the non-loop edges' features in order, then ``fill[0] .. fill[N-1]``."""
    kept = _kept_edges(edge_index)
    width = edge_attr.shape[1]
    rows = [edge_attr[e] for e, _ in kept]
    for v in range(num_nodes):
        features = [edge_attr[e] for e in _incoming(kept, v)]
        if fill_value is None:
            fill = np.ones(width)
        elif not isinstance(fill_value, str):
            fill = np.broadcast_to(np.asarray(fill_value, dtype=np.float64), (width,))
        elif not features:
            fill = np.ones(width) if fill_value == "mul" else np.zeros(width)
        elif fill_value in ("add", "sum"):
            fill = sum(features)
        elif fill_value == "mean":
            fill = sum(features) / len(features)
        elif fill_value == "max":
            fill = np.array([max(a[j] for a in features) for j in range(width)])
        elif fill_value == "min":
            fill = np.array([min(a[j] for a in features) for j in range(width)])
        else:  # "mul"
            fill = np.array([np.prod([a[j] for a in features]) for j in range(width)])
        rows.append(np.asarray(fill, dtype=np.float64))
    return np.array(rows, dtype=np.float64).reshape(-1, width)


def loop_fill_backward(
    d_out: np.ndarray,
    edge_attr: np.ndarray,
    edge_index: np.ndarray,
    num_nodes: int,
    fill_value: Any,
) -> np.ndarray:
    """``d_edge_attr (E, D)`` from ``d_out (E' + N, D)``; a dropped loop's row stays zero."""
    kept = _kept_edges(edge_index)
    width = edge_attr.shape[1]
    d_edge_attr = np.zeros_like(edge_attr)
    for row, (e, _) in enumerate(kept):
        d_edge_attr[e] += d_out[row]
    if not isinstance(fill_value, str):
        return d_edge_attr  # a constant: no gradient
    for v in range(num_nodes):
        d_fill = d_out[len(kept) + v]
        incoming = _incoming(kept, v)
        for j in range(width):
            column = [edge_attr[e, j] for e in incoming]
            for i, e in enumerate(incoming):
                if fill_value in ("add", "sum"):
                    d_edge_attr[e, j] += d_fill[j]
                elif fill_value == "mean":
                    d_edge_attr[e, j] += d_fill[j] / len(incoming)
                elif fill_value in ("max", "min"):
                    extreme = max(column) if fill_value == "max" else min(column)
                    if column[i] == extreme:
                        d_edge_attr[e, j] += d_fill[j] / column.count(extreme)
                else:  # "mul": the product of the other factors
                    d_edge_attr[e, j] += d_fill[j] * np.prod(column[:i] + column[i + 1 :])
    return d_edge_attr
