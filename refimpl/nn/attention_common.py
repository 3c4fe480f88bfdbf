"""Pieces shared by the attention layers: row-wise softmax, boundary checks, projections.

Private to the attention layers: :mod:`refimpl.nn.lipschitz.multi_head_attention` and its blocks
(:mod:`refimpl.nn.lipschitz.linear_score_attention`,
:mod:`refimpl.nn.lipschitz.transformer_score_attention`) use
the softmax and the checks; :mod:`refimpl.nn.transformer.transformer_conv` and
:mod:`refimpl.nn.nodeformer.conv` (and through it :mod:`refimpl.nn.nodeformer.edge_loss`)
use the query/key/value projections ``y = x W^T + b`` (``W_{name} (out, in)``,
``b_{name} (out,)``) and their adjoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from refimpl.backend import get_array_module
from refimpl.fields import check_positive_int
from refimpl.ops.linear import affine_maps, affine_maps_backward
from refimpl.validation import check_array, check_input, check_params, check_same_dtype

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
    """Row-wise softmax (LipschitzNorm Eq. 3), shifted by the row max for stability (m, n).

    Parameters
    ----------
    scores : array, (m, n)
        The scores; each row is normalised over its ``n`` entries.
    """
    xp = get_array_module(scores)
    exp = xp.exp(scores - xp.max(scores, axis=1, keepdims=True))
    return exp / xp.sum(exp, axis=1, keepdims=True)


def softmax_rows_derivative(probabilities: Any, d: Any) -> Any:
    """``(diag(p) - p p^T) d`` per row: the jvp and (the Jacobian being symmetric) the vjp.

    Parameters
    ----------
    probabilities : array, (m, n)
        ``p``, the softmax's output.
    d : array, (m, n)
        The tangent (jvp) or the cotangent (vjp).
    """
    xp = get_array_module(d)
    return probabilities * (d - xp.sum(probabilities * d, axis=1, keepdims=True))


def positive_int(owner: str, name: str, value: Any) -> None:
    """:func:`refimpl.fields.check_positive_int` for ``owner``'s field ``name``.

    Parameters
    ----------
    owner : str
        The class named in the message.
    name : str
        The field's name.
    value : object
        Its value.
    """
    check_positive_int(value, f"{owner} {name}")


def project(
    params: dict[str, Any], names: Sequence[str], x: Any, bias: bool, factors: Sequence[float] = ()
) -> list[Any]:
    """``[f (x W_{name}^T + b_{name}) for each name]`` (``b`` with ``bias``; ``f`` from
    ``factors``, 1 where not given): (N, in) -> [(N, out)], by :func:`affine_maps` with
    ``f W`` and ``f b`` (the factor costs no pass over the rows).

    Parameters
    ----------
    params : dict
        Holds ``W_{name}`` (out, in) and, with ``bias``, ``b_{name}`` (out,).
    names : sequence of str
        The maps, e.g. ``"qkv"``.
    x : array, (N, in)
        The input.
    bias : bool
        Add the biases.
    factors : sequence of float, default ()
        ``f`` per map, 1 where not given.
    """
    maps = _scaled_maps(names, factors)
    weights = [_scaled(params[f"W_{name}"], f) for name, f in maps]
    biases = [_scaled(params[f"b_{name}"], f) for name, f in maps] if bias else None
    return affine_maps(x, weights, biases)


def project_backward(
    params: dict[str, Any],
    names: Sequence[str],
    x: Any,
    d_ys: Sequence[Any],
    d_params: dict[str, Any],
    bias: bool,
    input_grad: bool = True,
    factors: Sequence[float] = (),
) -> Any:
    """Adjoint of :func:`project` for ``d_ys[i]`` (N, ..., reshaped to (N, out)): fills
    ``d_params`` with ``W_{name}`` (and ``b_{name}`` with ``bias``) and returns ``d_x (N,
    in)`` (None without ``input_grad``). With the factor ``f``: ``d_W = f d_y^T x``, ``d_b =
    f sum(d_y)``, ``d_x = sum_i d_y_i (f_i W_i)``.

    Parameters
    ----------
    params, names, x, bias, factors
        As given to :func:`project`.
    d_ys : sequence of array
        The gradient of each output, ``(N, ...)``.
    d_params : dict
        Filled in place with the maps' gradients.
    input_grad : bool, default True
        Compute ``d_x``.
    """
    maps = _scaled_maps(names, factors)
    weights = [_scaled(params[f"W_{name}"], f) for name, f in maps]
    # (N, out), the width spelled out: -1 cannot be resolved for N = 0 (the empty graph)
    flat = [d_y.reshape(d_y.shape[0], math.prod(d_y.shape[1:])) for d_y in d_ys]
    d_x, d_weights, d_biases = affine_maps_backward(x, weights, flat, bias, input_grad)
    for i, (name, f) in enumerate(maps):
        d_params[f"W_{name}"] = _scaled(d_weights[i], f)
        if bias:
            d_params[f"b_{name}"] = _scaled(d_biases[i], f)
    return d_x


def _scaled_maps(names: Sequence[str], factors: Sequence[float]) -> list[tuple[str, float]]:
    """``(name, factor)`` per map, the factor 1 where ``factors`` runs out."""
    padded = [*factors, *[1.0] * (len(names) - len(factors))]
    return list(zip(names, padded, strict=True))


def _scaled(array: Any, factor: float) -> Any:
    """``factor * array`` (small: a weight or its gradient); the array itself for 1."""
    return array if factor == 1.0 else factor * array


def check_normalization(owner: str, value: Any, allowed: tuple) -> None:
    """Raise a ValueError naming ``owner`` unless ``value`` is one of ``allowed``.

    Parameters
    ----------
    owner : str
        The class named in the message.
    value : object
        The ``normalization`` given.
    allowed : tuple
        The accepted values.
    """
    if value not in allowed:
        raise ValueError(
            f"{owner} normalization must be one of {', '.join(map(repr, allowed))}, got {value!r}"
        )


def check_alpha(owner: str, alpha: Any) -> None:
    """Raise a ValueError naming ``owner`` unless ``alpha`` is a finite real ``>= 0``.

    Parameters
    ----------
    owner : str
        The class named in the message.
    alpha : object
        Eq. 15's bound as given.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise ValueError(f"{owner} alpha must be a real number >= 0, got {alpha!r}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(
            f"{owner} alpha must be finite and >= 0 (LipschitzNorm Eq. 15), got {alpha}"
        )


def check_x(x: Any, rows: int, owner: str) -> Any:
    """``x`` is a finite float ``(rows, n)`` array with ``n >= 1``; returns its module.

    Parameters
    ----------
    x : array, (rows, n)
        The input, one vector per column.
    rows : int
        The rows it must have.
    owner : str
        The class named in the messages.
    """
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
    """``params`` as ``shapes`` says and ``x`` as :func:`check_x`, on one backend and dtype;
    returns the array module.

    Parameters
    ----------
    params : dict
        The block's parameters.
    shapes : dict
        Their names and shapes (``param_shapes()``).
    owner : str
        The class named in the messages.
    x : array, (rows, n)
        The input.
    rows : int
        The rows ``x`` must have.
    """
    check_params(params, shapes, owner)
    xp = check_x(x, rows, owner)
    get_array_module(x, *params.values())  # TypeError if x and params are on two backends
    check_same_dtype(params, x, "x")
    return xp


def check_tangent(d_x: Any, x: Any) -> None:
    """A jvp's tangent ``d_x``: an array of ``x``'s shape, dtype and backend.

    Parameters
    ----------
    d_x : array
        The tangent.
    x : array
        The forward's input.
    """
    check_array(d_x, "d_x", shape=tuple(x.shape))
    if d_x.dtype != x.dtype:
        raise TypeError(f"d_x has dtype {d_x.dtype} but the forward ran in {x.dtype}; cast d_x")
    get_array_module(d_x, x)  # TypeError if on another backend


def glorot(rng: np.random.Generator, shape: tuple, fan: tuple) -> np.ndarray:
    """Glorot-uniform draws on the host: ``U(-b, b)``, ``b = sqrt(6 / (fan[0] + fan[1]))``.

    Parameters
    ----------
    rng : numpy.random.Generator
        The generator drawn from.
    shape : tuple of int
        The array's shape.
    fan : (int, int)
        The two sizes the bound is taken from (``(out, in)`` of a weight).
    """
    bound = math.sqrt(6.0 / (fan[0] + fan[1]))
    return rng.uniform(-bound, bound, size=shape)
