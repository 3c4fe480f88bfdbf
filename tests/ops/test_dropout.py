"""Tests for refimpl.ops.dropout: explicit masks, reproducible draws, unbiasedness, backends."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import asarray, to_numpy
from refimpl.ops.dropout import Dropout
from refimpl.testing import FORWARD_RTOL, GRADCHECK_RTOL, check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from tests.backends import DEVICE_BACKENDS

F64 = FORWARD_RTOL[np.dtype(np.float64)]
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)
probabilities = st.sampled_from([0.0, 0.1, 0.3, 0.6, 0.9])


@given(shapes, probabilities, seeds())
def test_gradients_match_finite_differences_with_a_fixed_mask(shape, p, seed):
    rng = np.random.default_rng(seed)
    x, mask = rng.standard_normal(shape), rng.random(shape) >= p
    report = check_gradients(
        Dropout(p), {}, (x,), forward_kwargs={"training": True, "mask": mask}, rng=rng
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(shapes, probabilities.filter(lambda p: p > 0), seeds())
def test_matches_naive_loop_and_leaves_inputs_untouched(shape, p, seed):
    rng = np.random.default_rng(seed)
    x, d_y, mask = rng.standard_normal(shape), rng.standard_normal(shape), rng.random(shape) >= p
    copies = (x.copy(), d_y.copy(), mask.copy())
    y, cache = Dropout(p).forward({}, x, training=True, mask=mask)
    d_x, d_params = Dropout(p).backward({}, cache, d_y)

    keep = mask.ravel()
    y_naive = [v / (1 - p) if k else 0.0 for v, k in zip(x.ravel(), keep, strict=True)]
    d_x_naive = [g / (1 - p) if k else 0.0 for g, k in zip(d_y.ravel(), keep, strict=True)]
    assert max_relative_error(y, np.reshape(y_naive, shape)) <= F64
    assert max_relative_error(d_x, np.reshape(d_x_naive, shape)) <= F64
    assert d_params == {}
    np.testing.assert_array_equal(cache.mask, mask)
    for value, copy in zip((x, d_y, mask), copies, strict=True):
        np.testing.assert_array_equal(value, copy)


def test_drawn_mask_is_reproducible_from_the_seed_and_replayable():
    p, shape, x = 0.4, (6, 7), np.random.default_rng(0).standard_normal((6, 7))
    y1, cache1 = Dropout(p).forward({}, x, training=True, rng=np.random.default_rng(11))
    y2, cache2 = Dropout(p).forward({}, x, training=True, rng=np.random.default_rng(11))
    np.testing.assert_array_equal(y1, y2)
    # The documented draw, so another implementation can regenerate it from the seed.
    np.testing.assert_array_equal(cache1.mask, np.random.default_rng(11).random(shape) >= p)
    assert 0 < cache1.mask.sum() < cache1.mask.size  # the draw actually drops and keeps
    # Replaying the drawn mask gives the same output; a given mask wins over rng,
    # which is then not advanced.
    rng = np.random.default_rng(12)
    state = rng.bit_generator.state
    y3, _ = Dropout(p).forward({}, x, training=True, rng=rng, mask=cache2.mask)
    np.testing.assert_array_equal(y3, y1)
    assert rng.bit_generator.state == state


@pytest.mark.parametrize(("p", "training"), [(0.5, False), (0.0, True), (0.0, False)])
def test_identity_in_eval_mode_or_p_zero_draws_nothing(p, training):
    x, d_y = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    y, cache = Dropout(p).forward({}, x, training=training, rng=rng)
    d_x, _ = Dropout(p).backward({}, cache, d_y)
    assert y is x and d_x is d_y
    assert cache.mask is None
    assert rng.bit_generator.state == state


@pytest.mark.parametrize("p", [0.2, 0.7])  # not 0.5, where 1/(1-p) = 1/p hides a swap
@pytest.mark.parametrize("seed", [0, 1])
def test_mean_is_preserved_in_expectation(p, seed):
    # y_i - x_i = x_i (m_i / (1 - p) - 1) with m_i ~ Bernoulli(1 - p): mean 0,
    # variance x_i^2 p / (1 - p). Their average over n entries is within 5 of its
    # standard deviations of 0 except with probability ~6e-7 (normal tail; n is 10^5).
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.5, size=(400, 250))
    y, _ = Dropout(p).forward({}, x, training=True, rng=rng)
    sigma = math.sqrt(np.sum(x**2) * p / (1 - p)) / x.size
    assert abs(np.mean(y - x)) <= 5 * sigma
    # and the keep rate is 1 - p (binomial standard deviation sqrt(n p (1 - p)) / n)
    kept = np.mean(y != 0)
    assert abs(kept - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / x.size)


def test_float32_stays_float32():
    x = np.ones((3, 4), dtype=np.float32)
    y, cache = Dropout(0.3).forward({}, x, training=True, rng=np.random.default_rng(0))
    d_x, _ = Dropout(0.3).backward({}, cache, y)
    assert y.dtype == d_x.dtype == np.float32 and cache.mask.dtype == bool


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_backend_matches_numpy_for_drawn_and_given_masks(backend):
    rng = np.random.default_rng(4)
    x, d_y = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    block = Dropout(0.3)
    y, cache = block.forward({}, x, training=True, rng=np.random.default_rng(9))
    d_x, _ = block.backward({}, cache, d_y)

    x_b = asarray(x, backend=backend)
    y_b, cache_b = block.forward({}, x_b, training=True, rng=np.random.default_rng(9))
    d_x_b, _ = block.backward({}, cache_b, asarray(d_y, backend=backend))
    np.testing.assert_array_equal(to_numpy(cache_b.mask), cache.mask)
    assert max_relative_error(to_numpy(y_b), y) <= F64
    assert max_relative_error(to_numpy(d_x_b), d_x) <= F64
    given_mask = asarray(cache.mask, backend=backend)
    y_given, _ = block.forward({}, x_b, training=True, mask=given_mask)
    assert max_relative_error(to_numpy(y_given), y) <= F64


@pytest.mark.parametrize("p", [1.0, -0.1, float("nan"), "0.5", True])
def test_config_rejects_probability_outside_0_1(p):
    with pytest.raises(ValueError, match=r"p must be a number in \[0, 1\)"):
        Dropout(p)


def test_training_without_randomness_says_what_to_pass():
    with pytest.raises(ValueError, match=r"needs randomness: pass rng=.*or an explicit boolean"):
        Dropout(0.5).forward({}, np.ones(3), training=True)


@pytest.mark.parametrize(
    ("x", "mask", "error", "message"),
    [
        (np.ones((2, 3)), np.ones((3, 2), bool), ValueError, r"mask has shape \(3, 2\) but x"),
        (np.ones((2, 3)), np.ones((2, 3)), TypeError, r"mask must be a boolean array"),
        (asarray(np.ones(3), backend="strict"), np.ones(3, bool), TypeError, r"backends"),
        (np.arange(3), None, TypeError, r"x must be a floating-point array"),
        (np.array([1.0, np.inf]), None, ValueError, r"x contains NaN or infinity"),
    ],
)
def test_forward_rejects_bad_input_with_a_fix(x, mask, error, message):
    with pytest.raises(error, match=message):
        Dropout(0.5).forward({}, x, training=True, rng=np.random.default_rng(0), mask=mask)


@pytest.mark.parametrize("training", [True, False])
def test_backward_rejects_bad_cotangent(training):
    block = Dropout(0.5)
    _, cache = block.forward({}, np.ones((2, 3)), training=training, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"d_y must be an array of the output's shape \(2, 3\)"):
        block.backward({}, cache, np.ones(6))
    with pytest.raises(TypeError, match=r"d_y has dtype float32 but the forward ran in float64"):
        block.backward({}, cache, np.ones((2, 3), dtype=np.float32))
