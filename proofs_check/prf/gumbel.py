"""NodeFormer's Gumbel results as checks: Prop. 2, Prop. 3 (Gumbel-max), Thm 2 and Eq. 7.

Gumbel noise is ``g(u) = -log(-log u)``, ``u ~ U(0, 1)`` (Prop. 2; :func:`gumbel_noise`,
looked up when a check runs). With ``x = q_u / sqrt(tau)``, ``y_v = k_v / sqrt(tau)``
and ``beta_v = phi(x)^T phi(y_v)`` (Eq. 34), the kernelised Gumbel-Softmax of Eq. 7
is ``c_uv = beta_v e^{g_v/tau} / sum_w beta_w e^{g_w/tau}``; its argmax is that of
``tau log beta_v + g_v``, a Gumbel-max over the logits ``tau log beta_v``.

- ``prf.gumbel.prop2``: ``P(x_i + g_i > x_j + g_j) = 1 / (1 + exp(-(x_i - x_j)))``: a binomial
  z-score per pair
- ``prf.gumbel.prop3``: the argmax of the library's ``AllPairSoftmax`` Gumbel samples (Eq. 6) is
  ``Cat(alpha / sum alpha)``: chi-square per query
- ``prf.gumbel.thm2``: kernelised (Eq. 7): with ``m`` large for each ``tau`` the argmax is
  ``Cat(softmax(q^T k))``: chi-square
- ``prf.gumbel.eq7_library``: ``c_uv`` from Eq. 4 features = the library's ``KernelizedSoftmax``
  per-sample outputs (``V = I``), to rounding

Chi-square tests: :func:`~proofs_check.prf.statistics.pearson` against
:func:`~proofs_check.prf.statistics.chi2_threshold` (see :mod:`proofs_check.prf.statistics`).

Thm 2 as printed (``m`` "sufficiently large", then ``tau -> 0``) is false: for any
fixed ``m``, ``tau log beta_v -> -|k_v|^2 / 2 + const`` as ``tau -> 0``, so the argmax
law tends to ``softmax(-|k_v|^2 / 2)``, whatever ``q``. What holds is the other
order: as ``m -> infinity`` at fixed ``tau``, ``tau log beta_v -> q^T k_v`` and the
argmax law tends to ``softmax(q^T k)`` for every ``tau`` (``tau -> 0`` then only makes
``c`` one-hot). ``prf.gumbel.thm2`` checks that, with ``m`` growing as ``tau`` falls
(:func:`thm2_features`); erratum ``prf.thm2.order_of_limits`` shows the other.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import softmax

from proofs_check.prf.estimates import TAUS, projection_stack
from proofs_check.prf.statistics import chi2_threshold, pearson, z_threshold
from proofs_check.registry import Context, WorstCase, check
from refimpl.backend import to_numpy
from refimpl.nn.nodeformer import random_features
from refimpl.nn.nodeformer.all_pair_softmax import AllPairSoftmax
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax
from refimpl.nn.nodeformer.random_features import positive_random_features

__all__ = ["CATEGORICAL_DRAWS", "PAIR_DRAWS", "argmax_bias", "gumbel_noise", "thm2_features"]

PAIR_DRAWS = 20000  # Gumbel pairs per case of Prop. 2: standard error <= 0.0036
CATEGORICAL_DRAWS = 20000  # Gumbel samples per case of Prop. 3
THM2_DRAWS = 6000  # (projection, Gumbel) samples per (case, tau) of Thm 2
THM2_EXPONENT = 0.75  # max |q + k_v|^2 of the random Thm 2 cases: m grows like e^{S/tau}
THM2_NONCENTRALITY = 0.25  # the residual bias may shift X^2 by this much on average
THM2_CHUNK = 500  # samples per batch: features are (N + 1, chunk m)


def gumbel_noise(rng: np.random.Generator, shape: Any) -> np.ndarray:
    """``g = -log(-log u)``, ``u ~ U[0, 1)`` (Prop. 2), host float64: the library's own sampler
    (:func:`refimpl.nn.nodeformer.random_features.draw_gumbel`, which NodeFormerConv draws
    with), so the checks test the noise the layer uses."""
    return random_features.draw_gumbel(rng, shape, np.float64)


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


@check(
    id="prf.gumbel.prop3_limit",
    paper="NodeFormer",
    statement="tau -> 0: X_k -> 1 with probability alpha_k / sum alpha (Prop. 3, second "
    "bullet, Eq. 16), library Eq. 6 samples at tau = 1e-4; chi-square",
)
def prop3_limit(ctx: Context) -> WorstCase:
    """Prop. 3, second bullet: as ``tau -> 0`` the Gumbel-Softmax sample is one-hot (Eq. 16)
    and its hot entry ``k`` has probability ``alpha_k / sum alpha``.

    The library's ``AllPairSoftmax(1e-4)`` as in :func:`prop3`: a sample counts for ``k``
    where ``X_k >= 1 - 1e-9`` (at ``tau = 1e-4`` a gap of ``1e-3`` in ``log alpha + g``
    already leaves the runner-up below ``e^-10``); the few samples where no entry is that
    close to 1 (two perturbed logits within ``~2e-3``) are counted and must stay under
    ``1 %`` of the draws, and the counts of each row are chi-square-tested against
    ``softmax(L[u])``. ``measured`` is the worst ``X^2`` over its threshold.
    """
    rng = ctx.rng
    cases = [np.array([[0.4, -0.4], [2.0, 0.0]]), np.zeros((4, 4))]
    cases += [rng.uniform(-2.0, 2.0, (n, n)) for n in rng.integers(2, 7, max(ctx.cases // 4, 1))]
    tests = sum(len(logits) for logits in cases)
    worst = WorstCase("upper")
    block = AllPairSoftmax(1e-4)
    for logits in cases:
        n = len(logits)
        gumbel = ctx.asarray(gumbel_noise(rng, (n, CATEGORICAL_DRAWS)))  # (N keys, K)
        eye = ctx.asarray(np.eye(n))
        _, cache = block.forward({}, ctx.asarray(logits), eye, eye, gumbel)
        probabilities = to_numpy(cache.probabilities)  # (K, N queries, N keys)
        hot = probabilities >= 1 - 1e-9
        counts = hot.sum(axis=0)  # (N, N): per query, how often each key is the hot one
        undecided = 1.0 - hot.any(axis=2).mean()  # samples not yet one-hot
        statistics = np.array([pearson(counts[u], softmax(logits[u])) for u in range(n)])
        threshold = chi2_threshold(tests, n - 1)
        worst.add(np.maximum(statistics / threshold, undecided / 0.01), 1.0)
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
    """The ``c_uv`` these checks sample are the library's Eq. 7 (``V = I_N``, per sample:
    ``KernelizedSoftmax.sample_outputs``).

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
        block = KernelizedSoftmax(tau)
        _, cache = block.forward(
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
        outputs = to_numpy(block.sample_outputs(cache))  # (K, N, N)
        worst.add(np.abs(outputs - direct), allowance * direct)
    return worst
