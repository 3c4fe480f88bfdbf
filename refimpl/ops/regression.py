"""Masked regression losses: mean squared and mean absolute error, over rows and all targets.

Each returns a 0-d array, the mean over the rows selected by ``mask`` (a batch of graphs: one
row per graph, ``T`` targets each) and all ``T`` columns; rows outside the mask contribute
nothing and get a zero gradient. Their backward takes the scalar cotangent ``d_loss`` (1.0 to
start backpropagation) and returns ``(d_predictions, {})``. :mod:`refimpl.ops.losses` exports
them beside the classification losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module, is_array
from refimpl.validation import check_input, check_scalar_cotangent

__all__ = ["L1Loss", "L1LossCache", "MSELoss", "MSELossCache", "row_weights"]


class MSELossCache(NamedTuple):
    """What :meth:`MSELoss.backward` reads.

    Attributes
    ----------
    residual : array
        ``(G, T)``, ``predictions - targets``.
    weight : array
        ``(G,)``, ``mask / (count * T)`` in the predictions' dtype.
    """

    residual: Any
    weight: Any


class L1LossCache(NamedTuple):
    """What :meth:`L1Loss.backward` reads.

    Attributes
    ----------
    sign : array
        ``(G, T)``, ``sign(predictions - targets)`` in ``{-1, 0, +1}``, the predictions' dtype.
    weight : array
        ``(G,)``, ``mask / (count * T)`` in the predictions' dtype.
    """

    sign: Any
    weight: Any


@dataclass(frozen=True)
class MSELoss:
    """Regression loss: mean over masked rows and all T of ``(prediction - target)^2``.

    ``forward(params, predictions (G, T), targets (G, T), mask (G,) bool or
    None)`` returns ``(loss, cache)``, ``loss`` a 0-d array. Targets are real
    numbers of the predictions' float dtype, finite in every row (masked out or
    not). ``mask=None`` selects every row; an empty mask is an error.

    Cache: :class:`MSELossCache` (residual and row weights).
    Backward: ``d_predictions = d_loss * 2 (prediction - target) / (count * T)``
    on masked rows, 0 elsewhere.

    PyTorch parity: ``F.mse_loss(predictions[mask], targets[mask])`` (reduction
    "mean").
    """

    def forward(
        self, params: dict[str, Any], predictions: Any, targets: Any, mask: Any = None
    ) -> tuple[Any, MSELossCache]:
        # F1 residual (G, T), and the row weights over masked rows and all T
        xp, residual, weight = _residual_and_weights(predictions, targets, mask)
        # F2 weighted mean of the squares over masked rows and all T columns
        loss = xp.asarray((weight[:, None] * residual * residual).sum())  # 0-d
        return loss, MSELossCache(residual, weight)

    def backward(
        self, params: dict[str, Any], cache: MSELossCache, d_loss: Any
    ) -> tuple[Any, dict[str, Any]]:
        d_loss = check_scalar_cotangent(d_loss, cache.residual)
        # B2 (of F2) d residual = d_loss * weight * 2 r
        d_residual = (d_loss * cache.weight)[:, None] * (2 * cache.residual)  # (G, T)
        # B1 (of F1) d predictions = d residual (targets are data, not differentiated)
        return d_residual, {}


@dataclass(frozen=True)
class L1Loss:
    """Regression loss: mean over masked rows and all T of ``|prediction - target|`` (the MAE
    that the supplement's ZINC task reports).

    ``forward(params, predictions (G, T), targets (G, T), mask (G,) bool or
    None)`` returns ``(loss, cache)``, ``loss`` a 0-d array; inputs as
    :class:`MSELoss`.

    Cache: :class:`L1LossCache` (sign of the residual and row weights).
    Backward: ``d_predictions = d_loss * sign(prediction - target) / (count *
    T)`` on masked rows, 0 elsewhere. At a zero residual ``|r|`` has no
    derivative; the convention is ``sign(0) = 0``, so an exact prediction gets
    exactly zero gradient (PyTorch's ``l1_loss`` backward, ``sgn``, the same;
    0 lies in the subdifferential ``[-1, 1]``).

    PyTorch parity: ``F.l1_loss(predictions[mask], targets[mask])`` (reduction
    "mean").
    """

    def forward(
        self, params: dict[str, Any], predictions: Any, targets: Any, mask: Any = None
    ) -> tuple[Any, L1LossCache]:
        # F1 residual (G, T), and the row weights over masked rows and all T
        xp, residual, weight = _residual_and_weights(predictions, targets, mask)
        # F2 weighted mean of the absolute values over masked rows and all T columns
        loss = xp.asarray((weight[:, None] * xp.abs(residual)).sum())  # 0-d
        return loss, L1LossCache(xp.sign(residual), weight)

    def backward(
        self, params: dict[str, Any], cache: L1LossCache, d_loss: Any
    ) -> tuple[Any, dict[str, Any]]:
        d_loss = check_scalar_cotangent(d_loss, cache.sign)
        # B2 (of F2) d|r|/dr = sign(r), 0 at r = 0; B1 (of F1) d predictions = d residual
        return (d_loss * cache.weight)[:, None] * cache.sign, {}  # (G, T)


def _residual_and_weights(predictions: Any, targets: Any, mask: Any) -> tuple[Any, Any, Any]:
    """The regression losses' shared start, validated: ``(xp, predictions - targets (G, T),
    row weights (G,) = mask / (count * T))``."""
    xp = _check_predictions(predictions)
    targets = _check_real_targets(targets, predictions)
    _, weight = row_weights(predictions, mask, predictions.shape[1])  # over rows and all T
    return xp, predictions - targets, weight


def _check_predictions(predictions: Any) -> Any:
    """Validate regression ``predictions`` (G, T), float, finite; return their array module."""
    xp = check_input(predictions, "predictions", ndim=2)
    if predictions.shape[1] < 1:
        raise ValueError(
            f"predictions must have T >= 1 columns, got shape {tuple(predictions.shape)}; "
            "for one target per row use predictions.reshape(-1, 1)"
        )
    return xp


def _check_real_targets(targets: Any, predictions: Any) -> Any:
    """Regression targets: the predictions' shape, float dtype and backend, finite."""
    if not is_array(targets):
        raise TypeError(
            f"targets must be an array, got {type(targets).__name__}; convert with xp.asarray"
        )
    get_array_module(predictions, targets)  # TypeError if they live on two backends
    if tuple(targets.shape) != tuple(predictions.shape):
        raise ValueError(
            f"targets must have the predictions' shape {tuple(predictions.shape)}, got "
            f"{tuple(targets.shape)}; for one target per graph use y.reshape(-1, 1)"
        )
    if targets.dtype != predictions.dtype:
        raise TypeError(
            f"targets have dtype {targets.dtype} but predictions {predictions.dtype}; cast "
            "targets with targets.astype(predictions.dtype): nothing is cast silently"
        )
    check_input(targets, "targets")
    return targets


def row_weights(logits: Any, mask: Any, num_columns: int) -> tuple[Any, Any]:
    """The selected rows and their weights ``mask / (count * num_columns)``, checked.

    Shared with the classification losses of :mod:`refimpl.ops.losses`.

    Parameters
    ----------
    logits : array
        ``(N, ...)``, the loss's input: its rows, dtype and backend.
    mask : array or None
        ``(N,)`` bool on ``logits``' backend, at least one row; None selects every row.
    num_columns : int
        The columns each row's weight is shared over (1 for a mean over rows).

    Returns
    -------
    tuple of array
        ``(selected, weight)``: ``(N,)`` bool, and ``(N,)`` in ``logits``' dtype, 0 outside
        the mask.
    """
    num_rows = logits.shape[0]
    xp = get_array_module(logits)
    if mask is None:
        selected = xp.ones(num_rows, dtype=bool)
    else:
        if not is_array(mask) or mask.dtype.kind != "b":
            kind = mask.dtype if is_array(mask) else type(mask).__name__
            raise TypeError(
                f"mask must be a boolean array of shape (N,), got {kind}; from node indices "
                "idx build it with mask = xp.zeros(N, dtype=bool); mask[idx] = True"
            )
        if tuple(mask.shape) != (num_rows,):
            raise ValueError(f"mask must have shape (N,) = ({num_rows},), got {tuple(mask.shape)}")
        get_array_module(mask, logits)  # TypeError if the mask is on another backend
        selected = mask
    count = int(selected.sum())
    if count == 0:
        raise ValueError(
            "the mask selects no rows, so the mean loss is undefined; check the split "
            "(an empty training mask?)"
        )
    return selected, selected.astype(logits.dtype) / (count * num_columns)
