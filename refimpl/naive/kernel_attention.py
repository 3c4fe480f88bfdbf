"""Literal twin of NodeFormer's kernelised (Gumbel-)softmax, NodeFormer Eq. 5-7, Alg. 1.

With ``phi`` of Eq. 4 (:func:`refimpl.naive.random_features.prf`), queries ``q (N, d)``,
keys ``k (N, d)``, values ``v (N, d_v)``, temperature ``tau`` and Gumbel noise
``g (N, K)`` (one value per key node ``v`` and sample ``s``, shared by all queries)::

    Z_u = (1/K) sum_s  phi(q_u/sqrt tau)^T sum_v e^{g_vs/tau} phi(k_v/sqrt tau) v_v^T
                     / phi(q_u/sqrt tau)^T sum_w e^{g_ws/tau} phi(k_w/sqrt tau)
                                                          (Eq. 7; Alg. 1 lines 4-8)

Without noise (``gumbel=None``) it is Eq. 5 at ``q / sqrt(tau)``, ``k / sqrt(tau)``
(``K = 1``, ``g = 0``). Alg. 1 line 6 also multiplies the query features by ``G_k``: a
per-query factor of numerator and denominator, which cancels, so it is left out here as
in production. The backward is the chain rule through F5..F1, step by step.

No shifts, no floor: every feature is ``exp`` of Eq. 4's exponent as printed, and
``e^{g/tau}`` as printed. Production (``KernelizedSoftmax``) evaluates the same ratios
with max-shifts that cancel and, with ``stabilize=True``, a floor on its exponentials:
``exp(max(a, cut)) - e^cut``, ``cut = log(tiny) + 40`` (``e^cut = 5e-291`` in float64),
applied to exponents already shifted so that each query's and each sample's largest is
``-log sqrt(m)``. The floor changes nothing (not even a rounding) while every shifted
exponent stays above ``cut + 53 log 2`` (``cut + 37``): ``exp(a) - e^cut`` then rounds back
to ``exp(a)``. This twin does not replicate the floor; the tests draw inputs whose exponents
spread by far less than that (:func:`exponent_spread`), so it never binds.

The layer (a ``KernelizedSoftmax``) is read for ``tau`` only: ``stabilize`` changes how
production evaluates the ratios, not what they are. ``omega`` and ``gumbel`` are noise and
get no gradient. NumPy on the host, float64, sharing no code with
:mod:`refimpl.nn.nodeformer.kernel_attention`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refimpl.naive.random_features import prf, prf_backward

__all__ = [
    "KernelizedSoftmaxTwinCache",
    "exponent_spread",
    "kernelized_softmax_backward",
    "kernelized_softmax_forward",
]


class KernelizedSoftmaxTwinCache(NamedTuple):
    """The quantities Eq. 7 names, kept for the backward."""

    q: np.ndarray  # (N, d)
    k: np.ndarray  # (N, d)
    v: np.ndarray  # (N, d_v)
    omega: np.ndarray  # (m, d)
    gumbel: np.ndarray  # (N, K); zeros (N, 1) without noise
    phi_q: np.ndarray  # (N, m) phi(q_u / sqrt tau)
    phi_k: np.ndarray  # (N, m) phi(k_v / sqrt tau)
    weights: np.ndarray  # (N, K) e^{g_vs / tau}
    kv: np.ndarray  # (K, m, d_v) U_s = sum_v e^{g_vs/tau} phi(k_v) v_v^T
    k_sum: np.ndarray  # (K, m) O_s = sum_v e^{g_vs/tau} phi(k_v)
    numerators: np.ndarray  # (K, N, d_v) phi(q_u)^T U_s
    denominators: np.ndarray  # (K, N) phi(q_u)^T O_s


def kernelized_softmax_forward(
    layer: Any,
    params: dict,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega: np.ndarray,
    gumbel: np.ndarray | None = None,
) -> tuple[np.ndarray, KernelizedSoftmaxTwinCache]:
    """``Z (N, d_v)`` of Eq. 7 (Eq. 5 without ``gumbel``) and the cache; ``params`` is ``{}``."""
    tau = layer.tau
    g = np.zeros((q.shape[0], 1)) if gumbel is None else gumbel  # (N, K)
    samples = g.shape[1]
    # F1 random features of Eq. 4 at q / sqrt(tau) and k / sqrt(tau)  (N, m)
    phi_q = prf(q / math.sqrt(tau), omega)
    phi_k = prf(k / math.sqrt(tau), omega)
    # F2 Gumbel weights e^{g_vs / tau} (Alg. 1 line 4)  (N, K)
    weights = np.exp(g / tau)
    # F3 per sample, the shared sums of Eq. 7 (Alg. 1 lines 6-7)
    kv = np.einsum("vs,vi,vc->sic", weights, phi_k, v)  # (K, m, d_v)
    k_sum = np.einsum("vs,vi->si", weights, phi_k)  # (K, m)
    # F4 per query and sample, numerator and denominator of Eq. 7 (Alg. 1 line 8)
    numerators = np.einsum("ui,sic->suc", phi_q, kv)  # (K, N, d_v)
    denominators = np.einsum("ui,si->su", phi_q, k_sum)  # (K, N)
    # F5 each sample normalised on its own, then the K samples averaged (Alg. 1 line 8)
    z = np.sum(numerators / denominators[:, :, None], axis=0) / samples  # (N, d_v)
    cache = KernelizedSoftmaxTwinCache(
        q, k, v, omega, g, phi_q, phi_k, weights, kv, k_sum, numerators, denominators
    )
    return z, cache


def kernelized_softmax_backward(
    layer: Any, params: dict, cache: KernelizedSoftmaxTwinCache, d_z: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], dict]:
    """Gradients of ``<d_z, Z>``: ``((d_q (N, d), d_k (N, d), d_v (N, d_v)), {})``."""
    tau = layer.tau
    c = cache
    samples = c.weights.shape[1]
    # B5 (of F5) z = (1/K) sum_s num_s / den_s
    d_numerators = d_z[None, :, :] / (samples * c.denominators[:, :, None])  # (K, N, d_v)
    d_denominators = -np.einsum("uc,suc->su", d_z, c.numerators) / (
        samples * c.denominators**2
    )  # (K, N)
    # B4 (of F4) num = phi_q U_s, den = phi_q O_s
    d_phi_q = np.einsum("suc,sic->ui", d_numerators, c.kv) + np.einsum(
        "su,si->ui", d_denominators, c.k_sum
    )  # (N, m)
    d_kv = np.einsum("ui,suc->sic", c.phi_q, d_numerators)  # (K, m, d_v)
    d_k_sum = np.einsum("ui,su->si", c.phi_q, d_denominators)  # (K, m)
    # B3 (of F3) U_s = sum_v w_vs phi_k[v] v_v^T, O_s = sum_v w_vs phi_k[v]
    d_phi_k = np.einsum("vs,sic,vc->vi", c.weights, d_kv, c.v) + np.einsum(
        "vs,si->vi", c.weights, d_k_sum
    )  # (N, m)
    d_v = np.einsum("vs,vi,sic->vc", c.weights, c.phi_k, d_kv)  # (N, d_v)
    # B2 (of F2) the weights are noise: nothing flows into g
    # B1 (of F1) Eq. 4 at x / sqrt(tau): the chain rule through the scaling
    d_q = prf_backward(c.q / math.sqrt(tau), c.omega, c.phi_q, d_phi_q) / math.sqrt(tau)
    d_k = prf_backward(c.k / math.sqrt(tau), c.omega, c.phi_k, d_phi_k) / math.sqrt(tau)
    return (d_q, d_k, d_v), {}


def exponent_spread(cache: KernelizedSoftmaxTwinCache, tau: float) -> float:
    """How far below its group's largest the smallest exponent lies, over the groups that
    production shifts as one: each query's ``m`` feature exponents, and each sample's ``N m``
    key exponents ``a(k_v / sqrt tau)_i + g_vs / tau``. Production's floor (module docstring)
    cannot bind while this stays below ``-cut - 53 log 2 - log sqrt(m)`` (about 630 in
    float64 at m <= 8)."""
    m = cache.omega.shape[0]
    a_q = np.log(cache.phi_q * math.sqrt(m))  # (N, m) Eq. 4's exponent at q / sqrt(tau)
    a_k = np.log(cache.phi_k * math.sqrt(m))  # (N, m)
    key_exponents = a_k[:, None, :] + cache.gumbel[:, :, None] / tau  # (N, K, m)
    query_spread = np.max(a_q, axis=1) - np.min(a_q, axis=1)  # (N,)
    key_spread = np.max(key_exponents, axis=(0, 2)) - np.min(key_exponents, axis=(0, 2))  # (K,)
    return float(max(np.max(query_spread), np.max(key_spread)))
