"""The counterexamples of the NodeFormer errata, evaluated: one ``*_evidence`` function each.

Every function returns a :class:`proofs_check.erratum.Evidence` (built by :func:`evidence`)
saying whether the printed formula and the corrected one hold on the erratum's
counterexample, with the numbers; the entries that name them are built by
:func:`proofs_check.prf.errata`. Each draws from its own fixed seed and runs on the host
(NumPy), whatever backend the checks use.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp, softmax

from proofs_check.erratum import Evidence
from proofs_check.prf.estimates import kernel_estimates, projection_stack, rounding_allowance
from proofs_check.prf.gumbel import CATEGORICAL_DRAWS, PAIR_DRAWS, gumbel_noise
from proofs_check.prf.kernel import VARIANCE_DRAWS
from proofs_check.prf.moments import _sample_variance_moments, eq18_log_variance, eq18_variance
from proofs_check.prf.statistics import (
    _frequency_test,
    chi2_threshold,
    cornish_fisher,
    pearson,
    z_threshold,
)
from proofs_check.prf.thm1 import _scaled_pair, thm1_log_bound
from proofs_check.registry import Context
from refimpl.nn.nodeformer.all_pair_softmax import AllPairSoftmax
from refimpl.nn.nodeformer.random_features import feature_exponent, positive_random_features

__all__ = [
    "eq20_direction_evidence",
    "eq28_evidence",
    "eq30_evidence",
    "eq34_evidence",
    "eq35_evidence",
    "eq43_evidence",
    "eq51_sigma_evidence",
    "evidence",
    "order_of_limits_evidence",
    "thm1_exponent_evidence",
]


def evidence(printed_holds: bool, correct_holds: bool, detail: str) -> Evidence:
    """A :class:`proofs_check.erratum.Evidence` of plain ``bool`` verdicts."""
    return Evidence(bool(printed_holds), bool(correct_holds), detail)


def _host_context(seed: int) -> Context:
    return Context(rng=np.random.default_rng(seed), cases=0, xp=np)


def thm1_exponent_evidence() -> Evidence:
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


def eq20_direction_evidence() -> Evidence:
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


def eq51_sigma_evidence() -> Evidence:
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


# -- Prop. 2-3 and Thm 2's proof -----------------------------------------------------------
def eq35_evidence() -> Evidence:
    """Eq. 35's comparison at ``log alpha_v = 1``, ``log alpha_v' = 0``, sampled."""
    rng = np.random.default_rng(35)
    g = gumbel_noise(rng, (2, PAIR_DRAWS))
    frequency, _ = _frequency_test(1.0 + g[0] > 0.0 + g[1], 0.5)
    printed, correct = 1 / (1 + math.e), math.e / (1 + math.e)  # a_v' / (a_v + a_v'), a_v / ...
    tolerance = z_threshold(1) * math.sqrt(correct * (1 - correct) / PAIR_DRAWS)
    return evidence(
        abs(frequency - printed) <= tolerance,
        abs(frequency - correct) <= tolerance,
        f"P(log a_v + g_v > log a_v' + g_v') sampled {frequency:.4f} ({PAIR_DRAWS} pairs, z se "
        f"{tolerance:.4f}); printed a_v'/(a_v + a_v') = {printed:.4f}, Eq. 35's own middle line "
        f"1/(1 + exp(log a_v' - log a_v)) = a_v/(a_v + a_v') = {correct:.4f}",
    )


def eq28_evidence() -> Evidence:
    """Eq. 28-29 at ``alpha = (0.2, 0.3, 0.5)``, ``k = 3``: which exponent gives ``P = alpha_k``."""
    alpha, k = np.array([0.2, 0.3, 0.5]), 2
    printed_power = alpha.sum() / alpha[k]  # (alpha_1 + ... + alpha_n) / alpha_k
    correct_power = (alpha.sum() - alpha[k]) / alpha[k]  # sum_{i != k} alpha_i / alpha_k
    # int_0^1 u^p du = 1 / (p + 1): the probability each exponent gives
    printed, correct = 1 / (printed_power + 1), 1 / (correct_power + 1)
    rng = np.random.default_rng(28)
    winners = np.argmax(np.log(alpha)[:, None] + gumbel_noise(rng, (3, CATEGORICAL_DRAWS)), axis=0)
    frequency, tolerance = _frequency_test(winners == k, alpha[k])
    return evidence(
        abs(printed - alpha[k]) <= 1e-12 or abs(frequency - printed) <= tolerance,
        abs(correct - alpha[k]) <= 1e-12 and abs(frequency - correct) <= tolerance,
        f"alpha = (0.2, 0.3, 0.5), k = 3: printed exponent (alpha_1+alpha_2+alpha_3)/alpha_3 = "
        f"{printed_power:g} gives int u^p = {printed:.4f}; sum_(i!=k) alpha_i/alpha_k = "
        f"{correct_power:g} gives {correct:.4f} = alpha_3; sampled Gumbel-max {frequency:.4f}",
    )


def eq30_evidence() -> Evidence:
    """Eq. 30's limit at ``alpha = (0.6, 0.4)``, ``tau = 1e-6``, with the library's Eq. 6."""
    rng = np.random.default_rng(30)
    logits = np.log(np.array([[0.6, 0.4], [0.5, 0.5]]))  # row 0 is the case; row 1 a filler
    eye = np.eye(2)
    _, cache = AllPairSoftmax(1e-6).forward({}, logits, eye, eye, gumbel_noise(rng, (2, 20000)))
    samples = cache.probabilities[:, 0, :]  # (K, 2): Prop. 3's X at tau = 1e-6
    one_hot = float(np.mean(samples.max(axis=1) >= 1 - 1e-9))
    frequency, tolerance = _frequency_test(samples[:, 1] >= 1 - 1e-9, 0.4)
    return evidence(
        frequency <= tolerance,  # printed: X_(argmax alpha) = X_1 = 1 in the limit, always
        abs(frequency - 0.4) <= tolerance and one_hot >= 0.999,
        f"alpha = (0.6, 0.4), tau = 1e-6, 20000 samples of X (library AllPairSoftmax): one-hot "
        f"in {one_hot:.4f} of them, at index 2 (alpha_2 < alpha_1) in {frequency:.4f}, as "
        "P = alpha_2 = 0.4 says; the printed limit puts the 1 at argmax alpha = index 1 always",
    )


def order_of_limits_evidence() -> Evidence:
    """Thm 2 at fixed ``m = 64`` and ``tau = 1e-8``: the argmax law is ``softmax(-|k|^2/2)``."""
    tau, m, draws = 1e-8, 64, 10000
    q = np.array([0.6, 0.0])
    keys = np.array([[0.8, 0.3], [-0.5, 0.2], [0.1, -0.9], [0.3, 0.3], [-0.2, -0.1]])
    rng = np.random.default_rng(2)
    omega = projection_stack(rng, draws, m, 2, "iid")  # one fresh projection per sample
    # The library's Eq. 4 exponents; phi itself underflows at tau = 1e-8, so beta is
    # taken in the log domain: tau log beta_v = tau (logsumexp_i (a_i(x) + a_i(y_v)) - log m).
    exponents = feature_exponent(np.vstack([q, keys]) / math.sqrt(tau), omega)  # (6, draws m)
    pairs = (exponents[1:] + exponents[0]).reshape(len(keys), draws, m)
    scaled_log_beta = tau * (logsumexp(pairs, axis=2) - math.log(m)).T  # (draws, N)
    winners = np.argmax(scaled_log_beta + gumbel_noise(rng, scaled_log_beta.shape), axis=1)
    counts = np.bincount(winners, minlength=len(keys))
    claimed, limit = softmax(keys @ q), softmax(-0.5 * np.sum(keys**2, axis=1))
    threshold = chi2_threshold(1, len(keys) - 1)
    to_claimed, to_limit = pearson(counts, claimed), pearson(counts, limit)
    return evidence(
        to_claimed <= threshold,
        to_limit <= threshold,
        f"q = (0.6, 0), 5 keys, m = {m}, tau = {tau:g}, {draws} samples: frequencies "
        f"{np.round(counts / draws, 3).tolist()}; softmax(q^T k) = {np.round(claimed, 3).tolist()} "
        f"(X^2 = {to_claimed:.0f}), softmax(-|k|^2/2) = {np.round(limit, 3).tolist()} (X^2 = "
        f"{to_limit:.1f}); threshold {threshold:.1f}",
    )


def _beta_pair(q: Any, k_v: Any, k_w: Any, m: int, draws: int, seed: int) -> np.ndarray:
    """``(beta_v, beta_w)`` of Eq. 34 for ``draws`` projections of ``m`` rows: ``(draws, 2)``."""
    ctx = Context(rng=np.random.default_rng(seed), cases=0, xp=np)
    omega = projection_stack(ctx.rng, draws, m, q.size, "iid")
    features = positive_random_features(np.vstack([q, k_v, k_w]), omega)  # tau = 1
    return draws * (features[1:] * features[0]).reshape(2, draws, m).sum(axis=2).T


def eq34_evidence() -> Evidence:
    """Eq. 34's ``beta_v``, ``beta_v'`` at ``q = k_v = (1/2, 0)``, ``k_v' = (0, 1/2)``, m = 8."""
    q = k_v = np.array([0.5, 0.0])
    k_w, m, draws = np.array([0.0, 0.5]), 8, 4000
    beta = _beta_pair(q, k_v, k_w, m, draws, 34)
    means = np.exp([q @ k_v, q @ k_w])  # e^0.25, 1: not identically distributed
    # E[f_v f_v'] of one shared feature: exp(|2q + k_v + k_v'|^2/2 - |q|^2 - (|k_v|^2 + |k_v'|^2)/2)
    moment = math.exp(
        float(np.sum((2 * q + k_v + k_w) ** 2)) / 2 - q @ q - (k_v @ k_v + k_w @ k_w) / 2
    )
    exact = (moment - means[0] * means[1]) / m  # Cov(beta_v, beta_v') of shared features
    products = (beta[:, 0] - beta[:, 0].mean()) * (beta[:, 1] - beta[:, 1].mean())
    sample, error = float(products.mean()), float(products.std()) / math.sqrt(draws)
    z = z_threshold(2)
    difference = beta[:, 0] - beta[:, 1]
    same_mean = abs(difference.mean()) <= z * difference.std() / math.sqrt(draws)
    correlation = float(np.corrcoef(beta.T)[0, 1])
    return evidence(
        abs(sample) <= z * error and same_mean,
        abs(sample - exact) <= z * error,
        f"means e^(q^T k) = {means[0]:.4f}, {means[1]:.4f} (sampled {beta[:, 0].mean():.4f}, "
        f"{beta[:, 1].mean():.4f}); Cov = (E[f_v f_v'] - SM_v SM_v') / m = {exact:.4f}, sampled "
        f"{sample:.4f} +- {z * error:.4f} (correlation {correlation:.2f}): they share omega",
    )


def eq43_evidence() -> Evidence:
    """Eq. 43's ``E(c)`` at ``m = 1``, ``q = k_v = (1, 0)``, ``k_v' = (0, 1)``, ``tau = 1``."""
    q, k_v, k_w, draws = np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([0.0, 1.0]), 20000
    beta = _beta_pair(q, k_v, k_w, 1, draws, 43)
    c = np.log(beta[:, 0]) - np.log(beta[:, 1])  # = w^T (k_v - k_v') + (|k_v'|^2 - |k_v|^2) / 2
    printed = float(q @ (k_v - k_w))  # (1/tau)(log alpha_v - log alpha_v')
    exact = 0.5 * float(k_w @ k_w - k_v @ k_v)  # E(c) at m = 1
    mean, tolerance = float(c.mean()), z_threshold(1) * float(c.std()) / math.sqrt(draws)
    return evidence(
        abs(mean - printed) <= tolerance,
        abs(mean - exact) <= tolerance,
        f"m = 1: c = w^T (k_v - k_v') + (|k_v'|^2 - |k_v|^2)/2, so E(c) = {exact:g}; sampled "
        f"{mean:.4f} +- {tolerance:.4f} ({draws} draws); printed (1/tau)(log a_v - log a_v') = "
        f"{printed:g}",
    )
