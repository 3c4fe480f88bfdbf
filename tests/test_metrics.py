"""Tests for refimpl.metrics: loops and pairwise counts, scikit-learn, the skip rule, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import asarray
from refimpl.metrics import accuracy, roc_auc
from refimpl.testing.strategies import seeds
from tests.backends import DEVICE_BACKENDS


@st.composite
def classification(draw: st.DrawFn):
    """(logits (N, K), labels (N,), mask or None); integer-valued logits make argmax ties common."""
    n, k = draw(st.integers(1, 12)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(seeds()))
    logits = (
        rng.integers(-2, 3, (n, k)).astype(float) if draw(st.booleans()) else rng.random((n, k))
    )
    labels = rng.integers(0, k, n)
    mask = None
    if draw(st.booleans()):
        mask = rng.random(n) < 0.5
        mask[rng.integers(n)] = True
        labels[~mask] = -1  # placeholder outside the mask: must not be read
    return logits, labels, mask


@st.composite
def rankings(draw: st.DrawFn, one_d: bool | None = None):
    """(scores, targets, mask or None) with ties, constant columns and one-class columns."""
    n = draw(st.integers(1, 14))
    one_d = draw(st.booleans()) if one_d is None else one_d
    shape = (n,) if one_d else (n, draw(st.integers(1, 4)))
    rng = np.random.default_rng(draw(seeds()))
    kind = draw(st.sampled_from(["continuous", "few values", "constant"]))
    if kind == "continuous":
        scores = rng.standard_normal(shape)
    elif kind == "few values":
        scores = rng.integers(0, 3, shape).astype(float)  # many ties
    else:
        scores = np.full(shape, 0.25)
    targets = (rng.random(shape) < draw(st.sampled_from([0.1, 0.5, 0.9]))).astype(int)
    mask = None
    if draw(st.booleans()):
        mask = rng.random(n) < 0.7
        mask[rng.integers(n)] = True
    return scores, targets, mask


def brute_force_auc(scores, targets, mask):
    """Per column: count every (positive, negative) pair, ties 1/2; mean over two-class columns."""
    rows = np.ones(len(scores), bool) if mask is None else mask
    s, t = scores[rows].reshape(rows.sum(), -1), targets[rows].reshape(rows.sum(), -1)
    aucs = []
    for j in range(s.shape[1]):
        pos, neg = s[t[:, j] == 1, j], s[t[:, j] == 0, j]
        if len(pos) and len(neg):
            wins = sum(float(p > q) + 0.5 * float(p == q) for p in pos for q in neg)
            aucs.append(wins / (len(pos) * len(neg)))
    return aucs


@example(case=(np.array([[1.0, 1.0, 0.0]]), np.array([1]), None))  # tie: lowest index wins
@given(classification())
def test_accuracy_matches_a_loop(case):
    logits, labels, mask = case
    rows = [i for i in range(len(labels)) if mask is None or mask[i]]
    correct = 0
    for i in rows:
        best = 0
        for j in range(1, logits.shape[1]):
            if logits[i, j] > logits[i, best]:  # strict: the first maximum is kept
                best = j
        correct += best == labels[i]
    assert accuracy(logits, labels, mask) == correct / len(rows)


def test_accuracy_ties_go_to_the_lowest_index():
    logits = np.array([[0.5, 0.5, 0.5], [0.0, 2.0, 2.0], [1.0, 1.0, 0.0]])
    assert accuracy(logits, np.array([0, 1, 0])) == 1.0
    assert accuracy(logits, np.array([2, 2, 1])) == 0.0


@given(rankings())
def test_roc_auc_matches_pairwise_count(case):
    scores, targets, mask = case
    aucs = brute_force_auc(scores, targets, mask)
    if not aucs:
        with pytest.raises(ValueError, match=r"no column has both a positive and a negative"):
            roc_auc(scores, targets, mask)
        return
    # Both sides divide the same half-integer count by the same P Q once: exact.
    assert roc_auc(scores, targets, mask) == pytest.approx(np.mean(aucs), rel=1e-15)
    if scores.ndim == 2:  # and per column, exactly
        for j, auc in zip(_two_class_columns(targets, mask), aucs, strict=True):
            assert roc_auc(scores[:, j], targets[:, j], mask) == auc


@given(rankings(one_d=False), seeds())
def test_roc_auc_entry_mask_scores_each_task_over_its_observed_rows(case, seed):
    # OGB's Evaluator._eval_rocauc (ogbg-moltox21): a task counts if it has a positive and a
    # negative label; its AUC uses its labelled rows only; the counted tasks are averaged.
    scores, targets, _ = case
    observed = np.random.default_rng(seed).random(scores.shape) < 0.6
    labels = np.where(observed, targets, np.nan)  # OGB's empty cells
    aucs = [
        brute_force_auc(scores[observed[:, j], j], targets[observed[:, j], j], None)
        for j in range(scores.shape[1])
        if observed[:, j].any()
    ]
    counted = [auc[0] for auc in aucs if auc]
    if not counted:  # no task with both classes, or nothing observed at all
        with pytest.raises(ValueError, match=r"no column has both|mask selects nothing"):
            roc_auc(scores, labels, observed)
        return
    assert roc_auc(scores, labels, observed) == pytest.approx(np.mean(counted), rel=1e-15)
    pooled = brute_force_auc(scores[observed], targets[observed], None)  # some observed
    if pooled:  # micro: one AUC over the observed entries pooled
        assert roc_auc(scores, labels, observed, "micro") == pytest.approx(pooled[0], rel=1e-15)


def test_roc_auc_entry_mask_is_not_a_row_mask():
    # A task's missing label must drop that (row, task) entry only, not the row's other labels.
    scores = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.6]])
    targets = np.array([[0.0, 1.0], [1.0, np.nan], [np.nan, 0.0]])
    observed = ~np.isnan(targets)
    # task 0: rows 0 (neg, 0.1), 1 (pos, 0.8): 1.0; task 1: rows 0 (pos, 0.9), 2 (neg, 0.6): 1.0
    assert roc_auc(scores, targets, observed) == 1.0
    # swapping a masked score changes nothing; swapping an observed one does
    assert roc_auc(np.array([[0.1, 0.9], [0.8, 0.0], [0.99, 0.6]]), targets, observed) == 1.0
    assert roc_auc(np.array([[0.9, 0.9], [0.8, 0.2], [0.3, 0.6]]), targets, observed) == 0.5


def _two_class_columns(targets, mask):
    t = targets if mask is None else targets[mask]
    return [j for j in range(t.shape[1]) if 0 < t[:, j].sum() < len(t)]


@given(rankings(one_d=True))
def test_roc_auc_symmetries(case):
    scores, targets, mask = case
    if not brute_force_auc(scores, targets, mask):
        return
    auc = roc_auc(scores, targets, mask)
    assert roc_auc(3.0 * scores - 1.0, targets, mask) == auc  # increasing map: same ranks
    assert roc_auc(-scores, targets, mask) == pytest.approx(1.0 - auc, abs=1e-15)
    assert roc_auc(scores, 1 - targets, mask) == pytest.approx(1.0 - auc, abs=1e-15)


def test_roc_auc_named_cases():
    t = np.array([0, 0, 1, 1])
    assert roc_auc(np.array([0.1, 0.2, 0.3, 0.4]), t) == 1.0
    assert roc_auc(np.array([0.4, 0.3, 0.2, 0.1]), t) == 0.0
    assert roc_auc(np.full(4, 7.0), t) == 0.5  # all scores equal: every pair a tie
    assert roc_auc(np.array([1, 2, 2, 3]), t) == 0.875  # integer scores, one tied pair
    assert roc_auc(np.array([False, True, True, True]), t.astype(bool)) == 0.75


def test_roc_auc_skips_one_class_columns_and_micro_pools():
    scores = np.array([[0.1, 0.9, 0.3], [0.4, 0.8, 0.3], [0.35, 0.7, 0.3], [0.8, 0.6, 0.3]])
    targets = np.array([[0, 1, 0], [0, 1, 0], [1, 1, 0], [1, 1, 0]])  # columns 1, 2: one class
    assert roc_auc(scores, targets) == roc_auc(scores[:, 0], targets[:, 0]) == 0.75
    pooled = roc_auc(scores.reshape(-1), targets.reshape(-1))
    assert roc_auc(scores, targets, average="micro") == pooled
    # the mask can remove the only two-class column's negatives: nothing left to score
    with pytest.raises(ValueError, match=r"no column has both"):
        roc_auc(scores, targets, mask=np.array([False, False, True, True]))


@given(rankings(one_d=False), st.sampled_from(["macro", "micro"]))
def test_roc_auc_matches_sklearn(case, average):
    metrics = pytest.importorskip("sklearn.metrics")
    scores, targets, mask = case
    rows = np.ones(len(scores), bool) if mask is None else mask
    s, t = scores[rows], targets[rows]
    two_class = (t.sum(axis=0) > 0) & (t.sum(axis=0) < len(t))
    if average == "macro":
        s, t = s[:, two_class], t[:, two_class]  # our skip rule; sklearn would reject them
    if t.size == 0 or t.min() == t.max():
        return
    expected = metrics.roc_auc_score(t, s, average=average)
    assert roc_auc(scores, targets, mask, average) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_device_inputs_give_the_same_floats(backend):
    rng = np.random.default_rng(0)
    logits, labels, mask = rng.random((9, 3)), rng.integers(0, 3, 9), rng.random(9) < 0.6
    mask[0] = True
    targets = (rng.random((9, 3)) < 0.5).astype(int)
    device = [asarray(a, backend=backend) for a in (logits, labels, mask, targets)]
    assert accuracy(*device[:3]) == accuracy(logits, labels, mask)
    assert roc_auc(device[0], device[3]) == roc_auc(logits, targets)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: accuracy(np.ones(3), np.zeros(3, int)), ValueError, r"shape \(N, K\)"),
        (lambda: accuracy(np.ones((3, 2)), np.zeros(4, int)), ValueError, r"y must have shape"),
        (lambda: accuracy(np.ones((3, 2)), np.zeros(3)), TypeError, r"y must be of integer dtype"),
        (lambda: accuracy(np.ones((2, 2)), np.array([0, 2])), ValueError, r"in \[0, K\) = \[0, 2"),
        (lambda: accuracy(np.ones((2, 2)), [0, 1]), TypeError, r"y must be an array"),
        (
            lambda: accuracy(np.ones((2, 2)), np.zeros(2, int), np.zeros(2, bool)),
            ValueError,
            r"mask selects nothing",
        ),
        (
            lambda: accuracy(np.ones((2, 2)), np.zeros(2, int), np.ones(2, int)),
            TypeError,
            r"mask must be of boolean dtype, got int64",
        ),
        (lambda: accuracy(np.full((1, 2), np.nan), np.zeros(1, int)), ValueError, r"NaN"),
        (lambda: roc_auc(np.ones((3, 2)), np.ones(3)), ValueError, r"targets must have the"),
        (lambda: roc_auc(np.ones((3, 2, 1)), np.ones((3, 2, 1))), ValueError, r"shape \(N,\)"),
        (lambda: roc_auc(np.ones(3), np.array([0, 2, 1])), ValueError, r"must be 0 or 1"),
        (lambda: roc_auc(np.array([0.0, np.inf]), np.array([0, 1])), ValueError, r"infinity"),
        (lambda: roc_auc(np.ones(2), np.array([0, 1]), average="weighted"), ValueError, "macro"),
        (lambda: roc_auc(np.ones(2), np.ones(2)), ValueError, r"no column has both"),
        (
            lambda: roc_auc(np.ones(2), np.array([0, 1]), np.ones(3, bool)),
            ValueError,
            r"mask must have shape \(N,\) = \(2,\)",
        ),
        (lambda: roc_auc(np.ones(0), np.ones(0)), ValueError, r"N = 0"),
        (
            lambda: roc_auc(np.ones((2, 2)), np.eye(2), np.ones((2, 3), bool)),
            ValueError,
            r"or the scores' shape \(2, 2\)",
        ),
        (
            lambda: roc_auc(np.ones((2, 2)), np.eye(2), np.zeros((2, 2), bool)),
            ValueError,
            r"mask selects nothing",
        ),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
