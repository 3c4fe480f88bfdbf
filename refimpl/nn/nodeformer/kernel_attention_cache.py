"""``KernelizedSoftmaxCache``: what
:class:`refimpl.nn.nodeformer.kernel_attention.KernelizedSoftmax`'s backward reads."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["KernelizedSoftmaxCache"]


class KernelizedSoftmaxCache(NamedTuple):
    """What :meth:`KernelizedSoftmax.backward` reads (``K`` = samples, 1 without gumbel).

    Per-node arrays are stored transposed, one column per node, so a row block's slice
    runs along the nodes with unit stride. The key features ``K~`` (``K m`` per node) are
    not kept: each block rebuilds them from ``log_weights`` and ``key_exponents``
    (:func:`~refimpl.nn.nodeformer.kernel_attention.key_features`).

    Attributes
    ----------
    q, k : array, (N, d)
        Queries and keys (the features are taken of ``q / sqrt(tau)``, ``k / sqrt(tau)``).
    v : array, (N, d_v)
        Values.
    omega : array, (m, d)
        The projection, held fixed.
    query_features : array, (m, N)
        ``phi(q_u / sqrt tau)``, per-query shift.
    key_exponents : array, (m, N)
        ``a(k_v / sqrt tau) - r_v``: ``phi(k_v)``'s exponent, per-key shift.
    log_weights : array, (K, N)
        ``r_v + g_vs / tau - c_s - log sqrt(m)``: key ``v``'s log-weight in sample ``s``.
    kv : array, (K m, d_v)
        ``U_s = K~_s^T V`` stacked over ``s`` (Alg. 1 line 7).
    k_sum : array, (K, m)
        ``O_s = K~_s^T 1`` (Alg. 1 line 7).
    denominators : array, (K, N)
        ``O_s phi(q_u)``.
    coefficients : array, (K, N)
        ``1 / (K den_su)``: sample ``s``'s weight in query ``u``'s average.
    """

    q: Any
    k: Any
    v: Any
    omega: Any
    query_features: Any
    key_exponents: Any
    log_weights: Any
    kv: Any
    k_sum: Any
    denominators: Any
    coefficients: Any
