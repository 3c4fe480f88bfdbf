"""Masked losses: softmax cross-entropy and binary cross-entropy with logits (classification),
mean squared and mean absolute error (regression).

Each returns a 0-d array, the mean over the rows selected by ``mask`` (the
training split of the nodes, typically, or a batch of graphs: one row per graph
for graph-level tasks); rows outside the mask contribute nothing and get a
zero gradient. :class:`BCEWithLogits` also takes an (N, K) mask of single entries
(multi-label targets with missing labels). Their backward takes the scalar cotangent
``d_loss`` (1.0 to start backpropagation) and returns ``(d_inputs, {})``. The regression
losses are defined in :mod:`refimpl.ops.regression` and exported here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module, is_array
from refimpl.kernels.cross_entropy import cross_entropy_backward, cross_entropy_forward
from refimpl.ops.fused_switch import runs_fused_kernels
from refimpl.ops.regression import L1Loss, L1LossCache, MSELoss, MSELossCache, row_weights
from refimpl.validation import check_input, check_scalar_cotangent

__all__ = [
    "BCEWithLogits",
    "BCEWithLogitsCache",
    "CrossEntropyCache",
    "L1Loss",  # the regression losses, defined in refimpl.ops.regression
    "L1LossCache",
    "MSELoss",
    "MSELossCache",
    "RowSelection",
    "SoftmaxCrossEntropy",
]


class CrossEntropyCache(NamedTuple):
    """What :meth:`SoftmaxCrossEntropy.backward` reads.

    Attributes
    ----------
    probs : array
        ``(M, K)``, the softmax of the ``M`` selected rows' logits.
    one_hot : array
        ``(M, K)`` bool, the label of each selected row.
    weight : array
        ``(M,)``, ``1 / M`` in the logits' dtype.
    rows : array
        ``(M,)``, the selected rows' indices.
    shape : tuple of int
        ``(N, K)``, the logits'.
    """

    probs: Any
    one_hot: Any
    weight: Any
    rows: Any
    shape: tuple[int, int]


class RowSelection(NamedTuple):
    """The rows :class:`SoftmaxCrossEntropy` reads, checked once (its ``select``).

    Attributes
    ----------
    labels : array
        ``(N,)``, the labels it was made from.
    rows : array
        ``(M,)``, the selected rows' indices.
    weight : array
        ``(M,)``, ``1 / M`` in the logits' dtype.
    one_hot : array
        ``(M, K)`` bool, the label of each selected row.
    like : tuple
        ``(K, dtype)`` of the logits it serves.
    """

    labels: Any
    rows: Any
    weight: Any
    one_hot: Any
    like: tuple[int, Any]


class BCEWithLogitsCache(NamedTuple):
    """What :meth:`BCEWithLogits.backward` reads.

    Attributes
    ----------
    residual : array
        ``(N, K)``, ``sigmoid(logits) - targets`` (0 in place of targets outside the mask).
    weight : array
        ``(N, K)``, ``mask / count`` over the selected entries, in the logits' dtype.
    """

    residual: Any
    weight: Any


@dataclass(frozen=True)
class SoftmaxCrossEntropy:
    """Mean over masked nodes of ``-log softmax(logits)[label]``.

    ``forward(params, logits (N, K), labels (N,) int, mask (N,) bool or None)``
    returns ``(loss, cache)`` with ``loss`` a 0-d array. ``log softmax`` is
    ``z - max(z) - log(sum(exp(z - max(z))))`` (log-sum-exp, stable for logits of
    any size: every exponent is <= 0). ``mask=None`` selects every row; a :class:`RowSelection`
    (:meth:`select`, once per dataset) skips re-checking the mask and labels on every call.

    Only the masked rows are read: the cache (:class:`CrossEntropyCache`) holds their softmax
    output, one-hot labels, weights and indices.
    Backward: ``d_logits = d_loss * (softmax - one_hot) / count`` on masked rows,
    0 elsewhere.

    Edge semantics: labels outside the mask are never read (a placeholder such
    as -1 for unlabelled nodes is fine); labels inside must lie in ``[0, K)``.
    An empty mask is an error (the mean of nothing). ``K = 1`` gives loss 0.
    Accuracy: a nearly right row has a gradient that is a difference of terms
    of size ``d_loss / count`` (``softmax`` near 1 minus the one-hot 1), so it is
    accurate to a few ulps of that size, not of itself (as in PyTorch and SciPy).

    PyTorch parity: ``F.cross_entropy(logits[mask], labels[mask])`` (reduction
    "mean", no class weights, no label smoothing).

    Inside ``refimpl.nn.gat.fused_kernels()`` a device backend computes the forward and the
    backward as one kernel each (:mod:`refimpl.kernels.cross_entropy`): on the strict
    stand-in bitwise this path's results, on CuPy to its ``exp`` and ``log``'s rounding;
    NumPy always takes this path.
    """

    def select(self, labels: Any, mask: Any, num_classes: int, dtype: Any) -> RowSelection:
        """``mask``'s rows, labels checked, weights in ``dtype``: made once per dataset, passed
        as :meth:`forward`'s ``mask`` with these ``labels`` (unchanged), not checked again."""
        if not is_array(labels) or labels.dtype.kind not in "iu":
            kind = labels.dtype if is_array(labels) else type(labels).__name__
            raise TypeError(
                f"labels must be an integer array of class indices, got {kind}; for one-hot "
                "labels pass labels.argmax(axis=1), for multi-label targets use BCEWithLogits"
            )
        if labels.ndim != 1:
            raise ValueError(f"labels must have shape (N,), got {tuple(labels.shape)}")
        xp = get_array_module(labels)
        like = xp.empty((labels.shape[0], 0), dtype=dtype)  # (N, 0): the logits' rows, dtype
        selected, weight = row_weights(like, mask, 1)  # mean over rows
        chosen = labels[selected]
        if chosen.size and (int(chosen.min()) < 0 or int(chosen.max()) >= num_classes):
            raise ValueError(
                f"labels of masked rows must lie in [0, K) = [0, {num_classes}), got values in "
                f"[{int(chosen.min())}, {int(chosen.max())}]; check the number of classes"
            )
        rows = xp.flatnonzero(selected)  # (M,)
        one_hot = xp.arange(num_classes)[None, :] == chosen[:, None]  # (M, K)
        return RowSelection(labels, rows, weight[rows], one_hot, (num_classes, like.dtype))

    def forward(
        self, params: dict[str, Any], logits: Any, labels: Any, mask: Any = None
    ) -> tuple[Any, CrossEntropyCache]:
        xp = _check_logits(logits)
        num_rows, num_classes = logits.shape
        if is_array(labels) and tuple(labels.shape) != (num_rows,):
            raise ValueError(
                f"labels must have shape (N,) = ({num_rows},) to match logits {logits.shape}, "
                f"got {tuple(labels.shape)}"
            )
        get_array_module(logits, labels)  # TypeError if they live on two backends
        if not isinstance(mask, RowSelection):
            mask = self.select(labels, mask, num_classes, logits.dtype)
        elif mask.labels is not labels or mask.like != (num_classes, logits.dtype):
            raise ValueError("mask is a RowSelection of other labels, K or dtype; redo loss.select")
        # F0 the M masked rows: nothing else is read (their gradient is zero)
        rows, weight, one_hot = mask.rows, mask.weight, mask.one_hot  # (M,), (M,), (M, K)
        shape = (num_rows, num_classes)
        if runs_fused_kernels(xp):  # F0-F3 in one kernel, in this order
            loss, probs = cross_entropy_forward(xp, logits, rows, one_hot, weight)
            return loss, CrossEntropyCache(probs, one_hot, weight, rows, shape)
        logits = logits[rows]  # (M, K)
        # F1 log softmax by log-sum-exp
        maxima = logits.max(axis=1, keepdims=True)  # (M, 1)
        shifted = logits - maxima  # (M, K), <= 0
        log_norm = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))  # (M, 1), in [0, log K]
        log_probs = shifted - log_norm  # (M, K)
        # F2 pick each row's label column (one_hot: the selection's)
        picked = xp.where(one_hot, log_probs, 0).sum(axis=1)  # (M,)
        # F3 negative weighted mean over the masked rows
        loss = xp.asarray((weight * -picked).sum())  # 0-d
        return loss, CrossEntropyCache(xp.exp(log_probs), one_hot, weight, rows, shape)

    def backward(
        self, params: dict[str, Any], cache: CrossEntropyCache, d_loss: Any
    ) -> tuple[Any, dict[str, Any]]:
        d_loss = check_scalar_cotangent(d_loss, cache.probs)
        xp = get_array_module(cache.probs)
        if runs_fused_kernels(xp):  # B3-B0 in one kernel, in this order (rows: select's, sorted)
            d_logits = cross_entropy_backward(
                xp, cache.probs, cache.one_hot, cache.weight, cache.rows, d_loss, cache.shape[0]
            )
            return d_logits, {}
        # B3 (of F3) d picked = -d_loss * weight
        d_picked = -(d_loss * cache.weight)  # (M,)
        # B2 (of F2) scatter into the label column: adjoint of the pick
        d_log_probs = xp.where(cache.one_hot, d_picked[:, None], 0)  # (M, K)
        # B1 (of F1) log softmax backward: g - softmax * sum(g) (max and log-sum-exp shift rows)
        d_selected = d_log_probs - cache.probs * d_log_probs.sum(axis=1, keepdims=True)  # (M, K)
        # B0 (of F0) the masked rows receive it, the others zero (N, K)
        d_logits = xp.zeros(cache.shape, dtype=d_selected.dtype)
        d_logits[cache.rows] = d_selected
        return d_logits, {}


@dataclass(frozen=True)
class BCEWithLogits:
    """Multi-label loss: mean over the masked (row, column) entries of binary cross-entropy
    with logits.

    ``forward(params, logits (N, K), targets (N, K) in [0, 1], mask)`` returns ``(loss,
    cache)``, ``loss`` a 0-d array of the mean of ``max(z, 0) - z t + log1p(exp(-|z|))``,
    which equals ``-t log sigmoid(z) - (1 - t) log(1 - sigmoid(z))`` but never
    exponentiates a positive number. Targets may be soft (any value in ``[0, 1]``);
    boolean or integer 0/1 targets are converted to the logits' dtype (exactly).

    ``mask``: ``None`` (every entry), ``(N,)`` bool (whole rows: a split of the nodes, all
    K columns of each), or ``(N, K)`` bool (single entries: the observed labels of a
    multi-label task with missing ones, as TOX21's empty cells). The mean is over the
    ``count`` selected entries, the rule of OGB's molecule examples and of the
    massive-activation study's TOX21 loss (``BCEWithLogitsLoss()(scores[masks],
    labels[masks])`` in its ``graph_transformer_net.py``). Targets outside an ``(N, K)``
    mask are never read: NaN there (a missing label) is fine.

    Cache: :class:`BCEWithLogitsCache` (``sigmoid(z) - t`` and entry weights).
    Backward: ``d_logits = d_loss * (sigmoid(z) - t) / count`` on masked entries,
    exactly 0 elsewhere; like the cross-entropy's, accurate to a few ulps of
    ``d_loss / count`` (``sigmoid(z) - t`` cancels when ``z`` is far on the side of ``t``).

    PyTorch parity: ``F.binary_cross_entropy_with_logits(logits[mask], targets[mask])``
    (reduction "mean", no ``pos_weight``), for either mask shape.
    """

    def forward(
        self, params: dict[str, Any], logits: Any, targets: Any, mask: Any = None
    ) -> tuple[Any, BCEWithLogitsCache]:
        xp = _check_logits(logits)
        if is_array(mask) and mask.ndim == 2:
            # F0 the (N, K) entry mask: entries outside it are never read (NaN targets there)
            weight = _entry_weights(logits, mask)  # (N, K) mask / count
            if is_array(targets) and tuple(targets.shape) == tuple(logits.shape):
                targets = xp.where(mask, targets, xp.zeros((), dtype=targets.dtype))
        else:
            _, rows = row_weights(logits, mask, logits.shape[1])  # (N,) over rows and all K
            weight = xp.broadcast_to(rows[:, None], logits.shape)  # (N, K)
        targets = _check_targets(xp, targets, logits)
        # F1 elementwise loss; e = exp(-|z|) <= 1 is shared with the sigmoid below
        small = xp.exp(-xp.abs(logits))  # (N, K)
        losses = xp.maximum(logits, 0) - logits * targets + xp.log1p(small)  # (N, K)
        # F2 weighted mean over the masked entries (weight 0 elsewhere: finite losses, so 0)
        loss = xp.asarray((weight * losses).sum())  # 0-d
        # sigmoid from e: 1 / (1 + e) for z >= 0, e / (1 + e) for z < 0 (no overflow)
        sigmoid = xp.where(logits >= 0, 1, small) / (1 + small)  # (N, K)
        return loss, BCEWithLogitsCache(sigmoid - targets, weight)

    def backward(
        self, params: dict[str, Any], cache: BCEWithLogitsCache, d_loss: Any
    ) -> tuple[Any, dict[str, Any]]:
        d_loss = check_scalar_cotangent(d_loss, cache.residual)
        # B2 (of F2) and B1 (of F1): d/dz of the elementwise loss is sigmoid(z) - t;
        # B0 (of F0) entries outside the mask have weight 0, so gradient 0
        return (d_loss * cache.weight) * cache.residual, {}  # (N, K)


def _check_logits(logits: Any) -> Any:
    """Validate ``logits`` (N, K), float, finite; return their array module."""
    xp = check_input(logits, "logits", ndim=2)
    if logits.shape[1] < 1:
        raise ValueError(f"logits must have K >= 1 columns, got shape {tuple(logits.shape)}")
    return xp


def _entry_weights(logits: Any, mask: Any) -> Any:
    """The weights ``mask / count`` (N, K) of an (N, K) bool entry mask, at least one entry."""
    if mask.dtype.kind != "b":
        raise TypeError(
            f"mask must be a boolean array of shape (N,) (rows) or (N, K) (entries), got "
            f"{mask.dtype}; for labels with NaN where missing use mask = ~xp.isnan(targets)"
        )
    if tuple(mask.shape) != tuple(logits.shape):
        raise ValueError(
            f"an entry mask must have the logits' shape {tuple(logits.shape)}, got "
            f"{tuple(mask.shape)}; a row mask has shape (N,)"
        )
    get_array_module(mask, logits)  # TypeError if the mask is on another backend
    count = int(mask.sum())
    if count == 0:
        raise ValueError(
            "the mask selects no entry, so the mean loss is undefined; check that the batch "
            "has an observed label"
        )
    return mask.astype(logits.dtype) / count


def _check_targets(xp: Any, targets: Any, logits: Any) -> Any:
    """Validate multi-label targets; return them in the logits' dtype (exact for 0/1 ints)."""
    if not is_array(targets):
        raise TypeError(
            f"targets must be an array, got {type(targets).__name__}; convert with xp.asarray"
        )
    get_array_module(logits, targets)  # TypeError if they live on two backends
    if tuple(targets.shape) != tuple(logits.shape):
        raise ValueError(
            f"targets must have the logits' shape {tuple(logits.shape)}, got "
            f"{tuple(targets.shape)}; for class indices use SoftmaxCrossEntropy"
        )
    if targets.dtype.kind == "f" and targets.dtype != logits.dtype:
        raise TypeError(
            f"targets have dtype {targets.dtype} but logits {logits.dtype}; cast targets with "
            "targets.astype(logits.dtype)"
        )
    if targets.dtype.kind not in "fbiu":
        raise TypeError(f"targets must be float, bool or integer, got dtype {targets.dtype}")
    targets = targets.astype(logits.dtype, copy=False)
    if not bool(((targets >= 0) & (targets <= 1)).all()):  # False for NaN too
        raise ValueError(
            "targets must lie in [0, 1] (probabilities or 0/1 labels) and be finite; "
            "for class indices use SoftmaxCrossEntropy"
        )
    return targets
