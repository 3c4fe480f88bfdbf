"""Evaluation metrics: accuracy and ROC AUC, returned as Python floats.

Accuracy runs on the logits' backend and reads back only scalars, so a GPU training
loop that reports it copies no array. ROC AUC (multi-label data) ranks with SciPy:
it copies its inputs to NumPy (:func:`refimpl.backend.to_numpy`; one device-to-host
transfer per call on CuPy). Inputs may come from any backend, even different ones.
``mask`` is a boolean ``(N,)`` array selecting the rows to score (a split), or
``None`` for all rows; selecting no row is an error, as is a NaN or infinite
score (a diverged model has no meaningful ranking).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import rankdata

from refimpl.backend import asarray, backend_name, get_array_module, is_array, to_numpy

__all__ = ["accuracy", "roc_auc"]


def accuracy(logits: Any, y: Any, mask: Any = None) -> float:
    """Fraction of selected rows whose arg-max logit is the label.

    Parameters: ``logits`` (N, K) real; ``y`` (N,) integer labels in ``[0, K)``
    (labels outside ``mask`` are never read, so a placeholder such as -1 is
    fine); ``mask`` (N,) bool or ``None``.

    Computed on the logits' backend: only scalars (the count, the label range, the
    finiteness verdict) come back to the host, so evaluating on a GPU copies no array.
    ``y`` and ``mask`` on another backend are moved to it first.

    Ties: the prediction is the *lowest* index among equal maxima (``numpy.argmax``,
    ``torch.argmax`` on the CPU, ``cupy.argmax``), so a row of equal logits predicts
    class 0. The result is ``correct / count``, one correctly rounded division.
    """
    xp = _device(logits, "logits", kinds="fiu")
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must have shape (N, K) with K >= 1, got {tuple(logits.shape)}")
    _device(y, "y", kinds="iu")
    labels = _on(xp, y)
    if tuple(labels.shape) != (logits.shape[0],):
        raise ValueError(
            f"y must have shape (N,) = ({logits.shape[0]},) to match logits "
            f"{tuple(logits.shape)}, got {tuple(labels.shape)}"
        )
    rows = _rows(mask, logits.shape[0], xp)
    count = int(xp.count_nonzero(rows))
    _check_finite(logits[rows], "logits")
    chosen = labels[rows]
    low, high = int(chosen.min()), int(chosen.max())
    if low < 0 or high >= logits.shape[1]:
        raise ValueError(
            f"labels of selected rows must lie in [0, K) = [0, {logits.shape[1]}), got values "
            f"in [{low}, {high}]"
        )
    correct = int(xp.count_nonzero((logits.argmax(axis=1) == labels) & rows))
    return correct / count


def roc_auc(scores: Any, targets: Any, mask: Any = None, average: str = "macro") -> float:
    """Area under the ROC curve, by the Mann-Whitney U statistic, averaged over columns.

    For one column with ``P`` positives and ``Q`` negatives the AUC is the
    probability that a random positive outscores a random negative, ties
    counting 1/2: ``U / (P Q)`` with ``U = sum(ranks of the positives) - P (P + 1) / 2``
    and mid-ranks for ties (``scipy.stats.rankdata``, method "average"), which
    equals the pairwise count ``#{s_pos > s_neg} + #{s_pos == s_neg} / 2``
    exactly (rank sums are half-integers, exact in float64 below 2**52).

    Parameters: ``scores`` (N, K) or (N,) real or boolean; ``targets`` of the same shape,
    0/1 (bool, integer or float); ``mask`` (N,) bool or ``None``.
    ``average="macro"``: the mean of the per-column AUCs over columns that have
    both classes among the selected rows; a column with only one class is
    skipped (its AUC is undefined), as in the OGB multi-task evaluators;
    ``"micro"``: one AUC over all selected (score, target) pairs pooled. If no
    column has both classes, ``ValueError``.

    scikit-learn parity: ``roc_auc_score(targets, scores, average=...)`` when
    every column has both classes (scikit-learn errors or returns NaN instead of
    skipping a one-class column).
    """
    if average not in ("macro", "micro"):
        raise ValueError(f"average must be 'macro' or 'micro', got {average!r}")
    values = _host(scores, "scores", kinds="biuf")
    if values.ndim not in (1, 2):
        raise ValueError(f"scores must have shape (N,) or (N, K), got {values.shape}")
    truth = _host(targets, "targets", kinds="biuf")
    if truth.shape != values.shape:
        raise ValueError(f"targets must have the scores' shape {values.shape}, got {truth.shape}")
    rows = _rows(mask, values.shape[0])
    values, truth = values[rows], truth[rows]
    _check_finite(values, "scores")
    if not np.all((truth == 0) | (truth == 1)):
        raise ValueError("targets must be 0 or 1 (binary labels per column)")
    values = values.reshape(len(values), -1)  # (N, K); one column for (N,)
    truth = truth.reshape(values.shape).astype(bool)  # (N, K)
    if average == "micro":
        values, truth = values.reshape(-1, 1), truth.reshape(-1, 1)  # (N K, 1): pool all pairs
    positives = truth.sum(axis=0)  # (K,) P per column
    negatives = len(truth) - positives  # (K,) Q per column
    kept = (positives > 0) & (negatives > 0)
    if not kept.any():
        raise ValueError(
            "ROC AUC is undefined: no column has both a positive and a negative target among "
            "the selected rows"
        )
    values, truth = values[:, kept], truth[:, kept]  # (N, K')
    positives, negatives = positives[kept].astype(np.float64), negatives[kept].astype(np.float64)
    ranks = rankdata(values, method="average", axis=0)  # (N, K') mid-ranks, 1-based
    u = np.where(truth, ranks, 0.0).sum(axis=0) - positives * (positives + 1) / 2  # (K',)
    return float(np.mean(u / (positives * negatives)))


_KIND_WORDS = {"b": "boolean", "i": "integer", "u": "integer", "f": "floating-point"}


def _host(value: Any, name: str, kinds: str) -> np.ndarray:
    """``value`` (an array of any backend) copied to NumPy, with a dtype kind in ``kinds``."""
    _device(value, name, kinds)
    return to_numpy(value)


def _device(value: Any, name: str, kinds: str) -> Any:
    """The array module of ``value``, checked to be an array with a dtype kind in ``kinds``
    (no copy: the dtype is visible on every backend)."""
    if not is_array(value):
        raise TypeError(
            f"{name} must be an array (NumPy, CuPy or strict), got {type(value).__name__}"
        )
    if value.dtype.kind not in kinds:
        wanted = " or ".join(dict.fromkeys(_KIND_WORDS[k] for k in kinds))
        raise TypeError(f"{name} must be of {wanted} dtype, got {value.dtype}")
    return get_array_module(value)


def _on(xp: Any, value: Any) -> Any:
    """``value`` on the array module ``xp`` (moved only when it lives elsewhere)."""
    if get_array_module(value) is xp:
        return value
    return asarray(value, backend=backend_name(xp))


def _rows(mask: Any, num_rows: int, xp: Any = np) -> Any:
    """The selected rows as a boolean (N,) array on ``xp``; at least one."""
    if mask is None:
        rows = xp.ones(num_rows, dtype=bool)
    else:
        _device(mask, "mask", kinds="b")
        rows = _on(xp, mask)
        if tuple(rows.shape) != (num_rows,):
            raise ValueError(f"mask must have shape (N,) = ({num_rows},), got {tuple(rows.shape)}")
    if not bool(rows.any()):
        raise ValueError("no rows to score: the mask selects nothing (or N = 0)")
    return rows


def _check_finite(values: Any, name: str) -> None:
    if values.dtype.kind == "f" and not bool(get_array_module(values).isfinite(values).all()):
        raise ValueError(f"{name} contain NaN or infinity; a diverged model cannot be ranked")
