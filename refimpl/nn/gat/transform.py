"""``GATConv``'s feature transforms, step F1, and their backward, B1: each side's ``W x (+ b)``.

The *sources* ``u`` of the edges give the messages and the score's source half, the
*targets* ``v`` the score's target half. Which weight each side reads (PyG's names):

| layer | sources: ``h_src`` | targets: ``h_dst`` |
| --- | --- | --- |
| v1, ``in_channels`` an int | ``W x`` (lin) | ``W x`` (lin) |
| v1, ``in_channels`` a pair | ``W_s x`` (lin_src) | ``W_t x`` (lin_dst) |
| v2 with ``share_weights`` | ``W_s x + b_s`` (lin_l) | ``W_s x + b_s`` (lin_r) |
| v2 | ``W_s x + b_s`` (lin_l) | ``W_t x + b_t`` (lin_r) |

(``b_s``, ``b_t`` with ``projection_bias``.) The input is one array ``x (N, F)``, which both
sides read, or a pair ``(x_src (N_src, F_src), x_dst (N_dst, F_dst))`` on a bipartite graph
(PyG's ``x = (x_src, x_dst)``): the sources read ``x_src``, the targets ``x_dst``. Either
may be a sparse CSR matrix (sparse input features): ``W x`` and ``d_h^T x`` then run over
its stored values.

    F1  h_src = x_src W_src^T (+ b_src),  h_dst = x_dst W_dst^T (+ b_dst)      (N, H, C)
    B1  d W_side = d_h_side^T x_side,  d b_side = sum over nodes of d_h_side,
        d x_side = d_h_side W_side  (a weight both sides read sums both terms)

Where both sides read one array through one map, ``h_dst`` *is* ``h_src`` (one product), and
the score's backward returns both ends' gradients in ``d_h_src`` (``d_h_dst`` None).
"""

from __future__ import annotations

from typing import Any

from refimpl.ops.linear import weight_gradient

__all__ = ["input_sides", "side_maps", "transform", "transform_backward"]


def input_sides(x: Any) -> tuple[Any, Any]:
    """``(x_src, x_dst)``: the pair as given, or one array for both (the same object).

    Parameters
    ----------
    x : array or (array, array)
        ``GATConv.forward``'s input: ``(N, F)``, or ``(x_src, x_dst)`` on a bipartite graph.
    """
    return (x[0], x[1]) if isinstance(x, tuple) else (x, x)


def side_maps(conv: Any) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
    """``((weight, bias), (weight, bias))`` of the sources and the targets: parameter names,
    the bias None without ``projection_bias``.

    Parameters
    ----------
    conv : GATConv
        The layer (its ``version``, ``in_channels``, ``share_weights``, ``projection_bias``).
    """
    if conv.version == "v1":
        if isinstance(conv.in_channels, tuple):
            return ("W_s", None), ("W_t", None)
        return ("W", None), ("W", None)
    bias = ("b_s", "b_t") if conv.projection_bias else (None, None)
    if conv.share_weights:
        return ("W_s", bias[0]), ("W_s", bias[0])
    return ("W_s", bias[0]), ("W_t", bias[1])


def transform(conv: Any, params: dict[str, Any], x_src: Any, x_dst: Any) -> tuple[Any, Any]:
    """F1: ``(h_src (N_src, H, C), h_dst (N_dst, H, C))``; ``h_dst is h_src`` where one array
    goes through one map.

    Parameters
    ----------
    conv : GATConv
        The layer.
    params : dict
        Its parameters (the maps of :func:`side_maps`).
    x_src, x_dst : array or sparse CSR matrix, (N_src, F_src) and (N_dst, F_dst)
        The sources' and the targets' features (:func:`input_sides`).
    """
    source, target = side_maps(conv)
    h_src = _affine(conv, params, x_src, *source)
    if x_dst is x_src and target == source:
        return h_src, h_src
    return h_src, _affine(conv, params, x_dst, *target)


def transform_backward(
    conv: Any,
    params: dict[str, Any],
    x_src: Any,
    x_dst: Any,
    d_h_src: Any,
    d_h_dst: Any,
    d_params: dict[str, Any],
    input_grad: bool,
) -> tuple[Any, Any]:
    """B1: fills ``d_params`` with the maps' gradients; returns ``(d_x_src, d_x_dst)``, or
    ``(d_x, None)`` where one array was given (both sides' terms summed), or ``(None,
    None)`` without ``input_grad``. ``d_h_dst`` None: both ends' gradients are in
    ``d_h_src`` (``h_dst is h_src``).

    Parameters
    ----------
    conv : GATConv
        The layer.
    params : dict
        Its parameters.
    x_src, x_dst : array or sparse CSR matrix, (N_src, F_src) and (N_dst, F_dst)
        As given to :func:`transform`.
    d_h_src : array, (N_src, H, C)
        The gradient of ``h_src``.
    d_h_dst : array, (N_dst, H, C), or None
        The gradient of ``h_dst``; None where ``d_h_src`` holds both ends'.
    d_params : dict
        Filled in place: the maps' gradients, added to what it holds.
    input_grad : bool
        Compute the gradients of ``x_src`` and ``x_dst``.
    """
    source, target = side_maps(conv)
    same_input = x_dst is x_src
    d_h_src = _flat(d_h_src)
    if d_h_dst is not None:
        d_h_dst = _flat(d_h_dst)
        if same_input and target == source:  # one map of one array: one product
            d_h_src, d_h_dst = d_h_src + d_h_dst, None
    sides = [(source, x_src, d_h_src)]
    if d_h_dst is not None:
        sides.append((target, x_dst, d_h_dst))
    for (weight, bias), x_side, d_h in sides:
        _accumulate(d_params, weight, weight_gradient(d_h, x_side))  # d_h^T x, x maybe sparse
        if bias is not None:
            _accumulate(d_params, bias, d_h.sum(axis=0))
    if not input_grad:
        return None, None
    d_x = [d_h @ params[weight] for (weight, _), _, d_h in sides]
    if same_input:
        return (d_x[0] if len(d_x) == 1 else d_x[0] + d_x[1]), None
    return d_x[0], d_x[1]


def _affine(conv: Any, params: dict[str, Any], x: Any, weight: str, bias: str | None) -> Any:
    h = x @ params[weight].T  # (N, H*C)
    if bias is not None:
        h += params[bias]
    return h.reshape(x.shape[0], conv.heads, conv.out_channels)


def _flat(d_h: Any) -> Any:
    """(N, H, C) -> (N, H*C), the width spelled out (N may be 0)."""
    return d_h.reshape(d_h.shape[0], d_h.shape[1] * d_h.shape[2])


def _accumulate(d_params: dict[str, Any], name: str, value: Any) -> None:
    d_params[name] = d_params[name] + value if name in d_params else value
