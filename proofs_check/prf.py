"""NodeFormer's positive random features as checks: Prop. 1 (Eq. 18), Thm 1 (Eq. 19-21), Eq. 5.

With ``s = x + y`` and rows ``w_i`` of the projection (NodeFormer Eq. 4,
:mod:`refimpl.nn.random_features`), the kernel estimate of Prop. 1 is

    SM^_m(x, y) = phi(x)^T phi(y) = (1/m) sum_i Z_i,  Z_i = exp(w_i^T s - (|x|^2 + |y|^2) / 2).

For ``w ~ N(0, I_d)``, ``w^T s ~ N(0, |s|^2)``: ``Z`` is log-normal, ``E[Z^k] =
exp(k^2 |s|^2 / 2 - k (|x|^2 + |y|^2) / 2)``. ``k = 1`` is Eq. 18's mean ``SM(x, y) =
exp(x^T y)``, ``k = 2`` its variance ``V_m = exp(|s|^2) SM^2 (1 - exp(-|s|^2)) / m``
(:func:`eq18_variance`); the fourth central moment, ``SM^4 w^2 (e^{4|s|^2} + 2 e^{3|s|^2}
+ 3 e^{2|s|^2} - 3)`` with ``w = e^{|s|^2} - 1``, sets the tolerance of the variance
check. Eq. 18 is right as printed.

======================  ==================================================================
``prf.prop1.mean``      i.i.d. rows: ``E[SM^_m] = exp(x^T y)`` (Eq. 18, first line)
``prf.prop1.variance``  i.i.d. rows: ``Var[SM^_m] = V_m`` (Eq. 18, second line)
``prf.orthogonal.mean``  orthogonal rows (``draw_projection(kind="orthogonal")``): unbiased
``prf.orthogonal.variance``  orthogonal rows: ``Var <= V_m`` (as Performer proves)
``prf.thm1.rate``       ``E[Delta^2]^(1/2)`` falls like ``m^(-1/2)``: fitted log-log slope
``prf.thm1.bound``      ``P(Delta <= sqrt(exp(6 r^2/tau) / (m eps))) >= 1 - eps`` (Thm 1 with
                        the exponent corrected, erratum ``prf.thm1.exponent_r_squared``)
``prf.thm1.chebyshev``  ``P(Delta <= sqrt(V_m / eps)) >= 1 - eps``: the Chebyshev form
``prf.eq5.rate``        library ``KernelizedSoftmax`` vs exact ``AllPairSoftmax``: RMS error
                        of the output falls like ``m^(-1/2)``: fitted log-log slope
======================  ==================================================================

Statistics
----------
Every check draws with ``ctx.rng`` at a fixed seed, so its verdict is fixed; the
thresholds are still chosen so that, were the seed random, a correct library
would fail a check with probability at most ``FALSE_ALARM`` (Bonferroni over the
check's cases). A case's statistic is a z-score whose standard error comes from
the known distribution (Eq. 18 and the log-normal's cumulants) where the
estimator has one, and from the sample otherwise (orthogonal rows, ratios,
slopes), or a binomial proportion. ``measured`` and ``bound`` are the deviation and ``z *
standard error`` in the check's units, so the margin says how much of the
tolerance is used. The sample sizes make a biased or mis-normalised estimator
fail by many standard errors (the tests show it).

The log-normal's tail limits where a normal quantile is honest. The statistics
are skewed to the right, and the threshold adds the one-term Cornish-Fisher
correction ``|skewness| (z^2 - 1) / 6`` (:func:`cornish_fisher`) with the exact
skewness from the log-normal's cumulants (:func:`lognormal_cumulants`); the cases
keep that skewness small: ``|s|^2 <= 1`` for means (skewness of a mean of ``n m``
terms ``<= 0.14``), ``|s|^2 <= 1/2`` for the Thm 1 slope, and ``|s|^2 <= 1/4``, ``m >=
4`` for variances (skewness of ``s^2`` ``<= 0.11``; at ``|s|^2 = 1`` it reaches 8 and
simulated z-scores of ``s^2`` pass 6 once in a thousand). The proportion checks of
Thm 1 have no such limit and run up to ``r^2 / tau = 64``.

What Thm 1's ``O(.)`` leaves open
---------------------------------
The statement has no constant and does not say in which variables the ``O`` is
uniform. The proof (Eq. 19-21) has the constant 1 and, read with ``|q|, |k| <=
r``, needs ``exp(6 r^2 / tau)``: with the printed ``exp(6 r / tau)`` the statement
fails for ``r > 3`` (erratum ``prf.thm1.exponent_r_squared``); ``prf.thm1.bound``
checks the corrected one. The checks establish the ``m^(-1/2)`` rate (a slope,
constant-free) and the probability statement in its sharpest form, Chebyshev with
the exact ``V_m``; the ``exp(6 r^2 / tau)`` factor is a worst case over the ball,
attained at ``q = k``, and loose elsewhere by ``exp(6 r^2/tau - |s|^2 - 2 q^T k / tau)``.

Errata found here (entries built by :func:`errata`)
---------------------------------------------------
``prf.thm1.exponent_r_squared`` (Thm 1, Eq. 19-21: ``6r`` for ``6r^2``) and
``prf.eq20.inequality_direction`` (Eq. 20: "no greater than" for "no less than").
:func:`eq51_sigma_evidence` is the counterexample of ``prf.eq51.sigma_squared``
(Eq. 51, in Thm 2's proof), listed with the Gumbel errata of
:mod:`proofs_check.prf_gumbel`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from proofs_check.registry import Context, WorstCase, check
from refimpl.backend import to_numpy
from refimpl.nn.kernel_attention import AllPairSoftmax, KernelizedSoftmax
from refimpl.nn.random_features import draw_projection, positive_random_features

__all__ = [
    "FALSE_ALARM",
    "MOMENT_EXPONENT",
    "cornish_fisher",
    "eq18_log_variance",
    "eq18_variance",
    "eq20_direction_evidence",
    "eq51_sigma_evidence",
    "errata",
    "evidence",
    "kernel_estimates",
    "lognormal_cumulants",
    "projection_stack",
    "rounding_allowance",
    "slope_and_error",
    "thm1_exponent",
    "thm1_exponent_evidence",
    "thm1_log_bound",
    "z_threshold",
]

FALSE_ALARM = 1e-4  # per check: chance that a correct library fails it at a random seed
MOMENT_EXPONENT = 1.0  # max |x + y|^2 of the mean checks (module docstring: Statistics)
RATE_EXPONENT = 0.5  # ... of the Thm 1 slope
VARIANCE_EXPONENT = 0.25  # ... of the variance checks, with m >= VARIANCE_FEATURES
VARIANCE_FEATURES = 4
MEAN_DRAWS = 2000  # kernel estimates per case for the means
VARIANCE_DRAWS = 4000  # ... for the variances (relative standard error of s^2 <= 3 %)
RATE_FEATURES = (4, 16, 64, 256)  # m ladder of the Thm 1 slope
RATE_DRAWS = 1000
BOUND_DRAWS = 1000  # draws per case of the Thm 1 proportions
OUTPUT_FEATURES = (32, 128, 512, 2048)  # m ladder of the Eq. 5 slope (m >= 32: see eq5_rate)
OUTPUT_DRAWS = 48  # library forward passes per m and case
OUTPUT_EXPONENT = 0.5  # max |q_u + k_v|^2 / tau of the Eq. 5 cases
TAUS = (0.25, 0.5, 1.0)  # temperatures; 0.25 is the paper's (Sec. 4)
RADII = (0.25, 0.5, 1.0, 2.0, 4.0)  # r of Thm 1's proportion checks


# -- statistics ---------------------------------------------------------------------------
def z_threshold(tests: int, sides: int = 2) -> float:
    """The normal quantile ``z`` with ``P(max of tests |N(0,1)| > z) <= FALSE_ALARM``.

    Bonferroni: each of ``tests`` statistics gets ``FALSE_ALARM / tests``, split
    over ``sides`` tails. ``tests = 40``: 4.71 two-sided, 4.56 one-sided.
    """
    return float(stats.norm.isf(FALSE_ALARM / (sides * max(tests, 1))))


def cornish_fisher(z: float, skewness: float) -> float:
    """``z`` moved out by the one-term Cornish-Fisher correction ``|skewness| (z^2 - 1) / 6``,
    applied to both tails (conservative on the short one)."""
    return z + abs(skewness) * (z * z - 1) / 6


def slope_and_error(features: Any, values: Any, errors: Any) -> tuple[float, float]:
    """Least-squares slope of ``log values`` on ``log features`` and its standard error.

    ``errors`` are the standard errors of ``log values`` (independent points), so
    the slope's is ``sqrt(sum_j (x_j - xbar)^2 e_j^2) / sum_j (x_j - xbar)^2``.
    """
    x = np.log(np.asarray(features, dtype=float))
    centred = x - x.mean()
    spread = float(centred @ centred)
    slope = float(centred @ np.log(np.asarray(values, dtype=float))) / spread
    return slope, float(np.sqrt(centred**2 @ np.asarray(errors, dtype=float) ** 2)) / spread


# -- Eq. 18 -------------------------------------------------------------------------------
def eq18_log_variance(x: Any, y: Any, m: int) -> float:
    """``log V_m`` of Eq. 18: ``|s|^2 + 2 x^T y + log(1 - exp(-|s|^2)) - log m``; -inf at s = 0."""
    s2 = float(np.sum((x + y) ** 2))
    if s2 == 0.0:
        return -math.inf
    return s2 + 2.0 * float(x @ y) + math.log(-math.expm1(-s2)) - math.log(m)


def eq18_variance(x: Any, y: Any, m: int) -> float:
    """``V_m = exp(|x + y|^2) SM^2(x, y) (1 - exp(-|x + y|^2)) / m`` (NodeFormer Eq. 18)."""
    return math.exp(eq18_log_variance(x, y, m))


def lognormal_cumulants(x: Any, y: Any, m: int) -> tuple[float, float, float, float]:
    """Cumulants ``k2, k3, k4, k6`` of ``SM^_m / SM`` (i.i.d. rows), exact.

    ``Z / SM`` has raw moments ``w^(k (k - 1) / 2)``, ``w = e^{|s|^2}``; its cumulants
    factor as ``e^(j-1) P_j(w)`` with ``e = w - 1`` (taken with ``expm1``, so small
    ``|s|^2`` loses nothing to cancellation); the mean of ``m`` i.i.d. copies has
    ``kappa_j / m^(j - 1)``. ``k2 = e / m`` is Eq. 18.
    """
    e = math.expm1(float(np.sum((x + y) ** 2)))
    w = 1 + e
    k3 = e**2 * (w + 2)
    k4 = e**3 * (w**3 + 3 * w**2 + 6 * w + 6)
    p6 = [1, 5, 15, 35, 70, 120, 180, 240, 270, 240, 120]  # coefficients of w^10 ... w^0
    k6 = e**5 * float(np.polyval(p6, w))
    return e / m, k3 / m**2, k4 / m**3, k6 / m**5


def _standardised_cumulants(x: Any, y: Any, m: int) -> tuple[float, float, float]:
    """Skewness ``k3 / k2^(3/2)``, excess ``k4 / k2^2`` and ``k6 / k2^3`` of ``SM^_m``, without
    dividing by a small ``k2`` (the powers of ``e`` cancel in closed form)."""
    e = math.expm1(float(np.sum((x + y) ** 2)))
    w = 1 + e
    p6 = [1, 5, 15, 35, 70, 120, 180, 240, 270, 240, 120]
    return (
        math.sqrt(e) * (w + 2) / math.sqrt(m),
        e * (w**3 + 3 * w**2 + 6 * w + 6) / m,
        e**2 * float(np.polyval(p6, w)) / m**2,
    )


def _sample_variance_moments(x: Any, y: Any, m: int, draws: int) -> tuple[float, float]:
    """``(Var[s^2], skewness of s^2)`` for ``draws`` i.i.d. ``SM^_m`` (the cumulants of the
    k-statistic ``k_2``, Kendall & Stuart), ``Var`` in the units of ``s^2`` squared."""
    skewness, excess, sixth = _standardised_cumulants(x, y, m)
    n = draws
    variance = excess / n + 2 / (n - 1)  # in units of sigma^4
    third = (
        sixth / n**2 + 12 * excess / (n * (n - 1))
        + 4 * (n - 2) * skewness**2 / (n * (n - 1) ** 2) + 8 / (n - 1) ** 2
    )  # fmt: skip
    sigma2 = eq18_variance(x, y, m)  # Var[SM^_m], Eq. 18
    return variance * sigma2**2, third / variance**1.5


def _mean_skewness(x: Any, y: Any, m: int, draws: int) -> float:
    """Skewness of the mean of ``draws`` i.i.d. ``SM^_m``: ``k3 / k2^(3/2) / sqrt(draws)``."""
    return _standardised_cumulants(x, y, m)[0] / math.sqrt(draws)


# -- the estimates ------------------------------------------------------------------------
def projection_stack(rng: np.random.Generator, draws: int, m: int, d: int, kind: str) -> Any:
    """``draws`` independent projections of ``m`` rows, stacked: host ``(draws m, d)``.

    One call of :func:`draw_projection` (looked up when called, so a test can
    swap it). ``"orthogonal"`` draws ``ceil(m/d)`` whole blocks per projection and
    keeps the first ``m`` rows of each group, so every group has the distribution
    of ``draw_projection(rng, m, d, "orthogonal")`` and no block straddles two.
    """
    if kind == "iid":
        return draw_projection(rng, draws * m, d, "iid")
    per_draw = -(-m // d) * d
    stacked = draw_projection(rng, draws * per_draw, d, kind)  # (draws per_draw, d)
    return stacked.reshape(draws, per_draw, d)[:, :m].reshape(draws * m, d)


def kernel_estimates(ctx: Context, x: Any, y: Any, omega: Any, draws: int) -> np.ndarray:
    """``SM^_m(x, y)`` for each of the ``draws`` projections in ``omega``: host ``(draws,)``.

    The library's :func:`positive_random_features` of ``[x; y]`` on ``ctx``'s
    backend. It normalises by ``1/sqrt(rows) = 1/sqrt(draws m)``, so a projection's
    estimate is ``draws`` times the sum of its ``m`` products ``phi(x)_i phi(y)_i``.
    """
    features = positive_random_features(ctx.asarray(np.stack([x, y])), ctx.asarray(omega))
    products = to_numpy(features[0] * features[1]).reshape(draws, -1)  # (draws, m)
    return draws * products.sum(axis=1)


def rounding_allowance(omega: Any, x: Any, y: Any, m: int) -> float:
    """Relative rounding bound ``gamma`` on each computed ``SM^_m`` (float64).

    An exponent ``w^T x - |x|^2/2`` errs by at most ``(d + 2) u (|w||x| + |x|^2)``
    (``u = eps/2``), so ``exp`` by that plus ``u``; the ``1/sqrt(rows)`` factors,
    the product and the rescaling add ``4u``, the ``m``-term sum ``(m - 1) u``. With
    ``T = max_i |w_i| (|x| + |y|) + |x|^2 + |y|^2``: ``gamma = (m + 8 + (d + 2) T) eps``,
    twice the sum. It matters only where ``V_m = 0`` (``x = -y``, ``x = y = 0``).
    """
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    t = float(np.linalg.norm(omega, axis=1).max()) * (nx + ny) + nx**2 + ny**2
    return (m + 8 + (x.size + 2) * t) * float(np.finfo(np.float64).eps)


def _pair(rng: np.random.Generator, d: int, exponent: float) -> tuple[np.ndarray, np.ndarray]:
    """Random ``x, y`` in ``R^d`` with ``|x + y|^2 = exponent``: ``x, y = (s +- t) / 2``, ``s`` of
    that length, ``t ~ N(0, I_d / 4)``, so ``x^T y = (|s|^2 - |t|^2) / 4`` stays of order 1."""
    s, t = rng.standard_normal(d), rng.standard_normal(d) / 2
    s *= math.sqrt(exponent) / np.linalg.norm(s)
    return (s + t) / 2, (s - t) / 2


def kernel_cases(
    ctx: Context, exponent: float, fewest: int = 1, blocks: int | None = None
) -> list[tuple[Any, Any, int]]:
    """``(x, y, m)``: fixed edge cases, then ``ctx.cases`` random ones, ``|x+y|^2 <= exponent``.

    ``m = 1, 2, 4, ..., 32``, at least ``fewest``, at most ``blocks d`` when given.
    """
    rng = ctx.rng
    half = math.sqrt(exponent) / 2
    cases = [
        (np.zeros(3), np.zeros(3), 4),  # every feature 1/sqrt(m): SM^ = 1 exactly, V = 0
        (np.array([0.6, -0.3]), np.array([-0.6, 0.3]), 8),  # x = -y: Z constant, V = 0
        (np.array([half]), np.array([half]), fewest),  # d = 1, fewest rows, at the cap
        (np.array([half, half, 0, 0]), np.array([half, -half, 0, 0]), 16),  # x _|_ y
        (*_pair(rng, 5, exponent), max(3, fewest)),  # m < d: part of one orthogonal block
    ]
    for _ in range(ctx.cases):
        d, m = int(rng.integers(1, 7)), max(int(2 ** rng.integers(0, 6)), fewest)
        m = m if blocks is None else min(m, max(blocks * d, fewest))
        cases.append((*_pair(rng, d, exponent * rng.uniform(0.05, 1.0)), m))
    return cases


# -- Prop. 1 and orthogonal features -------------------------------------------------------
def _mean_check(ctx: Context, kind: str) -> WorstCase:
    worst = WorstCase("upper")
    cases = kernel_cases(ctx, MOMENT_EXPONENT, blocks=None if kind == "iid" else 2)
    z = z_threshold(len(cases))
    for x, y, m in cases:
        omega = projection_stack(ctx.rng, MEAN_DRAWS, m, x.size, kind)
        estimates = kernel_estimates(ctx, x, y, omega, MEAN_DRAWS)
        if kind == "iid":  # the standard error Eq. 18 predicts
            error = math.sqrt(eq18_variance(x, y, m) / MEAN_DRAWS)
        else:  # unknown in closed form: the sample's
            error = float(estimates.std(ddof=1)) / math.sqrt(MEAN_DRAWS)
        kernel, mean = math.exp(float(x @ y)), float(estimates.mean())
        allowance = rounding_allowance(omega, x, y, m) * mean
        z_case = cornish_fisher(z, _mean_skewness(x, y, m, MEAN_DRAWS))  # i.i.d. for both kinds
        worst.add(abs(mean - kernel) / kernel, (z_case * error + allowance) / kernel)
    return worst


@check(
    id="prf.prop1.mean",
    paper="NodeFormer",
    statement="i.i.d. PRF: E[phi(x)^T phi(y)] = exp(x^T y) (Prop. 1, Eq. 18); |mean/SM - 1|",
)
def prop1_mean(ctx: Context) -> WorstCase:
    """Eq. 18, mean: the average of ``MEAN_DRAWS`` estimates is within ``z sqrt(V_m / draws)``.

    ``measured = |mean / SM - 1|``; ``bound = (z sqrt(V_m / draws) + gamma mean) / SM``,
    ``z = z_threshold(cases)``, ``V_m`` of Eq. 18, ``gamma`` the rounding allowance.
    """
    return _mean_check(ctx, "iid")


@check(
    id="prf.orthogonal.mean",
    paper="NodeFormer",
    statement="orthogonal PRF are unbiased too: E[phi(x)^T phi(y)] = exp(x^T y); |mean/SM - 1|",
)
def orthogonal_mean(ctx: Context) -> WorstCase:
    """Orthogonal rows are marginally ``N(0, I_d)``, so Eq. 18's mean holds row by row.

    As ``prf.prop1.mean``, with the standard error taken from the sample (the
    orthogonal variance has no closed form here). Performer's unsigned QR, whose
    first row per block is not isotropic, fails it (tests).
    """
    return _mean_check(ctx, "orthogonal")


def _variance_check(ctx: Context, kind: str) -> WorstCase:
    worst = WorstCase("upper")
    blocks = None if kind == "iid" else 2
    cases = kernel_cases(ctx, VARIANCE_EXPONENT, VARIANCE_FEATURES, blocks)
    z = z_threshold(len(cases), sides=2 if kind == "iid" else 1)
    draws = VARIANCE_DRAWS
    for x, y, m in cases:
        omega = projection_stack(ctx.rng, draws, m, x.size, kind)
        estimates = kernel_estimates(ctx, x, y, omega, draws)
        variance, predicted = float(estimates.var(ddof=1)), eq18_variance(x, y, m)
        # perturbing each estimate by <= gamma relative moves s^2 by <= 4 gamma mean(SM^2)
        allowance = 8 * rounding_allowance(omega, x, y, m) * float(np.mean(estimates**2))
        scale = math.exp(2.0 * float(x @ y))  # SM^2: never 0, unlike V_m
        error, skewness = _sample_variance_moments(x, y, m, draws)
        z_case = cornish_fisher(z, skewness)  # the i.i.d. skewness, for both kinds
        if kind == "iid":
            tolerance = z_case * math.sqrt(error) + allowance
            worst.add(abs(variance - predicted) / scale, tolerance / scale)
        else:  # one-sided, Var[s^2] from the sample's fourth moment
            fourth = float(np.mean((estimates - estimates.mean()) ** 4))
            error = math.sqrt(max(fourth - variance**2 * (draws - 3) / (draws - 1), 0.0) / draws)
            worst.add((variance - predicted) / scale, (z_case * error + allowance) / scale)
    return worst


@check(
    id="prf.prop1.variance",
    paper="NodeFormer",
    statement="i.i.d. PRF: Var = exp(|x+y|^2) SM^2 (1 - exp(-|x+y|^2)) / m (Prop. 1, Eq. 18); "
    "|s^2 - V_m| / SM^2",
)
def prop1_variance(ctx: Context) -> WorstCase:
    """Eq. 18, variance: the sample variance of ``VARIANCE_DRAWS`` estimates matches ``V_m``.

    ``measured = |s^2 - V_m| / SM^2`` (``SM^2`` because ``V_m`` can be 0); ``bound =
    (z' sd(s^2) + rounding) / SM^2`` with ``Var[s^2] = k4 / n + 2 k2^2 / (n - 1)`` and
    ``z'`` the Cornish-Fisher-corrected ``z`` for the skewness of ``s^2``, both from
    the exact cumulants of the mean of ``m`` log-normals (:func:`lognormal_cumulants`):
    the tolerance follows from the known distribution, not from the sample.
    ``|x + y|^2 <= VARIANCE_EXPONENT``, ``m >= VARIANCE_FEATURES``.
    """
    return _variance_check(ctx, "iid")


@check(
    id="prf.orthogonal.variance",
    paper="NodeFormer",
    statement="orthogonal PRF: Var[SM^_m] <= the i.i.d. V_m of Eq. 18 (Performer); "
    "(s^2 - V_m) / SM^2",
)
def orthogonal_variance(ctx: Context) -> WorstCase:
    """Orthogonal rows estimate the kernel with no more variance than i.i.d. rows.

    Performer (Choromanski et al. 2021, NodeFormer's [6]) proves the orthogonal
    estimator's MSE is no larger; ``m = 1`` and ``d = 1`` give equality (one row, or
    ``1 x 1`` blocks: i.i.d. in distribution). One-sided: ``measured = (s^2 - V_m) /
    SM^2`` (negative: the reduction), ``bound = (z sd(s^2) + rounding) / SM^2``,
    ``sd(s^2)`` from the sample's fourth moment. Projections have at most two
    blocks (``m <= 2d``): QR is the cost.
    """
    return _variance_check(ctx, "orthogonal")


# -- Thm 1 ----------------------------------------------------------------------------------
def thm1_exponent(r: float, tau: float) -> float:
    """Thm 1's exponent for ``|q|, |k| <= r``: ``6 r^2 / tau`` (Eq. 20 with ``|q + k|^2 <= 4 r^2``
    and ``2 q^T k <= 2 r^2``; printed: ``6 r / tau``, see :func:`thm1_exponent_evidence`)."""
    return 6.0 * r * r / tau


def thm1_log_bound(r: float, tau: float, m: int, eps: float) -> float:
    """``log sqrt(exp(thm1_exponent) / (m eps))``, Thm 1 / Eq. 21 with the constant 1."""
    return 0.5 * (thm1_exponent(r, tau) - math.log(m * eps))


def _scaled_pair(rng: np.random.Generator, d: int, r: float) -> tuple[np.ndarray, np.ndarray]:
    """``q, k`` with ``|q| = r`` and ``|k| = r U(1/2, 1)``, random directions."""
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    return q * r / np.linalg.norm(q), k * r * rng.uniform(0.5, 1.0) / np.linalg.norm(k)


def _proportion_check(ctx: Context, log_threshold: Callable[..., float]) -> WorstCase:
    """``P(Delta <= t) >= 1 - eps`` on random ``(tau, r, m, eps)``, ``t = exp(log_threshold)``.

    ``measured``: the fraction of ``BOUND_DRAWS`` estimates within ``t`` (plus the
    rounding allowance); ``bound``: ``1 - eps - z sqrt(eps (1 - eps) / draws)``,
    one-sided normal approximation to the binomial.
    """
    rng = ctx.rng
    four = np.array([4.0, 0.0])
    cases = [  # q = k: |q + k| = 2r, the worst case; r = 4 breaks the printed exponent
        (four, four, 1.0, 4.0, 100, 0.1),
        (-four / 8, four / 8, 0.25, 0.5, 16, 0.05),  # q = -k: SM^ exact, V_m = 0
    ]
    for _ in range(max(ctx.cases // 2, 1)):
        tau, r = float(rng.choice(TAUS)), float(rng.choice(RADII))
        m, eps = int(4 ** rng.integers(0, 5)), float(rng.choice([0.05, 0.1, 0.25, 0.5]))
        cases.append((*_scaled_pair(rng, int(rng.integers(1, 5)), r), tau, r, m, eps))
    z = z_threshold(len(cases), sides=1)
    worst = WorstCase("lower")
    for q, k, tau, r, m, eps in cases:
        x, y = q / math.sqrt(tau), k / math.sqrt(tau)
        omega = projection_stack(rng, BOUND_DRAWS, m, q.size, "iid")
        estimates = kernel_estimates(ctx, x, y, omega, BOUND_DRAWS)
        kernel = math.exp(float(x @ y))
        slack = rounding_allowance(omega, x, y, m) * np.maximum(estimates, kernel)
        delta = np.abs(estimates - kernel)  # Thm 1's Delta, (draws,)
        inside = delta <= math.exp(log_threshold(x, y, tau, r, m, eps)) + slack
        worst.add(float(np.mean(inside)), 1 - eps - z * math.sqrt(eps * (1 - eps) / BOUND_DRAWS))
    return worst


@check(
    id="prf.thm1.bound",
    paper="NodeFormer",
    statement="|q|,|k| <= r: P(Delta <= sqrt(exp(6 r^2/tau) / (m eps))) >= 1 - eps (Thm 1, Eq. 21 "
    "with r^2); fraction",
)
def thm1_bound(ctx: Context) -> WorstCase:
    """Thm 1 as the proof states it (Eq. 21, constant 1), with the exponent ``6 r^2 / tau``.

    Cases: ``tau`` in ``TAUS``, ``r`` in ``RADII`` (up to ``r^2 / tau = 64``),
    ``m = 1 ... 256``, ``eps`` in ``{0.05, 0.1, 0.25, 0.5}``, ``|q| = r``, and the fixed
    ``q = k = (4, 0)``, ``tau = 1``, ``m = 100``, ``eps = 0.1`` where the printed
    ``exp(6 r / tau)`` gives a fraction near 0 (see :func:`thm1_exponent`).
    """
    return _proportion_check(ctx, lambda x, y, tau, r, m, eps: thm1_log_bound(r, tau, m, eps))


@check(
    id="prf.thm1.chebyshev",
    paper="NodeFormer",
    statement="P(Delta <= sqrt(V_m / eps)) >= 1 - eps with V_m of Eq. 18 (Thm 1's Chebyshev step, "
    "Eq. 19); fraction",
)
def thm1_chebyshev(ctx: Context) -> WorstCase:
    """The sharpest form of Thm 1's argument: Chebyshev with the exact variance of Eq. 18.

    Same cases as ``prf.thm1.bound``; the threshold is ``sqrt(V_m / eps) <=
    sqrt(exp(6 r^2 / tau) / (m eps))``, so this implies that check. It fails if
    the estimator's spread exceeds Eq. 18's (or Eq. 18 understates it).
    """
    return _proportion_check(
        ctx, lambda x, y, tau, r, m, eps: 0.5 * (eq18_log_variance(x, y, m) - math.log(eps))
    )


@check(
    id="prf.thm1.rate",
    paper="NodeFormer",
    statement="RMS of Delta = |SM^_m - SM| falls like m^(-1/2) (Thm 1); |log-log slope + 1/2|",
)
def thm1_rate(ctx: Context) -> WorstCase:
    """Thm 1's ``m`` dependence without its constant: the RMS error's slope in ``log m`` is -1/2.

    Per case (``tau`` in ``TAUS``, ``r <= sqrt(tau / 2) / 2``, so ``|q + k|^2 / tau <= 1/2``):
    ``MSE_j`` of ``RATE_DRAWS`` estimates at each ``m_j`` in ``RATE_FEATURES``, the
    least-squares slope ``b`` of ``log MSE`` on ``log m`` with the standard error of
    ``log MSE_j`` from the sample (``sd(Delta^2) / (sqrt(n) MSE_j)``). ``measured =
    |b/2 + 1/2|``, ``bound = z se(b) / 2``. For i.i.d. rows ``E[Delta^2] = V_1 / m``
    exactly, so the only bias is Jensen's in ``log MSE_j`` (below 0.01 at ``m = 4``
    against a standard error near 0.13): a non-decaying error (bias) gives ``b ~ 0``.
    Simulated with the log-normal itself, ``|z| > 3`` happens 1.5 times as often as
    for a normal at ``|s|^2 = 1/2`` (5 times at ``|s|^2 = 1``, hence ``RATE_EXPONENT``).
    """
    rng = ctx.rng
    cases = []
    for k in range(max(ctx.cases // 4, 1) + 1):
        tau = TAUS[k % len(TAUS)]
        r = math.sqrt(tau * RATE_EXPONENT) / 2 * (1.0 if k == 0 else rng.uniform(0.3, 1.0))
        cases.append((tau, r, *_scaled_pair(rng, int(rng.integers(1, 5)), r)))
    z = z_threshold(len(cases))
    worst = WorstCase("upper")
    for tau, _, q, k in cases:
        x, y = q / math.sqrt(tau), k / math.sqrt(tau)
        kernel, mse, errors = math.exp(float(x @ y)), [], []
        for m in RATE_FEATURES:
            omega = projection_stack(rng, RATE_DRAWS, m, q.size, "iid")
            squared = (kernel_estimates(ctx, x, y, omega, RATE_DRAWS) - kernel) ** 2
            mse.append(float(squared.mean()))
            errors.append(float(squared.std(ddof=1)) / (math.sqrt(RATE_DRAWS) * mse[-1]))
        slope, error = slope_and_error(RATE_FEATURES, mse, errors)
        worst.add(abs(slope / 2 + 0.5), z * error / 2)
    return worst


# -- Eq. 5 --------------------------------------------------------------------------------
@check(
    id="prf.eq5.rate",
    paper="NodeFormer",
    statement="kernelised output (Eq. 5) -> exact softmax output (Eq. 2): RMS error ~ m^(-1/2); "
    "|slope + 1/2|",
)
def eq5_rate(ctx: Context) -> WorstCase:
    """The library's O(N) output converges to the exact O(N^2) one at the rate ``m^(-1/2)``.

    ``KernelizedSoftmax(tau)`` against ``AllPairSoftmax(tau)`` (``Z = softmax(Q K^T /
    tau) V``) on ``N = 2..8`` nodes, ``OUTPUT_DRAWS`` projections per ``m`` in
    ``OUTPUT_FEATURES``; the error is the mean square over ``Z``'s entries.
    Eq. 5 is a ratio of two unbiased estimates, so (delta method) its error is
    ``O(m^(-1/2))`` with an ``O(1/m)`` relative correction of the order of the
    denominator's relative variance per feature (``<= e^{1/2} - 1`` for
    ``|q_u + k_v|^2 / tau <= OUTPUT_EXPONENT``). From ``m = 32`` on it is not
    resolved: at the cap, 1500 passes per ``m`` give ``m MSE`` flat to 2 % and an
    MSE slope of ``-1.00 +- 0.01``, against a tolerance near 0.1 on the MSE slope
    here. ``measured``, ``bound``: as ``prf.thm1.rate``, standard errors from the
    sample.
    """
    rng = ctx.rng
    cases = max(ctx.cases // 8, 1)
    z = z_threshold(cases)
    worst = WorstCase("upper")
    for _ in range(cases):
        n, d, d_v = int(rng.integers(2, 9)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
        tau = float(rng.choice(TAUS))
        q, k = rng.standard_normal((n, d)), rng.standard_normal((n, d))
        v = rng.standard_normal((n, d_v))
        widest = float(np.max(np.sum((q[:, None] + k[None]) ** 2, axis=-1)))  # max |q_u + k_v|^2
        scale = math.sqrt(OUTPUT_EXPONENT * tau / widest)
        q, k, v = ctx.asarray(q * scale), ctx.asarray(k * scale), ctx.asarray(v)
        exact, _ = AllPairSoftmax(tau).forward({}, q, k, v)
        kernelised = KernelizedSoftmax(tau)
        mse, errors = [], []
        for m in OUTPUT_FEATURES:
            squared = np.empty(OUTPUT_DRAWS)
            for j in range(OUTPUT_DRAWS):
                out, _ = kernelised.forward({}, q, k, v, ctx.asarray(draw_projection(rng, m, d)))
                squared[j] = float(ctx.xp.mean((out - exact) ** 2))
            mse.append(float(squared.mean()))
            errors.append(float(squared.std(ddof=1)) / (math.sqrt(OUTPUT_DRAWS) * mse[-1]))
        slope, error = slope_and_error(OUTPUT_FEATURES, mse, errors)
        worst.add(abs(slope / 2 + 0.5), z * error / 2)
    return worst


# -- errata ---------------------------------------------------------------------------------
def evidence(printed_holds: bool, correct_holds: bool, detail: str) -> Any:
    """A :class:`proofs_check.errata.Evidence`, imported when called: ``errata`` imports us."""
    from proofs_check.errata import Evidence

    return Evidence(bool(printed_holds), bool(correct_holds), detail)


def _host_context(seed: int) -> Context:
    return Context(rng=np.random.default_rng(seed), cases=0, xp=np)


def thm1_exponent_evidence() -> Any:
    """Thm 1 / Eq. 21 at ``q = k = (4, 0)``, ``tau = 1``, ``m = 100``, ``eps = 0.1``."""
    r, tau, m, eps, draws = 4.0, 1.0, 100, 0.1, 2000
    x = y = np.array([r, 0.0]) / math.sqrt(tau)
    kernel = math.exp(float(x @ y))  # e^16
    printed = math.exp(0.5 * (6 * r / tau - math.log(m * eps)))  # e^12 / sqrt(10) < SM
    corrected = math.exp(thm1_log_bound(r, tau, m, eps))
    # Z_i = exp(w_i^T s - c), |s| = 8, c = 16; SM^ >= SM - t needs some Z_i >= SM - t, so
    # P(Delta <= t) <= m P(N(0, 1) >= (log(SM - t) + c) / |s|): a rigorous upper bound.
    norm_s, c = float(np.linalg.norm(x + y)), float(x @ x + y @ y) / 2
    quantile = (math.log(kernel - printed) + c) / norm_s
    printed_at_most = m * float(stats.norm.sf(quantile))
    # Chebyshev with Eq. 18: P(Delta <= t) >= 1 - V_m / t^2 = 1 - eps (1 - e^{-64}) here
    chebyshev = eq18_log_variance(x, y, m) <= math.log(eps) + 2 * math.log(corrected) + 1e-12
    ctx = _host_context(21)
    estimates = kernel_estimates(ctx, x, y, projection_stack(ctx.rng, draws, m, 2, "iid"), draws)
    delta = np.abs(estimates - kernel)
    sampled_printed, sampled = float(np.mean(delta <= printed)), float(np.mean(delta <= corrected))
    detail = (
        f"SM = e^16 = {kernel:.4g}; printed t = e^12/sqrt(10) = {printed:.4g} < SM, so Delta <= t "
        f"needs some Z_i >= SM - t: P <= m P(N(0,1) >= {quantile:.3f}) = {printed_at_most:.2g} < "
        f"1 - eps = 0.9 (sampled {sampled_printed:.4f} of {draws}); with 6 r^2 / tau, t = "
        f"{corrected:.4g} and Chebyshev gives P >= 1 - eps (1 - e^-64) (sampled {sampled:.4f})"
    )
    return evidence(
        printed_at_most >= 1 - eps or sampled_printed >= 1 - eps,
        chebyshev and sampled >= 1 - eps,
        detail,
    )


def eq20_direction_evidence() -> Any:
    """Eq. 19's right side against Eq. 20 at ``q = k = (1/2, 0)``, then on random inputs."""

    def sides(q: Any, k: Any, tau: float, r: float, m: int, eps: float) -> tuple[float, float]:
        x, y = q / math.sqrt(tau), k / math.sqrt(tau)
        rhs19 = 1 - math.exp(eq18_log_variance(x, y, m) + math.log(m * eps) - 6 * r / tau)
        eq20 = 1 - eps * math.exp(float(np.sum((x + y) ** 2)) + 2 * float(x @ y) - 6 * r / tau)
        return rhs19, eq20

    half = np.array([0.5, 0.0])
    rhs19, eq20 = sides(half, half, 1.0, 0.5, 10, 0.1)
    rng = np.random.default_rng(20)
    gaps = []
    for _ in range(1000):
        r, tau = rng.uniform(0.1, 1.0), rng.uniform(0.25, 2.0)
        q, k = _scaled_pair(rng, int(rng.integers(1, 5)), r)
        lhs, rhs = sides(q, k, tau, r, int(rng.integers(1, 100)), rng.uniform(0.01, 0.5))
        gaps.append(lhs - rhs)
    detail = (
        f"q = k = (0.5, 0), r = 0.5, tau = 1, m = 10, eps = 0.1: Eq. 19's right side "
        f"1 - V_m m eps e^(-6r/tau) = {rhs19:.4f} > Eq. 20's 1 - eps e^(|s|^2 + 2q^Tk - 6r) = "
        f"{eq20:.4f}; on 1000 random inputs the difference, eps e^(2 q^T k/tau - 6r/tau) > 0, "
        f"is >= {min(gaps):.2e} (Eq. 20 bounds V_m by dropping its factor 1 - e^-|s|^2)"
    )
    return evidence(rhs19 <= eq20, rhs19 > eq20 and min(gaps) > 0 and eq20 >= 0.9, detail)


def eq51_sigma_evidence() -> Any:
    """Eq. 51's ``sigma^2`` against the sample variance, at ``x = y = 0`` and at a generic pair."""
    m, draws = 8, VARIANCE_DRAWS
    ctx = _host_context(51)
    lines, printed_ok, correct_ok = [], True, True
    for x, y in ((np.zeros(2), np.zeros(2)), (np.array([0.3, 0.0]), np.array([0.1, 0.1]))):
        omega = projection_stack(ctx.rng, draws, m, 2, "iid")
        estimates = kernel_estimates(ctx, x, y, omega, draws)
        # Eq. 51 as printed, (1/m) exp(-(|x|^2 + |y|^2)/2) sum_i exp(w_i^T (x + y)), per draw:
        # that is SM^_m itself, so its average estimates exp(x^T y), not a variance
        printed = float(estimates.mean())
        sample, predicted = float(estimates.var(ddof=1)), eq18_variance(x, y, m)
        error, skewness = _sample_variance_moments(x, y, m, draws)
        allowance = 8 * rounding_allowance(omega, x, y, m) * float(np.mean(estimates**2))
        tolerance = cornish_fisher(z_threshold(2), skewness) * math.sqrt(error) + allowance
        printed_ok &= abs(printed - sample) <= tolerance
        correct_ok &= abs(predicted - sample) <= tolerance
        lines.append(
            f"x = {x.tolist()}, y = {y.tolist()}: sample variance {sample:.3g}, Eq. 18 "
            f"{predicted:.3g}, printed Eq. 51 {printed:.4g}"
        )
    return evidence(printed_ok, correct_ok, f"m = {m}, {draws} draws; " + "; ".join(lines))


def errata() -> list[Any]:
    """This module's :class:`proofs_check.errata.Erratum` entries (errata imports us: lazy)."""
    from proofs_check.errata import Erratum

    return [
        Erratum(
            id="prf.thm1.exponent_r_squared",
            paper="NodeFormer",
            location="Thm 1 and App. B.1, Eq. 19-21 (the step 'Since ||(q_u + k_v)/sqrt(tau)||^2 "
            "<= 4r/tau and 2 q_u^T k_v / tau <= 2r/tau')",
            printed="Delta <= sqrt(exp(6r/tau) / (m eps)) with probability >= 1 - eps",
            correct="sqrt(exp(6 r^2/tau) / (m eps)): for ||q||, ||k|| <= r, ||q + k||^2 <= 4r^2 "
            "and q^T k <= r^2 (the printed form holds for r <= 1 only)",
            counterexample="q = k = (4, 0), tau = 1, m = 100, eps = 0.1 (i.i.d. features)",
            evaluate=thm1_exponent_evidence,
        ),
        Erratum(
            id="prf.eq20.inequality_direction",
            paper="NodeFormer",
            location="App. B.1, the sentence introducing Eq. 20",
            printed="the RHS of Eqn. 19 is no greater than 1 - eps exp(||(q+k)/sqrt tau||^2 + "
            "2 q^T k / tau - 6r/tau)",
            correct="no less than (V <= exp(|s|^2) SM^2 / m drops the factor 1 - exp(-|s|^2) < 1); "
            "only then does Eq. 21's >= 1 - eps follow",
            counterexample="q = k = (0.5, 0), r = 0.5, tau = 1, m = 10, eps = 0.1; 1000 random "
            "inputs",
            evaluate=eq20_direction_evidence,
        ),
    ]
