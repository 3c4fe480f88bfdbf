"""Pieces shared by the attention layers: row-wise softmax, boundary checks, projections.

Private to the attention layers: :mod:`refimpl.nn.attention` and its blocks
(:mod:`refimpl.nn.linear_score_attention`, :mod:`refimpl.nn.transformer_attention`) use
the softmax and the checks; :mod:`refimpl.nn.transformer_conv` and
:mod:`refimpl.nn.nodeformer` (and through it :mod:`refimpl.nn.nodeformer_edge_loss`)
use the query/key/value projections ``y = x W^T + b`` (``W_{name} (out, in)``,
``b_{name} (out,)``) and their adjoint.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refimpl.backend import get_array_module
from refimpl.validation import (
    check_array,
    check_input,
    check_params,
    check_positive_int,
    check_same_dtype,
)

__all__ = [
    "check_alpha",
    "check_normalization",
    "check_tangent",
    "check_with_params",
    "check_x",
    "glorot",
    "positive_int",
    "project",
    "project_backward",
    "softmax_rows",
    "softmax_rows_derivative",
]


def softmax_rows(scores: Any) -> Any:
    """Row-wise softmax (Eq. 3), shifted by the row max for stability (m, n)."""
    xp = get_array_module(scores)
    exp = xp.exp(scores - xp.max(scores, axis=1, keepdims=True))
    return exp / xp.sum(exp, axis=1, keepdims=True)


def softmax_rows_derivative(probabilities: Any, d: Any) -> Any:
    """``(diag(p) - p p^T) d`` per row: the jvp and (the Jacobian being symmetric) the vjp."""
    xp = get_array_module(d)
    return probabilities * (d - xp.sum(probabilities * d, axis=1, keepdims=True))


def positive_int(owner: str, name: str, value: Any) -> None:
    """:func:`refimpl.validation.check_positive_int` for ``owner``'s field ``name``."""
    check_positive_int(value, f"{owner} {name}")


def project(params: dict[str, Any], name: str, x: Any, bias: bool) -> Any:
    """``x W_{name}^T (+ b_{name} with bias)``: (N, in) -> (N, out)."""
    y = x @ params[f"W_{name}"].T
    if bias:
        y += params[f"b_{name}"]  # in place: y is new (a second (N, out) array costs a pass)
    return y


def project_backward(
    params: dict[str, Any],
    x: Any,
    d_heads: dict[str, Any],
    d_params: dict[str, Any],
    width: int,
    bias: bool,
    input_grad: bool = True,
    d_x: Any = None,
) -> Any:
    """Adjoint of :func:`project` for each ``d_heads[name]`` (N, ..., reshaped to (N, width)).

    Fills ``d_params`` with ``W_{name}`` (and ``b_{name}`` with ``bias``) and returns
    ``d_x (N, in)``: the given ``d_x`` (None: nothing yet) plus, with ``input_grad``, each
    projection's term, added in the order of ``d_heads`` (the order fixes the rounding).
    """
    n, owned = x.shape[0], False
    for name, d_head in d_heads.items():
        d_y = d_head.reshape(n, width)  # (N, out)
        d_params[f"W_{name}"] = d_y.T @ x  # (out, N) @ (N, in)
        if bias:
            d_params[f"b_{name}"] = d_y.sum(axis=0)
        if input_grad:
            term = d_y @ params[f"W_{name}"]  # (N, out) @ (out, in)
            if d_x is None:
                d_x, owned = term, True
            elif owned:
                d_x += term  # in place into an array made here
            else:
                d_x, owned = d_x + term, True  # the caller's d_x is not written to
    return d_x


def check_normalization(owner: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(
            f"{owner} normalization must be one of {', '.join(map(repr, allowed))}, got {value!r}"
        )


def check_alpha(owner: str, alpha: Any) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise ValueError(f"{owner} alpha must be a real number >= 0, got {alpha!r}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(
            f"{owner} alpha must be finite and >= 0 (LipschitzNorm Eq. 15), got {alpha}"
        )


def check_x(x: Any, rows: int, owner: str) -> Any:
    """``x`` is a finite float ``(rows, n)`` array with ``n >= 1``; returns its module."""
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) == 2 and shape[0] != rows and shape[1] == rows:
        raise ValueError(
            f"{owner}: x has shape {tuple(shape)} but must be ({rows}, n): the input vectors "
            "are the columns of x (LipschitzNorm Sec. 3.3); pass x.T"
        )
    xp = check_input(x, "x", shape=(rows, None))
    if x.shape[1] == 0:
        raise ValueError(f"{owner}: x has no columns; attention needs n >= 1 input vectors")
    return xp


def check_with_params(params: Any, shapes: dict, owner: str, x: Any, rows: int) -> Any:
    check_params(params, shapes, owner)
    xp = check_x(x, rows, owner)
    get_array_module(x, *params.values())  # TypeError if x and params are on two backends
    check_same_dtype(params, x, "x")
    return xp


def check_tangent(d_x: Any, x: Any) -> None:
    check_array(d_x, "d_x", shape=tuple(x.shape))
    if d_x.dtype != x.dtype:
        raise TypeError(f"d_x has dtype {d_x.dtype} but the forward ran in {x.dtype}; cast d_x")
    get_array_module(d_x, x)  # TypeError if on another backend


def glorot(rng: np.random.Generator, shape: tuple, fan: tuple) -> np.ndarray:
    bound = math.sqrt(6.0 / (fan[0] + fan[1]))
    return rng.uniform(-bound, bound, size=shape)
