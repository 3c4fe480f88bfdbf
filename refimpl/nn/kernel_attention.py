"""All-pair softmax attention of NodeFormer: exact O(N^2) and kernelised O(N), Gumbel or not.

Queries, keys and values are rows: ``Q, K (N, d)``, ``V (N, d_v)``; the output is
``Z (N, d_v)``. Gumbel noise ``g (N, K)`` holds one value per *key* node ``v`` and
sample ``s``, shared by all queries (as the authors' code draws it); ``K`` is the
number of samples, ``tau > 0`` the temperature.

:class:`AllPairSoftmax`, the ground truth for small ``N`` (forms ``N x N``)::

    Z = softmax(Q K^T / tau) V                                  (Eq. 2, with tau)
    Z = (1/K) sum_s softmax((Q K^T + 1 g[:, s]^T) / tau) V      (Eq. 6, 15)

:class:`KernelizedSoftmax`, linear in ``N`` (never forms ``N x N``), with
``phi`` of Eq. 4 on ``Q / sqrt(tau)`` and ``K / sqrt(tau)`` and ``omega (m, d)``::

    Z_u = phi(q_u)^T sum_v phi(k_v) v_v^T / phi(q_u)^T sum_w phi(k_w)            (Eq. 5)
    Z_u = (1/K) sum_s  phi(q_u)^T sum_v e^{g_vs/tau} phi(k_v) v_v^T
                     / phi(q_u)^T sum_w e^{g_ws/tau} phi(k_w)          (Eq. 7, 17, Alg. 1)

so ``phi(q/sqrt tau)^T phi(k/sqrt tau)`` estimates ``exp(q^T k / tau)`` (Prop. 1)
and each sample weights key ``v`` by ``e^{g_vs / tau}``, is normalised on its
own, and the ``K`` results are averaged (Alg. 1 line 8). Without ``gumbel`` the
forms are Eq. 2 and Eq. 5 (``K = 1``, ``g = 0``, bit for bit).

Stabilisation (``stabilize=True``), in the log domain
-----------------------------------------------------
With ``a(x)_i = w_i^T x - ||x||^2 / 2`` (:func:`feature_exponent`):

* query features ``exp(a(q_u) - max_i a(q_u)_i) / sqrt(m)``: a per-query factor,
  cancels in the ratio (``stabilizer="row"`` of :mod:`refimpl.nn.random_features`);
* per-sample key features ``K~[v, s, i] = exp((a(k_v)_i - r_v) + (r_v + g_vs / tau
  - c_s)) / sqrt(m)`` with ``r_v = max_i a(k_v)_i`` and ``c_s = max_v (r_v + g_vs /
  tau)``: Alg. 1 line 6's ``e^{g_vs/tau} phi(k_v)`` times one factor ``e^{-c_s}``
  common to all keys of sample ``s``, which cancels in that sample's ratio. Both
  bracketed terms are ``<= 0`` (nothing overflows) and each sample's largest key
  holds a feature ``1 / sqrt(m)``.
* exponents below ``log(finfo.tiny) + 40`` give exact zeros instead of subnormal
  floats, which slow every product they enter 10-100 times on x86 (with Gumbel
  noise at ``tau = 0.25`` a fifth of the float32 key weights fell there). The
  flushed terms are below ``2.8e-21`` (float32; ``5e-291`` in float64) against a
  ``1 / sqrt(m)`` in every sum they enter: a relative change below ``N m 2.8e-21``.

Alg. 1 line 6 also multiplies the *query* features by ``G_k``: a per-query
factor that cancels in line 8, so it is left out. The backward holds every
shift constant, which is exact because the output does not depend on them (the
gradient of Eq. 5/7 in ``Q, K, V``, not of any stabilised intermediate).
``stabilize=False`` evaluates Eq. 4 and ``e^{g/tau}`` as printed (overflow-prone;
for tests that the stabiliser cancels).

Edge semantics
--------------
* ``N = 1``: one key, so its weight is 1 and ``Z = V``. :class:`AllPairSoftmax`:
  every softmax is exactly 1, so ``d_Q = d_K = 0`` exactly (``Z`` and ``d_V``
  are means of ``K`` equal terms: a few ulps); :class:`KernelizedSoftmax`: up to
  rounding (``num / den`` with ``num = den * v`` summed in another order).
* ``K = 1``: one sample, no averaging.
* Denominators: ``phi > 0`` so they are positive in exact arithmetic, and no
  ``eps`` is added (the authors add ``1e-6`` to every feature, which does not
  cancel). A denominator that underflows to 0 (features of ``q_u`` and of the
  keys peaking on different rows of ``omega`` at very large ``||q|| / sqrt(tau)``)
  or any non-finite one raises :class:`~refimpl.validation.NonFiniteError`.
* The random features are noise: ``omega`` and ``gumbel`` get no gradient.

Parity with the authors' ``kernelized_softmax`` / ``kernelized_gumbel_softmax``
(``nodeformer.py``): same ratios and sample layout (their noise is
``[N, B, H, K]``, drawn as ``-log(Exp(1))``); they add ``1e-6`` to every
feature, shift keys by ``max(omega x)`` without ``-||x||^2/2`` (a different
global constant, which cancels) and multiply by ``e^{g/tau}`` unshifted, and
their features carry NodeFormerConv's ``d^{-1/4}`` on ``q`` and ``k``, which a
caller applies before this block (``qk_scale="sqrt_d"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.nn.random_features import (
    check_features_input,
    feature_exponent,
    feature_exponent_backward,
)
from refimpl.validation import (
    NonFiniteError,
    check_cotangent,
    check_input,
    check_like,
    check_nonnegative_number,
    check_params,
)

__all__ = [
    "AllPairSoftmax",
    "AllPairSoftmaxCache",
    "KernelizedSoftmax",
    "KernelizedSoftmaxCache",
]


class AllPairSoftmaxCache(NamedTuple):
    """What :meth:`AllPairSoftmax.backward` reads."""

    q: Any  # (N, d)
    k: Any  # (N, d)
    v: Any  # (N, d_v)
    probabilities: Any  # (K, N, N) row softmax of (Q K^T + 1 g_s^T) / tau; K = 1 without gumbel


@dataclass(frozen=True)
class AllPairSoftmax:
    """Exact all-pair softmax attention, NodeFormer Eq. 2 (with ``tau``) and Eq. 6 / 15 (Gumbel).

    ``forward({}, q (N, d), k (N, d), v (N, d_v), gumbel=None | (N, K)) -> (z (N, d_v),
    cache)``; ``backward({}, cache, d_z) -> ((d_q, d_k, d_v), {})``. ``O(K N^2)`` time
    and memory: the ground truth for :class:`KernelizedSoftmax` at small ``N``.
    """

    tau: float = 1.0  # temperature; 1 is Eq. 2 as printed (the authors' code defaults to 0.25)

    def __post_init__(self) -> None:
        check_nonnegative_number(self.tau, "AllPairSoftmax tau", allow_zero=False)

    def forward(
        self, params: dict[str, Any], q: Any, k: Any, v: Any, gumbel: Any = None
    ) -> tuple[Any, AllPairSoftmaxCache]:
        """``Z``: q, k (N, d), v (N, d_v), gumbel (N, K) or None -> (N, d_v), and the cache."""
        xp = _check_inputs("AllPairSoftmax", params, q, k, v, gumbel)
        # F1 raw scores q_u^T k_v: (N, d) @ (d, N) -> (N, N)
        raw = q @ k.T
        # F2 scores (q_u^T k_v + g_vs) / tau, one slab per sample: (K, N, N)
        if gumbel is None:
            scores = (raw / self.tau)[None]  # (1, N, N)
        else:
            scores = (raw[None] + gumbel.T[:, None, :]) / self.tau  # (K, 1, N) over keys
        if not bool(xp.all(xp.isfinite(scores))):
            raise NonFiniteError(
                f"AllPairSoftmax: (q^T k + g) / tau overflowed at tau = {self.tau}; "
                "scale q and k down or raise tau"
            )
        # F3 row softmax over keys, shifted by the row max (K, N, N)
        exp = xp.exp(scores - xp.max(scores, axis=2, keepdims=True))
        probabilities = exp / xp.sum(exp, axis=2, keepdims=True)
        # F4 average of the K samples: mean_s P_s V, (K, N, N) @ (N, d_v) -> (K, N, d_v) -> (N, d_v)
        z = xp.mean(probabilities @ v, axis=0)
        return z, AllPairSoftmaxCache(q, k, v, probabilities)

    def backward(
        self, params: dict[str, Any], cache: AllPairSoftmaxCache, d_z: Any
    ) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
        """Gradients of ``<d_z, z>``: ``((d_q (N, d), d_k (N, d), d_v (N, d_v)), {})``."""
        q, k, v, probabilities = cache
        check_cotangent(d_z, v.shape, v.dtype, v, name="d_z")
        xp = get_array_module(d_z, v)
        samples = probabilities.shape[0]
        # B4 (of F4): d_v = (1/K) sum_s P_s^T d_z; d_P_s = d_z V^T / K for every s
        # (N, N)^T @ (N, d_v) -> (N, d_v); (N, d_v) @ (d_v, N) -> (N, N)
        d_v = xp.sum(probabilities, axis=0).T @ d_z / samples
        d_probabilities = (d_z @ v.T) / samples  # (N, N), broadcast over samples
        # B3 (of F3): softmax vjp P * (d_P - rowsum(P * d_P)), (K, N, N)
        d_scores = probabilities * (
            d_probabilities - xp.sum(probabilities * d_probabilities, axis=2, keepdims=True)
        )
        # B2 (of F2): the scores of all samples share raw / tau; g is noise (no gradient)
        d_raw = xp.sum(d_scores, axis=0) / self.tau  # (N, N)
        # B1 (of F1): (N, N) @ (N, d) -> (N, d), twice
        d_q = d_raw @ k
        d_k = d_raw.T @ q
        return (d_q, d_k, d_v), {}


class KernelizedSoftmaxCache(NamedTuple):
    """What :meth:`KernelizedSoftmax.backward` reads (``K`` = samples, 1 without gumbel)."""

    q_scaled: Any  # (N, d) Q / sqrt(tau)
    k_scaled: Any  # (N, d) K / sqrt(tau)
    v: Any  # (N, d_v)
    omega: Any  # (m, d) projection, held fixed
    query_features: Any  # (N, m) phi(Q / sqrt tau), per-query shift
    keys: Any  # (N, K, m) K~_s[v] = e^{g_vs/tau} phi(k_v / sqrt tau), per-sample shift c_s
    kv: Any  # (K m, d_v) U_s = K~_s^T V stacked over s (Alg. 1 line 7)
    k_sum: Any  # (K, m) O_s = K~_s^T 1 (Alg. 1 line 7)
    denominators: Any  # (N, K) phi(q_u)^T O_s
    coefficients: Any  # (N, K) 1 / (K den_us): sample s's weight in query u's average


@dataclass(frozen=True)
class KernelizedSoftmax:
    """Kernelised softmax (NodeFormer Eq. 5) and kernelised Gumbel-Softmax (Eq. 7, Alg. 1).

    ``forward({}, q (N, d), k (N, d), v (N, d_v), omega (m, d), gumbel=None | (N, K))
    -> (z (N, d_v), cache)``; ``backward({}, cache, d_z) -> ((d_q, d_k, d_v), {})``.
    ``O(N K m (d + d_v))`` time, ``O(N K m)`` memory: the ``K`` samples share one
    ``(N, K m)`` layout, so every product is one matrix product and no ``(K, N, d_v)``
    array is formed. ``omega`` and ``gumbel`` are noise (no gradient) and must share
    ``q``'s dtype and backend. Stabilisation, what cancels, flushed subnormals, ``N = 1``
    and zero denominators: module docstring.
    """

    tau: float = 1.0  # temperature; 1 is Eq. 5 as printed (the authors' code defaults to 0.25)
    stabilize: bool = True  # log-domain shifts that cancel in the ratio; False: Eq. 4 as printed

    def __post_init__(self) -> None:
        check_nonnegative_number(self.tau, "KernelizedSoftmax tau", allow_zero=False)
        if not isinstance(self.stabilize, bool):
            raise ValueError(f"KernelizedSoftmax stabilize must be a bool, got {self.stabilize!r}")

    def forward(
        self, params: dict[str, Any], q: Any, k: Any, v: Any, omega: Any, gumbel: Any = None
    ) -> tuple[Any, KernelizedSoftmaxCache]:
        """``Z``: q, k (N, d), v (N, d_v), omega (m, d), gumbel (N, K) or None -> (N, d_v)."""
        xp = _check_inputs("KernelizedSoftmax", params, q, k, v, gumbel, omega)
        n, m = q.shape[0], omega.shape[0]
        scale = 1.0 / math.sqrt(self.tau)
        log_sqrt_m = 0.5 * math.log(m)  # Eq. 4's 1 / sqrt(m), in the log domain
        # F1 features are taken of q / sqrt(tau), k / sqrt(tau) (Eq. 6-7, Alg. 1 line 6)  (N, d)
        q_scaled, k_scaled = q * scale, k * scale
        # F2 exponents of Eq. 4 (N, m)
        a_q, a_k = feature_exponent(q_scaled, omega), feature_exponent(k_scaled, omega)
        # F3 the Gumbel log-weights g / tau (Alg. 1 line 4, in the log domain)  (N, K)
        log_weights = xp.zeros((n, 1), dtype=q.dtype) if gumbel is None else gumbel / self.tau
        samples = log_weights.shape[1]
        if self.stabilize:
            # F4 query features, per-query shift (cancels in line 8)  (N, m)
            query_features = _exp_flushed(a_q - (xp.max(a_q, axis=1, keepdims=True) + log_sqrt_m))
            # F5-F7 per-sample key features exp(a(k_v) + g_vs/tau - c_s) / sqrt(m): the per-key
            # r_v enters both terms with opposite signs, c_s is common to sample s (Alg. 1 lines
            # 5-6)  (N, K, m)
            r = xp.max(a_k, axis=1, keepdims=True)  # (N, 1)
            log_weights = r + log_weights
            log_weights = log_weights - (xp.max(log_weights, axis=0, keepdims=True) + log_sqrt_m)
            keys = _exp_flushed(log_weights[:, :, None] + (a_k - r)[:, None, :])
        else:
            # F4-F7 as printed: phi of Eq. 4 and e^{g / tau}
            query_features = xp.exp(a_q - log_sqrt_m)
            keys = xp.exp(log_weights)[:, :, None] * xp.exp(a_k - log_sqrt_m)[:, None, :]
        flat_keys = keys.reshape(n, samples * m)  # (N, K m), sample-major columns
        # F8 U_s = K~_s^T V for all s at once: (K m, N) @ (N, d_v); O_s = K~_s^T 1 (line 7)
        kv = flat_keys.T @ v  # (K m, d_v)
        k_sum = xp.sum(flat_keys, axis=0).reshape(samples, m)  # (K, m)
        # F9 denominators phi_q O_s^T: (N, m) @ (m, K) -> (N, K)  (line 8)
        denominators = query_features @ k_sum.T
        if not bool(xp.all(xp.isfinite(denominators) & (denominators > 0))):
            raise NonFiniteError(_denominator_message(self, denominators))
        # F10 Z_u = sum_s phi_q[u] U_s / (K den_us): normalise each sample, average (line 8);
        #     one product over the stacked samples, (N, K m) @ (K m, d_v) -> (N, d_v)
        coefficients = 1.0 / (samples * denominators)  # (N, K)
        z = _mixing(coefficients, query_features) @ kv
        cache = KernelizedSoftmaxCache(
            q_scaled,
            k_scaled,
            v,
            omega,
            query_features,
            keys,
            kv,
            k_sum,
            denominators,
            coefficients,
        )
        return z, cache

    def backward(
        self, params: dict[str, Any], cache: KernelizedSoftmaxCache, d_z: Any
    ) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
        """Gradients of ``<d_z, z>``: ``((d_q (N, d), d_k (N, d), d_v (N, d_v)), {})``."""
        v = cache.v
        check_cotangent(d_z, v.shape, v.dtype, v, name="d_z")
        xp = get_array_module(d_z, v)
        query_features, keys, kv, k_sum = cache.query_features, cache.keys, cache.kv, cache.k_sum
        coefficients = cache.coefficients
        n, samples, m = keys.shape
        # B10 (of F10) z = P kv with P[u, (s, i)] = coef_us phi_q[u, i]
        d_kv = _mixing(coefficients, query_features).T @ d_z  # (K m, N) @ (N, d_v)
        d_mixing = (d_z @ kv.T).reshape(n, samples, m)  # (N, d_v) @ (d_v, K m)
        d_query_features = xp.einsum("nk,nkm->nm", coefficients, d_mixing)  # (N, m)
        d_coefficients = xp.einsum("nkm,nm->nk", d_mixing, query_features)  # (N, K)
        # coef = 1 / (K den): d coef / d den = -coef / den
        d_denominators = -d_coefficients * coefficients / cache.denominators  # (N, K)
        # B9 (of F9) den = phi_q O^T: (N, K) @ (K, m); (K, N) @ (N, m)
        d_query_features = d_query_features + d_denominators @ k_sum
        d_k_sum = d_denominators.T @ query_features  # (K, m)
        # B8 (of F8) d_K~ = V d_U^T + 1 d_O^T; d_V = K~ d_U
        flat_keys = keys.reshape(n, samples * m)
        d_v = flat_keys @ d_kv  # (N, K m) @ (K m, d_v)
        d_keys = (v @ d_kv.T).reshape(n, samples, m) + d_k_sum[None]  # (N, K, m)
        # B7-B3 (of F7-F3): the features are exp(a - shift) / sqrt(m), so d a = sum of d_phi phi;
        # nothing flows into g (noise) or into the shifts: each is held constant, which is exact
        # because Z does not depend on them (module docstring)
        d_a_q = d_query_features * query_features  # (N, m)
        d_a_k = xp.einsum("nkm,nkm->nm", d_keys, keys)  # (N, m), summed over the samples
        # B2 (of F2) through Eq. 4's exponent a = x omega^T - ||x||^2 / 2  (N, d)
        omega = cache.omega
        d_q_scaled = feature_exponent_backward(cache.q_scaled, omega, d_a_q)
        d_k_scaled = feature_exponent_backward(cache.k_scaled, omega, d_a_k)
        # B1 (of F1)
        scale = 1.0 / math.sqrt(self.tau)
        return (d_q_scaled * scale, d_k_scaled * scale, d_v), {}

    @staticmethod
    def sample_outputs(cache: KernelizedSoftmaxCache) -> Any:
        """Each sample's normalised output before the average (Eq. 7's ratio per ``s``):
        ``phi_q U_s / den_s``, ``(K, N, d_v)``; ``z`` is their mean."""
        samples, m = cache.k_sum.shape
        kv = cache.kv.reshape(samples, m, -1)  # (K, m, d_v)
        return (cache.query_features @ kv) / cache.denominators.T[:, :, None]


def _mixing(coefficients: Any, query_features: Any) -> Any:
    """``P (N, K m)``: ``P[u, (s, i)] = coef_us phi_q[u, i]``, F10's query side."""
    n = coefficients.shape[0]
    return (coefficients[:, :, None] * query_features[:, None, :]).reshape(n, -1)


def _exp_flushed(exponent: Any) -> Any:
    """``exp(exponent)`` (in place), exactly 0 where it would fall below ``tiny * e^40``.

    Subnormal floats (below ``finfo.tiny``: ``1.2e-38`` in float32) make every product
    they enter 10-100 times slower on x86; with Gumbel noise at ``tau = 0.25`` a fifth
    of the key weights land there in float32. Flushing at ``tiny * e^40`` (``2.8e-21``
    in float32, ``5e-291`` in float64) keeps products with factors down to ``e^-40``
    normal too. The flushed features are below ``2.8e-21`` while every row of the
    query features and every sample's keys hold a ``1 / sqrt(m)``, so the sums they
    enter change by at most ``N m 2.8e-21`` relative, far below float32's ``6e-8``.
    """
    xp = get_array_module(exponent)
    cut = math.log(float(xp.finfo(exponent.dtype).tiny)) + 40.0
    exponent[exponent < cut] = -math.inf
    return xp.exp(exponent, out=exponent)


def _denominator_message(block: KernelizedSoftmax, denominators: Any) -> str:
    xp = get_array_module(denominators)
    bad = int(xp.sum(~(xp.isfinite(denominators) & (denominators > 0))))
    where = f"{bad} of {denominators.size} (sample, query) denominators"
    if not block.stabilize:
        return (
            f"KernelizedSoftmax: {where} of Eq. 5/7 over- or underflowed with stabilize=False "
            "(exp(w^T x) and e^(g/tau) evaluated as printed); use stabilize=True"
        )
    return (
        f"KernelizedSoftmax: {where} of Eq. 5/7 are 0 or not finite: ||q|| / sqrt(tau) or "
        f"||k|| / sqrt(tau) is too large (tau = {block.tau}) for the random features to "
        "resolve; scale q and k down, raise tau, or draw more features"
    )


def _check_inputs(
    owner: str, params: Any, q: Any, k: Any, v: Any, gumbel: Any, omega: Any = None
) -> Any:
    """Shapes, finiteness, one dtype, one backend; returns the array module."""
    check_params(params, {}, owner)
    xp = check_input(q, "q", shape=(None, None))
    n, d = q.shape
    if n == 0 or d == 0:
        raise ValueError(f"{owner}: q has shape {(n, d)}; attention needs N >= 1 nodes, d >= 1")
    check_input(k, "k", shape=(n, d))
    check_input(v, "v", shape=(n, None))
    if v.shape[1] == 0:
        raise ValueError(f"{owner}: v has shape {tuple(v.shape)}; it needs d_v >= 1 columns")
    named = {"k": k, "v": v}
    if omega is not None:
        check_features_input(q, omega, owner, name="q")
        named["omega"] = omega
    if gumbel is not None:
        shape = getattr(gumbel, "shape", None)
        if shape is not None and len(shape) == 2:
            if shape[0] != n and shape[1] == n:
                raise ValueError(
                    f"{owner}: gumbel has shape {tuple(shape)} but must be (N, K) = "
                    f"({n}, K): one value per key node and sample; pass gumbel.T"
                )
        check_input(gumbel, "gumbel", shape=(n, None))
        if gumbel.shape[1] == 0:
            raise ValueError(f"{owner}: gumbel has no columns; pass K >= 1 samples or None")
        named["gumbel"] = gumbel
    check_like(named, q, "q", owner)
    return xp
