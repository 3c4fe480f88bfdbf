"""Massive activations (MAs): max/median activation ratios, and the gamma-KS test of MA-supp Sec. 3.

Source: the supplement ``papers/massive-activations-gnn-supplement.md``
(cited ``MA-supp``), Sec. 3.2 steps 1-4 with the KS statistic of Eq. 15-16.
Step 1 cites the main paper's Eq. 1 (not in ``papers/``) for the activation
ratio; it is taken here as in the massive-activation literature: each
magnitude over the median magnitude of its row.

Shapes: ``x`` is ``(R, C)``, one row per node (``R = N``), edge (``R = E``) or
edge and head (reshape ``(E, H, C)`` to ``(E * H, C)`` for a median per head),
and ``C`` channels. Per row ``i``:

    m_i    = median_j |x_ij|                     row median of the magnitudes
    r_ij   = |x_ij| / m_i                        activation ratio (step 1)
    rho_i  = max_j r_ij                          max/median ratio; an MA when > threshold
    t_ij   = -log10(r_ij + eps)                  MA-supp Sec. 3.2 step 2
    (k, loc, theta) = argmax sum log p(t)        step 3: gamma MLE, all three free
    D_n    = sup_t |F_n(t) - F(t)|               step 4: one-sample KS (Eq. 15-16)

with ``p`` the density of ``loc + Gamma(shape=k, scale=theta)`` and ``F`` its
CDF. The supplement says "negative logarithm" without a base; a base only
rescales ``t``, which the free ``loc`` and ``theta`` absorb, so ``D_n`` and the
p-value do not depend on it (``mean_loglik`` shifts by ``log`` of the factor).
Untrained models give small ``D_n``; MAs sit far left of the bulk
(``t ~ -3`` at ``rho = 1000``), drag the fitted ``loc`` down and raise ``D_n``
(MA-supp Sec. 3.3). The threshold defaults to 1000, the usual MA criterion of
about a thousand times the median magnitude (Sun et al., 2024).

Conventions
-----------
- ``median="midpoint"``: NumPy's median, the mean of the two middle magnitudes
  when ``C`` is even (computed as ``lo + (hi - lo) / 2``, which cannot overflow
  and is within one ulp of NumPy's ``(lo + hi) / 2``). ``median="lower"``: the
  lower of the two, as ``torch.median`` returns. For odd ``C`` they agree.
- Zero median: ``r_ij = +inf`` where ``|x_ij| > 0``, and ``0 / 0 := 1``: an
  entry equal to its row median has ratio 1, zero or not. So an all-zero row has
  ``rho = 1`` (no outlier; not flagged, and it does not turn a graph's maximum
  into NaN), and a row with more than half zeros and any non-zero entry has
  ``rho = +inf`` (flagged).
- Precision: magnitudes are sorted in the input dtype; the selected maxima and
  medians are cast to float64 (exactly) before the midpoint and the division,
  so results are host float64 NumPy arrays whatever the input dtype/backend.
- ``eps`` (default ``1e-12``) sits inside the log, as in step 2: it moves
  ``t`` by less than ``4.4e-7`` for any ratio ``>= 1e-6``, and it keeps an
  exact zero entry (of a row with positive median) finite at
  ``t = -log10(eps) = 12``, kept in the sample: an isolated spike right of the
  bulk that raises ``D_n`` by itself. Layers with many exact zeros (after a
  ReLU) are better tested before the ReLU.
- Non-finite ``t``: ``r = +inf`` (a non-zero entry of a zero-median row) gives
  ``t = -inf``, and with ``eps = 0`` a zero entry gives ``t = +inf``. These are
  dropped before the fit and counted in ``num_nonfinite``; the infinite ratios
  among them are exactly those :func:`max_median_ratio` reports (and flags).
- Subsampling: element counts reach millions (edges x heads x channels) and
  the fit's cost grows with the number of values, so at most ``max_samples`` (default
  100 000; ``None`` = all) elements are drawn uniformly without replacement by
  ``numpy.random.default_rng(seed)``. Positions depend only on ``(R, C)`` and
  the seed, so a base and a trained array of one layer are compared on the same
  elements. Medians are always those of the full rows.

Reading the statistics
----------------------
The ``t`` of one array are not independent (a row's entries share its median)
and the median entry itself has ``r = 1`` exactly (an atom at ``t = 0`` of mass
``1/C`` for odd ``C`` or ``median="lower"``), so at ``n ~ 1e5`` the p-value
rejects any real layer: as in the paper, compare ``D_n`` (base vs trained), not
p-values. The per-layer summaries and that comparison (a table, a plot) are in
:mod:`refimpl.diagnostics.massive_activations_report`.

Null calibration (measured; tests/diagnostics/test_massive_activations.py).
For ``t`` drawn from a gamma (shape 5, loc -1, scale 0.2; 300 values; seeds
0..199; SciPy 1.17):

- KS against the *true* parameters (``gamma_ks_test(t, params=...)``):
  p-values consistent with uniform, 13/200 rejections at alpha = 0.05, inside
  the binomial interval [2, 21] (99.9 %);
- KS against the gamma *fitted to the same sample* (the paper's procedure):
  0/200 rejections, mean p-value 0.81 instead of 0.5. Estimating the
  parameters pulls the fit towards the sample, so ``D_n`` is stochastically
  smaller than the KS null assumes (the Lilliefors effect): the p-value is
  conservative, a rejection still means something, a non-rejection little.
- The three-parameter likelihood is unbounded as ``loc -> min t`` with shape
  < 1 (no global MLE exists), and SciPy's Nelder-Mead can stop near that
  boundary (``gamma_loc`` within ~1e-3 of ``min t``, shape below 1) at a point
  less likely than the true parameters. At true shape 2 (loc -1, scale 0.5)
  this happened in 1/200 samples, which KS rejected; at true shape 0.7 KS
  rejects 77/200 (10 expected). The test is reliable when the fitted shape is
  well above 1 (Gaussian activations give about 5); a fitted shape below 1
  with ``gamma_loc`` at the sample minimum marks an unreliable fit, not an MA.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import to_numpy
from refimpl.validation import check_input

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_THRESHOLD",
    "MEDIANS",
    "LogRatios",
    "activation_ratios",
    "gamma_ks_test",
    "log_ratios",
    "max_median_ratio",
    "ratio_distribution_test",
]


MEDIANS = ("midpoint", "lower")  # NumPy's median; torch.median's
DEFAULT_EPS = 1e-12  # inside the log; zeros map to t = 12
DEFAULT_MAX_SAMPLES = 100_000  # gamma.fit grows with n; KS resolution ~1/sqrt(n) = 0.003
DEFAULT_THRESHOLD = 1000.0  # MA: max |x| about 1000x the row median (Sun et al., 2024)
_MIN_FIT_SAMPLES = 4  # more values than the three free parameters


# -- validation --------------------------------------------------------------------------------


def _check_median(median: str) -> None:
    if median not in MEDIANS:
        raise ValueError(
            f"unknown median convention {median!r}; choose 'midpoint' (NumPy: mean of the two "
            "middle values for an even count) or 'lower' (torch.median: the lower one)"
        )


def _check_activations(x: Any, name: str) -> Any:
    """A finite, non-empty floating ``(R, C)`` array; returns its array module."""
    xp = check_input(x, name, ndim=2)
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(x.shape)}); pass at least one row and one channel"
        )
    return xp


def _check_threshold(threshold: float) -> float:
    if not isinstance(threshold, (int, float)) or not threshold > 0:
        raise ValueError(f"threshold must be a positive number, got {threshold!r}")
    return float(threshold)


def _check_sampling(eps: float, max_samples: int | None) -> None:
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if max_samples is not None and (
        isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1
    ):
        raise ValueError(f"max_samples must be a positive int or None (all), got {max_samples!r}")


# -- ratios ------------------------------------------------------------------------------------


def _sorted_magnitudes(x: Any, median: str, name: str) -> tuple[Any, Any]:
    """``(xp, |x| sorted along each row)``, after validating ``x`` and ``median``."""
    xp = _check_activations(x, name)
    _check_median(median)
    return xp, xp.sort(xp.abs(x), axis=1)  # (R, C) ascending per row


def _medians(magnitudes: Any, median: str, xp: Any) -> Any:
    """Row medians ``(R,)`` float64 of row-sorted magnitudes ``(R, C)``."""
    cols = magnitudes.shape[1]
    lower = magnitudes[:, (cols - 1) // 2].astype(xp.float64)  # (R,)
    if median == "lower":
        return lower
    upper = magnitudes[:, cols // 2].astype(xp.float64)  # (R,); == lower for odd C
    return lower + (upper - lower) / 2  # both >= 0: no overflow


def _ratio(numerator: Any, median: Any, xp: Any) -> Any:
    """``numerator / median`` with the zero-median convention: ``+inf`` above it, ``0/0 = 1``."""
    positive = median > 0
    ratio = numerator / xp.where(positive, median, 1.0)
    return xp.where(positive, ratio, xp.where(numerator > 0, xp.inf, 1.0))


def max_median_ratio(x: Any, median: str = "midpoint") -> np.ndarray:
    """Per row, ``rho_i = max_j |x_ij| / median_j |x_ij|``: the largest activation ratio.

    Parameters
    ----------
    x : (R, C) finite float array, NumPy or CuPy
        One row per node, edge or (edge, head); ``C`` channels.
    median : ``"midpoint"`` or ``"lower"``
        NumPy's median (mean of the two middle magnitudes for even ``C``) or
        torch.median's (the lower of the two).

    Returns
    -------
    (R,) float64 host array, ``>= 1``; ``+inf`` for a row whose median is 0
    while its maximum is not, and 1 for an all-zero row (``0 / 0 := 1``).
    """
    xp, magnitudes = _sorted_magnitudes(x, median, "x")
    maxima = magnitudes[:, -1].astype(xp.float64)  # (R,)
    return to_numpy(_ratio(maxima, _medians(magnitudes, median, xp), xp))


def activation_ratios(x: Any, median: str = "midpoint") -> np.ndarray:
    r"""Every ratio $r_{ij} = |x_{ij}| / m_i$, $m_i$ its row's median (MA-supp Sec. 3.2, step 1).

    Materialises all $R C$ ratios on the host; the test itself (:func:`log_ratios`) only
    gathers its sample.

    Parameters
    ----------
    x : (R, C) finite float array, NumPy or CuPy
        One row per node, edge or (edge, head); ``C`` channels.
    median : ``"midpoint"`` or ``"lower"``, default ``"midpoint"``
        NumPy's median or torch.median's, as in :func:`max_median_ratio`.

    Returns
    -------
    (R, C) float64 host array
        $r_{ij} \ge 0$; in a zero-median row ``+inf`` for a non-zero entry and 1 for a zero
        one (the convention of :func:`max_median_ratio`).
    """
    xp, magnitudes = _sorted_magnitudes(x, median, "x")
    medians = _medians(magnitudes, median, xp)  # (R,)
    return to_numpy(_ratio(xp.abs(x).astype(xp.float64), medians[:, None], xp))  # (R, C)


class LogRatios(NamedTuple):
    r"""The sample of $t = -\log_{10}(r + \epsilon)$ that the gamma is fitted to.

    Attributes
    ----------
    values : numpy.ndarray
        ``(n,)`` float64, the finite $t$ of the sampled elements in row-major element order.
    num_nonfinite : int
        Sampled elements dropped because their $t$ was $\pm\infty$.
    """

    values: np.ndarray
    num_nonfinite: int


def log_ratios(
    x: Any,
    median: str = "midpoint",
    eps: float = DEFAULT_EPS,
    max_samples: int | None = DEFAULT_MAX_SAMPLES,
    seed: int | None = 0,
) -> LogRatios:
    r"""MA-supp Sec. 3.2 steps 1-2: $t_{ij} = -\log_{10}(|x_{ij}| / m_i + \epsilon)$, sampled.

    Medians $m_i$ are of the full rows. Non-finite $t$ are dropped and counted (see the
    module docstring).

    Parameters
    ----------
    x : (R, C) finite float array, NumPy or CuPy
        One row per node, edge or (edge, head); ``C`` channels.
    median : ``"midpoint"`` or ``"lower"``, default ``"midpoint"``
        NumPy's median or torch.median's, as in :func:`max_median_ratio`.
    eps : float, default ``DEFAULT_EPS`` (1e-12)
        Finite, ``>= 0``; added to the ratio inside the log (a zero entry gives $t = 12$).
    max_samples : int or None, default ``DEFAULT_MAX_SAMPLES`` (100 000)
        At most this many of the $R C$ positions, drawn uniformly without replacement;
        ``None``, or a number not below $R C$, takes them all.
    seed : int or None, default 0
        Seed of ``numpy.random.default_rng`` for the positions, which depend only on
        ``(R, C)`` and the seed (``None``: fresh entropy).

    Returns
    -------
    LogRatios
        The finite sample and the count of dropped infinite values.
    """
    xp, magnitudes = _sorted_magnitudes(x, median, "x")
    _check_sampling(eps, max_samples)
    rows, cols = x.shape
    medians = _medians(magnitudes, median, xp)  # (R,)
    flat = xp.abs(x).reshape(-1)  # (R*C,) row-major
    if max_samples is None or max_samples >= rows * cols:
        values = flat.astype(xp.float64)  # (R*C,)
        row_of = xp.repeat(xp.arange(rows), cols)  # (R*C,)
    else:
        rng = np.random.default_rng(seed)
        picked = np.sort(rng.choice(rows * cols, size=max_samples, replace=False))  # (S,) host
        positions = xp.asarray(picked)  # explicit host -> device move of the indices
        values = flat[positions].astype(xp.float64)  # (S,)
        row_of = positions // cols  # (S,)
    shifted = _ratio(values, medians[row_of], xp) + eps  # (S,), in [0, inf]
    zero = shifted == 0  # only with eps = 0: t = +inf, set without a log(0) warning
    t = to_numpy(xp.where(zero, xp.inf, -xp.log10(xp.where(zero, 1.0, shifted))))  # (S,)
    finite = np.isfinite(t)
    return LogRatios(t[finite], int(t.size - np.count_nonzero(finite)))


# -- gamma fit and KS --------------------------------------------------------------------------


def _check_params(params: Any) -> tuple[float, float, float]:
    try:
        shape, loc, scale = (float(p) for p in params)
    except (TypeError, ValueError) as err:
        raise ValueError(f"params must be (shape, loc, scale), got {params!r}") from err
    if not (shape > 0 and scale > 0 and math.isfinite(shape * scale) and math.isfinite(loc)):
        raise ValueError(
            f"params must be finite with shape > 0 and scale > 0, got {(shape, loc, scale)}"
        )
    return shape, loc, scale


def gamma_ks_test(t: Any, params: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """MA-supp Sec. 3.2 steps 3-4 on a 1-D sample: gamma MLE, then the one-sample KS test.

    Parameters
    ----------
    t : (n,) finite float array
        The sample (any backend; moved to the host), e.g. :func:`log_ratios`' values.
    params : ``(shape, loc, scale)`` or None
        None: fitted by maximum likelihood with all three free
        (``scipy.stats.gamma.fit``; the p-value is then conservative, see the
        module docstring). Given: the KS test against that fixed gamma, whose
        p-value is uniform under the null.

    Returns
    -------
    dict with ``ks_statistic`` (``D_n`` of Eq. 15), ``p_value``
    (``scipy.stats.kstest``), ``gamma_shape``, ``gamma_loc``, ``gamma_scale``,
    ``mean_loglik`` (mean log-density of ``t`` under the gamma; ``-inf`` if a
    value lies below ``loc``) and ``num_samples`` (``n``).
    """
    from scipy import stats  # slow to import: only when a test is run

    check_input(t, "t", ndim=1)
    sample = to_numpy(t).astype(np.float64, copy=False)
    if params is None:
        if sample.size < _MIN_FIT_SAMPLES:
            raise ValueError(
                f"t has {sample.size} values; fitting a gamma's three parameters needs at least "
                f"{_MIN_FIT_SAMPLES} (pass more rows or a larger max_samples)"
            )
        if sample.min() == sample.max():
            raise ValueError(
                f"t is constant ({sample[0]!r}): no gamma can be fitted; every ratio is equal "
                "(constant rows?)"
            )
        shape, loc, scale = (float(p) for p in stats.gamma.fit(sample))
    else:
        if sample.size == 0:
            raise ValueError("t is empty; pass at least one value")
        shape, loc, scale = _check_params(params)
    ks = stats.kstest(sample, "gamma", args=(shape, loc, scale))
    return {
        "ks_statistic": float(ks.statistic),
        "p_value": float(ks.pvalue),
        "gamma_shape": shape,
        "gamma_loc": loc,
        "gamma_scale": scale,
        "mean_loglik": float(np.mean(stats.gamma.logpdf(sample, shape, loc, scale))),
        "num_samples": int(sample.size),
    }


def ratio_distribution_test(
    x: Any,
    median: str = "midpoint",
    eps: float = DEFAULT_EPS,
    max_samples: int | None = DEFAULT_MAX_SAMPLES,
    seed: int | None = 0,
) -> dict[str, Any]:
    r"""MA-supp Sec. 3.2, steps 1-4: ratios, $-\log_{10}$, gamma MLE, KS of the sample.

    :func:`log_ratios` then :func:`gamma_ks_test`. $D_n$ grows with MAs; see the module
    docstring on p-values.

    Parameters
    ----------
    x : (R, C) finite float array, NumPy or CuPy
        One row per node, edge or (edge, head); at least 4 finite $t$ must remain.
    median : ``"midpoint"`` or ``"lower"``, default ``"midpoint"``
        As in :func:`max_median_ratio`.
    eps : float, default ``DEFAULT_EPS`` (1e-12)
        Inside the log, as in :func:`log_ratios`.
    max_samples : int or None, default ``DEFAULT_MAX_SAMPLES`` (100 000)
        Elements sampled, as in :func:`log_ratios` (``None``: all).
    seed : int or None, default 0
        Seed of the sampled positions, as in :func:`log_ratios`.

    Returns
    -------
    dict
        :func:`gamma_ks_test`'s dict plus ``num_nonfinite`` (sampled elements whose $t$ was
        infinite and was dropped).
    """
    sample = log_ratios(x, median, eps, max_samples, seed)
    if sample.values.size < _MIN_FIT_SAMPLES:
        raise ValueError(
            f"only {sample.values.size} finite t remain ({sample.num_nonfinite} infinite ones "
            f"dropped: zero-median rows, or zeros with eps=0); at least {_MIN_FIT_SAMPLES} are "
            "needed to fit a gamma"
        )
    return {**gamma_ks_test(sample.values), "num_nonfinite": sample.num_nonfinite}
