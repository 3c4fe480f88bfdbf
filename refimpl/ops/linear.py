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

from refimpl.backend import asarray
from refimpl.validation import check_block_inputs, check_cotangent

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

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the parameters, in order."""
        shapes = {"W": (self.out_features, self.in_features)}
        if self.bias:
            shapes["b"] = (self.out_features,)
        return shapes

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
        check_block_inputs(params, self.param_shapes(), "Linear", x, self.in_features)
        weight = params["W"]
        # F1 the linear map
        y = x @ weight.T  # (N, in) @ (in, out) -> (N, out)
        if self.bias:
            # F2 the bias, broadcast over rows
            y = y + params["b"]  # (N, out) + (out,)
        return y, LinearCache(x)

    def backward(
        self, params: dict[str, Any], cache: LinearCache, d_y: Any, input_grad: bool = True
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_y, y>``: ``(d_x (N, in), {"W": (out, in), "b": (out,)})``.

        ``input_grad=False`` skips ``d_x`` (returned as None): a model's first layer
        needs only its weights' gradient.
        """
        x, weight = cache.x, params["W"]
        expected = (x.shape[0], self.out_features)
        check_cotangent(d_y, expected, x.dtype, x)
        d_params = {}
        if self.bias:
            # B2 (of F2) the adjoint of broadcasting over rows is the sum over rows
            d_params["b"] = d_y.sum(axis=0)  # (out,)
        # B1 (of F1)
        d_x = d_y @ weight if input_grad else None  # (N, out) @ (out, in) -> (N, in)
        d_params["W"] = d_y.T @ x  # (out, N) @ (N, in) -> (out, in)
        return d_x, {name: d_params[name] for name in params}  # keyed (and ordered) as params
