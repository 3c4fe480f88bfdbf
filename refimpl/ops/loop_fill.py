"""Edge features for the self-loops a layer adds: PyG's ``add_self_loops(..., fill_value)``.

A GAT layer with ``add_self_loops`` and edge features drops the graph's self-loops with their
features, appends one loop per node, and gives loop ``(v, v)`` the features ``fill[v]`` (D,),
computed from the features of the remaining edges into ``v`` (PyG ``compute_loop_attr``):

| ``fill_value``       | ``fill[v]``                           | node without incoming edges |
| -------------------- | ------------------------------------- | --------------------------- |
| a number ``c``       | ``c`` in every feature                | ``c``                       |
| ``D`` numbers        | those numbers                         | those numbers               |
| ``None``             | ones                                  | ones                        |
| ``"add"``, ``"sum"`` | ``sum_{e -> v} a_e``                  | 0                           |
| ``"mean"``           | ``sum_{e -> v} a_e / |N(v)|``         | 0                           |
| ``"max"``, ``"min"`` | featurewise max / min over ``e -> v`` | 0                           |
| ``"mul"``            | featurewise product over ``e -> v``   | 1                           |

The fill is a function of ``edge_attr``, so its gradient flows back into the features of the
edges it read. Forward and backward side by side (``A`` the features of the non-loop edges,
``S`` the sum over each target's edges, ``G`` its adjoint, the gather to edges):

    F1  A = edge_attr[non-loop edges]                               (E', D)
    F2  fill = reduce over each target's edges of A                 (N, D)
    F3  out = [A; fill]                                             (E' + N, D)

    B3  d_A = d_out[:E'],  d_fill = d_out[E':]
    B2  add: G(d_fill);  mean: G(d_fill / max(|N(v)|, 1));
        max / min: G(d_fill / t) on the edges attaining the extreme, ``t`` of them: ties share
        the gradient equally, as torch's ``scatter_reduce`` does (a valid subgradient);
        mul: ``G(d_fill) * prod of the other factors``, exact with zeros among them
    B1  d_edge_attr = d_A at the non-loop edges, 0 at the dropped loops

The product is multiplied out directly, factor by factor in edge order, as torch's
``scatter_reduce(..., "prod")`` does on the CPU: one factor gives itself bit for bit, and
several the same rounded product as torch. The cache keeps the product of the non-zero factors
and the count of zeros, so the backward divides only by non-zero factors and gives a lone zero
the exact product of the others. On NumPy and the strict stand-in it is one
``multiply.reduceat`` over the features grouped by target; CuPy's ``reduceat`` adds only, so
there it goes by rank: the ``k``-th factor of every target that has one, ``k = 0, 1, ...``,
one vectorised step per rank up to the largest in-degree (the same products, in the same
order). Constant fills pass no gradient. Without ``add_self_loops`` the layer reads
``edge_attr`` as given and this module is not involved.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module
from refimpl.graph import Graph
from refimpl.kernels.segment import Segments, gather, segment_max, segment_sum

__all__ = [
    "FILL_REDUCTIONS",
    "LoopFillCache",
    "check_fill_value",
    "fill_self_loops",
    "fill_self_loops_backward",
]

FILL_REDUCTIONS = ("mean", "add", "sum", "max", "min", "mul")


class LoopFillCache(NamedTuple):
    """What :func:`fill_self_loops_backward` reads.

    Attributes
    ----------
    fill_value : float, tuple of float, str or None
        As configured (:func:`check_fill_value`).
    kept : array
        ``(E,)`` bool over the input's edges: not a self-loop.
    non_loops : Segments
        The kept edges grouped by target.
    features : array
        ``(E', D)``, their features, ``A``.
    fill : array
        ``(N, D)``, the loops' features.
    product_of_nonzeros : array or None
        ``"mul"``: ``(N, D)``, the product over the non-zero factors; else None.
    zeros : array or None
        ``"mul"``: ``(N, D)``, how many factors are zero; else None.
    """

    fill_value: Any
    kept: Any
    non_loops: Segments
    features: Any
    fill: Any
    product_of_nonzeros: Any
    zeros: Any


def check_fill_value(fill_value: Any, edge_dim: int | None) -> Any:
    """``fill_value`` as the layer stores it; a ValueError names what is wrong.

    Parameters
    ----------
    fill_value : float, sequence of float, str or None
        A number, ``edge_dim`` numbers, None (ones) or a reduction of ``FILL_REDUCTIONS``
        (module docstring). Numbers may come as any array (a NumPy array, a torch tensor:
        PyG's ``fill_value`` may be a ``Tensor``); finite, in float64's range.
    edge_dim : int or None
        The layer's edge feature width, which a sequence of numbers must match; None: not
        checked.

    Returns
    -------
    float, tuple of float, str or None
        A float, a tuple of ``edge_dim`` floats, the reduction's name, or None.
    """
    if fill_value is None or (isinstance(fill_value, str) and fill_value in FILL_REDUCTIONS):
        return fill_value
    shown = " ".join(repr(fill_value).split())  # one line, however the value prints
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    if isinstance(fill_value, str):
        raise ValueError(
            f"fill_value must be a number, {edge_dim or 'edge_dim'} numbers, None or one of "
            f"{', '.join(map(repr, FILL_REDUCTIONS))}, got {shown}"
        )
    if isinstance(fill_value, bool):
        raise ValueError(f"fill_value must be a number, not a bool, got {fill_value!r}")
    values = _as_floats(fill_value)
    if values is None or values.ndim > 1 or not np.all(np.isfinite(values)):
        raise ValueError(
            f"fill_value must be finite numbers in float64's range (a scalar or (edge_dim,)), "
            f"got {shown}"
        )
    if values.ndim == 0:
        return float(values)
    if edge_dim is not None and values.shape[0] != edge_dim:
        raise ValueError(
            f"fill_value has {values.shape[0]} numbers but edge_dim is {edge_dim}: give one per "
            "edge feature, or one number for all"
        )
    return tuple(float(v) for v in values)


def _as_floats(value: Any) -> np.ndarray | None:
    """``value`` as a float64 array, or None where it is no number (or overflows float64:
    ``10**400`` raises OverflowError, not ValueError)."""
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return None


def fill_self_loops(edge_attr: Any, graph: Graph, fill_value: Any) -> tuple[Any, LoopFillCache]:
    """The edge features over ``graph.remove_self_loops().add_self_loops()``'s edges (F1-F3).

    A bipartite graph's loops are its first ``min(N_src, N_dst)`` targets', as PyG's.

    Parameters
    ----------
    edge_attr : array
        ``(E, D)``, features over ``graph``'s edges.
    graph : Graph
        The layer's graph; its own self-loops, if any, are dropped.
    fill_value : float, tuple of float, str or None
        As :func:`check_fill_value` returns it.

    Returns
    -------
    tuple
        ``(out, cache)``: ``out`` ``(E' + N, D)``, the kept edges' features then one row per
        loop, and a :class:`LoopFillCache`.
    """
    xp = get_array_module(edge_attr)
    num_nodes, width = min(graph.num_nodes, graph.num_dst_nodes), edge_attr.shape[1]
    # F1 the non-loop edges' features (E', D)
    edge_index = graph.edge_index_on(xp)
    kept = edge_index[0] != edge_index[1]  # (E,)
    features = edge_attr[kept]
    non_loops = graph.remove_self_loops().dst_segments(xp)
    # F2 the loops' features (N, D)
    product_of_nonzeros = zeros = None
    if fill_value is None or not isinstance(fill_value, str):
        constant = 1.0 if fill_value is None else fill_value
        fill = xp.broadcast_to(xp.asarray(constant, dtype=edge_attr.dtype), (num_nodes, width))
    elif fill_value in ("add", "sum"):
        fill = segment_sum(features, non_loops)
    elif fill_value == "mean":
        fill = segment_sum(features, non_loops) / _edges_per_target(non_loops, features)
    elif fill_value == "max":
        fill = segment_max(features, non_loops)[0]  # 0 for a node without incoming edges
    elif fill_value == "min":
        fill = -segment_max(-features, non_loops)[0]
    else:  # "mul"
        product_of_nonzeros, zeros = _product_parts(features, non_loops)
        fill = xp.where(zeros > 0, 0.0, product_of_nonzeros).astype(edge_attr.dtype, copy=False)
    # F3 the kept features, then one row per loop (E' + N, D)
    out = xp.concatenate([features, fill[:num_nodes]], axis=0)
    return out, LoopFillCache(
        fill_value, kept, non_loops, features, fill, product_of_nonzeros, zeros
    )


def fill_self_loops_backward(cache: LoopFillCache, d_out: Any) -> Any:
    """Adjoint of :func:`fill_self_loops` (B3-B1).

    Parameters
    ----------
    cache : LoopFillCache
        From :func:`fill_self_loops`.
    d_out : array
        ``(E' + N, D)``, the cotangent of its output.

    Returns
    -------
    array
        ``d_edge_attr``, ``(E, D)``: zero at the dropped self-loops.
    """
    xp = get_array_module(d_out)
    features, non_loops, fill_value = cache.features, cache.non_loops, cache.fill_value
    # B3 the kept rows, and the loops' rows
    d_features = d_out[: features.shape[0]]
    d_fill = xp.zeros((non_loops.num_segments, d_out.shape[1]), dtype=d_out.dtype)  # (N_dst, D)
    d_fill[: d_out.shape[0] - features.shape[0]] = d_out[features.shape[0] :]  # the loops
    # B2 through the reduction (constant fills pass nothing)
    if isinstance(fill_value, str):
        if fill_value in ("add", "sum"):
            d_features = d_features + gather(d_fill, non_loops)
        elif fill_value == "mean":
            d_features = d_features + gather(d_fill / _edges_per_target(non_loops, features),
                                             non_loops)  # fmt: skip
        elif fill_value in ("max", "min"):
            attains = features == gather(cache.fill, non_loops)  # (E', D)
            ties = segment_sum(attains.astype(d_out.dtype), non_loops)  # (N, D)
            share = d_fill / xp.maximum(ties, 1)
            d_features = d_features + xp.where(attains, gather(share, non_loops), 0)
        else:  # "mul": d a_e = d_fill * (the product of the other factors)
            d_edges = gather(d_fill * cache.product_of_nonzeros, non_loops)  # (E', D)
            zeros = gather(cache.zeros, non_loops)
            nonzero = features != 0
            others = xp.where(
                zeros == 0,
                d_edges / xp.where(nonzero, features, 1),  # no zero: the product over a_e
                xp.where((zeros == 1) & ~nonzero, d_edges, 0),  # the one zero gets the rest
            )
            d_features = d_features + others
    # B1 back to the input's edges; a dropped self-loop's features get no gradient
    d_edge_attr = xp.zeros((cache.kept.shape[0], d_out.shape[1]), dtype=d_out.dtype)
    d_edge_attr[cache.kept] = d_features
    return d_edge_attr


def _edges_per_target(non_loops: Segments, like: Any) -> Any:
    """``max(|N(v)|, 1)`` as a column ``(N, 1)`` in ``like``'s dtype (PyG's clamp)."""
    xp = non_loops.xp
    return xp.maximum(non_loops.counts(), 1).astype(like.dtype)[:, None]


def _product_parts(features: Any, non_loops: Segments) -> tuple[Any, Any]:
    """``(product of the non-zero factors (N, D), number of zero factors (N, D))`` per
    target, the product in edge order (:func:`_segment_product`); 1 and 0 for no factors."""
    nonzero = features != 0
    product = _segment_product(non_loops.xp.where(nonzero, features, 1), non_loops)
    zeros = segment_sum((~nonzero).astype(features.dtype), non_loops)
    return product, zeros


def _segment_product(values: Any, segments: Segments, by_rank: bool | None = None) -> Any:
    """``values (E, D)`` multiplied over each segment's items in item order, left to right:
    ``(N, D)``, 1 for an empty segment. ``by_rank`` (default: on CuPy alone) takes the route
    by rank instead of ``multiply.reduceat`` (module docstring); both give the same bits."""
    xp = segments.xp
    order, indptr = segments.csr_structure()  # items grouped by segment, in item order
    counts = indptr[1:] - indptr[:-1]  # (N,)
    product = xp.ones((segments.num_segments, values.shape[1]), dtype=values.dtype)
    if segments.num_items == 0:
        return product
    grouped = values[order]  # (E, D) segment by segment
    if not (segments.backend == "cupy" if by_rank is None else by_rank):
        filled = counts > 0  # reduceat would give an empty segment its next item
        product[filled] = xp.multiply.reduceat(grouped, indptr[:-1][filled], axis=0)
        return product
    ranked = xp.argsort(-counts)  # (N,) most factors first: those with a k-th are a prefix
    starts = indptr[:-1][ranked]  # (N,)
    histogram = xp.bincount(counts, minlength=int(counts.max()) + 1)  # (max + 1,)
    having = (segments.num_segments - xp.cumsum(histogram)[:-1]).tolist()  # > k factors
    for k, size in enumerate(having):  # one step per rank, not per node or edge
        product[ranked[:size]] *= grouped[starts[:size] + k]
    return product
