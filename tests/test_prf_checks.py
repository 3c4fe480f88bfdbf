"""proofs_check.prf: NodeFormer's random-feature and Gumbel checks.

Each check passes, on every backend and budget, and each can fail: a test swaps
in a broken estimator, noise or bound and asserts the verdict flips. The pieces
the tolerances rest on (Eq. 18's moments, the delta-method bias, the estimates
themselves) are checked against independent computations: Gauss-Hermite
quadrature, naive loops, sampled laws.
"""

from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy import stats
from scipy.special import logsumexp, softmax

from proofs_check import prf, runner
from proofs_check.prf import estimates, kernel, moments, thm1
from proofs_check.prf import gumbel as prf_gumbel
from proofs_check.registry import DEFAULT_CASES, REGISTRY, Context
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax
from refimpl.nn.nodeformer.random_features import draw_projection, positive_random_features
from refimpl.testing.strategies import seeds

CHECK_IDS = [i for i in REGISTRY if i.startswith("prf.")]
FAST = 4
ERRATA = prf.errata()


def _context(seed: int = 0) -> Context:
    return Context(rng=np.random.default_rng(seed), cases=0, xp=np)


# -- the checks pass -------------------------------------------------------------------------
def test_all_checks_are_registered() -> None:
    assert CHECK_IDS == [
        "prf.prop1.mean",
        "prf.orthogonal.mean",
        "prf.prop1.variance",
        "prf.orthogonal.variance",
        "prf.thm1.bound",
        "prf.thm1.chebyshev",
        "prf.thm1.rate",
        "prf.eq5.rate",
        "prf.gumbel.prop2",
        "prf.gumbel.prop3",
        "prf.gumbel.prop3_limit",
        "prf.gumbel.thm2",
        "prf.gumbel.eq7_library",
    ]


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_each_check_passes_at_default_settings(check_id: str) -> None:
    record = REGISTRY[check_id](seed=0, cases=DEFAULT_CASES)
    assert record.passed and record.margin >= 0, record
    assert record.n_cases >= 2


def test_checks_pass_with_no_random_case_on_the_strict_backend(monkeypatch) -> None:
    # The fixed cases still run; the strict stand-in raises on any stray host call.
    monkeypatch.setattr(prf_gumbel, "THM2_DRAWS", 1000)  # the code path, not the power
    for check_id in CHECK_IDS:
        record = REGISTRY[check_id](seed=1, cases=0, backend="strict")
        assert record.passed and record.n_cases >= 1, record


def test_checks_are_reproducible_for_a_seed() -> None:
    for check_id in ("prf.prop1.variance", "prf.gumbel.prop2"):
        first = REGISTRY[check_id](seed=3, cases=FAST)
        assert REGISTRY[check_id](seed=3, cases=FAST) == first
        assert REGISTRY[check_id](seed=4, cases=FAST) != first


# -- each check can fail ---------------------------------------------------------------------
def _scaled_features(factor: float):
    # A feature map off by a constant factor: every kernel estimate is off by factor^2.
    return lambda x, omega, shift=0.0: factor * positive_random_features(x, omega, shift)


def _paired_rows(rng, m, d, kind="iid"):
    # Every row drawn twice: half the independent features, twice the variance (m >= 2).
    rows = draw_projection(rng, -(-m // 2), d, kind)
    return np.repeat(rows, 2, axis=0)[:m]


def _unsigned_orthogonal(rng, m, d, kind="iid"):
    # Performer's draw: QR without the sign correction, so the first row of every block
    # is not isotropic (its first coordinate is never positive; for d = 1, w = +chi_1).
    if kind != "orthogonal":
        return draw_projection(rng, m, d, kind)
    blocks = -(-m // d)
    q, _ = np.linalg.qr(rng.standard_normal((blocks, d, d)))
    directions = q.transpose(0, 2, 1).reshape(blocks * d, d)[:m]
    return np.linalg.norm(rng.standard_normal((m, d)), axis=1)[:, None] * directions


class _Biased(KernelizedSoftmax):
    """Eq. 5 with a constant error: the output cannot converge."""

    def forward(self, params, q, k, v, omega, gumbel=None):
        out, cache = super().forward(params, q, k, v, omega, gumbel)
        return out + 0.05, cache


def _normal_noise(rng, shape):
    return rng.standard_normal(shape)  # not Gumbel: the argmax law is not the softmax


def _unnormalised_features(x, omega, shift=0.0):
    # Eq. 4 without exp(-|x|^2 / 2): beta_v estimates exp(|x + y_v|^2 / 2), not exp(x^T y_v).
    return positive_random_features(x, omega, shift) * np.exp(0.5 * np.sum(x * x, axis=1))[:, None]


@pytest.mark.parametrize(
    ("check_id", "module", "name", "broken", "cases"),
    [
        ("prf.prop1.mean", estimates, "positive_random_features", _scaled_features(1.05), FAST),
        (
            "prf.orthogonal.mean",
            estimates,
            "positive_random_features",
            _scaled_features(1.05),
            FAST,
        ),
        ("prf.orthogonal.mean", estimates, "draw_projection", _unsigned_orthogonal, FAST),
        ("prf.prop1.variance", estimates, "draw_projection", _paired_rows, FAST),
        # Eq. 18 without its factor 1 - exp(-|x + y|^2)
        (
            "prf.prop1.variance",
            kernel,
            "eq18_variance",
            lambda x, y, m: math.exp(float(np.sum((x + y) ** 2) + 2 * x @ y)) / m,
            FAST,
        ),
        ("prf.orthogonal.variance", estimates, "draw_projection", _paired_rows, FAST),
        ("prf.thm1.rate", estimates, "positive_random_features", _scaled_features(1.05), FAST),
        ("prf.thm1.bound", thm1, "thm1_exponent", lambda r, tau: 6 * r / tau, 0),  # as printed
        ("prf.thm1.chebyshev", estimates, "positive_random_features", _scaled_features(1.5), FAST),
        ("prf.eq5.rate", thm1, "KernelizedSoftmax", _Biased, 0),
        ("prf.gumbel.prop2", prf_gumbel, "gumbel_noise", _normal_noise, 0),
        ("prf.gumbel.prop3", prf_gumbel, "gumbel_noise", _normal_noise, 0),
        ("prf.gumbel.thm2", prf_gumbel, "gumbel_noise", lambda rng, shape: np.zeros(shape), 0),
        ("prf.gumbel.thm2", prf_gumbel, "positive_random_features", _unnormalised_features, 0),
        # the temperature ignored: c_uv of the wrong tau
        (
            "prf.gumbel.eq7_library",
            prf_gumbel,
            "KernelizedSoftmax",
            lambda t: KernelizedSoftmax(),
            0,
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_broken_piece_fails_its_check(monkeypatch, check_id, module, name, broken, cases):
    monkeypatch.setattr(prf_gumbel, "THM2_DRAWS", 1500)  # these breaks need no more
    monkeypatch.setattr(module, name, broken)
    record = REGISTRY[check_id](cases=cases)
    assert not record.passed and record.margin < 0, record


def test_an_understated_variance_fails_the_chebyshev_check(monkeypatch) -> None:
    # V_m / 100: the threshold sqrt(V_m / eps) shrinks tenfold and the fraction inside drops.
    real = prf.eq18_log_variance
    monkeypatch.setattr(thm1, "eq18_log_variance", lambda x, y, m: real(x, y, m) - math.log(100))
    record = REGISTRY["prf.thm1.chebyshev"](cases=DEFAULT_CASES)
    assert not record.passed and record.measured < 1 - 0.5, record


def test_a_check_that_evaluates_no_case_fails(monkeypatch) -> None:
    monkeypatch.setattr(kernel, "kernel_cases", lambda *args, **kwargs: [])
    record = REGISTRY["prf.prop1.mean"](cases=FAST)
    assert record.n_cases == 0 and not record.passed


# -- Eq. 18 and the tolerances, against quadrature -------------------------------------------
def _lognormal_moments(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Mean and central moments 2..6 of Z = exp(w^T (x+y) - (|x|^2+|y|^2)/2) by Gauss-Hermite
    quadrature in w^T (x+y) / |x+y| ~ N(0, 1): independent of any closed form."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(150)
    weights = weights / math.sqrt(2 * math.pi)
    z = np.exp(np.linalg.norm(x + y) * nodes - (x @ x + y @ y) / 2)
    mean = float(weights @ z)
    return [mean, *(float(weights @ (z - mean) ** k) for k in range(2, 7))]


@given(d=st.integers(1, 5), m=st.integers(1, 64), exponent=st.floats(0.0, 2.0), seed=seeds())
@example(d=2, m=1, exponent=0.0, seed=0)  # x = -y: V = 0
def test_eq18_and_the_variance_of_s2_match_quadrature(d, m, exponent, seed) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(d), rng.standard_normal(d)
    if exponent == 0.0:
        y = -x
    else:
        scale = math.sqrt(exponent / float(np.sum((x + y) ** 2)))
        x, y = x * scale, y * scale
    mean, variance, third, fourth, _, sixth = _lognormal_moments(x, y)
    assert mean == pytest.approx(math.exp(float(x @ y)), rel=1e-12)
    assert prf.eq18_variance(x, y, m) == pytest.approx(variance / m, rel=1e-9, abs=1e-15 * mean**2)
    # cumulants of Z / SM (m = 1): k3 = mu3, k4 = mu4 - 3 mu2^2, k6 = mu6 - 15 mu4 mu2 - ...
    cumulants = np.array(prf.lognormal_cumulants(x, y, 1)) * mean ** np.array([2, 3, 4, 6])
    expected = [
        variance,
        third,
        fourth - 3 * variance**2,
        sixth - 15 * fourth * variance - 10 * third**2 + 30 * variance**3,
    ]
    np.testing.assert_allclose(cumulants, expected, rtol=1e-7, atol=1e-12 * mean**6)
    draws = 1000
    mu4_m = (fourth + 3 * (m - 1) * variance**2) / m**3
    expected = mu4_m / draws - (variance / m) ** 2 * (draws - 3) / (draws * (draws - 1))
    got, _ = moments._sample_variance_moments(x, y, m, draws)
    assert got == pytest.approx(expected, rel=1e-8, abs=1e-15 * mean**4)


def test_the_skewness_of_s2_matches_simulated_log_normals() -> None:
    # Kendall & Stuart's third cumulant of k_2, fed the log-normal's: against 4000 samples of
    # s^2 drawn without the library (a skewness estimate's standard error is ~ sqrt(6 / n)
    # and more for skewed data: hence the 15 % on top). The checks' regime, at a tenth of n.
    s2, m, draws, reps = 0.25, 4, 400, 4000
    x = np.array([math.sqrt(s2) / 2])
    normal = np.random.default_rng(8).standard_normal((reps, draws, m))
    variances = np.exp(math.sqrt(s2) * normal - s2 / 2).mean(axis=2).var(axis=1, ddof=1)
    _, predicted = moments._sample_variance_moments(x, x, m, draws)
    assert abs(stats.skew(variances) - predicted) <= 0.15 * predicted + 4 * math.sqrt(6 / reps)


def test_z_threshold_is_the_bonferroni_normal_quantile() -> None:
    assert prf.z_threshold(1) == pytest.approx(stats.norm.isf(prf.FALSE_ALARM / 2))
    assert prf.z_threshold(40, sides=1) == pytest.approx(stats.norm.isf(prf.FALSE_ALARM / 40))
    assert prf.z_threshold(10) < prf.z_threshold(100)
    assert prf_gumbel.chi2_threshold(5, 3) == pytest.approx(stats.chi2.isf(prf.FALSE_ALARM / 5, 3))


@given(slope=st.floats(-2.0, 2.0), constant=st.floats(1e-3, 1e3))
def test_slope_and_error_recover_a_power_law(slope, constant) -> None:
    features = np.array([4, 16, 64, 256])
    fitted, error = prf.slope_and_error(features, constant * features**slope, [0.1] * 4)
    assert fitted == pytest.approx(slope, abs=1e-12)
    spread = np.sum((np.log(features) - np.log(features).mean()) ** 2)
    assert error == pytest.approx(0.1 / math.sqrt(spread))


# -- the estimates ---------------------------------------------------------------------------
@given(
    d=st.integers(1, 5),
    m=st.integers(1, 12),
    draws=st.integers(1, 6),
    kind=st.sampled_from(["iid", "orthogonal"]),
    seed=seeds(),
)
def test_kernel_estimates_match_a_naive_loop(d, m, draws, kind, seed) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(d) / 2, rng.standard_normal(d) / 2
    omega = prf.projection_stack(rng, draws, m, d, kind)
    assert omega.shape == (draws * m, d)
    got = prf.kernel_estimates(_context(), x, y, omega, draws)
    for r in range(draws):  # Eq. 4 written out, one projection at a time
        w = omega[r * m : (r + 1) * m]
        phi_x = np.exp(w @ x - x @ x / 2) / math.sqrt(m)
        phi_y = np.exp(w @ y - y @ y / 2) / math.sqrt(m)
        assert got[r] == pytest.approx(phi_x @ phi_y, rel=1e-13)


@given(d=st.integers(1, 5), m=st.integers(1, 12), seed=seeds())
def test_orthogonal_stack_keeps_blocks_within_each_projection(d, m, seed) -> None:
    # Rows i, j of one projection in one block of d rows are orthogonal; every row is a
    # chi_d length times a unit direction, as draw_projection(rng, m, d, "orthogonal").
    draws = 3
    omega = prf.projection_stack(np.random.default_rng(seed), draws, m, d, "orthogonal")
    for r in range(draws):
        projection = omega[r * m : (r + 1) * m]
        for start in range(0, m, d):
            block = projection[start : start + d]
            gram = block @ block.T
            off_diagonal = gram - np.diag(np.diag(gram))
            assert np.abs(off_diagonal).max() <= 1e-12 * max(1.0, np.abs(gram).max())


def test_degenerate_pairs_are_exact_up_to_the_rounding_allowance() -> None:
    # x = -y: every Z_i = exp(-|x|^2) exactly, so the estimates differ from it by rounding only.
    ctx = _context(5)
    x = np.array([0.6, -0.3, 1.2])
    omega = prf.projection_stack(ctx.rng, 200, 16, 3, "iid")
    estimates = prf.kernel_estimates(ctx, x, -x, omega, 200)
    gamma = prf.rounding_allowance(omega, x, -x, 16)
    assert gamma < 1e-12
    assert np.abs(estimates / math.exp(-x @ x) - 1).max() <= gamma


def test_the_printed_thm1_exponent_undercuts_the_corrected_one_only_above_r_1() -> None:
    for r in (0.25, 0.5, 1.0, 2.0, 4.0):
        printed = 6 * r  # tau = 1
        assert (printed >= prf.thm1_exponent(r, 1.0)) == (r <= 1.0)


# -- Gumbel pieces ---------------------------------------------------------------------------
def test_gumbel_noise_has_the_gumbel_moments() -> None:
    g = prf_gumbel.gumbel_noise(np.random.default_rng(7), 200000)
    z = prf.z_threshold(2)
    assert abs(g.mean() - np.euler_gamma) <= z * math.pi / math.sqrt(6 * g.size)
    # the variance of the sample variance of a Gumbel: (mu4 - sigma^4) / n, kurtosis 5.4
    sigma2 = math.pi**2 / 6
    assert abs(g.var() - sigma2) <= z * sigma2 * math.sqrt(4.4 / g.size)


def test_pearson_is_zero_on_exact_counts_and_grows_with_the_misfit() -> None:
    p = np.array([0.5, 0.3, 0.2])
    assert prf_gumbel.pearson([500, 300, 200], p) == 0.0
    assert prf_gumbel.pearson([520, 280, 200], p) == pytest.approx(20**2 / 500 + 20**2 / 300)


def test_argmax_bias_predicts_the_sampled_law() -> None:
    # P(argmax = v) = E_omega softmax(tau log beta(omega)) exactly (Gumbel-max given omega);
    # averaged over many projections it must match pi + b / m where the variance is small.
    rng = np.random.default_rng(11)
    q, keys = prf_gumbel.thm2_case(rng, 3, 5)
    tau, m, draws = 0.5, 128, 10000
    x, y = q / math.sqrt(tau), keys / math.sqrt(tau)
    w = rng.standard_normal((draws, m, 3))
    exponents = w @ (x[:, None] + y.T) - 0.5 * (x @ x + np.sum(y * y, axis=1))  # (draws, m, N)
    laws = softmax(tau * (logsumexp(exponents, axis=1) - math.log(m)), axis=1)  # (draws, N)
    error = laws.std(axis=0) / math.sqrt(draws)
    bias = laws.mean(axis=0) - softmax(keys @ q)
    predicted = prf_gumbel.argmax_bias(q, keys, tau) / m
    assert np.all(np.abs(bias - predicted) <= prf.z_threshold(5) * error + 0.2 * np.abs(predicted))
    assert np.abs(predicted).max() > 2 * error.max()  # the bias is resolved, not noise


def test_thm2_features_grow_as_tau_falls() -> None:
    q, keys = prf_gumbel.thm2_case(np.random.default_rng(2), 3, 5)
    features = [prf_gumbel.thm2_features(q, keys, tau, 4000) for tau in (1.0, 0.5, 0.25)]
    assert features[0] < features[1] < features[2]


def test_thm2_cases_stay_inside_the_exponent_and_spread_their_logits() -> None:
    rng = np.random.default_rng(9)
    for _ in range(20):
        q, keys = prf_gumbel.thm2_case(rng, int(rng.integers(2, 5)), 5)
        assert np.sum((q + keys) ** 2, axis=1).max() <= prf_gumbel.THM2_EXPONENT * (1 + 1e-12)
        logits, spread = keys @ q, prf_gumbel.THM2_EXPONENT
        assert -0.75 * spread - 1e-12 <= logits.min() and logits.max() <= 0.25 * spread + 1e-12


def test_fixed_m_and_tau_to_zero_drops_the_query() -> None:
    # The erratum prf.thm2.order_of_limits, on another input: tau log beta_v tends to
    # -(|q|^2 + |k_v|^2) / 2 for every projection, so the law forgets q.
    rng = np.random.default_rng(4)
    q, keys = np.array([0.9, -0.2, 0.1]), rng.standard_normal((4, 3)) / 2
    x, y = q / 1e-4, keys / 1e-4  # tau = 1e-8
    omega = rng.standard_normal((32, 3))
    a_x = x @ omega.T - x @ x / 2  # (32,): Eq. 4's exponents
    a_y = y @ omega.T - 0.5 * np.sum(y * y, axis=1)[:, None]  # (4, 32)
    exponents = a_x[None] + a_y
    scaled = 1e-8 * (logsumexp(exponents, axis=1) - math.log(32))
    limit = -0.5 * (q @ q + np.sum(keys**2, axis=1))
    assert np.abs(scaled - limit).max() <= 1e-3


# -- errata ----------------------------------------------------------------------------------
def test_errata_are_complete_unique_and_demonstrated() -> None:
    ids = [e.id for e in ERRATA]
    assert len(set(ids)) == len(ids) == 9
    for erratum in ERRATA:
        assert erratum.id.startswith("prf.") and erratum.paper == "NodeFormer"
        assert all([erratum.location, erratum.printed, erratum.correct, erratum.counterexample])
        evidence = erratum.evaluate()
        assert not evidence.printed_holds and evidence.correct_holds, (erratum.id, evidence)


def test_checks_and_errata_run_through_the_cli(monkeypatch) -> None:
    # As they will once registered (CHECK_MODULES += prf; ERRATA += these):
    # "prf.eq" selects the check prf.eq5.rate and the errata on Eq. 20, 28, 30, 34, 35, 43, 51.
    monkeypatch.setattr(runner, "ERRATA", ERRATA)
    out = io.StringIO()
    assert runner.main(["--only", "prf.eq", "--cases", "0"], out=out) == 0
    text = out.getvalue()
    assert text.strip().splitlines()[-1] == "1 checks, 1 passed, 0 failed"
    assert text.count("[demonstrated]") == 7 and "NOT" not in text


# -- thresholds and bounds pinned to their formulas (mutation testing, docs/mutation.md) -------
def test_cornish_fisher_moves_z_out_by_the_one_term_correction() -> None:
    # Guards the Cornish-Fisher correction (audit mutant: dropped, passed every check):
    # z + |skewness| (z^2 - 1) / 6, the same on both tails.
    assert prf.cornish_fisher(4.0, 0.3) == pytest.approx(4.0 + 0.3 * 15.0 / 6.0, rel=1e-15)
    assert prf.cornish_fisher(4.0, -0.3) == prf.cornish_fisher(4.0, 0.3)
    assert prf.cornish_fisher(2.5, 0.0) == 2.5


def test_false_alarm_gives_the_documented_thresholds() -> None:
    # Guards FALSE_ALARM = 1e-4 (mutant: 1e-5, every threshold wider, passed): the statistics
    # docstring's z at 40 tests, 4.71 two-sided and 4.56 one-sided, and a chi-square quantile
    # computed from the literal 1e-4.
    assert prf.z_threshold(40) == pytest.approx(4.71, abs=0.005)
    assert prf.z_threshold(40, sides=1) == pytest.approx(4.56, abs=0.005)
    assert prf.chi2_threshold(5, 3) == pytest.approx(stats.chi2.isf(1e-4 / 5, 3), rel=1e-12)


def test_thm1_exponent_and_log_bound_are_their_formulas() -> None:
    # Guards Thm 1's corrected exponent 6 r^2 / tau and log sqrt(exp(6 r^2/tau) / (m eps)).
    assert prf.thm1_exponent(2.0, 0.5) == pytest.approx(48.0, rel=1e-15)
    expected = 0.5 * (6.0 * 0.75**2 / 0.25 - math.log(64 * 0.1))
    assert prf.thm1_log_bound(0.75, 0.25, 64, 0.1) == pytest.approx(expected, rel=1e-14)


def test_eq18_log_variance_is_the_log_of_eq18() -> None:
    # Guards each term of log V_m = |s|^2 + 2 x^T y + log(1 - exp(-|s|^2)) - log m against
    # Eq. 18 as printed: V_m = exp(|x + y|^2) SM^2 (1 - exp(-|x + y|^2)) / m, SM = exp(x^T y).
    x, y = np.array([0.3, -0.2, 0.5]), np.array([0.1, 0.4, -0.3])
    s2, sm = float(np.sum((x + y) ** 2)), math.exp(float(x @ y))
    printed = math.exp(s2) * sm**2 * (1 - math.exp(-s2)) / 7
    assert prf.eq18_log_variance(x, y, 7) == pytest.approx(math.log(printed), rel=1e-12)


def test_kernel_rounding_allowance_is_the_documented_gamma() -> None:
    # Guards gamma = (m + 8 + (d + 2) T) eps with T = max_i |w_i| (|x| + |y|) + |x|^2 + |y|^2
    # (mutants: a term of T dropped, d - 2, a 1e-4 slip passed: only x = -y cases sit at the
    # rounding level).
    omega = np.array([[3.0, 4.0], [1.0, 0.0]])  # row norms 5 and 1
    x, y = np.array([0.6, 0.8]), np.array([0.0, 2.0])  # |x| = 1, |y| = 2
    t = 5.0 * (1.0 + 2.0) + 1.0 + 4.0
    gamma = (16 + 8 + (2 + 2) * t) * float(np.finfo(np.float64).eps)
    assert prf.rounding_allowance(omega, x, y, 16) == pytest.approx(gamma, rel=1e-14, abs=0)


def test_standardised_cumulants_are_the_cumulants_over_powers_of_k2() -> None:
    # Guards _standardised_cumulants (mutant: w - 2 for w + 2 in the skewness, passed; the
    # skewness only widens Cornish-Fisher): skewness k3 / k2^1.5, excess k4 / k2^2 and
    # k6 / k2^3 from lognormal_cumulants, which quadrature checks.
    x, y = np.array([0.4, -0.1]), np.array([0.2, 0.3])
    k2, k3, k4, k6 = prf.lognormal_cumulants(x, y, 8)
    expected = (k3 / k2**1.5, k4 / k2**2, k6 / k2**3)
    np.testing.assert_allclose(moments._standardised_cumulants(x, y, 8), expected, rtol=1e-12)


def test_sample_variance_moments_match_an_exact_enumeration(monkeypatch) -> None:
    # Guards Kendall & Stuart's cumulants of s^2 (mutant: n - 0.1 for n - 1 in the third,
    # passed the 15 % simulation test): fed a three-point law's cumulants, they must give
    # the variance and skewness of s^2 over all 3^4 samples of 4 draws, exactly.
    values, probabilities, n = np.array([0.0, 1.0, 3.0]), np.array([0.5, 0.3, 0.2]), 4
    mean = probabilities @ values
    mu = {k: float(probabilities @ (values - mean) ** k) for k in (2, 3, 4, 6)}
    k2, k3 = mu[2], mu[3]
    k4 = mu[4] - 3 * mu[2] ** 2
    k6 = mu[6] - 15 * mu[4] * mu[2] - 10 * mu[3] ** 2 + 30 * mu[2] ** 3
    standardised = (k3 / k2**1.5, k4 / k2**2, k6 / k2**3)
    monkeypatch.setattr(moments, "_standardised_cumulants", lambda x, y, m: standardised)
    monkeypatch.setattr(moments, "eq18_variance", lambda x, y, m: k2)
    samples = np.array(list(itertools.product(range(3), repeat=n)))  # (81, 4) indices
    weights = probabilities[samples].prod(axis=1)
    s2 = values[samples].var(axis=1, ddof=1)
    s2_mean = weights @ s2
    variance = weights @ (s2 - s2_mean) ** 2
    skewness = (weights @ (s2 - s2_mean) ** 3) / variance**1.5
    got_variance, got_skewness = moments._sample_variance_moments(None, None, 1, n)
    assert got_variance == pytest.approx(variance, rel=1e-10)
    assert got_skewness == pytest.approx(skewness, rel=1e-10)


def test_frequency_test_uses_the_binomial_standard_error() -> None:
    # Guards _frequency_test (mutant: p instead of p (1 - p) in the variance, passed: a
    # looser tolerance): frequency and z sqrt(p (1 - p) / n) of a 0/1 sample.
    hits = np.array([1, 0, 0, 1, 1, 0, 0, 0])
    frequency, tolerance = prf.statistics._frequency_test(hits, 0.25)
    assert frequency == 3 / 8
    assert tolerance == pytest.approx(prf.z_threshold(1) * math.sqrt(0.25 * 0.75 / 8), rel=1e-14)


def test_the_gumbel_checks_run_the_librarys_sampler(monkeypatch) -> None:
    # Mutation: the library's Gumbel sampler (refimpl.nn.nodeformer.random_features.draw_gumbel,
    # which NodeFormerConv draws with) replaced by -log u, exponential noise. The checks
    # read the library's sampler, so Prop. 2 and both bullets of Prop. 3 now fail.
    from refimpl.nn.nodeformer import random_features

    def exponential(rng, shape, dtype=np.float64):
        return (-np.log(rng.random(shape))).astype(dtype)

    assert REGISTRY["prf.gumbel.prop2"](cases=8).passed
    monkeypatch.setattr(random_features, "draw_gumbel", exponential)
    assert not REGISTRY["prf.gumbel.prop2"](cases=8).passed
    assert not REGISTRY["prf.gumbel.prop3"](cases=8).passed
    assert not REGISTRY["prf.gumbel.prop3_limit"](cases=8).passed  # Prop. 3's second bullet


def test_prop1_elbo_check_fails_with_the_reverse_divergence(monkeypatch) -> None:
    # Mutation: the ELBO's divergence taken the other way round, D(p0 || q), as Eq. 10's
    # direction would suggest: the identity log p(Y) = ELBO + D(q || posterior) breaks.
    from proofs_check import load_checks, variational

    load_checks()
    check = REGISTRY["nodeformer.prop1.elbo"]
    assert check(cases=8).passed
    original = variational.elbo_terms

    def reversed_kl(q, prior, likelihood):
        log_evidence, elbo, kl_posterior = original(q, prior, likelihood)
        kl_prior = float(np.sum(q * np.log(q / prior)))
        swapped = float(np.sum(prior * np.log(prior / q)))
        return log_evidence, elbo + kl_prior - swapped, kl_posterior

    monkeypatch.setattr(variational, "elbo_terms", reversed_kl)
    assert not check(cases=8).passed


def test_a_five_percent_biased_estimator_passes_thm1_bound_but_not_the_mean(monkeypatch):
    # Thm 1 is a probability bound with room to spare: an estimator biased by 5 % still meets
    # it (prf.thm1.bound passes), and Prop. 1's mean check is what catches the bias. Mutation:
    # the library's features scaled by sqrt(1.05), so every kernel estimate is 5 % high.
    from proofs_check.prf import estimates

    original = estimates.positive_random_features
    monkeypatch.setattr(
        estimates, "positive_random_features", lambda *a, **k: original(*a, **k) * 1.05**0.5
    )
    assert REGISTRY["prf.thm1.bound"](cases=8).passed
    assert not REGISTRY["prf.prop1.mean"](cases=8).passed


def test_prop1_elbo_tolerance_is_guarded(monkeypatch) -> None:
    # The identity holds to ~1e-16 relative; an ELBO off by 3e-12 of log p(Y) (under a
    # tolerance ten times looser, 1e-11, it would pass) must fail _TOL = 1e-12.
    from proofs_check import load_checks, variational

    load_checks()
    check = REGISTRY["nodeformer.prop1.elbo"]
    original = variational.elbo_terms

    def slipped(q, prior, likelihood):
        log_evidence, elbo, kl_posterior = original(q, prior, likelihood)
        scale = max(abs(log_evidence), abs(elbo), kl_posterior, 1.0)
        return log_evidence, elbo + 3e-12 * scale, kl_posterior

    monkeypatch.setattr(variational, "elbo_terms", slipped)
    record = check(cases=8)
    assert not record.passed and record.measured < 1e-11
