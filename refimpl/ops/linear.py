"""``Linear``: the affine map ``y = x W^T + b`` with its hand-written backward.

``W`` has shape ``(out, in)`` as in PyTorch and the papers (DESIGN.md, Weights):
row ``W[i, :]`` holds the weights *incoming* to output neuron ``i``, column
``W[:, j]`` the ones *outgoing* from input ``j`` (the rows and columns of
GAT-balance Thm 2.2, Eq. 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module, is_array

__all__ = ["Linear", "LinearCache"]


class LinearCache(NamedTuple):
    """What :meth:`Linear.backward` reads: the input (``W`` comes from ``params``)."""

    x: Any  # (N, in)


@dataclass(frozen=True)
class Linear:
    """Affine map ``y = x W^T + b``, ``(N, in) -> (N, out)``.

    Parameters (``params``)
    -----------------------
    W : (out, in)
        Weights; ``W[i, :]`` are the weights incoming to output ``i``.
    b : (out,)
        Bias; the key is absent when ``bias=False``.

    Cache: :class:`LinearCache` with the input ``x``.

    Edge semantics: ``N = 0`` is allowed (empty output, zero ``d_W``). The dtype
    of ``x`` must equal that of ``W`` and ``b``; nothing is cast silently.

    PyTorch parity: ``torch.nn.functional.linear(x, W, b)`` with the same
    ``(out, in)`` layout. :meth:`init_params` is Glorot/Xavier uniform
    (``torch.nn.init.xavier_uniform_``, gain 1; PyG's ``Linear(...,
    weight_initializer="glorot")``), not ``torch.nn.Linear``'s default
    Kaiming-uniform.
    """

    in_features: int  # fan-in of every output neuron
    out_features: int  # number of output neurons
    bias: bool = True  # add b; PyTorch default

    def __post_init__(self) -> None:
        for name in ("in_features", "out_features"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Linear {name} must be a positive int, got {value!r}")

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Glorot/Xavier uniform ``W ~ U(-a, a)``, ``a = sqrt(6 / (in + out))``, and ``b = 0``.

        Drawn on the host from ``rng`` (so every backend gets the same numbers
        for the same seed), then moved to ``backend`` (the global one if None).
        """
        bound = math.sqrt(6.0 / (self.in_features + self.out_features))
        weight = rng.uniform(-bound, bound, size=(self.out_features, self.in_features))
        params = {"W": asarray(weight.astype(dtype), backend=backend)}  # (out, in)
        if self.bias:
            params["b"] = asarray(np.zeros(self.out_features, dtype=dtype), backend=backend)
        return params

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, LinearCache]:
        """``y = x W^T + b``: x (N, in) -> y (N, out), and the cache."""
        self._check_params(params)
        _check_array("x", x, "(N, in_features)", ndim=2)
        if x.shape[1] != self.in_features:
            raise ValueError(
                f"Linear expects x of shape (N, {self.in_features}), got {tuple(x.shape)}; "
                "the last axis must be in_features"
            )
        weight = params["W"]
        get_array_module(x, *params.values())  # TypeError if x and params live on two backends
        if x.dtype != weight.dtype:
            raise TypeError(
                f"x has dtype {x.dtype} but W has dtype {weight.dtype}; cast x with "
                f"x.astype(W.dtype), or create the parameters with init_params(dtype={x.dtype})"
            )
        _check_finite("x", x)
        y = x @ weight.T  # (N, out)
        if self.bias:
            y = y + params["b"]  # (N, out) + (out,) broadcast over rows
        return y, LinearCache(x)

    def backward(
        self, params: dict[str, Any], cache: LinearCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_y, y>``: ``(d_x (N, in), {"W": (out, in), "b": (out,)})``."""
        x, weight = cache.x, params["W"]
        expected = (x.shape[0], self.out_features)
        _check_cotangent(d_y, expected, x.dtype)
        d_x = d_y @ weight  # (N, out) @ (out, in) -> (N, in)
        d_params = {"W": d_y.T @ x}  # (out, N) @ (N, in) -> (out, in)
        if self.bias:
            d_params["b"] = d_y.sum(axis=0)  # adjoint of broadcast over rows: sum, (out,)
        return d_x, d_params

    def _check_params(self, params: dict[str, Any]) -> None:
        expected = {"W": (self.out_features, self.in_features)}
        if self.bias:
            expected["b"] = (self.out_features,)
        if set(params) != set(expected):
            raise ValueError(
                f"Linear(bias={self.bias}) expects params with keys {sorted(expected)}, got "
                f"{sorted(params)}; create them with Linear.init_params"
            )
        for name, shape in expected.items():
            value = params[name]
            _check_array(name, value, str(shape), ndim=len(shape))
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"Linear({self.in_features}, {self.out_features}) expects {name} of shape "
                    f"{shape}, got {tuple(value.shape)} (W is (out, in), as in PyTorch)"
                )
            if value.dtype != params["W"].dtype:
                raise TypeError(
                    f"b has dtype {value.dtype} but W has {params['W'].dtype}; "
                    "cast both to one float dtype"
                )
            _check_finite(name, value)


def _check_array(name: str, value: Any, shape: str, ndim: int) -> None:
    if not is_array(value):
        raise TypeError(
            f"{name} must be an array (NumPy, CuPy or strict), got {type(value).__name__}; "
            "convert with refimpl.backend.asarray"
        )
    if value.dtype.kind != "f":
        raise TypeError(
            f"{name} must be a floating-point array, got dtype {value.dtype}; "
            "convert with .astype(float)"
        )
    if value.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")


def _check_finite(name: str, value: Any) -> None:
    xp = get_array_module(value)
    if not bool(xp.isfinite(value).all()):
        raise ValueError(
            f"{name} contains NaN or infinity; check the previous step (learning rate, "
            "division by zero, log of zero) before calling Linear"
        )


def _check_cotangent(d_y: Any, shape: tuple[int, ...], dtype: Any) -> None:
    if not is_array(d_y) or tuple(d_y.shape) != shape:
        got = tuple(d_y.shape) if is_array(d_y) else type(d_y).__name__
        raise ValueError(f"d_y must be an array of the output's shape {shape}, got {got}")
    if d_y.dtype != dtype:
        raise TypeError(
            f"d_y has dtype {d_y.dtype} but the forward ran in {dtype}; cast d_y to {dtype}"
        )
