"""Evaluation metrics: accuracy and ROC AUC, returned as Python floats.

Accuracy runs on the logits' backend and reads back only scalars, so a GPU training
loop that reports it copies no array. ROC AUC (multi-label data) ranks with SciPy:
it copies its inputs to NumPy (:func:`refimpl.backend.to_numpy`; one device-to-host
transfer per call on CuPy). Inputs may come from any backend, even different ones.
``mask`` is a boolean ``(N,)`` array selecting the rows to score (a split), or
``None`` for all rows (:func:`roc_auc` also takes an ``(N, K)`` mask of single entries,
for labels missing in places); selecting no row is an error, as is a NaN or infinite
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

    Computed on the logits' backend: only scalars (the count, the label range, the
    finiteness verdict) come back to the host, so evaluating on a GPU copies no array.
    ``y`` and ``mask`` on another backend are moved to it first.

    Ties: the prediction is the *lowest* index among equal maxima (``numpy.argmax``,
    ``torch.argmax`` on the CPU, ``cupy.argmax``), so a row of equal logits predicts
    class 0. The result is ``correct / count``, one correctly rounded division.

    Parameters
    ----------
    logits : array
        ``(N, K)`` real scores, finite in the rows counted.
    y : array
        ``(N,)`` integer labels in ``[0, K)``; labels outside ``mask`` are never read, so a
        placeholder such as -1 is fine there.
    mask : array or None, default None
        ``(N,)`` bool, the rows counted (at least one); ``None`` counts every row.

    Returns
    -------
    float
        The fraction of counted rows predicted right, in ``[0, 1]``.
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

    ``average="macro"`` is the mean of the per-column AUCs over columns that have
    both classes among their selected entries, each column's AUC over its selected
    entries only; a column with only one class is skipped (its AUC is undefined):
    OGB's rule (``Evaluator._eval_rocauc`` in ``ogb/graphproppred/evaluate.py``: a task
    counts if it has at least one positive and one negative label, its AUC is taken over
    its labelled rows, NaN marking the unlabelled, and the tasks' AUCs are averaged);
    ``"micro"``: one AUC over all selected (score, target) pairs pooled. If no
    column has both classes, ``ValueError``.

    scikit-learn parity: ``roc_auc_score(targets, scores, average=...)`` when
    every column has both classes (scikit-learn errors or returns NaN instead of
    skipping a one-class column).

    Parameters
    ----------
    scores : array
        ``(N, K)`` or ``(N,)``, real or boolean: higher means more likely positive.
    targets : array
        The shape of ``scores``, 0/1 (bool, integer or float).
    mask : array or None, default None
        ``(N,)`` bool selecting rows, or of the scores' shape selecting single entries (the
        observed labels of a multi-label task with missing ones; targets outside it are never
        read, so NaN there is fine); ``None`` selects everything.
    average : {"macro", "micro"}, default "macro"
        The mean of the per-column AUCs (one-class columns skipped), or one AUC over all
        selected pairs pooled.

    Returns
    -------
    float
        The AUC in ``[0, 1]``.

    Raises
    ------
    ValueError
        If no column has both classes among its selected entries.
    """
    if average not in ("macro", "micro"):
        raise ValueError(f"average must be 'macro' or 'micro', got {average!r}")
    values = _host(scores, "scores", kinds="biuf")
    if values.ndim not in (1, 2):
        raise ValueError(f"scores must have shape (N,) or (N, K), got {values.shape}")
    truth = _host(targets, "targets", kinds="biuf")
    if truth.shape != values.shape:
        raise ValueError(f"targets must have the scores' shape {values.shape}, got {truth.shape}")
    columns = (len(values), values.shape[1] if values.ndim == 2 else 1)  # (N, K); K=1 for (N,)
    entries = _entries(mask, values.shape).reshape(columns)  # (N, K) the selected entries
    values, truth = values.reshape(columns), truth.reshape(columns)
    if not entries.any():
        raise ValueError("no entries to score: the mask selects nothing (or N = 0)")
    _check_finite(values[entries], "scores")
    if not np.all((truth[entries] == 0) | (truth[entries] == 1)):
        raise ValueError("targets must be 0 or 1 (binary labels per column)")
    truth = np.where(entries, truth, 0).astype(bool)  # (N, K) unselected entries never read
    if average == "micro":  # (N K, 1): pool all pairs
        values, truth, entries = (a.reshape(-1, 1) for a in (values, truth, entries))
    positives = (truth & entries).sum(axis=0)  # (K,) P per column
    negatives = entries.sum(axis=0) - positives  # (K,) Q per column
    kept = (positives > 0) & (negatives > 0)
    if not kept.any():
        raise ValueError(
            "ROC AUC is undefined: no column has both a positive and a negative target among "
            "the selected rows"
        )
    aucs = []
    for column in np.flatnonzero(kept):
        chosen = entries[:, column]
        # mid-ranks (1-based) among the column's selected entries only
        ranks = rankdata(values[chosen, column], method="average")
        p, q = float(positives[column]), float(negatives[column])
        u = ranks[truth[chosen, column]].sum() - p * (p + 1) / 2
        aucs.append(u / (p * q))
    return float(np.mean(aucs))


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


def _entries(mask: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The selected entries of an array of ``shape`` as a bool NumPy array of that shape: a
    row mask (N,) broadcast over the columns, an entry mask of ``shape`` as is, or all."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    mask = _host(mask, "mask", kinds="b")
    if mask.shape == shape:
        return mask
    if mask.shape != shape[:1]:
        raise ValueError(
            f"mask must have shape (N,) = ({shape[0]},) (rows) or the scores' shape {shape} "
            f"(entries), got {mask.shape}"
        )
    return np.broadcast_to(mask.reshape((-1,) + (1,) * (len(shape) - 1)), shape)


def _check_finite(values: Any, name: str) -> None:
    if values.dtype.kind == "f" and not bool(get_array_module(values).isfinite(values).all()):
        raise ValueError(f"{name} contain NaN or infinity; a diverged model cannot be ranked")
