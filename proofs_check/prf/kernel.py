"""NodeFormer Prop. 1 (Eq. 18) and orthogonal features as checks: the mean and variance of SM^_m.

- ``prf.prop1.mean``: i.i.d. rows: ``E[SM^_m] = exp(x^T y)`` (Eq. 18, first line)
- ``prf.orthogonal.mean``: orthogonal rows (``draw_projection(kind="orthogonal")``): unbiased
- ``prf.prop1.variance``: i.i.d. rows: ``Var[SM^_m] = V_m`` (Eq. 18, second line)
- ``prf.orthogonal.variance``: orthogonal rows: ``Var <= V_m`` (as Performer proves)

``SM^_m`` and ``V_m`` are those of :mod:`proofs_check.prf.moments`; the estimates come
from :mod:`proofs_check.prf.estimates`. The cases (:func:`kernel_cases`) keep ``|x + y|^2
<= MOMENT_EXPONENT`` for the means and ``<= VARIANCE_EXPONENT`` with ``m >=
VARIANCE_FEATURES`` for the variances, where the Cornish-Fisher-corrected normal
quantile is honest (:mod:`proofs_check.prf.statistics`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from proofs_check.prf.estimates import kernel_estimates, projection_stack, rounding_allowance
from proofs_check.prf.moments import _mean_skewness, _sample_variance_moments, eq18_variance
from proofs_check.prf.statistics import cornish_fisher, z_threshold
from proofs_check.registry import Context, WorstCase, check

__all__ = ["MOMENT_EXPONENT", "VARIANCE_DRAWS", "kernel_cases"]

MOMENT_EXPONENT = 1.0  # max |x + y|^2 of the mean checks (proofs_check.prf.statistics)
VARIANCE_EXPONENT = 0.25  # ... of the variance checks, with m >= VARIANCE_FEATURES
VARIANCE_FEATURES = 4
MEAN_DRAWS = 2000  # kernel estimates per case for the means
VARIANCE_DRAWS = 4000  # ... for the variances (relative standard error of s^2 <= 3 %)


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
