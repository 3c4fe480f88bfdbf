"""Elementwise activations (ReLU, LeakyReLU, ELU, identity), each a forward/backward pair.

Kinks follow PyTorch's autograd exactly, so gradients can be compared entry by
entry with a PyTorch model even where an input lands on the kink:

| block        | derivative for x > 0 | derivative for x <= 0 (incl. 0) |
| ------------ | -------------------- | ------------------------------- |
| ReLU         | 1                    | 0                               |
| LeakyReLU(s) | 1                    | s                               |
| ELU(a)       | 1                    | ``a * exp(x)`` (so ``a`` at 0)  |
| Identity     | 1                    | 1                               |

``-0.0`` counts as 0 (it is not ``> 0``). Parameter-free: ``params`` is ignored
(pass ``{}``) and ``d_params`` is ``{}``.

Plain functions for layers that call them on values they have already validated:
``leaky_relu`` and its backward, ``select_by_mask`` and ``sigmoid`` (overflow-free;
its derivative ``s (1 - s)`` is written where it is used).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.validation import check_cotangent, check_input

__all__ = [
    "ACTIVATIONS",
    "ELU",
    "ELUCache",
    "Identity",
    "IdentityCache",
    "LeakyReLU",
    "ReLU",
    "SignCache",
    "get_activation",
    "leaky_relu",
    "leaky_relu_backward",
    "negative_part",
    "positive_part",
    "select_by_mask",
    "sigmoid",
]


class SignCache(NamedTuple):
    """ReLU / LeakyReLU: which entries lie strictly right of the kink.

    Attributes
    ----------
    positive : array
        ``(*S,)`` bool, ``x > 0``.
    dtype : dtype
        ``x``'s, to validate the cotangent.
    """

    positive: Any
    dtype: Any


class ELUCache(NamedTuple):
    """ELU: the input itself (its backward needs ``exp(x)``, not only the sign).

    Attributes
    ----------
    x : array
        ``(*S,)``, the input.
    """

    x: Any


class IdentityCache(NamedTuple):
    """Identity: only the shape and dtype, to validate the cotangent.

    Attributes
    ----------
    shape : tuple of int
        The input's shape.
    dtype : dtype
        The input's dtype.
    """

    shape: tuple[int, ...]
    dtype: Any


@dataclass(frozen=True)
class ReLU:
    """``relu(x) = max(x, 0)`` elementwise, any shape.

    Cache: :class:`SignCache` (``x > 0``). Kink: ``relu'(0) = 0`` (PyTorch's
    ``threshold_backward``). PyTorch parity: ``torch.relu``.
    """

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, SignCache]:
        check_input(x)
        positive = x > 0  # (*S,) bool
        return positive_part(x), SignCache(positive, x.dtype)

    def backward(
        self, params: dict[str, Any], cache: SignCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        check_cotangent(d_y, cache.positive.shape, cache.dtype, cache.positive)
        return d_y * cache.positive, {}  # bool factor: dtype kept


@dataclass(frozen=True)
class LeakyReLU:
    """``x`` for ``x > 0``, ``negative_slope * x`` otherwise, elementwise.

    Cache: :class:`SignCache` (``x > 0``). Kink: the derivative at 0 is
    ``negative_slope`` (1 only for ``x > 0``), as PyTorch's
    ``leaky_relu_backward``. PyTorch parity: ``torch.nn.functional.leaky_relu``.

    Parameters
    ----------
    negative_slope : float, default 0.01
        The slope for ``x <= 0``, any finite real (PyTorch's default; GAT's attention uses
        0.2).
    """

    negative_slope: float = 0.01  # PyTorch default (GAT's attention uses 0.2)

    def __post_init__(self) -> None:
        _check_real("negative_slope", self.negative_slope)

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, SignCache]:
        check_input(x)
        y, positive = leaky_relu(x, self.negative_slope)
        return y, SignCache(positive, x.dtype)

    def backward(
        self, params: dict[str, Any], cache: SignCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        check_cotangent(d_y, cache.positive.shape, cache.dtype, cache.positive)
        return leaky_relu_backward(cache.positive, d_y, self.negative_slope), {}


@dataclass(frozen=True)
class ELU:
    """``x`` for ``x > 0``, ``alpha * (exp(x) - 1)`` otherwise, elementwise.

    Cache: :class:`ELUCache` (the input). The derivative for ``x <= 0`` is
    ``alpha * exp(x)`` computed from ``x``, not as ``y + alpha`` from the output:
    the latter cancels to 0 for very negative ``x`` (PyTorch's ``elu_backward``
    with ``is_result=False``). ``exp`` only ever sees ``min(x, 0)``, so large
    inputs raise no overflow warning. PyTorch parity: ``torch.nn.functional.elu``.

    Parameters
    ----------
    alpha : float, default 1.0
        The scale for ``x <= 0``, any finite real (PyTorch's default).
    """

    alpha: float = 1.0  # PyTorch default

    def __post_init__(self) -> None:
        _check_real("alpha", self.alpha)

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, ELUCache]:
        xp = check_input(x)
        below = negative_part(x)  # (*S,) min(x, 0)
        xp.expm1(below, out=below)  # expm1: exact near 0
        below *= self.alpha
        y = positive_part(x)
        y += below  # one of the two terms is 0
        return y, ELUCache(x)

    def backward(
        self, params: dict[str, Any], cache: ELUCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        x = cache.x
        xp = check_cotangent(d_y, x.shape, x.dtype, x)
        slope = negative_part(x)  # (*S,) min(x, 0)
        xp.exp(slope, out=slope)
        slope *= self.alpha  # = alpha at x = 0
        return d_y * select_by_mask(x > 0, 1.0, slope, d_y.dtype), {}


@dataclass(frozen=True)
class Identity:
    """``y = x``, returned as is (not a copy; no block mutates its inputs).

    Cache: :class:`IdentityCache` (shape and dtype). PyTorch parity:
    ``torch.nn.Identity``.
    """

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, IdentityCache]:
        check_input(x)
        return x, IdentityCache(tuple(x.shape), x.dtype)

    def backward(
        self, params: dict[str, Any], cache: IdentityCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        check_cotangent(d_y, cache.shape, cache.dtype)
        return d_y, {}


ACTIVATIONS: dict[str, type] = {
    "relu": ReLU,
    "leaky_relu": LeakyReLU,
    "elu": ELU,
    "identity": Identity,
}


def get_activation(name: str, **kwargs: Any) -> ReLU | LeakyReLU | ELU | Identity:
    """The activation registered as ``name``, configured with ``kwargs``.

    ``get_activation("leaky_relu", negative_slope=0.2)``; an unknown name raises
    ``ValueError`` listing the valid ones.

    Parameters
    ----------
    name : {"relu", "leaky_relu", "elu", "identity"}
        The activation.
    **kwargs : Any
        Its configuration (``negative_slope`` of :class:`LeakyReLU`, ``alpha`` of
        :class:`ELU`).

    Returns
    -------
    ReLU, LeakyReLU, ELU or Identity
        The configured activation.
    """
    if not isinstance(name, str) or name not in ACTIVATIONS:  # a list is unhashable
        raise ValueError(
            f"unknown activation {name!r}; valid names are {', '.join(sorted(ACTIVATIONS))}"
        )
    return ACTIVATIONS[name](**kwargs)


def leaky_relu(x: Any, negative_slope: float) -> tuple[Any, Any]:
    """``(LeakyReLU(x), x > 0)`` without input checks: the core of :class:`LeakyReLU`.

    ``max(x, s x)`` for ``s <= 1`` (``min`` for ``s > 1``) is branch-free, where a
    ``where`` over a random sign pattern mispredicts every other element. For layers
    that call it on values they have already validated.

    Parameters
    ----------
    x : array
        Any shape, floating-point.
    negative_slope : float
        The slope for ``x <= 0``.

    Returns
    -------
    tuple of array
        ``(y, positive)``: the activation and the bool mask ``x > 0``, both of ``x``'s shape.
    """
    xp = get_array_module(x)
    pick = xp.maximum if negative_slope <= 1 else xp.minimum
    y = negative_slope * x
    pick(x, y, out=y)  # in place on the fresh product: one allocation less
    return y, x > 0


def leaky_relu_backward(positive: Any, d_y: Any, negative_slope: float) -> Any:
    """``d_y`` times the LeakyReLU derivative (1 where ``x > 0``, else the slope, at 0 too).

    Parameters
    ----------
    positive : array
        Bool, ``x > 0``, as :func:`leaky_relu` returns it.
    d_y : array
        The cotangent of the output, of ``positive``'s shape.
    negative_slope : float
        The forward's slope.

    Returns
    -------
    array
        The cotangent of ``x``, in ``d_y``'s dtype.
    """
    d_x = select_by_mask(positive, 1.0, negative_slope, d_y.dtype)
    d_x *= d_y
    return d_x


def positive_part(x: Any) -> Any:
    """``max(x, 0)`` elementwise (NaN stays NaN), into a fresh zeroed array: NumPy runs
    ``maximum`` with a scalar operand in a loop several times slower than with two arrays.

    Parameters
    ----------
    x : array
        Any shape.

    Returns
    -------
    array
        A new array of ``x``'s shape and dtype.
    """
    xp = get_array_module(x)
    zeros = xp.zeros(x.shape, dtype=x.dtype)
    return xp.maximum(x, zeros, out=zeros)


def negative_part(x: Any) -> Any:
    """``min(x, 0)`` elementwise (NaN stays NaN), as :func:`positive_part`.

    Parameters
    ----------
    x : array
        Any shape.

    Returns
    -------
    array
        A new array of ``x``'s shape and dtype.
    """
    xp = get_array_module(x)
    zeros = xp.zeros(x.shape, dtype=x.dtype)
    return xp.minimum(x, zeros, out=zeros)


def select_by_mask(positive: Any, if_positive: Any, otherwise: Any, dtype: Any) -> Any:
    """``where(positive, if_positive, otherwise)`` by arithmetic, in ``dtype``; broadcasts.

    Branch-free: a ``where`` over a random sign pattern mispredicts every other
    element; these two passes do not branch.

    Parameters
    ----------
    positive : array
        Bool mask.
    if_positive : float or array
        The value where ``positive``; broadcasts against it.
    otherwise : float or array
        The value elsewhere; broadcasts against it.
    dtype : dtype
        The result's dtype.

    Returns
    -------
    array
        A new array of the broadcast shape.
    """
    xp = get_array_module(positive)
    factor = xp.multiply(positive, if_positive - otherwise, dtype=dtype)
    factor += otherwise
    return factor


def sigmoid(z: Any) -> Any:
    """``1 / (1 + exp(-z))`` without overflow: ``exp(-|z|)`` never exceeds 1.

    Parameters
    ----------
    z : array
        Any shape, floating-point.

    Returns
    -------
    array
        Of ``z``'s shape and dtype, in ``[0, 1]``.
    """
    xp = get_array_module(z)
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1 / (1 + e), e / (1 + e))


def _check_real(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
