"""Tests for refimpl.ops.activations: PyTorch kinks, scalar formulas, gradients, backends."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import asarray, to_numpy
from refimpl.ops.activations import (
    ACTIVATIONS,
    ELU,
    Identity,
    LeakyReLU,
    ReLU,
    get_activation,
    negative_part,
    positive_part,
)
from refimpl.testing import FORWARD_RTOL, GRADCHECK_RTOL, check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from tests.backends import DEVICE_BACKENDS

F64 = FORWARD_RTOL[np.dtype(np.float64)]
BLOCKS = [ReLU(), LeakyReLU(), LeakyReLU(0.2), ELU(), ELU(0.5), Identity()]


def scalar_value_and_slope(block, v: float) -> tuple[float, float]:
    """The textbook definition, one Python float at a time (PyTorch's kink conventions)."""
    if isinstance(block, ReLU):
        return (v, 1.0) if v > 0 else (0.0, 0.0)
    if isinstance(block, LeakyReLU):
        return (v, 1.0) if v > 0 else (block.negative_slope * v, block.negative_slope)
    if isinstance(block, ELU):
        return (v, 1.0) if v > 0 else (block.alpha * math.expm1(v), block.alpha * math.exp(v))
    return v, 1.0


def away_from_kink(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Finite differences across the kink at 0 are meaningless: push every value
    # at least 1e-2 (>> eps = 1e-6) away from it.
    x = rng.standard_normal(shape)
    return np.where(x >= 0, x + 1e-2, x - 1e-2)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


@given(st.sampled_from(BLOCKS), shapes, seeds())
def test_gradients_match_finite_differences(block, shape, seed):
    rng = np.random.default_rng(seed)
    report = check_gradients(block, {}, (away_from_kink(rng, shape),), rng=rng)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(st.sampled_from(BLOCKS), shapes, seeds(), st.booleans())
def test_matches_scalar_formula_and_leaves_inputs_untouched(block, shape, seed, with_zeros):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 3
    if with_zeros:  # the kink itself, where the convention decides the slope
        x[rng.random(shape) < 0.3] = 0.0
    d_y = rng.standard_normal(shape)
    x_copy, d_y_copy = x.copy(), d_y.copy()
    y, cache = block.forward({}, x)
    d_x, d_params = block.backward({}, cache, d_y)

    pairs = [scalar_value_and_slope(block, float(v)) for v in x.ravel()]
    y_naive = np.array([value for value, _ in pairs]).reshape(shape)
    d_x_naive = np.array([slope for _, slope in pairs]).reshape(shape) * d_y
    assert max_relative_error(y, y_naive) <= F64
    assert max_relative_error(d_x, d_x_naive) <= F64
    assert d_params == {}
    np.testing.assert_array_equal(x, x_copy)
    np.testing.assert_array_equal(d_y, d_y_copy)


KINK_X = np.array([-1.0, -0.0, 0.0, 1.0])
KINK_D_Y = np.array([2.0, 3.0, 5.0, 7.0])


def _at_kink(block):
    y, cache = block.forward({}, KINK_X)
    d_x, _ = block.backward({}, cache, KINK_D_Y)
    return y, d_x


def test_relu_derivative_at_zero_is_zero():
    y, d_x = _at_kink(ReLU())
    np.testing.assert_array_equal(y, [0.0, 0.0, 0.0, 1.0])
    np.testing.assert_array_equal(d_x, [0.0, 0.0, 0.0, 7.0])  # torch: grad where result > 0


@pytest.mark.parametrize("slope", [0.01, 0.2])
def test_leaky_relu_derivative_at_zero_is_negative_slope(slope):
    y, d_x = _at_kink(LeakyReLU(slope))
    np.testing.assert_array_equal(y, [-slope, 0.0, 0.0, 1.0])
    # torch: x > 0 ? grad : grad * slope, so the slope (not 1) at exactly 0 and -0
    np.testing.assert_array_equal(d_x, [slope * 2.0, slope * 3.0, slope * 5.0, 7.0])


def test_elu_derivative_at_zero_is_alpha():
    alpha = 0.5
    y, d_x = _at_kink(ELU(alpha))
    np.testing.assert_array_equal(y, [alpha * math.expm1(-1.0), 0.0, 0.0, 1.0])
    # alpha * exp(0) = alpha exactly at the kink (torch's elu_backward for x <= 0)
    assert d_x[1] == alpha * 3.0 and d_x[2] == alpha * 5.0 and d_x[3] == 7.0
    assert d_x[0] == pytest.approx(alpha * math.exp(-1.0) * 2.0, rel=F64)


@pytest.mark.filterwarnings("error")  # an overflow in exp would be a RuntimeWarning
def test_elu_extreme_inputs_stay_finite_and_keep_tiny_slopes():
    # The slope alpha * exp(x) is taken from x, not as y + alpha: for x = -40,
    # y + alpha cancels to exactly 0 while the true slope is alpha * 4.2e-18.
    alpha = 1.5
    x = np.array([-1e3, -40.0, 1e3])
    y, cache = ELU(alpha).forward({}, x)
    d_x, _ = ELU(alpha).backward({}, cache, np.ones(3))
    np.testing.assert_array_equal(y, [-alpha, alpha * math.expm1(-40.0), 1e3])
    np.testing.assert_array_equal(d_x, [0.0, alpha * math.exp(-40.0), 1.0])
    assert d_x[1] > 0


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("block", BLOCKS, ids=repr)
def test_extreme_inputs_stay_finite(block):
    y, cache = block.forward({}, np.array([-1e3, 1e3]))
    d_x, _ = block.backward({}, cache, np.ones(2))
    assert np.isfinite(y).all() and np.isfinite(d_x).all()


def test_identity_passes_input_and_cotangent_through():
    x, d_y = np.arange(3.0), np.ones(3)
    y, cache = Identity().forward({}, x)
    assert y is x
    assert Identity().backward({}, cache, d_y) == (d_y, {})


@pytest.mark.parametrize("block", BLOCKS, ids=repr)
def test_float32_stays_float32(block):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y, cache = block.forward({}, x)
    d_x, _ = block.backward({}, cache, y)
    assert y.dtype == d_x.dtype == np.float32


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("block", BLOCKS, ids=repr)
def test_backend_matches_numpy(block, backend):
    rng = np.random.default_rng(1)
    x, d_y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    x[0, 0] = 0.0
    y, cache = block.forward({}, x)
    d_x, _ = block.backward({}, cache, d_y)
    y_b, cache_b = block.forward({}, asarray(x, backend=backend))
    d_x_b, _ = block.backward({}, cache_b, asarray(d_y, backend=backend))
    assert max_relative_error(to_numpy(y_b), y) <= F64
    assert max_relative_error(to_numpy(d_x_b), d_x) <= F64


def test_registry_builds_configured_blocks():
    assert set(ACTIVATIONS) == {"relu", "leaky_relu", "elu", "identity"}
    assert get_activation("relu") == ReLU()
    assert get_activation("leaky_relu", negative_slope=0.2) == LeakyReLU(0.2)
    assert get_activation("elu", alpha=0.5) == ELU(0.5)
    assert get_activation("identity") == Identity()
    with pytest.raises(ValueError, match=r"unknown activation 'gelu'; valid names are elu, "):
        get_activation("gelu")


@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (np.arange(3), TypeError, r"x must be a floating-point array, got dtype int64"),
        ([1.0, 2.0], TypeError, r"x must be an array.*refimpl.backend.asarray"),
        (np.array([1.0, np.nan]), ValueError, r"x contains NaN or infinity"),
        (np.array([np.inf]), ValueError, r"x contains NaN or infinity"),
    ],
)
@pytest.mark.parametrize("block", BLOCKS, ids=repr)
def test_forward_rejects_bad_input_with_a_fix(block, x, error, message):
    with pytest.raises(error, match=message):
        block.forward({}, x)


@pytest.mark.parametrize("block", BLOCKS, ids=repr)
def test_backward_rejects_bad_cotangent(block):
    _, cache = block.forward({}, np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"d_y must be an array of the output's shape \(2, 3\)"):
        block.backward({}, cache, np.ones((3, 2)))
    with pytest.raises(TypeError, match=r"d_y has dtype float32 but the forward ran in float64"):
        block.backward({}, cache, np.ones((2, 3), dtype=np.float32))


@pytest.mark.parametrize(
    "make", [lambda: LeakyReLU(float("nan")), lambda: ELU("1"), lambda: ELU(math.inf)]
)
def test_config_rejects_non_finite_coefficients(make):
    with pytest.raises(ValueError, match=r"must be a finite real number"):
        make()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_positive_and_negative_parts_are_maximum_and_minimum_with_zero_bit_for_bit(
    dtype: type,
) -> None:
    """The same bits as ``maximum(x, 0)`` and ``minimum(x, 0)``, signed zeros, infinities and
    NaN included (they only avoid NumPy's slow scalar-operand loop)."""
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.5, -2.25]
    x = np.concatenate([special, np.random.default_rng(0).standard_normal(101)]).astype(dtype)
    x = x.reshape(2, -1)  # any shape
    bits = np.int32 if dtype == np.float32 else np.int64
    for fast, reference in ((positive_part, np.maximum), (negative_part, np.minimum)):
        got, want = fast(x), reference(x, 0)
        assert got.dtype == x.dtype and got.shape == x.shape
        np.testing.assert_array_equal(got.view(bits), want.view(bits))
