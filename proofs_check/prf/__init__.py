"""NodeFormer's random features and Gumbel-Softmax as checks: Prop. 1-3, Thm 1-2, Eq. 5, 7, 18.

With ``s = x + y`` and rows ``w_i`` of the projection (NodeFormer Eq. 4,
:mod:`refimpl.nn.nodeformer.random_features`), the kernel estimate of Prop. 1 is

    SM^_m(x, y) = phi(x)^T phi(y) = (1/m) sum_i Z_i,  Z_i = exp(w_i^T s - (|x|^2 + |y|^2) / 2),

a mean of log-normals whose mean and variance are Eq. 18's (right as printed;
:mod:`~proofs_check.prf.moments`). Gumbel noise is ``g(u) = -log(-log u)``, ``u ~ U(0, 1)``
(Prop. 2); with ``beta_v = phi(x)^T phi(y_v)`` (Eq. 34) the kernelised Gumbel-Softmax of
Eq. 7 is ``c_uv = beta_v e^{g_v/tau} / sum_w beta_w e^{g_w/tau}``, whose argmax is a
Gumbel-max over the logits ``tau log beta_v`` (:mod:`~proofs_check.prf.gumbel`).

- ``prf.prop1.mean``: i.i.d. rows: ``E[SM^_m] = exp(x^T y)`` (Eq. 18, first line)
- ``prf.prop1.variance``: i.i.d. rows: ``Var[SM^_m] = V_m`` (Eq. 18, second line)
- ``prf.orthogonal.mean``: orthogonal rows (``draw_projection(kind="orthogonal")``): unbiased
- ``prf.orthogonal.variance``: orthogonal rows: ``Var <= V_m`` (as Performer proves)
- ``prf.thm1.rate``: ``E[Delta^2]^(1/2)`` falls like ``m^(-1/2)``: fitted log-log slope
- ``prf.thm1.bound``: ``P(Delta <= sqrt(exp(6 r^2/tau) / (m eps))) >= 1 - eps`` (Thm 1 with the
  exponent corrected, erratum ``prf.thm1.exponent_r_squared``)
- ``prf.thm1.chebyshev``: ``P(Delta <= sqrt(V_m / eps)) >= 1 - eps``: the Chebyshev form
- ``prf.eq5.rate``: library ``KernelizedSoftmax`` vs exact ``AllPairSoftmax``: RMS error of the
  output falls like ``m^(-1/2)``: fitted log-log slope
- ``prf.gumbel.prop2``: ``P(x_i + g_i > x_j + g_j) = 1 / (1 + exp(-(x_i - x_j)))``: a binomial
  z-score per pair
- ``prf.gumbel.prop3``: the argmax of the library's ``AllPairSoftmax`` Gumbel samples (Eq. 6) is
  ``Cat(alpha / sum alpha)``: chi-square per query
- ``prf.gumbel.prop3_limit``: as ``tau -> 0`` the samples turn one-hot, hot at ``k`` with
  probability ``alpha_k / sum alpha`` (Prop. 3, second bullet, Eq. 16)
- ``prf.gumbel.thm2``: kernelised (Eq. 7): with ``m`` large for each ``tau`` the argmax is
  ``Cat(softmax(q^T k))``: chi-square (Thm 2 in the order of limits that holds; the printed
  order fails)
- ``prf.gumbel.eq7_library``: ``c_uv`` from Eq. 4 features = the library's ``KernelizedSoftmax``
  per-sample outputs (``V = I``), to rounding

Every threshold keeps the chance that a correct library fails a check at a random seed
below ``FALSE_ALARM`` (:mod:`~proofs_check.prf.statistics` says how); what Thm 1's
``O(.)`` leaves open is in :mod:`~proofs_check.prf.thm1`, why Thm 2 is checked with ``m``
growing as ``tau`` falls in :mod:`~proofs_check.prf.gumbel`.

Errata found here (entries built by :func:`errata`)
---------------------------------------------------
``prf.thm1.exponent_r_squared`` (Thm 1, Eq. 19-21: ``6r`` for ``6r^2``),
``prf.eq20.inequality_direction`` (Eq. 20: "no greater than" for "no less than"),
``prf.eq35.ratio``, ``prf.eq28.exponent``, ``prf.eq30.one_hot_index``,
``prf.thm2.order_of_limits``, ``prf.eq34.not_iid``, ``prf.eq43.not_an_expectation`` and
``prf.eq51.sigma_squared`` (Eq. 51, in Thm 2's proof), in that order; their
counterexamples are evaluated by :mod:`~proofs_check.prf.errata_evidence`.

Modules
-------
statistics
    ``FALSE_ALARM``, z and chi-square thresholds, Cornish-Fisher, Pearson's ``X^2``, log-log
    slopes
moments
    Eq. 18 and the log-normal's cumulants, in closed form
estimates
    the library's ``SM^_m`` over stacked projections, its rounding
kernel
    checks ``prf.prop1.*``, ``prf.orthogonal.*``
thm1
    checks ``prf.thm1.*``, ``prf.eq5.rate``
gumbel
    checks ``prf.gumbel.*``; :func:`gumbel_noise`, Thm 2's ``m``
errata_evidence
    the errata's counterexamples

The package imports the check modules in this order, which is the report's.
Everything in ``__all__`` is importable from the package. The library's pieces are
looked up when a check runs, in the submodule that uses them; a test swaps in a broken
one there, e.g. ``monkeypatch.setattr(prf.estimates, "positive_random_features", ...)``.
"""

from __future__ import annotations

from proofs_check.erratum import Erratum
from proofs_check.prf.estimates import kernel_estimates, projection_stack, rounding_allowance
from proofs_check.prf.moments import eq18_log_variance, eq18_variance, lognormal_cumulants
from proofs_check.prf.statistics import (
    FALSE_ALARM,
    chi2_threshold,
    cornish_fisher,
    pearson,
    slope_and_error,
    z_threshold,
)

# The checks. Importing a module registers its checks, so the order of these imports is
# the order of the report (hence not sorted); the errata evidence imports all three.
# isort: off
from proofs_check.prf.kernel import MOMENT_EXPONENT
from proofs_check.prf.thm1 import thm1_exponent, thm1_log_bound
from proofs_check.prf.gumbel import argmax_bias, gumbel_noise, thm2_features
from proofs_check.prf.errata_evidence import (
    eq20_direction_evidence,
    eq28_evidence,
    eq30_evidence,
    eq34_evidence,
    eq35_evidence,
    eq43_evidence,
    eq51_sigma_evidence,
    evidence,
    order_of_limits_evidence,
    thm1_exponent_evidence,
)
# isort: on

__all__ = [
    "FALSE_ALARM",
    "MOMENT_EXPONENT",
    "argmax_bias",
    "chi2_threshold",
    "cornish_fisher",
    "eq18_log_variance",
    "eq18_variance",
    "eq20_direction_evidence",
    "eq51_sigma_evidence",
    "errata",
    "evidence",
    "gumbel_noise",
    "kernel_estimates",
    "lognormal_cumulants",
    "pearson",
    "projection_stack",
    "rounding_allowance",
    "slope_and_error",
    "thm1_exponent",
    "thm1_exponent_evidence",
    "thm1_log_bound",
    "thm2_features",
    "z_threshold",
]


def errata() -> list[Erratum]:
    """The package's :class:`proofs_check.erratum.Erratum` entries, in report order."""
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
            evaluate=eq51_sigma_evidence,
        ),
    ]
