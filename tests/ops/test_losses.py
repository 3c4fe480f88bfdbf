"""Tests for refimpl.ops.losses: SciPy formulations and naive loops, gradients, extreme logits,
the L1 kink, masks, backends, PyTorch parity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy.special import expit, log_expit, log_softmax, softmax

from refimpl.backend import asarray, to_numpy
from refimpl.ops.losses import BCEWithLogits, L1Loss, MSELoss, SoftmaxCrossEntropy
from refimpl.testing import FORWARD_RTOL, GRADCHECK_RTOL, check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from tests.backends import DEVICE_BACKENDS

F64 = FORWARD_RTOL[np.dtype(np.float64)]
CE, BCE = SoftmaxCrossEntropy(), BCEWithLogits()


@st.composite
def cases(draw: st.DrawFn, multi_label: bool = False, scales=(1.0,)):
    """(logits, labels or targets, mask or None, d_loss), values from a drawn seed."""
    n, k = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(seeds()))
    logits = rng.standard_normal((n, k)) * draw(st.sampled_from(scales))
    mask = None
    kind = draw(st.sampled_from(["none", "rows", "entries"] if multi_label else ["none", "rows"]))
    if kind == "rows":
        mask = rng.random(n) < 0.5
        mask[rng.integers(n)] = True  # a loss needs at least one row
    if kind == "entries":  # missing labels: an (N, K) mask of the observed ones
        mask = rng.random((n, k)) < 0.5
        mask[rng.integers(n), rng.integers(k)] = True  # a loss needs at least one entry
    if multi_label:
        soft = draw(st.booleans())
        targets = rng.random((n, k)) if soft else (rng.random((n, k)) < 0.5).astype(float)
        if kind == "entries":
            targets[~mask] = np.nan  # a missing label (OGB's empty cell): must not be read
    else:
        targets = rng.integers(0, k, n)
        if mask is not None:
            targets[~mask] = -1  # placeholder label outside the mask: must not be read
    return logits, targets, mask, float(rng.standard_normal())


def naive_cross_entropy(logits, labels, mask, d_loss):
    rows = np.flatnonzero(np.ones(len(labels), bool) if mask is None else mask)
    loss = -np.mean([log_softmax(logits[i])[labels[i]] for i in rows])
    d_logits = np.zeros_like(logits)
    for i in rows:
        d_logits[i] = softmax(logits[i]) - np.eye(logits.shape[1])[labels[i]]
    return loss, d_logits * d_loss / len(rows)


def naive_bce(logits, targets, mask, d_loss):
    """Over the selected rows (an (N,) mask) or entries (an (N, K) mask)."""
    rows = np.ones(len(logits), bool) if mask is None else mask
    z, t = logits[rows], targets[rows]
    loss = -np.mean(t * log_expit(z) + (1 - t) * log_expit(-z))
    d_logits = np.zeros_like(logits)
    d_logits[rows] = (expit(z) - t) * d_loss / z.size
    return loss, d_logits


def assert_close_on_scale(actual, expected, scale: float) -> None:
    """``max |actual - expected| <= FORWARD_RTOL * max(scale, max |expected|)``.

    Both sides compute a small number as a difference of terms of size
    ``scale`` (``softmax - one_hot`` and ``sigmoid - t`` when a row is nearly
    right; ``z - log_sum_exp`` in the loss), so each is accurate to a few ulps
    *of the terms*, not of the result: a saturated row's gradient of 5e-9 carries
    an absolute error of ~1e-16 (relative 1e-8) in SciPy and here alike.
    """
    error = float(np.max(np.abs(np.asarray(actual) - expected)))
    assert error <= F64 * max(scale, float(np.max(np.abs(expected)))), (error, scale)


# Saturated rows found by Hypothesis: the gradient is a rounding-level difference.
SATURATED_CE = (np.array([[-6.23815083, 12.40027015]]), np.array([1]), np.array([True]), -0.65)
SATURATED_BCE = (np.array([[30.0, -30.0, 2.0]]), np.array([[1.0, 0.0, 1.0]]), None, 1.3)


# Logits of scale 1 only: a row with a logit gap of ~20 has a softmax gradient of
# ~1e-9, below what central differences resolve (noise ~1e-16 / eps = 1e-10).
# Saturated rows are covered by the SciPy comparison and the extreme-logit tests.
@given(cases())
def test_cross_entropy_gradients_match_finite_differences(case):
    logits, labels, mask, _ = case
    report = check_gradients(CE, {}, (logits, labels), forward_kwargs={"mask": mask})
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(cases(multi_label=True))
def test_bce_gradients_match_finite_differences(case):
    logits, targets, mask, _ = case
    report = check_gradients(
        BCE, {}, (logits, targets), forward_kwargs={"mask": mask}, wrt_inputs=[0]
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def _compare_with_naive(block, naive, case, loss_scale: float, grad_scale: float) -> None:
    logits, targets, mask, d_loss = case
    copies = [None if a is None else a.copy() for a in (logits, targets, mask)]
    loss, cache = block.forward({}, logits, targets, mask)
    d_logits, d_params = block.backward({}, cache, d_loss)

    loss_naive, d_logits_naive = naive(logits, targets, mask, d_loss)
    assert loss.shape == () and loss.dtype == np.float64 and d_params == {}
    assert_close_on_scale(loss, loss_naive, loss_scale)
    assert_close_on_scale(d_logits, d_logits_naive, grad_scale)
    for value, copy in zip((logits, targets, mask), copies, strict=True):
        np.testing.assert_array_equal(value, copy)


@example(case=SATURATED_CE)
@given(cases(scales=(1.0, 10.0, 30.0)))
def test_cross_entropy_matches_scipy_and_leaves_inputs_untouched(case):
    logits, labels, mask, d_loss = case
    count = len(labels) if mask is None else int(mask.sum())
    # loss terms: z_label - max(z) and log-sum-exp, each at most the row's range (+ log K)
    loss_scale = 1.0 + float(np.ptp(logits)) + np.log(logits.shape[1])
    _compare_with_naive(CE, naive_cross_entropy, case, loss_scale, abs(d_loss) / count)


@example(case=SATURATED_BCE)
@given(cases(multi_label=True, scales=(1.0, 10.0, 30.0)))
def test_bce_matches_scipy_and_leaves_inputs_untouched(case):
    logits, _, mask, d_loss = case
    rows = np.ones(len(logits), bool) if mask is None else mask
    count = int(np.broadcast_to(rows.reshape(len(logits), -1), logits.shape).sum())  # entries
    loss_scale = 1.0 + float(np.max(np.abs(logits)))  # terms max(z, 0) and z t
    _compare_with_naive(BCE, naive_bce, case, loss_scale, abs(d_loss) / count)


@pytest.mark.filterwarnings("error")  # an overflow in exp would be a RuntimeWarning
def test_cross_entropy_extreme_logits_stay_finite():
    logits = np.array([[1e3, -1e3, 0.0], [-1e3, 1e3, 0.0]])
    loss, cache = CE.forward({}, logits, np.array([0, 0]))
    d_logits, _ = CE.backward({}, cache, 1.0)
    assert float(loss) == pytest.approx(1e3, rel=F64)  # mean of 0 and 2e3
    # softmax saturates to one-hot rows; exp(-1e3) underflows to exactly 0
    np.testing.assert_allclose(d_logits, [[0.0, 0.0, 0.0], [-0.5, 0.5, 0.0]], rtol=0, atol=F64)


@pytest.mark.filterwarnings("error")
def test_bce_extreme_logits_stay_finite():
    logits = np.array([[1e3, -1e3, 1e3, -1e3]])
    loss, cache = BCE.forward({}, logits, np.array([[1.0, 0.0, 0.0, 1.0]]))
    d_logits, _ = BCE.backward({}, cache, 1.0)
    assert float(loss) == pytest.approx(500.0, rel=F64)  # mean of 0, 0, 1e3, 1e3
    np.testing.assert_array_equal(d_logits, [[0.0, 0.0, 0.25, -0.25]])


@pytest.mark.parametrize("block", [CE, BCE], ids=["cross_entropy", "bce"])
def test_rows_outside_the_mask_get_exactly_zero_gradient(block):
    rng = np.random.default_rng(5)
    logits, mask = rng.standard_normal((5, 3)), np.array([True, False, True, False, False])
    targets = np.array([2, -7, 0, 99, -1]) if block is CE else rng.random((5, 3))
    loss, cache = block.forward({}, logits, targets, mask)
    d_logits, _ = block.backward({}, cache, 1.0)
    np.testing.assert_array_equal(d_logits[~mask], 0.0)
    # Equal to the loss over the selected rows alone (PyTorch: loss(logits[mask], ...)).
    loss_selected, _ = block.forward({}, logits[mask], targets[mask])
    assert max_relative_error(loss, loss_selected) <= F64


def test_bce_missing_labels_get_zero_gradient_and_change_nothing():
    # TOX21's empty cells: a masked entry's logit and target must not reach the loss.
    rng = np.random.default_rng(11)
    logits, targets = rng.standard_normal((4, 3)), (rng.random((4, 3)) < 0.5).astype(float)
    observed = np.array([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 1, 0]], dtype=bool)
    loss, cache = BCE.forward({}, logits, np.where(observed, targets, np.nan), observed)
    d_logits, _ = BCE.backward({}, cache, 1.0)
    np.testing.assert_array_equal(d_logits[~observed], 0.0)
    moved = np.where(observed, logits, rng.standard_normal((4, 3)) * 50)  # masked logits only
    loss_moved, cache_moved = BCE.forward({}, moved, np.where(observed, targets, 1.0), observed)
    assert float(loss_moved) == float(loss)
    np.testing.assert_array_equal(BCE.backward({}, cache_moved, 1.0)[0], d_logits)
    # the mean is over the 7 observed entries, not the 12 cells (nor the 4 rows)
    terms = np.logaddexp(0, logits) - logits * targets  # (4, 3) the elementwise loss
    assert max_relative_error(loss, terms[observed].sum() / 7) <= F64


@given(cases(multi_label=True))
def test_bce_matches_torch_with_any_mask(case):
    # The study's TOX21 loss: BCEWithLogitsLoss()(scores[masks], labels[masks]).
    torch = pytest.importorskip("torch")
    logits, targets, mask, d_loss = case
    loss, cache = BCE.forward({}, logits, targets, mask)
    d_logits, _ = BCE.backward({}, cache, d_loss)
    chosen = torch.from_numpy(np.ones(len(logits), bool) if mask is None else mask)
    z = torch.tensor(logits, requires_grad=True)
    torch_loss = torch.nn.BCEWithLogitsLoss()(z[chosen], torch.tensor(targets)[chosen])
    (torch_loss * d_loss).backward()
    assert max_relative_error(loss, torch_loss.detach().numpy()) <= F64
    assert max_relative_error(d_logits, z.grad.numpy()) <= F64


def test_cross_entropy_with_one_class_is_zero():
    loss, cache = CE.forward({}, np.array([[3.0], [-2.0]]), np.array([0, 0]))
    d_logits, _ = CE.backward({}, cache, 1.0)
    assert float(loss) == 0.0
    np.testing.assert_array_equal(d_logits, 0.0)


def test_bce_accepts_boolean_targets_exactly():
    logits = np.random.default_rng(6).standard_normal((3, 2))
    hard = np.array([[True, False], [False, False], [True, True]])
    loss_bool, _ = BCE.forward({}, logits, hard)
    loss_float, _ = BCE.forward({}, logits, hard.astype(np.float64))
    assert float(loss_bool) == float(loss_float)


@pytest.mark.parametrize("block", [CE, BCE], ids=["cross_entropy", "bce"])
def test_float32_stays_float32_and_cotangent_forms_agree(block):
    logits = np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32)
    targets = np.array([0, 2, 1, 1]) if block is CE else np.eye(4, 3, dtype=np.float32)
    loss, cache = block.forward({}, logits, targets)
    d_from_float, _ = block.backward({}, cache, 2.0)
    d_from_array, _ = block.backward({}, cache, np.asarray(2.0, dtype=np.float32))
    d_from_scalar, _ = block.backward({}, cache, np.float32(2.0))
    assert loss.dtype == d_from_float.dtype == d_from_array.dtype == np.float32
    np.testing.assert_array_equal(d_from_float, d_from_array)
    np.testing.assert_array_equal(d_from_float, d_from_scalar)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("block", [CE, BCE], ids=["cross_entropy", "bce"])
def test_backend_matches_numpy(block, backend):
    rng = np.random.default_rng(8)
    logits, mask = rng.standard_normal((5, 3)), np.array([True, False, True, True, False])
    targets = np.array([2, -1, 0, 1, -1]) if block is CE else rng.random((5, 3))
    loss, cache = block.forward({}, logits, targets, mask)
    d_logits, _ = block.backward({}, cache, 0.7)

    on = [asarray(a, backend=backend) for a in (logits, targets, mask)]
    loss_b, cache_b = block.forward({}, *on)
    d_loss_b = asarray(np.asarray(0.7), backend=backend)
    d_logits_b, _ = block.backward({}, cache_b, d_loss_b)
    assert loss_b.shape == ()
    assert max_relative_error(to_numpy(loss_b), loss) <= F64
    assert max_relative_error(to_numpy(d_logits_b), d_logits) <= F64


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_bce_entry_mask_on_backend_matches_numpy(backend):
    rng = np.random.default_rng(12)
    logits, observed = rng.standard_normal((5, 3)), rng.random((5, 3)) < 0.5
    observed[0, 0] = True
    targets = np.where(observed, rng.random((5, 3)), np.nan)
    loss, cache = BCE.forward({}, logits, targets, observed)
    d_logits, _ = BCE.backward({}, cache, 0.7)
    on = [asarray(a, backend=backend) for a in (logits, targets, observed)]
    loss_b, cache_b = BCE.forward({}, *on)
    d_logits_b, _ = BCE.backward({}, cache_b, asarray(np.asarray(0.7), backend=backend))
    assert max_relative_error(to_numpy(loss_b), loss) <= F64
    assert max_relative_error(to_numpy(d_logits_b), d_logits) <= F64


LOGITS = np.zeros((3, 2))
CE_ERRORS = [
    ((LOGITS, np.array([0, 1, 0]), np.zeros(3, bool)), ValueError, r"mask selects no rows"),
    ((LOGITS[:0], np.array([], int), None), ValueError, r"mask selects no rows"),
    ((LOGITS, np.array([0, 2, 0]), None), ValueError, r"in \[0, K\) = \[0, 2\), got .*\[0, 2\]"),
    ((LOGITS, np.array([0, -1, 0]), None), ValueError, r"must lie in \[0, K\)"),
    ((LOGITS, np.array([0.0, 1.0, 0.0]), None), TypeError, r"labels must be an integer array"),
    ((LOGITS, np.array([0, 1]), None), ValueError, r"labels must have shape \(N,\) = \(3,\)"),
    ((LOGITS, np.array([0, 1, 0]), np.array([1, 0, 1])), TypeError, r"mask must be a boolean"),
    ((LOGITS, np.array([0, 1, 0]), np.ones(2, bool)), ValueError, r"mask must have shape"),
    ((LOGITS[0], np.array([0]), None), ValueError, r"logits must be 2-D"),
    ((LOGITS.astype(int), np.array([0, 1, 0]), None), TypeError, r"floating-point array"),
    ((LOGITS + np.nan, np.array([0, 1, 0]), None), ValueError, r"logits contains NaN"),
]
BCE_ERRORS = [
    ((LOGITS, np.zeros((3, 1)), None), ValueError, r"targets must have the logits' shape"),
    ((LOGITS, np.full((3, 2), 1.5), None), ValueError, r"targets must lie in \[0, 1\]"),
    ((LOGITS, np.full((3, 2), np.nan), None), ValueError, r"targets must lie in \[0, 1\]"),
    ((LOGITS, np.zeros((3, 2), np.float32), None), TypeError, r"targets have dtype float32"),
    ((LOGITS, np.zeros((3, 2)), np.zeros(3, bool)), ValueError, r"mask selects no rows"),
    ((LOGITS, np.zeros((3, 2)), np.zeros((3, 2), bool)), ValueError, r"mask selects no entry"),
    ((LOGITS, np.zeros((3, 2)), np.ones((3, 1), bool)), ValueError, r"entry mask must have"),
    ((LOGITS, np.zeros((3, 2)), np.ones((3, 2))), TypeError, r"mask must be a boolean"),
    # only the entries outside the mask may be NaN
    ((LOGITS, np.full((3, 2), np.nan), np.eye(3, 2, dtype=bool)), ValueError, r"\[0, 1\]"),
]


@pytest.mark.parametrize(
    ("block", "inputs", "error", "message"),
    [(CE, *case) for case in CE_ERRORS] + [(BCE, *case) for case in BCE_ERRORS],
)
def test_forward_rejects_bad_input_with_a_fix(block, inputs, error, message):
    with pytest.raises(error, match=message):
        block.forward({}, *inputs)


@pytest.mark.parametrize("block", [CE, BCE], ids=["cross_entropy", "bce"])
def test_backward_rejects_non_scalar_or_mistyped_cotangent(block):
    _, cache = block.forward({}, LOGITS, np.array([0, 1, 0]) if block is CE else LOGITS)
    with pytest.raises(ValueError, match=r"d_loss must be a scalar"):
        block.backward({}, cache, np.ones(2))
    with pytest.raises(TypeError, match=r"d_loss has dtype float32 but the loss was computed"):
        block.backward({}, cache, np.asarray(1.0, dtype=np.float32))
    with pytest.raises(TypeError, match=r"d_loss must be a number or a 0-d array"):
        block.backward({}, cache, "1.0")


# -- regression losses: MSELoss and L1Loss --------------------------------------------------------

MSE, L1 = MSELoss(), L1Loss()
REGRESSION = {"mse": MSE, "l1": L1}


@st.composite
def regression_cases(draw: st.DrawFn):
    """(predictions, targets, mask or None, d_loss) with G rows and T targets, from a seed."""
    g, t = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(seeds()))
    predictions, targets = rng.standard_normal((g, t)), rng.standard_normal((g, t))
    mask = None
    if draw(st.booleans()):
        mask = rng.random(g) < 0.5
        mask[rng.integers(g)] = True  # a loss needs at least one row
    return predictions, targets, mask, float(rng.standard_normal())


def naive_regression(name, predictions, targets, mask, d_loss):
    """Per-entry loops: the mean of (p - t)^2 or |p - t| over masked rows and all columns."""
    rows = [i for i in range(len(predictions)) if mask is None or mask[i]]
    terms, d_predictions = [], np.zeros_like(predictions)
    count = len(rows) * predictions.shape[1]
    for i in rows:
        for j in range(predictions.shape[1]):
            r = predictions[i, j] - targets[i, j]
            terms.append(r * r if name == "mse" else abs(r))
            slope = 2 * r if name == "mse" else (1.0 if r > 0 else -1.0 if r < 0 else 0.0)
            d_predictions[i, j] = d_loss * slope / count
    return float(np.mean(terms)), d_predictions


@pytest.mark.parametrize("name", list(REGRESSION))
@given(case=regression_cases())
def test_regression_losses_match_naive_loops_and_leave_inputs_untouched(name, case):
    predictions, targets, mask, d_loss = case
    copies = [None if a is None else a.copy() for a in (predictions, targets, mask)]
    loss, cache = REGRESSION[name].forward({}, predictions, targets, mask)
    d_predictions, d_params = REGRESSION[name].backward({}, cache, d_loss)
    loss_naive, d_naive = naive_regression(name, predictions, targets, mask, d_loss)
    assert loss.shape == () and loss.dtype == np.float64 and d_params == {}
    assert max_relative_error(loss, np.asarray(loss_naive)) <= F64
    assert max_relative_error(d_predictions, d_naive) <= F64
    for value, copy in zip((predictions, targets, mask), copies, strict=True):
        np.testing.assert_array_equal(value, copy)


@pytest.mark.parametrize("name", list(REGRESSION))
@given(case=regression_cases())
def test_regression_gradients_match_finite_differences(name, case):
    # Residuals are standard normal differences: |p - t| < eps = 1e-6 (the L1 kink inside a
    # central difference) has probability ~1e-6 per entry.
    predictions, targets, mask, _ = case
    report = check_gradients(
        REGRESSION[name], {}, (predictions, targets), forward_kwargs={"mask": mask}, wrt_inputs=[0]
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_l1_gradient_at_zero_residual_is_exactly_zero():
    # |r| has no derivative at r = 0; the convention is sign(0) = 0, as PyTorch's l1_loss
    # backward (sgn). An exact prediction must not be pushed either way.
    predictions = np.array([[1.5, -2.0], [0.0, 3.0]])
    targets = np.array([[1.5, -1.0], [0.0, 3.0]])  # three residuals exactly 0
    loss, cache = L1.forward({}, predictions, targets)
    d_predictions, _ = L1.backward({}, cache, 1.0)
    assert float(loss) == 0.25  # |-1| / 4
    np.testing.assert_array_equal(d_predictions, [[0.0, -0.25], [0.0, 0.0]])


@pytest.mark.parametrize("name", list(REGRESSION))
def test_regression_rows_outside_the_mask_get_exactly_zero_gradient(name):
    rng = np.random.default_rng(9)
    predictions, targets = rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
    mask = np.array([True, False, False, True, False])
    loss, cache = REGRESSION[name].forward({}, predictions, targets, mask)
    d_predictions, _ = REGRESSION[name].backward({}, cache, 1.0)
    np.testing.assert_array_equal(d_predictions[~mask], 0.0)
    loss_selected, _ = REGRESSION[name].forward({}, predictions[mask], targets[mask])
    assert max_relative_error(loss, loss_selected) <= F64


@pytest.mark.parametrize("name", list(REGRESSION))
@given(case=regression_cases())
@example(  # zero residuals: torch's l1_loss gradient there is 0 too
    case=(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 0.0], [3.0, 5.0]]), None, 0.7)
)
def test_regression_losses_match_torch(name, case):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    predictions, targets, mask, d_loss = case
    loss, cache = REGRESSION[name].forward({}, predictions, targets, mask)
    d_predictions, _ = REGRESSION[name].backward({}, cache, d_loss)

    rows = np.ones(len(predictions), bool) if mask is None else mask
    p = torch.tensor(predictions, requires_grad=True)
    t = torch.tensor(targets)
    rows_t = torch.from_numpy(rows)
    torch_loss = (functional.mse_loss if name == "mse" else functional.l1_loss)(
        p[rows_t], t[rows_t]
    )
    (torch_loss * d_loss).backward()
    assert max_relative_error(loss, torch_loss.detach().numpy()) <= F64
    assert max_relative_error(d_predictions, p.grad.numpy()) <= F64
    if name == "l1":  # the kink convention agrees exactly, not just within rounding
        zero = (predictions == targets) & rows[:, None]
        np.testing.assert_array_equal(d_predictions[zero], p.grad.numpy()[zero])


@pytest.mark.parametrize("name", list(REGRESSION))
def test_regression_float32_stays_float32(name):
    rng = np.random.default_rng(10)
    predictions = rng.standard_normal((4, 2)).astype(np.float32)
    targets = rng.standard_normal((4, 2)).astype(np.float32)
    loss, cache = REGRESSION[name].forward({}, predictions, targets)
    d_from_float, _ = REGRESSION[name].backward({}, cache, 2.0)
    d_from_scalar, _ = REGRESSION[name].backward({}, cache, np.float32(2.0))
    assert loss.dtype == d_from_float.dtype == np.float32
    np.testing.assert_array_equal(d_from_float, d_from_scalar)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("name", list(REGRESSION))
def test_regression_backend_matches_numpy(name, backend):
    rng = np.random.default_rng(11)
    predictions, targets = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    mask = np.array([True, False, True, True, False])
    loss, cache = REGRESSION[name].forward({}, predictions, targets, mask)
    d_predictions, _ = REGRESSION[name].backward({}, cache, 0.7)
    on = [asarray(a, backend=backend) for a in (predictions, targets, mask)]
    loss_b, cache_b = REGRESSION[name].forward({}, *on)
    d_b, _ = REGRESSION[name].backward({}, cache_b, asarray(np.asarray(0.7), backend=backend))
    assert loss_b.shape == ()
    assert max_relative_error(to_numpy(loss_b), loss) <= F64
    assert max_relative_error(to_numpy(d_b), d_predictions) <= F64


PREDICTIONS = np.zeros((3, 2))
REGRESSION_ERRORS = [
    ((PREDICTIONS, np.zeros((3, 1)), None), ValueError, r"targets must have the predictions'"),
    ((PREDICTIONS, np.zeros((3, 2), np.float32), None), TypeError, r"targets have dtype float32"),
    ((PREDICTIONS, np.zeros((3, 2), np.int64), None), TypeError, r"targets have dtype int64"),
    ((PREDICTIONS, np.full((3, 2), np.nan), None), ValueError, r"targets contains NaN"),
    ((PREDICTIONS, [[0.0, 0.0]] * 3, None), TypeError, r"targets must be an array"),
    ((PREDICTIONS, PREDICTIONS, np.zeros(3, bool)), ValueError, r"mask selects no rows"),
    ((PREDICTIONS, PREDICTIONS, np.ones(2, bool)), ValueError, r"mask must have shape"),
    ((PREDICTIONS[:, 0], PREDICTIONS[:, 0], None), ValueError, r"predictions must be 2-D"),
    ((PREDICTIONS[:, :0], PREDICTIONS[:, :0], None), ValueError, r"T >= 1 columns"),
    ((PREDICTIONS + np.inf, PREDICTIONS, None), ValueError, r"predictions contains NaN"),
]


@pytest.mark.parametrize(
    ("name", "inputs", "error", "message"),
    [(name, *case) for name in REGRESSION for case in REGRESSION_ERRORS],
)
def test_regression_forward_rejects_bad_input_with_a_fix(name, inputs, error, message):
    with pytest.raises(error, match=message):
        REGRESSION[name].forward({}, *inputs)


@pytest.mark.parametrize("name", list(REGRESSION))
def test_regression_backward_rejects_non_scalar_or_mistyped_cotangent(name):
    _, cache = REGRESSION[name].forward({}, PREDICTIONS, PREDICTIONS + 1)
    with pytest.raises(ValueError, match=r"d_loss must be a scalar"):
        REGRESSION[name].backward({}, cache, np.ones(2))
    with pytest.raises(TypeError, match=r"d_loss has dtype float32 but the loss was computed"):
        REGRESSION[name].backward({}, cache, np.asarray(1.0, dtype=np.float32))
