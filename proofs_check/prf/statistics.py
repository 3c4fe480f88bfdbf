"""Thresholds and test statistics of the NodeFormer checks: z-scores, chi-square, slopes.

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
skewness from the log-normal's cumulants (:func:`proofs_check.prf.lognormal_cumulants`); the
cases keep that skewness small: ``|s|^2 <= 1`` for means (skewness of a mean of ``n m``
terms ``<= 0.14``), ``|s|^2 <= 1/2`` for the Thm 1 slope, and ``|s|^2 <= 1/4``, ``m >=
4`` for variances (skewness of ``s^2`` ``<= 0.11``; at ``|s|^2 = 1`` it reaches 8 and
simulated z-scores of ``s^2`` pass 6 once in a thousand). The proportion checks of
Thm 1 have no such limit and run up to ``r^2 / tau = 64``.

Chi-square tests (the Gumbel checks) use Pearson's ``X^2 = sum (O - E)^2 / E`` against
the ``1 - FALSE_ALARM / tests`` quantile of ``chi^2_{N-1}`` (:func:`chi2_threshold`), with
every expected count above 5; ``measured = X^2``, ``bound`` = that quantile.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

__all__ = [
    "FALSE_ALARM",
    "chi2_threshold",
    "cornish_fisher",
    "pearson",
    "slope_and_error",
    "z_threshold",
]

FALSE_ALARM = 1e-4  # per check: chance that a correct library fails it at a random seed


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


def chi2_threshold(tests: int, df: int) -> float:
    """The ``1 - FALSE_ALARM / tests`` quantile of ``chi^2_df`` (Bonferroni over ``tests``)."""
    return float(stats.chi2.isf(FALSE_ALARM / max(tests, 1), df))


def pearson(counts: Any, probabilities: Any) -> float:
    """Pearson's ``X^2 = sum_v (O_v - n p_v)^2 / (n p_v)`` of one sample of counts."""
    counts = np.asarray(counts, dtype=float)
    expected = counts.sum() * np.asarray(probabilities, dtype=float)
    return float(np.sum((counts - expected) ** 2 / expected))


def _frequency_test(hits: Any, p: float) -> tuple[float, float]:
    """``(frequency, z standard error)`` of a 0/1 sample against probability ``p``."""
    hits = np.asarray(hits, dtype=float)
    return float(hits.mean()), z_threshold(1) * math.sqrt(p * (1 - p) / hits.size)
