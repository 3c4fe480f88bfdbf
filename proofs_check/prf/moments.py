"""NodeFormer Eq. 18 in closed form: the moments of the positive-random-feature estimate.

With ``s = x + y`` and rows ``w_i`` of the projection (NodeFormer Eq. 4,
:mod:`refimpl.nn.nodeformer.random_features`), the kernel estimate of Prop. 1 is

    SM^_m(x, y) = phi(x)^T phi(y) = (1/m) sum_i Z_i,  Z_i = exp(w_i^T s - (|x|^2 + |y|^2) / 2).

For ``w ~ N(0, I_d)``, ``w^T s ~ N(0, |s|^2)``: ``Z`` is log-normal, ``E[Z^k] =
exp(k^2 |s|^2 / 2 - k (|x|^2 + |y|^2) / 2)``. ``k = 1`` is Eq. 18's mean ``SM(x, y) =
exp(x^T y)``, ``k = 2`` its variance ``V_m = exp(|s|^2) SM^2 (1 - exp(-|s|^2)) / m``
(:func:`eq18_variance`); the fourth central moment, ``SM^4 w^2 (e^{4|s|^2} + 2 e^{3|s|^2}
+ 3 e^{2|s|^2} - 3)`` with ``w = e^{|s|^2} - 1``, sets the tolerance of the variance
check. Eq. 18 is right as printed.

Everything here is exact for i.i.d. rows: the expected values and tolerances of the
checks in :mod:`proofs_check.prf.kernel` and the Chebyshev form of Thm 1
(:mod:`proofs_check.prf.thm1`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["eq18_log_variance", "eq18_variance", "lognormal_cumulants"]


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
