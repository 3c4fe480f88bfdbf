"""Exact all-pair softmax attention of NodeFormer, O(N^2): Eq. 2 (with ``tau``) and Eq. 6 (Gumbel).

Queries, keys and values are rows: ``Q, K (N, d)``, ``V (N, d_v)``; the output is
``Z (N, d_v)``; Gumbel noise ``g (N, K)`` holds one value per *key* node and sample::

    Z = softmax(Q K^T / tau) V                                  (Eq. 2, with tau)
    Z = (1/K) sum_s softmax((Q K^T + 1 g[:, s]^T) / tau) V      (Eq. 6, 15)

It forms ``N x N`` (``K`` of them): the ground truth for
:class:`~refimpl.nn.nodeformer.kernel_attention.KernelizedSoftmax` at small ``N``, which
estimates it in ``O(N)``. With ``N = 1`` every softmax is exactly 1, so ``d_Q = d_K = 0``
exactly (``Z`` and ``d_V`` are means of ``K`` equal terms: a few ulps). ``gumbel`` is
noise: it gets no gradient. :func:`check_attention_inputs` validates the inputs of both
forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.fields import check_nonnegative_number
from refimpl.nn.nodeformer.random_features import check_features_input
from refimpl.validation import (
    NonFiniteError,
    check_cotangent,
    check_input,
    check_like,
    check_params,
)

__all__ = ["AllPairSoftmax", "AllPairSoftmaxCache", "check_attention_inputs"]


class AllPairSoftmaxCache(NamedTuple):
    """What :meth:`AllPairSoftmax.backward` reads.

    Attributes
    ----------
    q, k : array, (N, d)
        Queries and keys.
    v : array, (N, d_v)
        Values.
    probabilities : array, (K, N, N)
        The row softmax of ``(Q K^T + 1 g_s^T) / tau`` per sample; ``K = 1`` without gumbel.
    """

    q: Any
    k: Any
    v: Any
    probabilities: Any


@dataclass(frozen=True)
class AllPairSoftmax:
    r"""Exact all-pair softmax attention, NodeFormer Eq. (2) (with $\tau$) and Eq. (6) (Gumbel).

    With Gumbel noise $g_{vs}$ per key $v$ and sample $s = 1..K$ (Eq. (6), its $K$-sample
    average Eq. (15); Eq. (2) is $K = 1$, $g = 0$):

    $$
    \mathbf{Z} = \frac{1}{K} \sum_{s=1}^{K} \operatorname{softmax}\big((\mathbf{Q}
    \mathbf{K}^\top + \mathbf{1} \mathbf{g}_s^\top) / \tau\big) \mathbf{V}
    $$

    with the softmax over each row (the keys). $O(K N^2)$ time and memory: the ground truth
    for :class:`~refimpl.nn.KernelizedSoftmax` at small $N$.

    Parameters
    ----------
    tau : float, default 1.0
        $\tau > 0$, the temperature; 1 is Eq. (2) as printed (the authors' code: 0.25).

    Shapes
    ------
    - **input**: ``q``, ``k`` $(N, d)$; ``v`` $(N, d_v)$; ``gumbel`` $(N, K)$ or None
      (noise: no gradient)
    - **output**: ``z`` $(N, d_v)$
    - **backward**: ``d_z`` $(N, d_v)$; returns ``((d_q, d_k, d_v), {})``
    """

    tau: float = 1.0  # temperature; 1 is Eq. 2 as printed (the authors' code defaults to 0.25)

    def __post_init__(self) -> None:
        check_nonnegative_number(self.tau, "AllPairSoftmax tau", allow_zero=False)

    def forward(
        self, params: dict[str, Any], q: Any, k: Any, v: Any, gumbel: Any = None
    ) -> tuple[Any, AllPairSoftmaxCache]:
        """``Z``: q, k (N, d), v (N, d_v), gumbel (N, K) or None -> (N, d_v), and the cache."""
        xp = check_attention_inputs("AllPairSoftmax", params, q, k, v, gumbel)
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


def check_attention_inputs(
    owner: str, params: Any, q: Any, k: Any, v: Any, gumbel: Any, omega: Any = None
) -> Any:
    """Shapes, finiteness, one dtype, one backend of an all-pair attention's inputs (``omega``
    only for the kernelised form); returns the array module.

    Parameters
    ----------
    owner : str
        The block named in the messages.
    params : dict
        Must be ``{}``.
    q, k : array, (N, d)
        Queries and keys.
    v : array, (N, d_v)
        Values.
    gumbel : array, (N, K), or None
        The Gumbel noise.
    omega : array, (m, d), optional
        The projection (kernelised form only).
    """
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
