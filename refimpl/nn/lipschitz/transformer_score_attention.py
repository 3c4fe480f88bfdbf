"""``TransformerAttention``: LipschitzNorm Eq. 7 and its normalised form Eq. 19.

The input stacks queries, keys and values by rows, ``X = (Q||K||V)`` ``(3d, n)``;
scores and probabilities are ``(n, n)``; the output is ``V softmax(g)^T`` ``(d, n)``::

    g = Q^T K / sqrt(d)                                      (normalization=None, Eq. 7)
    g = Q^T K / max{uv, uw, vw}                              ("lipschitz", Eq. 19)
    u = ||Q||_F,  v = ||K^T||_(inf,2),  w = ||V^T||_(inf,2)

Conventions (ties in ``max{uv, uw, vw}`` and in the longest column, zero
denominators, the rounding clip) are those of :mod:`refimpl.nn.lipschitz.score_norms`; the
overview is in :mod:`refimpl.nn.lipschitz.multi_head_attention`, which exports this block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module
from refimpl.nn.attention_common import (
    check_normalization,
    check_tangent,
    check_with_params,
    positive_int,
    softmax_rows,
    softmax_rows_derivative,
)
from refimpl.nn.lipschitz.score_norms import (
    transformer_norm,
    transformer_norm_backward,
    transformer_norm_jvp,
)
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.validation import check_cotangent

__all__ = ["TransformerAttention", "TransformerAttentionCache"]


class TransformerAttentionCache(NamedTuple):
    """What :meth:`TransformerAttention.backward` and ``jvp`` read.

    Attributes
    ----------
    x : array, (3d, n)
        The input ``(Q||K||V)``.
    raw : array, (n, n)
        ``Q^T K``.
    scores : array, (n, n)
        ``g(X)``.
    probabilities : array, (n, n)
        ``softmax(g(X))``, row-wise.
    denominator : 0-d array
        ``sqrt(d)`` (Eq. 7) or ``max{uv, uw, vw}`` (Eq. 19).
    norm : TransformerNormCache or None
        Eq. 19's normalisation cache (:mod:`refimpl.nn.lipschitz.score_norms`), or None.
    """

    x: Any
    raw: Any
    scores: Any
    probabilities: Any
    denominator: Any
    norm: Any


@dataclass(frozen=True)
class TransformerAttention:
    r"""Transformer attention (LipschitzNorm, Dasoulas et al. 2021, Eq. (7)), normalised by
    Eq. (19).

    The input stacks queries, keys and values by rows, $\mathbf{X} = (\mathbf{Q} \Vert
    \mathbf{K} \Vert \mathbf{V})$ $(3d, n)$; the softmax is row-wise:

    $$
    \begin{gathered}
    \operatorname{Att}(\mathbf{X}) = \mathbf{V} \operatorname{softmax}(g)^\top
    \\
    g = \frac{\mathbf{Q}^\top \mathbf{K}}{\sqrt{d}} \ \text{(Eq. (7))}
    \quad \text{or} \quad
    g = \frac{\mathbf{Q}^\top \mathbf{K}}{\max\{u v, u w, v w\}} \ \text{(Eq. (19))}
    \end{gathered}
    $$

    with $u = \lVert \mathbf{Q} \rVert_F$, $v = \lVert \mathbf{K}^\top \rVert_{\infty,2}$,
    $w = \lVert \mathbf{V}^\top \rVert_{\infty,2}$. No parameters (``param_shapes() ==
    {}``).

    Parameters
    ----------
    dim : int
        $d$, the rows of each of $\mathbf{Q}$, $\mathbf{K}$, $\mathbf{V}$.
    normalization : {None, "lipschitz"}, default None
        None: Eq. (7); ``"lipschitz"``: Eq. (19).

    Shapes
    ------
    - **input**: ``x`` $(3d, n)$
    - **output**: $(d, n)$
    - **backward**: ``d_out`` $(d, n)$; returns ``(d_x (3d, n), {})``
    - **jvp**: ``d_x`` $(3d, n)$; returns $(d, n)$
    """

    dim: int  # d, rows of each of Q, K, V
    normalization: str | None = None  # None (Eq. 7) | "lipschitz" (Eq. 19)

    def __post_init__(self) -> None:
        positive_int("TransformerAttention", "dim", self.dim)
        check_normalization("TransformerAttention", self.normalization, (None, "lipschitz"))

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """No parameters: queries, keys and values are inputs."""
        return {}

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """``{}`` (kept for the common block protocol)."""
        return {}

    def _split(self, x: Any) -> tuple[Any, Any, Any]:
        d = self.dim
        return x[:d], x[d : 2 * d], x[2 * d :]  # (d, n) each, views

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, TransformerAttentionCache]:
        """``V softmax(g)^T``: x (3d, n) -> out (d, n), and the cache."""
        check_with_params(params, {}, "TransformerAttention", x, 3 * self.dim)
        out, cache = self.forward_unchecked(params, x)
        check_overflow(out, "TransformerAttention.forward: its output", x.dtype)
        return out, cache

    def forward_unchecked(
        self, params: dict[str, Any], x: Any
    ) -> tuple[Any, TransformerAttentionCache]:
        # F1 split X = (Q||K||V) by rows
        q, k, v = self._split(x)
        # F2 raw = Q^T K: (n, d) @ (d, n) -> (n, n)
        raw = q.T @ k
        # F3 scores (n, n)
        if self.normalization == "lipschitz":
            scores, norm = transformer_norm(raw, q, k, v)
            denominator = norm.denominator
        else:
            norm, denominator = None, get_array_module(x).asarray(math.sqrt(self.dim), x.dtype)
            scores = raw / denominator
        # F4 row-wise softmax (n, n)
        probabilities = softmax_rows(scores)
        # F5 out = V P^T: (d, n) @ (n, n) -> (d, n)
        out = v @ probabilities.T
        return out, TransformerAttentionCache(x, raw, scores, probabilities, denominator, norm)

    def backward(
        self, params: dict[str, Any], cache: TransformerAttentionCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_x (3d, n), {})``."""
        x = cache.x
        check_cotangent(d_out, (self.dim, x.shape[1]), x.dtype, x, name="d_out")
        return backward_checked(
            lambda: self.backward_unchecked(params, cache, d_out), "TransformerAttention", x.dtype
        )

    def backward_unchecked(
        self, params: dict[str, Any], cache: TransformerAttentionCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        xp = get_array_module(d_out)
        q, k, v = self._split(cache.x)
        probabilities = cache.probabilities
        # B5 (of F5): (d, n) @ (n, n) -> (d, n); (n, d) @ (d, n) -> (n, n)
        d_v = d_out @ probabilities
        d_probabilities = d_out.T @ v
        # B4 (of F4)
        d_scores = softmax_rows_derivative(probabilities, d_probabilities)  # (n, n)
        # B3 (of F3)
        if self.normalization == "lipschitz":
            d_raw, d_q, d_k, d_v_norm = transformer_norm_backward(cache.norm, d_scores)
            d_v = d_v + d_v_norm
        else:
            d_raw, d_q, d_k = d_scores / cache.denominator, 0, 0
        # B2 (of F2) raw = Q^T K: (d, n) @ (n, n) -> (d, n) for both
        d_q = d_q + k @ d_raw.T
        d_k = d_k + q @ d_raw
        # B1 (of F1) the split's adjoint is the concatenation (3d, n)
        return xp.concatenate([d_q, d_k, d_v], axis=0), {}

    def jvp(self, params: dict[str, Any], cache: TransformerAttentionCache, d_x: Any) -> Any:
        """``D Att_X (H)`` for ``H = d_x (3d, n)``: ``(d, n)``."""
        check_tangent(d_x, cache.x)
        return self._jvp(params, cache, d_x)

    def _jvp(self, params: dict[str, Any], cache: TransformerAttentionCache, d_x: Any) -> Any:
        q, k, v = self._split(cache.x)
        probabilities = cache.probabilities
        # J1 (of F1)
        d_q, d_k, d_v = self._split(d_x)
        # J2 (of F2): (n, d) @ (d, n) -> (n, n), twice
        d_raw = d_q.T @ k + q.T @ d_k
        # J3 (of F3)
        if self.normalization == "lipschitz":
            d_scores = transformer_norm_jvp(cache.norm, d_raw, d_q, d_k, d_v)
        else:
            d_scores = d_raw / cache.denominator
        # J4 (of F4), J5 (of F5): H_V P^T + V (D softmax)^T, (d, n)
        d_probabilities = softmax_rows_derivative(probabilities, d_scores)
        return d_v @ probabilities.T + v @ d_probabilities.T
