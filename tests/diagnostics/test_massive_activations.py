"""Massive activations: ratios vs per-row loops, KS by hand, null calibration, planted MAs.

The per-layer reports (base vs trained, table, plot) are tested in
test_massive_activations_report.py.

Statistical assertions use fixed seeds, so they are deterministic; ``LEVEL`` is
the chance that each would fail for a correct implementation on fresh seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy import special, stats

from refimpl.backend import asarray
from refimpl.diagnostics import (
    DEFAULT_EPS,
    DEFAULT_THRESHOLD,
    MEDIANS,
    activation_ratios,
    gamma_ks_test,
    log_ratios,
    max_median_ratio,
    max_ratio_per_graph,
    ratio_distribution_test,
)
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL
from refimpl.validation import NonFiniteError
from tests.backends import DEVICE_BACKENDS

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
ALPHA = 0.05  # significance level whose false-positive rate is measured
LEVEL = 1e-3  # chance that a statistical assertion fails for a correct implementation
NULL_SEEDS = 200  # samples per calibration run
NULL_SIZE = 300  # values per sample: gamma.fit ~10 ms each
NULL_GAMMA = (5.0, -1.0, 0.2)  # shape, loc, scale: near the fit to Gaussian activations' t


# -- naive references --------------------------------------------------------------------------


def naive_median(magnitudes: list[float], median: str) -> float:
    ordered = sorted(magnitudes)
    if median == "lower":
        return ordered[(len(ordered) - 1) // 2]
    return float(np.median(ordered))


def naive_ratio(value: float, median: float) -> float:
    if median > 0:
        return value / median
    return math.inf if value > 0 else 1.0  # the documented zero-median convention


def naive_max_median_ratio(x: np.ndarray, median: str) -> np.ndarray:
    out = []
    for row in x:
        magnitudes = [abs(float(v)) for v in row]
        out.append(naive_ratio(max(magnitudes), naive_median(magnitudes, median)))
    return np.array(out)


def naive_activation_ratios(x: np.ndarray, median: str) -> np.ndarray:
    out = np.empty(x.shape)
    for i, row in enumerate(x):
        m = naive_median([abs(float(v)) for v in row], median)
        for j, v in enumerate(row):
            out[i, j] = naive_ratio(abs(float(v)), m)
    return out


def ks_by_hand(t: np.ndarray, shape: float, loc: float, scale: float) -> float:
    """Eq. 15-16: the ECDF jumps at the sorted values, so the sup is at one of their two sides."""
    cdf = special.gammainc(shape, (np.sort(t) - loc) / scale)  # regularised lower gamma
    n = t.size
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n)))


def mean_loglik_by_hand(t: np.ndarray, shape: float, loc: float, scale: float) -> float:
    z = (t - loc) / scale
    return float(np.mean((shape - 1) * np.log(z) - z - math.lgamma(shape) - math.log(scale)))


def loglik_terms_size(t: np.ndarray, shape: float, loc: float, scale: float) -> float:
    """The mean magnitude of the terms :func:`mean_loglik_by_hand` adds: what rounding in
    either route is relative to, rather than their (possibly near-zero) mean."""
    z = (t - loc) / scale
    parts = np.abs((shape - 1) * np.log(z)) + z + abs(math.lgamma(shape)) + abs(math.log(scale))
    return float(np.mean(parts))


@st.composite
def activations(draw: st.DrawFn, max_rows: int = 6, max_cols: int = 9) -> np.ndarray:
    """(R, C) arrays, even and odd C; sometimes small integers (ties, zeros, zero medians)."""
    rows, cols = draw(st.integers(1, max_rows)), draw(st.integers(1, max_cols))
    rng = np.random.default_rng(draw(seeds()))
    if draw(st.booleans()):
        return rng.integers(-2, 3, size=(rows, cols)).astype(np.float64)
    return rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-3, 3)


# -- ratios ------------------------------------------------------------------------------------


@given(x=activations(), median=st.sampled_from(MEDIANS))
@example(x=np.array([[0.0, 0.0, 3.0, -4.0], [0.0, 0.0, 0.0, 0.0]]), median="midpoint")
@example(x=np.array([[0.0, 0.0, 3.0, -4.0], [0.0, 0.0, 0.0, 0.0]]), median="lower")
def test_ratios_match_per_row_loops(x: np.ndarray, median: str) -> None:
    np.testing.assert_allclose(
        max_median_ratio(x, median), naive_max_median_ratio(x, median), rtol=RTOL64
    )
    np.testing.assert_allclose(
        activation_ratios(x, median), naive_activation_ratios(x, median), rtol=RTOL64
    )


@given(x=activations())
def test_lower_median_matches_torch_median(x: np.ndarray) -> None:
    torch = pytest.importorskip("torch")
    magnitudes = torch.from_numpy(np.abs(x))
    medians = torch.median(magnitudes, dim=1).values  # the lower middle value for even C
    ratio = magnitudes.max(dim=1).values / medians  # inf for k/0, nan for 0/0
    expected = torch.nan_to_num(ratio, nan=1.0, posinf=math.inf).numpy()
    np.testing.assert_allclose(max_median_ratio(x, "lower"), expected, rtol=RTOL64)


def test_even_and_odd_rows_by_hand() -> None:
    even = np.array([[1.0, -2.0, 3.0, -4.0]])  # middle magnitudes 2 and 3
    assert max_median_ratio(even, "midpoint")[0] == 4.0 / 2.5
    assert max_median_ratio(even, "lower")[0] == 4.0 / 2.0
    odd = np.array([[3.0, -1.0, 2.0]])  # both conventions: median 2
    assert max_median_ratio(odd, "midpoint")[0] == max_median_ratio(odd, "lower")[0] == 1.5


def test_zero_median_conventions() -> None:
    x = np.array(
        [
            [0.0, 0.0, 0.0, 5.0],  # median 0, max 5: +inf under both conventions
            [0.0, 0.0, 0.0, 0.0],  # 0 / 0 := 1: an all-zero row is not flagged
            [0.0, 0.0, 3.0, -4.0],  # midpoint median 1.5, lower median 0
        ]
    )
    np.testing.assert_array_equal(max_median_ratio(x, "midpoint"), [np.inf, 1.0, 4.0 / 1.5])
    np.testing.assert_array_equal(max_median_ratio(x, "lower"), [np.inf, 1.0, np.inf])
    # Elementwise: an entry equal to its (zero) median has ratio 1, any other +inf.
    np.testing.assert_array_equal(activation_ratios(x, "lower")[0], [1.0, 1.0, 1.0, np.inf])


@given(x=activations(), median=st.sampled_from(MEDIANS), power=st.integers(-20, 20), seed=seeds())
def test_ratio_is_invariant_to_scale_sign_and_channel_order(
    x: np.ndarray, median: str, power: int, seed: int
) -> None:
    # Powers of two scale exactly, so the ratios must be bitwise equal.
    expected = max_median_ratio(x, median)
    np.testing.assert_array_equal(max_median_ratio(x * 2.0**power, median), expected)
    np.testing.assert_array_equal(max_median_ratio(-x, median), expected)
    permuted = np.random.default_rng(seed).permutation(x.shape[1])
    np.testing.assert_array_equal(max_median_ratio(x[:, permuted], median), expected)


@given(x=activations(), median=st.sampled_from(MEDIANS))
def test_float32_input_is_divided_in_float64(x: np.ndarray, median: str) -> None:
    # The selected max and median are cast exactly before the division, so a float32
    # array gives the float64 result of its own values.
    single = x.astype(np.float32)
    ratio = max_median_ratio(single, median)
    assert ratio.dtype == np.float64
    np.testing.assert_array_equal(ratio, max_median_ratio(single.astype(np.float64), median))


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("median", MEDIANS)
def test_device_backend_matches_numpy(backend: str, median: str) -> None:
    x = np.random.default_rng(11).standard_normal((40, 10))
    x[3, :6] = 0.0  # a zero-median row: infinite ratios on both
    on = asarray(x, backend=backend)
    for function in (max_median_ratio, activation_ratios):
        result = function(on, median)
        assert isinstance(result, np.ndarray)
        np.testing.assert_array_equal(result, function(x, median))
    device, host = log_ratios(on, median, max_samples=100), log_ratios(x, median, max_samples=100)
    # The ratios above are bitwise equal (a selection and one division); a log10 is correctly
    # rounded on neither side, and CUDA's differs from the host's by an ulp (seen on an H200).
    np.testing.assert_array_max_ulp(device.values, host.values, maxulp=2)
    assert device.num_nonfinite == host.num_nonfinite


# -- log ratios, sampling, non-finite policy ---------------------------------------------------


@given(x=activations(max_rows=8), median=st.sampled_from(MEDIANS))
def test_log_ratios_match_the_naive_transform(x: np.ndarray, median: str) -> None:
    t = -np.log10(naive_activation_ratios(x, median).ravel() + DEFAULT_EPS)  # row-major
    sample = log_ratios(x, median, max_samples=None)
    np.testing.assert_allclose(sample.values, t[np.isfinite(t)], rtol=RTOL64)
    assert sample.num_nonfinite == np.count_nonzero(~np.isfinite(t))


def test_subsample_is_seeded_drawn_from_the_elements_and_position_only() -> None:
    x = np.random.default_rng(3).standard_normal((50, 20))
    full = log_ratios(x, max_samples=None).values
    sample = log_ratios(x, max_samples=100, seed=7).values
    assert sample.size == 100
    assert np.isin(sample, full).all()
    np.testing.assert_array_equal(log_ratios(x, max_samples=100, seed=7).values, sample)
    assert not np.array_equal(log_ratios(x, max_samples=100, seed=8).values, sample)
    # Positions depend on the shape and the seed only: a rescaled array (same ratios)
    # is sampled at the same elements, as base and trained arrays of a layer are.
    np.testing.assert_array_equal(log_ratios(4.0 * x, max_samples=100, seed=7).values, sample)


def test_zero_median_rows_drop_their_infinite_t_and_count_them() -> None:
    x = np.array(
        [
            [0.5, -1.0, 1.5, 2.0, -0.7, 0.9, 1.1, -1.3],
            [0.0, 0.0, 0.0, 0.0, 0.0, 3.0, -4.0, 7.0],  # median 0: three ratios are +inf
        ]
    )
    sample = log_ratios(x, max_samples=None)
    assert sample.num_nonfinite == 3
    assert sample.values.size == 13
    # The row's zeros equal its median: ratio 1, t = -log10(1 + eps), kept.
    np.testing.assert_allclose(sample.values[8:], -np.log10(1.0 + DEFAULT_EPS), rtol=RTOL64)


def test_exact_zero_entries_map_to_minus_log_eps_or_are_dropped_with_eps_zero() -> None:
    x = np.random.default_rng(4).standard_normal((3, 9))
    x[1, 2] = 0.0  # the row's median stays positive
    for eps in (DEFAULT_EPS, 1e-6):
        t = log_ratios(x, eps=eps, max_samples=None).values
        assert t[9 + 2] == pytest.approx(-math.log10(eps), rel=RTOL64)
    dropped = log_ratios(x, eps=0.0, max_samples=None)
    assert dropped.num_nonfinite == 1
    assert dropped.values.size == x.size - 1


# -- gamma fit and KS --------------------------------------------------------------------------


@given(seed=seeds(), size=st.integers(20, 400), fitted=st.booleans())
def test_ks_statistic_and_loglik_match_eq_15_16_by_hand(seed: int, size: int, fitted: bool):
    shape, loc, scale = NULL_GAMMA
    t = loc + np.random.default_rng(seed).gamma(shape, scale, size)
    result = gamma_ks_test(t, params=None if fitted else NULL_GAMMA)
    params = (result["gamma_shape"], result["gamma_loc"], result["gamma_scale"])
    if not fitted:
        assert params == NULL_GAMMA
    assert result["num_samples"] == size
    # Widened from RTOL64: SciPy's gamma CDF takes another route than gammainc.
    assert result["ks_statistic"] == pytest.approx(ks_by_hand(t, *params), rel=1e-10)
    # mean_loglik adds terms that cancel to a mean near 0 (a near-normal fit has shape ~1e4
    # and terms ~1e5: seed 154516, size 20 differed by 1.1e-10 of the mean), so the two
    # routes (SciPy's logpdf, lgamma here) are judged against the terms' size
    by_hand = mean_loglik_by_hand(t, *params)
    assert abs(result["mean_loglik"] - by_hand) <= RTOL64 * loglik_terms_size(t, *params)


def test_fit_recovers_the_mean_and_variance_of_a_large_gamma_sample() -> None:
    shape, loc, scale = NULL_GAMMA
    size = 20_000
    t = loc + np.random.default_rng(5).gamma(shape, scale, size)
    fit = gamma_ks_test(t)
    mean, var = loc + shape * scale, shape * scale**2
    fitted_mean = fit["gamma_loc"] + fit["gamma_shape"] * fit["gamma_scale"]
    fitted_var = fit["gamma_shape"] * fit["gamma_scale"] ** 2
    # Standard errors of a sample's mean and variance (gamma kurtosis 3 + 6 / shape);
    # a two-sided normal bound at LEVEL.
    z = stats.norm.isf(LEVEL / 2)
    assert abs(fitted_mean - mean) <= z * math.sqrt(var / size)
    assert abs(fitted_var - var) <= z * var * math.sqrt((2 + 6 / shape) / size)


@pytest.fixture(scope="module")
def null_p_values() -> dict[str, np.ndarray]:
    """KS p-values of NULL_SEEDS gamma samples: fitted, true parameters, wrong parameters."""
    shape, loc, scale = NULL_GAMMA
    wrong = (shape, loc + scale, scale)  # shifted by one scale
    out: dict[str, list[float]] = {"fitted": [], "known": [], "wrong": []}
    for seed in range(NULL_SEEDS):
        t = loc + np.random.default_rng(seed).gamma(shape, scale, NULL_SIZE)
        out["fitted"].append(gamma_ks_test(t)["p_value"])
        out["known"].append(gamma_ks_test(t, params=NULL_GAMMA)["p_value"])
        out["wrong"].append(gamma_ks_test(t, params=wrong)["p_value"])
    return {k: np.array(v) for k, v in out.items()}


def test_known_parameter_false_positive_rate_is_within_its_binomial_interval(null_p_values):
    # Against the true gamma the KS p-value is exactly uniform: rejections ~ Binomial.
    p = null_p_values["known"]
    low, high = stats.binom.interval(1 - LEVEL, NULL_SEEDS, ALPHA)
    assert low <= np.count_nonzero(p < ALPHA) <= high
    assert stats.kstest(p, "uniform").pvalue > LEVEL


def test_fitted_false_positive_rate_does_not_exceed_alpha(null_p_values):
    # Fitting the three parameters to the same sample makes the test conservative
    # (Lilliefors): the rate may be far below alpha, but not above its binomial bound.
    rejections = np.count_nonzero(null_p_values["fitted"] < ALPHA)
    assert rejections <= stats.binom.isf(LEVEL, NULL_SEEDS, ALPHA)


def test_fitted_p_values_are_stochastically_larger_than_uniform(null_p_values):
    # The Lilliefors effect itself, documented in the module docstring: not uniform.
    assert stats.kstest(null_p_values["fitted"], "uniform", alternative="less").pvalue < LEVEL


def test_calibration_check_rejects_misspecified_parameters(null_p_values):
    # Negative control: the interval check above can fail; a gamma shifted by one scale
    # is rejected far more often than the null allows.
    _, high = stats.binom.interval(1 - LEVEL, NULL_SEEDS, ALPHA)
    assert np.count_nonzero(null_p_values["wrong"] < ALPHA) > high


def test_ratio_distribution_test_is_gamma_ks_test_of_the_log_ratios() -> None:
    x = np.random.default_rng(6).standard_normal((30, 12))
    t = -np.log10(naive_activation_ratios(x, "midpoint").ravel() + DEFAULT_EPS)
    result = ratio_distribution_test(x, max_samples=None)
    expected = gamma_ks_test(t)
    assert result.pop("num_nonfinite") == 0
    # Equal today; widened from RTOL64 because the two t may differ by an ulp (NumPy's
    # midpoint vs ours), which Nelder-Mead's stopping rule can amplify in the fit.
    assert result == pytest.approx(expected, rel=1e-9)


# -- planted massive activations ---------------------------------------------------------------


def plant(x: np.ndarray, rows: np.ndarray, factors: np.ndarray, median: str) -> np.ndarray:
    """Replace each chosen row's largest entry by ``factor`` x its median (C >= 3: the
    middle order statistics, hence the median, are unchanged)."""
    out = x.copy()
    for i, factor in zip(np.flatnonzero(rows), factors, strict=False):
        m = naive_median([abs(float(v)) for v in out[i]], median)
        j = int(np.argmax(np.abs(out[i])))
        out[i, j] = np.sign(out[i, j]) * factor * m
    return out


@given(
    rows=st.integers(2, 12),
    cols=st.integers(4, 12),
    num_graphs=st.integers(1, 5),
    median=st.sampled_from(MEDIANS),
    seed=seeds(),
)
@example(rows=2, cols=4, num_graphs=3, median="lower", seed=0)  # graphs with no rows
def test_planted_massive_activations_are_flagged_in_exactly_their_rows_and_graphs(
    rows: int, cols: int, num_graphs: int, median: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # Ordinary rows: magnitudes in [1, 2), so every unplanted ratio is below 2.
    x = rng.uniform(1.0, 2.0, (rows, cols)) * rng.choice([-1.0, 1.0], (rows, cols))
    planted = rng.random(rows) < 0.3
    factors = rng.uniform(1.5, 10.0, rows) * DEFAULT_THRESHOLD
    x = plant(x, planted, factors, median)

    ratio = max_median_ratio(x, median)
    np.testing.assert_array_equal(ratio > DEFAULT_THRESHOLD, planted)
    np.testing.assert_allclose(ratio[planted], factors[: planted.sum()], rtol=RTOL64)
    assert np.all(ratio[~planted] < 2.0)

    batch = rng.integers(0, num_graphs, rows)
    per_graph = max_ratio_per_graph(x, batch, num_graphs, median)
    expected_flags = np.zeros(num_graphs, dtype=bool)
    expected_flags[batch[planted]] = True
    np.testing.assert_array_equal(per_graph.flagged, expected_flags)
    for g in range(num_graphs):
        members = ratio[batch == g]
        if members.size:
            assert per_graph.max_ratio[g] == members.max()
        else:
            assert math.isnan(per_graph.max_ratio[g])


def test_threshold_is_strict_and_configurable() -> None:
    x = np.array([[1.0, 1.0, 1.0, 8.0], [1.0, 1.0, 1.0, 2.0]])  # ratios 8 and 2
    batch = np.array([0, 1])
    np.testing.assert_array_equal(max_ratio_per_graph(x, batch, 2, threshold=8.0).flagged, [0, 0])
    np.testing.assert_array_equal(max_ratio_per_graph(x, batch, 2, threshold=1.5).flagged, [1, 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planting_raises_the_ks_statistic(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((400, 32))
    rows = np.zeros(400, dtype=bool)
    rows[rng.choice(400, 4, replace=False)] = True
    planted = plant(x, rows, np.full(4, 2 * DEFAULT_THRESHOLD), "midpoint")
    clean, dirty = (ratio_distribution_test(a, max_samples=None) for a in (x, planted))
    assert dirty["ks_statistic"] > clean["ks_statistic"]
    # The mechanism: the gamma's support must reach the MAs' t = -log10(2000).
    assert dirty["gamma_loc"] < -math.log10(2 * DEFAULT_THRESHOLD) < clean["gamma_loc"]


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (np.ones(4), ValueError, "2-D"),
        (np.ones((2, 2, 2)), ValueError, "2-D"),
        (np.ones((0, 3)), ValueError, "empty"),
        (np.ones((3, 0)), ValueError, "empty"),
        (np.array([[1.0, np.nan]]), NonFiniteError, "NaN or infinity"),
        (np.array([[1.0, np.inf]]), NonFiniteError, "NaN or infinity"),
        (np.ones((2, 2), dtype=np.int64), TypeError, "floating"),
        ([[1.0, 2.0]], TypeError, "must be an array"),
    ],
)
def test_bad_activations_are_rejected(x, error, match) -> None:
    for function in (max_median_ratio, activation_ratios, log_ratios, ratio_distribution_test):
        with pytest.raises(error, match=match):
            function(x)


def test_unknown_median_convention() -> None:
    for function in (max_median_ratio, activation_ratios, log_ratios):
        with pytest.raises(ValueError, match="unknown median convention 'mean'"):
            function(np.ones((2, 3)), median="mean")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eps": -1.0}, "eps must be"),
        ({"eps": math.nan}, "eps must be"),
        ({"max_samples": 0}, "max_samples must be"),
        ({"max_samples": 2.5}, "max_samples must be"),
        ({"max_samples": True}, "max_samples must be"),
    ],
)
def test_bad_sampling_options(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ratio_distribution_test(np.ones((3, 3)), **kwargs)


def test_too_few_finite_log_ratios() -> None:
    # One zero-median row: the non-zero entry's t is -inf and dropped; 3 values remain.
    with pytest.raises(ValueError, match="only 3 finite t remain"):
        ratio_distribution_test(np.array([[0.0, 0.0, 0.0, 5.0]]))


@pytest.mark.parametrize(
    ("t", "params", "error", "match"),
    [
        (np.ones((3, 3)), None, ValueError, "1-D"),
        (np.array([0.1, np.nan, 0.3, 0.4]), None, NonFiniteError, "NaN or infinity"),
        (np.array([0.1, 0.2, 0.3]), None, ValueError, "at least 4"),
        (np.full(10, 0.5), None, ValueError, "constant"),
        (np.array([]), NULL_GAMMA, ValueError, "empty"),
        (np.array([0.1, 0.2]), (0.0, 0.0, 1.0), ValueError, "shape > 0"),
        (np.array([0.1, 0.2]), (1.0, 0.0, -1.0), ValueError, "scale > 0"),
        (np.array([0.1, 0.2]), (1.0, 0.0), ValueError, r"\(shape, loc, scale\)"),
    ],
)
def test_bad_gamma_ks_input(t, params, error, match) -> None:
    with pytest.raises(error, match=match):
        gamma_ks_test(t, params=params)


@pytest.mark.parametrize(
    ("batch", "num_graphs", "threshold", "error", "match"),
    [
        (np.array([0, 1, 2]), 2, DEFAULT_THRESHOLD, ValueError, r"must lie in \[0, 2\)"),
        (np.array([0, -1, 0]), 2, DEFAULT_THRESHOLD, ValueError, r"must lie in \[0, 2\)"),
        (np.array([0, 1]), 2, DEFAULT_THRESHOLD, ValueError, r"shape \(3\)"),
        (np.array([0.0, 1.0, 1.0]), 2, DEFAULT_THRESHOLD, TypeError, "integer graph ids"),
        (np.array([0, 0, 0]), 0, DEFAULT_THRESHOLD, ValueError, "num_graphs"),
        (np.array([0, 0, 0]), 1, 0.0, ValueError, "threshold"),
        (np.array([0, 0, 0]), 1, math.nan, ValueError, "threshold"),
    ],
)
def test_bad_per_graph_input(batch, num_graphs, threshold, error, match) -> None:
    with pytest.raises(error, match=match):
        max_ratio_per_graph(np.ones((3, 4)), batch, num_graphs, threshold=threshold)
