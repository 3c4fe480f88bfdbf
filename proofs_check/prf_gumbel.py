"""NodeFormer's Gumbel results as checks: Prop. 2, Prop. 3 (Gumbel-max), Thm 2 and Eq. 7.

Gumbel noise is ``g(u) = -log(-log u)``, ``u ~ U(0, 1)`` (Prop. 2; :func:`gumbel_noise`,
looked up when a check runs). With ``x = q_u / sqrt(tau)``, ``y_v = k_v / sqrt(tau)``
and ``beta_v = phi(x)^T phi(y_v)`` (Eq. 34), the kernelised Gumbel-Softmax of Eq. 7
is ``c_uv = beta_v e^{g_v/tau} / sum_w beta_w e^{g_w/tau}``; its argmax is that of
``tau log beta_v + g_v``, a Gumbel-max over the logits ``tau log beta_v``.

=========================  ==============================================================
``prf.gumbel.prop2``       ``P(x_i + g_i > x_j + g_j) = 1 / (1 + exp(-(x_i - x_j)))``: a
                           binomial z-score per pair
``prf.gumbel.prop3``       the argmax of the library's ``AllPairSoftmax`` Gumbel samples
                           (Eq. 6) is ``Cat(alpha / sum alpha)``: chi-square per query
``prf.gumbel.thm2``        kernelised (Eq. 7): with ``m`` large for each ``tau`` the
                           argmax is ``Cat(softmax(q^T k))``: chi-square
``prf.gumbel.eq7_library`` ``c_uv`` from Eq. 4 features = the library's ``KernelizedSoftmax``
                           per-sample outputs (``V = I``), to rounding
=========================  ==============================================================

Chi-square tests use Pearson's ``X^2 = sum (O - E)^2 / E`` against the ``1 -
FALSE_ALARM / tests`` quantile of ``chi^2_{N-1}`` (:func:`chi2_threshold`), with every
expected count above 5; ``measured = X^2``, ``bound`` = that quantile.

Thm 2 as printed (``m`` "sufficiently large", then ``tau -> 0``) is false: for any
fixed ``m``, ``tau log beta_v -> -|k_v|^2 / 2 + const`` as ``tau -> 0``, so the argmax
law tends to ``softmax(-|k_v|^2 / 2)``, whatever ``q``. What holds is the other
order: as ``m -> infinity`` at fixed ``tau``, ``tau log beta_v -> q^T k_v`` and the
argmax law tends to ``softmax(q^T k)`` for every ``tau`` (``tau -> 0`` then only makes
``c`` one-hot). ``prf.gumbel.thm2`` checks that, with ``m`` growing as ``tau`` falls
(:func:`thm2_features`); erratum ``prf.thm2.order_of_limits`` shows the other.

Errata found here (:func:`errata`): ``prf.eq35.ratio``, ``prf.eq28.exponent``,
``prf.eq30.one_hot_index``, ``prf.thm2.order_of_limits``, ``prf.eq34.not_iid``,
``prf.eq43.not_an_expectation`` and ``prf.eq51.sigma_squared`` (its counterexample
is :func:`proofs_check.prf.eq51_sigma_evidence`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp, softmax

from proofs_check import prf
from proofs_check.prf import FALSE_ALARM, TAUS, evidence, projection_stack, z_threshold
from proofs_check.registry import Context, WorstCase, check
from refimpl.backend import to_numpy
from refimpl.nn.kernel_attention import AllPairSoftmax, KernelizedSoftmax
from refimpl.nn.random_features import feature_exponent, positive_random_features

__all__ = [
    "argmax_bias",
    "chi2_threshold",
    "errata",
    "gumbel_noise",
    "pearson",
    "thm2_features",
]

PAIR_DRAWS = 20000  # Gumbel pairs per case of Prop. 2: standard error <= 0.0036
CATEGORICAL_DRAWS = 20000  # Gumbel samples per case of Prop. 3
THM2_DRAWS = 6000  # (projection, Gumbel) samples per (case, tau) of Thm 2
THM2_EXPONENT = 0.75  # max |q + k_v|^2 of the random Thm 2 cases: m grows like e^{S/tau}
THM2_NONCENTRALITY = 0.25  # the residual bias may shift X^2 by this much on average
THM2_CHUNK = 500  # samples per batch: features are (N + 1, chunk m)


def gumbel_noise(rng: np.random.Generator, shape: Any) -> np.ndarray:
    """``g = -log(-log u)``, ``u ~ U[0, 1)`` (Prop. 2), host float64; ``u = 0`` gives ``-inf``
    (probability ``2^-53`` per entry: that node loses)."""
    with np.errstate(divide="ignore"):
        return -np.log(-np.log(rng.random(shape)))


def chi2_threshold(tests: int, df: int) -> float:
    """The ``1 - FALSE_ALARM / tests`` quantile of ``chi^2_df`` (Bonferroni over ``tests``)."""
    return float(stats.chi2.isf(FALSE_ALARM / max(tests, 1), df))


def pearson(counts: Any, probabilities: Any) -> float:
    """Pearson's ``X^2 = sum_v (O_v - n p_v)^2 / (n p_v)`` of one sample of counts."""
    counts = np.asarray(counts, dtype=float)
    expected = counts.sum() * np.asarray(probabilities, dtype=float)
    return float(np.sum((counts - expected) ** 2 / expected))


# -- Prop. 2 and 3 ----------------------------------------------------------------------------
@check(
    id="prf.gumbel.prop2",
    paper="NodeFormer",
    statement="P(x_i + g_i > x_j + g_j) = 1 / (1 + exp(-(x_i - x_j))) (Prop. 2, Eq. 25); "
    "|freq - P|",
)
def prop2(ctx: Context) -> WorstCase:
    """Prop. 2 on gaps ``x_i - x_j`` in ``{0, 5, -3}`` and ``ctx.cases`` from ``U(-4, 4)``.

    ``measured = |f - p|`` for the frequency ``f`` of ``PAIR_DRAWS`` pairs; ``bound =
    z sqrt(p (1 - p) / n)``, the binomial standard error, ``z = z_threshold(cases)``.
    """
    gaps = np.concatenate([[0.0, 5.0, -3.0], ctx.rng.uniform(-4.0, 4.0, ctx.cases)])  # (C,)
    noise = ctx.asarray(gumbel_noise(ctx.rng, (gaps.size, PAIR_DRAWS, 2)))  # (C, n, 2)
    wins = ctx.xp.mean(ctx.asarray(gaps)[:, None] + noise[:, :, 0] > noise[:, :, 1], axis=1)
    p = 1.0 / (1.0 + np.exp(-gaps))
    worst = WorstCase("upper")
    tolerance = z_threshold(gaps.size) * np.sqrt(p * (1 - p) / PAIR_DRAWS)
    worst.add(np.abs(to_numpy(wins) - p), tolerance, cases=gaps.size)
    return worst


@check(
    id="prf.gumbel.prop3",
    paper="NodeFormer",
    statement="argmax_k (log alpha_k + g_k) ~ Cat(alpha / sum alpha) (Prop. 3, Eq. 29), library "
    "Eq. 6 samples; chi-square",
)
def prop3(ctx: Context) -> WorstCase:
    """Prop. 3, first bullet, through the library's exact Gumbel-Softmax (Eq. 6, 15).

    ``AllPairSoftmax(tau)`` with ``q = L`` (``N x N`` logits), ``k = I_N`` and
    ``CATEGORICAL_DRAWS`` Gumbel samples: row ``u`` of each sample's attention is
    Prop. 3's ``X`` for ``log alpha = L[u]``, and its argmax must be
    ``Cat(softmax(L[u]))`` at every ``tau`` (``0.1, 1, 10``). Fixed cases: ``N = 2``,
    equal logits, one dominant logit; then ``ctx.cases // 2`` with ``L ~ U(-2, 2)``
    (every expected count ``> 50``). One chi-square per query row.
    """
    rng = ctx.rng
    cases = [np.array([[0.4, -0.4], [2.0, 0.0]]), np.zeros((5, 5)), np.eye(6) * 3.0]
    cases += [rng.uniform(-2.0, 2.0, (n, n)) for n in rng.integers(2, 9, ctx.cases // 2)]
    tests = sum(len(logits) for logits in cases)
    worst = WorstCase("upper")
    for logits in cases:
        n = len(logits)
        block = AllPairSoftmax(float(rng.choice([0.1, 1.0, 10.0])))
        gumbel = ctx.asarray(gumbel_noise(rng, (n, CATEGORICAL_DRAWS)))  # (N keys, K)
        eye = ctx.asarray(np.eye(n))
        _, cache = block.forward({}, ctx.asarray(logits), eye, eye, gumbel)
        winners = ctx.xp.argmax(cache.probabilities, axis=2)  # (K, N): per sample and query
        counts = to_numpy(ctx.xp.sum(winners[:, :, None] == ctx.xp.arange(n), axis=0))  # (N, N)
        statistics = [pearson(counts[u], softmax(logits[u])) for u in range(n)]
        worst.add(np.array(statistics), chi2_threshold(tests, n - 1))
    return worst


# -- Thm 2 ------------------------------------------------------------------------------------
def argmax_bias(q: Any, keys: Any, tau: float) -> np.ndarray:
    """``m`` times the bias of the kernelised argmax law at large ``m`` (delta method), ``(N,)``.

    With ``delta_v = beta_v / E beta_v - 1``, ``Cov(delta) = (M / (mu mu^T) - 1) / m`` where
    ``M_vw = E[f_v f_w] = exp(|2x + y_v + y_w|^2 / 2 - |x|^2 - (|y_v|^2 + |y_w|^2) / 2)`` is
    the moment of one feature (Eq. 18's, for two keys). ``tau log(1 + delta)`` has
    mean ``-tau diag(Cov) / 2`` and covariance ``tau^2 Cov`` to second order, so
    ``P(argmax = v) - pi_v ~ J E[e] + (1/2) H : Cov(e)`` with the softmax's
    Jacobian ``J`` and Hessian ``H`` at ``pi = softmax(K q)``. Against sampled laws it
    is accurate once ``Cov`` is small and overstates the bias before (module tests).
    """
    x, y = q / math.sqrt(tau), keys / math.sqrt(tau)  # (d,), (N, d)
    mu = np.exp(y @ x)  # (N,)
    pair = 2 * x + y[:, None, :] + y[None, :, :]  # (N, N, d)
    norms = np.sum(y * y, axis=1)  # (N,)
    log_moment = 0.5 * np.sum(pair**2, axis=-1) - x @ x - 0.5 * (norms[:, None] + norms[None])
    cov = np.exp(log_moment) / np.outer(mu, mu) - 1.0  # (N, N), at m = 1
    pi = softmax(keys @ q)
    eye = np.eye(len(pi))
    jacobian = np.diag(pi) - np.outer(pi, pi)
    centred = eye - pi[None, :]  # [v, a] = 1[v = a] - pi_a
    # d^2 pi_v / dl_a dl_b = pi_v ((1[v=a] - pi_a)(1[v=b] - pi_b) - pi_a (1[a=b] - pi_b))
    hessian = pi[:, None, None] * (
        centred[:, :, None] * centred[:, None, :] - pi[None, :, None] * (eye - pi[None, None, :])
    )  # (N, N, N)
    return jacobian @ (-tau * np.diag(cov) / 2) + 0.5 * np.einsum(
        "vab,ab->v", hessian, tau**2 * cov
    )


def thm2_features(q: Any, keys: Any, tau: float, draws: int) -> int:
    """The smallest ``m`` whose predicted bias ``b / m`` (:func:`argmax_bias`) shifts the
    chi-square of ``draws`` samples by at most ``THM2_NONCENTRALITY`` on average:
    ``draws sum_v (b_v / m)^2 / pi_v <= THM2_NONCENTRALITY``."""
    bias, pi = argmax_bias(q, keys, tau), softmax(keys @ q)
    return max(math.ceil(math.sqrt(draws * float(np.sum(bias**2 / pi)) / THM2_NONCENTRALITY)), 1)


def kernelised_winners(ctx: Context, q: Any, keys: Any, tau: float, m: int, draws: int) -> Any:
    """Argmax of ``c_u`` (Eq. 7) for ``draws`` fresh (projection, Gumbel) pairs: host ``(draws,)``.

    Each sample has its own i.i.d. projection of ``m`` rows, so samples are
    independent; ``beta`` comes from the library's :func:`positive_random_features`
    of ``[q; K] / sqrt(tau)`` on one stacked projection (normalised by
    ``1/sqrt(rows)``, so a sample's ``beta_v`` is ``rows / m`` times its sum).
    """
    points = ctx.asarray(np.vstack([q, keys]) / math.sqrt(tau))  # (N + 1, d)
    winners = []
    for start in range(0, draws, THM2_CHUNK):
        chunk = min(THM2_CHUNK, draws - start)
        omega = projection_stack(ctx.rng, chunk, m, q.size, "iid")  # (chunk m, d)
        features = positive_random_features(points, ctx.asarray(omega))  # (N + 1, chunk m)
        products = to_numpy(features[1:] * features[0]).reshape(len(keys), chunk, m)
        beta = chunk * products.sum(axis=2).T  # (chunk, N)
        gumbel = gumbel_noise(ctx.rng, beta.shape)
        with np.errstate(divide="ignore"):  # beta = 0 (underflow) loses, as c_uv = 0 would
            winners.append(np.argmax(np.log(beta) + gumbel / tau, axis=1))
    return np.concatenate(winners)


def thm2_case(rng: np.random.Generator, d: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``q`` with ``|q| = sqrt(S)/2`` and keys ``k_v = -q + sqrt(S) u_v``, ``u_v`` uniform in the
    unit ball, ``S = THM2_EXPONENT``: every ``|q + k_v|^2 <= S`` and the logits ``q^T k_v``
    spread over ``[-3S/4, S/4]``, with key norms that differ."""
    root = math.sqrt(THM2_EXPONENT)
    q = rng.standard_normal(d)
    q *= root / 2 / np.linalg.norm(q)
    u = rng.standard_normal((n, d))
    u *= (rng.random((n, 1)) ** (1 / d)) / np.linalg.norm(u, axis=1, keepdims=True)
    return q, -q + root * u


@check(
    id="prf.gumbel.thm2",
    paper="NodeFormer",
    statement="kernelised Gumbel-Softmax, m -> inf then tau small: P(argmax c_u = v) -> "
    "softmax(q^T k)_v (Thm 2); chi-square",
)
def thm2(ctx: Context) -> WorstCase:
    """Thm 2 in the order that holds: for each ``tau`` in ``TAUS`` (1, 1/2, 1/4), ``m`` large.

    Per case (a fixed one with logits 0.25 ... -0.75 and key norms 0.5 ... 1.5, then
    ``max(ctx.cases // 10, 1)`` of :func:`thm2_case`) and ``tau``: ``m =``
    :func:`thm2_features` (it grows like ``e^{|q+k|^2/tau}``), ``THM2_DRAWS``
    independent samples of the argmax of Eq. 7, and Pearson's ``X^2`` against
    ``softmax(q^T k)``. The residual bias at that ``m`` shifts ``X^2`` by at most
    ``THM2_NONCENTRALITY`` (delta method), so the test's size stays near its
    nominal level; the broken variants of the tests (features without
    ``e^{-|x|^2/2}``, no Gumbel noise) reach ``X^2`` in the hundreds at the fixed case.
    """
    rng = ctx.rng
    q = np.array([0.5, 0.0])  # fixed: logits 0.25 ... -0.75, key norms 0.5 ... 1.5
    unit = np.array([[1.0, 0.0], [0.7, 0.7], [0.0, 0.3], [-1.0, 0.0], [-0.5, -0.5]])
    cases = [(q, -q + unit)]  # |q + k_v| = |unit_v| <= 1
    for _ in range(max(ctx.cases // 10, 1)):
        cases.append(thm2_case(rng, int(rng.integers(2, 5)), int(rng.integers(3, 7))))
    threshold = {n: chi2_threshold(len(cases) * len(TAUS), n - 1) for n in range(2, 8)}
    worst = WorstCase("upper")
    for q, keys in cases:
        for tau in TAUS:
            m = thm2_features(q, keys, tau, THM2_DRAWS)
            winners = kernelised_winners(ctx, q, keys, tau, m, THM2_DRAWS)
            counts = np.bincount(winners, minlength=len(keys))
            worst.add(pearson(counts, softmax(keys @ q)), threshold[len(keys)])
    return worst


# -- Eq. 7 against the library ---------------------------------------------------------------
@check(
    id="prf.gumbel.eq7_library",
    paper="NodeFormer",
    statement="c_uv = beta_v e^{g_v/tau} / sum_w beta_w e^{g_w/tau} (Eq. 7) = library "
    "KernelizedSoftmax per sample; |c_lib - c| vs rounding",
)
def eq7_library(ctx: Context) -> WorstCase:
    """The ``c_uv`` these checks sample are the library's Eq. 7 (``V = I_N``, ``cache.outputs``).

    Direct: ``phi`` of Eq. 4 (unstabilised) on ``q / sqrt(tau)``, ``k / sqrt(tau)`` and
    ``e^{g/tau}``, normalised per sample; library: the stabilised log-domain form.
    ``measured = |c_lib - c|``, ``bound = 4 (m + N + 12 + (d + 2) T + G) eps c`` per entry,
    ``T = max_i |w_i| (max|x| + max|y|) + max|x|^2 + max|y|^2``, ``G = max |g| / tau``:
    twice the first-order rounding of both routes (exponents, ``m``- and ``N``-term
    sums, the ratio). Fixed cases: ``N = 1`` (``c = 1``), ``K = 1``, ``|g| / tau = 20``.
    """
    rng = ctx.rng
    eps = float(np.finfo(np.float64).eps)
    cases = [(1, 3, 8, 2, 0.25, None), (4, 2, 1, 1, 1.0, None), (5, 3, 16, 2, 0.25, 5.0)]
    for _ in range(ctx.cases):
        n, d, m, samples = (int(v) for v in rng.integers([1, 1, 1, 1], [7, 5, 65, 6]))
        cases.append((n, d, m, samples, float(rng.choice(TAUS)), None))
    worst = WorstCase("upper")
    for n, d, m, samples, tau, extreme in cases:
        q, k = rng.standard_normal((n, d)) / 2, rng.standard_normal((n, d)) / 2
        omega = rng.standard_normal((m, d))
        g = gumbel_noise(rng, (n, samples))
        if extreme is not None:
            g[:, 0] = np.where(np.arange(n) % 2 == 0, extreme, -extreme)
        eye = ctx.asarray(np.eye(n))
        _, cache = KernelizedSoftmax(tau).forward(
            {}, ctx.asarray(q), ctx.asarray(k), eye, ctx.asarray(omega), ctx.asarray(g)
        )
        x, y = ctx.asarray(q / math.sqrt(tau)), ctx.asarray(k / math.sqrt(tau))
        beta = (
            positive_random_features(x, ctx.asarray(omega))
            @ positive_random_features(y, ctx.asarray(omega)).T
        )  # (N queries, N keys)
        weighted = beta[None] * ctx.xp.exp(ctx.asarray(g.T / tau))[:, None, :]  # (K, N, N)
        direct = to_numpy(weighted / ctx.xp.sum(weighted, axis=2, keepdims=True))
        norm_x = float(np.linalg.norm(q, axis=1).max()) / math.sqrt(tau)
        norm_y = float(np.linalg.norm(k, axis=1).max()) / math.sqrt(tau)
        t = float(np.linalg.norm(omega, axis=1).max()) * (norm_x + norm_y) + norm_x**2 + norm_y**2
        allowance = 4 * (m + n + 12 + (d + 2) * t + float(np.abs(g).max()) / tau) * eps
        worst.add(np.abs(to_numpy(cache.outputs) - direct), allowance * direct)
    return worst


# -- errata ---------------------------------------------------------------------------------
def _frequency_test(hits: Any, p: float) -> tuple[float, float]:
    """``(frequency, z standard error)`` of a 0/1 sample against probability ``p``."""
    hits = np.asarray(hits, dtype=float)
    return float(hits.mean()), z_threshold(1) * math.sqrt(p * (1 - p) / hits.size)


def eq35_evidence() -> Any:
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


def eq28_evidence() -> Any:
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


def eq30_evidence() -> Any:
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


def order_of_limits_evidence() -> Any:
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


def eq34_evidence() -> Any:
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


def eq43_evidence() -> Any:
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


def errata() -> list[Any]:
    """The :class:`proofs_check.errata.Erratum` entries of Prop. 2-3 and Thm 2's proof (lazy:
    ``errata`` imports this module)."""
    from proofs_check.errata import Erratum

    return [
        Erratum(
            id="prf.eq35.ratio",
            paper="NodeFormer",
            location="App. B.2, Eq. 35, last line",
            printed="P(log a_v + g_v > log a_v' + g_v') = ... = a_v' / (a_v + a_v')",
            correct="= 1 / (1 + exp(log a_v' - log a_v)) = a_v / (a_v + a_v') (Prop. 2; Eq. 49 "
            "uses this value)",
            counterexample="log a_v = 1, log a_v' = 0 (q^T k_v = 1, q^T k_v' = 0), 20000 pairs",
            evaluate=eq35_evidence,
        ),
        Erratum(
            id="prf.eq28.exponent",
            paper="NodeFormer",
            location="App. B.2, proof of Prop. 3, Eq. 26 and 28",
            printed="u_k^(a_1/a_k) ... u_k^(a_n/a_k) = g_k^((a_1 + ... + a_n)/a_k) = "
            "g_k^(1/a_k - 1)",
            correct="the product runs over i != k (Eq. 26's k-th line compares X_k with itself): "
            "u_k^(sum_(i!=k) a_i/a_k) = u_k^(1/a_k - 1) for sum a = 1; the middle exponent is "
            "1/a_k",
            counterexample="alpha = (0.2, 0.3, 0.5), k = 3",
            evaluate=eq28_evidence,
        ),
        Erratum(
            id="prf.eq30.one_hot_index",
            paper="NodeFormer",
            location="App. B.2, Eq. 30 and the sentence after it",
            printed="lim_(tau->0) exp((log a_i + g_i - log a_j - g_j)/tau) = inf if a_i > a_j, 0 "
            "otherwise; the limit is one-hot at X_(argmax_i a_i)",
            correct="inf if log a_i + g_i > log a_j + g_j: the one-hot sits at the random index "
            "argmax_i (log a_i + g_i), equal to k with probability a_k / sum a (Eq. 31)",
            counterexample="alpha = (0.6, 0.4), tau = 1e-6, 20000 samples",
            evaluate=eq30_evidence,
        ),
        Erratum(
            id="prf.thm2.order_of_limits",
            paper="NodeFormer",
            location="Thm 2 (Sec. 3.2) and App. B.2, Eq. 48-50",
            printed="m sufficiently large: lim_(tau->0) P(c_uv > c_uv', all v') = "
            "softmax(q^T k)_v; proof: lim_(P_eps->1) lim_(tau->0)",
            correct="at any fixed m, tau log beta_v -> -(|q|^2 + |k_v|^2)/2 as tau -> 0, so the "
            "limit is softmax(-|k_v|^2/2)_v: q drops out (and P_eps does not stay near 1: "
            "sigma_v^2 / a_v^(2/tau) = (e^(|q+k_v|^2/tau) - 1)/m grows without bound while Eq. "
            "36 needs eps_v < a_v^(1/tau)). softmax(q^T k) is lim_(tau->0) lim_(m->inf), indeed "
            "lim_(m->inf) at every tau (checked by prf.gumbel.thm2)",
            counterexample="q = (0.6, 0), keys (0.8, 0.3), (-0.5, 0.2), (0.1, -0.9), (0.3, 0.3), "
            "(-0.2, -0.1), m = 64, tau = 1e-8, 10000 samples (log domain)",
            evaluate=order_of_limits_evidence,
        ),
        Erratum(
            id="prf.eq34.not_iid",
            paper="NodeFormer",
            location="App. B.2, after Eq. 34 and in Eq. 39",
            printed="beta_v and beta_v' are two i.i.d. random variables",
            correct="they share omega (and q_u): dependent, Cov = (E[f_v f_v'] - SM_v SM_v') / m, "
            "and with means e^(q^T k_v / tau) that differ; Eq. 39's product bound needs an "
            "argument (the union bound gives 1 - s_v^2/e_v^2 - s_v'^2/e_v'^2, enough for Eq. 49)",
            counterexample="q = k_v = (0.5, 0), k_v' = (0, 0.5), tau = 1, m = 8, 4000 draws",
            evaluate=eq34_evidence,
        ),
        Erratum(
            id="prf.eq43.not_an_expectation",
            paper="NodeFormer",
            location="App. B.2, the sentence before Eq. 43 (and E(c) in Eq. 43-46)",
            printed="c = log beta_v - log beta_v', so that E(c) = (1/tau)(log a_v - log a_v')",
            correct="E(c) differs from it (Jensen: E log beta_v < log E beta_v, by amounts that "
            "differ between keys; equal only as m -> inf); the proof needs only the constant "
            "c* = (1/tau)(log a_v - log a_v'), around which Eq. 42 bounds c",
            counterexample="m = 1, q = k_v = (1, 0), k_v' = (0, 1), tau = 1, 20000 draws",
            evaluate=eq43_evidence,
        ),
        Erratum(
            id="prf.eq51.sigma_squared",
            paper="NodeFormer",
            location="App. B.2, Eq. 51 (sigma^2 in the proof of Thm 2)",
            printed="sigma^2 = (1/m) exp(-(||x||^2 + ||y||^2)/2) sum_i exp(w_i^T (x + y))",
            correct="sigma^2 = exp(||x+y||^2) SM^2(x, y) (1 - exp(-||x+y||^2)) / m (Eq. 18); the "
            "printed expression is the estimator SM^_m itself: random, mean exp(x^T y), not -> 0",
            counterexample="x = y = 0 (SM^_m = 1 exactly: variance 0, printed 1), and "
            "x = (0.3, 0), y = (0.1, 0.1); m = 8",
            evaluate=prf.eq51_sigma_evidence,
        ),
    ]
