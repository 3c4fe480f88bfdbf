"""``Linear``: the affine map ``y = x W^T + b`` with its hand-written backward.

``W`` has shape ``(out, in)`` as in PyTorch and the papers (docs/design.md, Weights):
row ``W[i, :]`` holds the weights *incoming* to output neuron ``i``, column
``W[:, j]`` the ones *outgoing* from input ``j`` (the rows and columns of
GAT-balance Thm 2.2, Eq. 3).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module, is_sparse
from refimpl.fields import check_bool, check_positive_int
from refimpl.kernels.parallel import map_blocks, row_blocks, sum_in_order
from refimpl.validation import check_block_inputs, check_cotangent

__all__ = [
    "ROW_BLOCK",
    "Linear",
    "LinearCache",
    "affine_maps",
    "affine_maps_backward",
    "weight_gradient",
    "with_ones",
]

ROW_BLOCK = 4096  # host rows per block: big enough to amortise a BLAS call, small enough for cache


def affine_maps(x: Any, weights: Sequence[Any], biases: Sequence[Any] | None = None) -> list[Any]:
    """``[x W_i^T + b_i for each map i]``, several maps of one input in one pass over its rows.

    ``x`` may be a sparse CSR matrix (sparse input features): each map is then one sparse
    product, over the stored values only.

    No validation: callers check shapes and dtypes at their boundary.

    Parameters
    ----------
    x : array or sparse matrix
        ``(N, in)``, dense or CSR.
    weights : sequence of array
        ``weights[i]`` is ``(out_i, in)``.
    biases : sequence of array or None, default None
        ``biases[i]`` is ``(out_i,)``; None: no bias.

    Returns
    -------
    list of array
        ``[(N, out_i)]``, each a new C-contiguous array.
    """
    xp = get_array_module(x)
    if is_sparse(x):
        outputs = [xp.ascontiguousarray(x @ weight.T) for weight in weights]  # (N, out_i)
        for i, y in enumerate(outputs if biases is not None else []):
            y += biases[i]
        return outputs
    n = x.shape[0]
    dtype = xp.result_type(x, *weights)
    outputs = [xp.empty((n, weight.shape[0]), dtype=dtype) for weight in weights]
    blocks = row_blocks(xp, n, ROW_BLOCK)

    def block(j: int) -> None:
        rows = blocks[j]
        for i, weight in enumerate(weights):
            # F1 the linear map (B, in) @ (in, out_i), F2 the bias over rows, in place
            y = xp.matmul(x[rows], weight.T, out=outputs[i][rows])
            if biases is not None:
                y += biases[i]

    map_blocks(block, len(blocks))
    return outputs


def affine_maps_backward(
    x: Any, weights: Sequence[Any], d_ys: Sequence[Any], bias: bool, input_grad: bool = True
) -> tuple[Any, list[Any], list[Any] | None]:
    """Adjoint of :func:`affine_maps`: the gradients of ``x``, the weights and the biases.

    Per block of rows, ``D = [d_y_1 | ... | d_y_M] (B, sum out_i)``: ``d_x = D [W_1; ...;
    W_M]`` (B1 of F1) and ``D^T [x | 1] = [d_W | d_b]`` (B1, and B2 of F2: the adjoint of
    broadcasting over rows is the sum over rows), the latter summed over the blocks in
    block order. ``N = 0`` gives zero gradients. A sparse ``x``: ``d_W_i =``
    :func:`weight_gradient`, over its stored values; ``d_x`` is dense (the gradient for
    every entry, stored or not).

    Parameters
    ----------
    x : array or sparse matrix
        ``(N, in)``, the forward's input.
    weights : sequence of array
        ``weights[i]`` is ``(out_i, in)``.
    d_ys : sequence of array
        ``d_ys[i]`` is ``(N, out_i)``, the cotangent of output ``i``.
    bias : bool
        Whether the maps had biases (then their gradients are returned).
    input_grad : bool, default True
        Whether to compute ``d_x``; False returns None for it.

    Returns
    -------
    tuple
        ``(d_x, d_weights, d_biases)``: ``d_x`` ``(N, in)`` or None, ``d_weights[i]``
        ``(out_i, in)``, ``d_biases[i]`` ``(out_i,)`` (None without bias).
    """
    xp = get_array_module(x, *d_ys)
    stacked_weight = weights[0] if len(weights) == 1 else xp.concatenate(weights)  # (sum, in)
    if is_sparse(x):
        d_y = d_ys[0] if len(d_ys) == 1 else xp.concatenate(d_ys, axis=1)  # (N, sum)
        d_x = d_y @ stacked_weight if input_grad else None
        d_weights = [weight_gradient(d, x) for d in d_ys]
        d_biases = [d.sum(axis=0) for d in d_ys] if bias else None
        return d_x, d_weights, d_biases
    n, width = x.shape
    sizes = [weight.shape[0] for weight in weights]
    d_x = xp.empty_like(x) if input_grad else None
    blocks = row_blocks(xp, n, ROW_BLOCK)

    def block(j: int) -> Any:
        rows = blocks[j]
        d_y = d_ys[0][rows] if len(d_ys) == 1 else xp.concatenate([d[rows] for d in d_ys], 1)
        if input_grad:
            xp.matmul(d_y, stacked_weight, out=d_x[rows])  # (B, sum) @ (sum, in)
        inputs = with_ones(x[rows]) if bias else x[rows]  # (B, in [+ 1])
        return d_y.T @ inputs  # (sum, B) @ (B, in [+ 1]): [d_W | d_b]

    parts = map_blocks(block, len(blocks))
    if parts:
        total = sum_in_order(parts)
    else:
        total = xp.zeros((sum(sizes), width + bias), dtype=stacked_weight.dtype)
    pieces = [total[start:stop] for start, stop in itertools.pairwise(np.cumsum([0, *sizes]))]
    d_weights = [xp.ascontiguousarray(piece[:, :width]) for piece in pieces]
    d_biases = [xp.ascontiguousarray(piece[:, width]) for piece in pieces] if bias else None
    return d_x, d_weights, d_biases


def weight_gradient(d_y: Any, x: Any) -> Any:
    """``d_y^T x``; for a sparse ``x`` (CSR) computed as ``(x^T d_y)^T``, a pass over its stored
    values only.

    Parameters
    ----------
    d_y : array
        ``(N, out)``.
    x : array or sparse matrix
        ``(N, in)``, dense or CSR.

    Returns
    -------
    array
        ``(out, in)``, C-contiguous.
    """
    xp = get_array_module(d_y)
    if is_sparse(x):
        return xp.ascontiguousarray((x.T @ d_y).T)
    return d_y.T @ x


def with_ones(values: Any) -> Any:
    """``[values | 1]`` ``(B, F + 1)``: one product with it gives ``A^T values`` and the
    column sums ``A^T 1`` together (and, transposed, their adjoint), without a separate
    pass.

    Parameters
    ----------
    values : array
        ``(B, F)``.

    Returns
    -------
    array
        ``(B, F + 1)``, a new array with a last column of ones.
    """
    xp = get_array_module(values)
    out = xp.empty((values.shape[0], values.shape[1] + 1), dtype=values.dtype)
    out[:, :-1] = values
    out[:, -1] = 1
    return out


class LinearCache(NamedTuple):
    """What :meth:`Linear.backward` reads: the input (``W`` comes from ``params``).

    Attributes
    ----------
    x : array or sparse matrix
        ``(N, in)``, the input.
    """

    x: Any


@dataclass(frozen=True)
class Linear:
    r"""Affine map, ``(N, in) -> (N, out)``:

    $$
    y = x W^\top + b .
    $$

    Its parameters (``params``): ``W`` ``(out, in)``, whose row ``W[i, :]`` holds the weights
    incoming to output ``i``, and ``b`` ``(out,)``, absent when ``bias=False``. The backward
    reads :class:`LinearCache`, the input ``x``.

    Edge semantics: ``N = 0`` is allowed (empty output, zero ``d_W``). The dtype
    of ``x`` must equal that of ``W`` and ``b``; nothing is cast silently.

    PyTorch parity: ``torch.nn.functional.linear(x, W, b)`` with the same
    ``(out, in)`` layout. :meth:`init_params` is Glorot/Xavier uniform
    (``torch.nn.init.xavier_uniform_``, gain 1; PyG's ``Linear(...,
    weight_initializer="glorot")``), not ``torch.nn.Linear``'s default
    Kaiming-uniform.

    Parameters
    ----------
    in_features : int
        The input width (fan-in of every output neuron), ``>= 1``.
    out_features : int
        The number of output neurons, ``>= 1``.
    bias : bool, default True
        Whether to add ``b`` (PyTorch's default; ``bias`` in PyTorch and PyG).

    Shapes
    ------
    - ``x``: ``(N, in)``, a dense array or a SciPy / CuPy sparse matrix.
    - output: ``(N, out)``, ``W``'s dtype; ``W``: ``(out, in)``; ``b``: ``(out,)``.
    """

    in_features: int  # fan-in of every output neuron
    out_features: int  # number of output neurons
    bias: bool = True  # add b; PyTorch default

    def __post_init__(self) -> None:
        for name in ("in_features", "out_features"):
            check_positive_int(getattr(self, name), f"Linear {name}")  # at most 2**31 - 1
        object.__setattr__(self, "bias", check_bool(self.bias, "Linear bias"))  # "False" is true

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
        check_block_inputs(params, self.param_shapes(), "Linear", x, self.in_features, sparse=True)
        # F1 the linear map (N, in) @ (in, out) -> (N, out), F2 the bias broadcast over rows
        biases = [params["b"]] if self.bias else None
        return affine_maps(x, [params["W"]], biases)[0], LinearCache(x)

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
        # B2 (of F2) the sum over rows, B1 (of F1) d_x = d_y W, d_W = d_y^T x
        d_x, d_weights, d_biases = affine_maps_backward(x, [weight], [d_y], self.bias, input_grad)
        d_params = {"W": d_weights[0]}
        if self.bias:
            d_params["b"] = d_biases[0]  # (out,)
        return d_x, {name: d_params[name] for name in params}  # keyed (and ordered) as params
