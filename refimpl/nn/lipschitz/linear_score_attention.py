"""``Attention``: LipschitzNorm Eq. 4 with the linear score ``g~(X) = Q^T X`` (Eq. 15, 17).

``X`` is ``(d, n)`` (input vectors as columns), ``Q`` is ``(d, m)`` (a parameter,
one query per output), scores and probabilities ``(m, n)``, output ``(d, m)``::

    Att(X) = X softmax(g(X))^T                                         (Eq. 4)
    g = Q^T X                                      (normalization=None)
    g = Q^T X / (||Q||_F ||X^T||_(inf,2))          ("linear", Eq. 17)
    g = alpha Q^T X / max{||Q^T X||_(2,inf), ||X^T||_(inf,2) ||Q||_*}   ("lipschitz", Eq. 15)

Eq. 15 uses ``L_{F,(2,inf)}(Q^T X) = ||Q||_*`` exactly (proof of Cor. 1), where
Eq. 17 uses the bound ``||Q||_F``. Conventions (ties, zero denominators, the
rounding clip) are those of :mod:`refimpl.nn.lipschitz.score_norms`; the overview is in
:mod:`refimpl.nn.lipschitz.multi_head_attention`, which exports this block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray
from refimpl.nn.attention_common import (
    check_alpha,
    check_normalization,
    check_tangent,
    check_with_params,
    glorot,
    positive_int,
    softmax_rows,
    softmax_rows_derivative,
)
from refimpl.nn.lipschitz.score_norms import (
    linear_norm,
    linear_norm_backward,
    linear_norm_jvp,
    lipschitz_norm,
    lipschitz_norm_backward,
    lipschitz_norm_jvp,
)
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.validation import check_cotangent

__all__ = ["Attention", "AttentionCache"]


class AttentionCache(NamedTuple):
    """What :meth:`Attention.backward` and :meth:`Attention.jvp` read.

    Attributes
    ----------
    x : array, (d, n)
        The input.
    raw : array, (m, n)
        ``g~ = Q^T X``.
    scores : array, (m, n)
        ``g(X)``.
    probabilities : array, (m, n)
        ``softmax(g(X))``, row-wise.
    denominator : 0-d array or None
        Eq. 17's ``c = ||Q||_F ||X^T||_(inf,2)``; Eq. 15's ``max{...}``, so that ``g = alpha
        g~ / denominator`` (Sec. 9.6's ``alpha c(X)``); None when unnormalised.
    norm : LinearNormCache, LipschitzNormCache or None
        The normalisation's cache (:mod:`refimpl.nn.lipschitz.score_norms`).
    """

    x: Any
    raw: Any
    scores: Any
    probabilities: Any
    denominator: Any
    norm: Any


@dataclass(frozen=True)
class Attention:
    r"""Attention with the linear score $\tilde g(\mathbf{X}) = \mathbf{Q}^\top \mathbf{X}$
    (LipschitzNorm, Dasoulas et al. 2021, Eq. (4)), normalised by Eq. (17) or Eq. (15).

    Input vectors are the columns of $\mathbf{X}$ $(d, n)$, $\mathbf{Q}$ $(d, m)$ a
    parameter, the softmax row-wise (Eq. (3)):

    $$
    \begin{gathered}
    \operatorname{Att}(\mathbf{X}) = \mathbf{X} \operatorname{softmax}(g(\mathbf{X}))^\top
    \\
    g = \frac{\mathbf{Q}^\top \mathbf{X}}{\lVert \mathbf{Q} \rVert_F
    \lVert \mathbf{X}^\top \rVert_{\infty,2}} \quad \text{(Eq. (17))}
    \\
    g = \frac{\alpha \mathbf{Q}^\top \mathbf{X}}{\max\{\lVert \mathbf{Q}^\top \mathbf{X}
    \rVert_{2,\infty}, \lVert \mathbf{X}^\top \rVert_{\infty,2} \lVert \mathbf{Q}
    \rVert_*\}} \quad \text{(Eq. (15))}
    \end{gathered}
    $$

    Eq. (15) with $L = \lVert \mathbf{Q} \rVert_*$, the exact $L_{F,(2,\infty)}$ of
    $\mathbf{Q}^\top \mathbf{X}$ (proof of Cor. 1). :meth:`jvp` is Eq. (8) with
    $\mathbf{Q}$ fixed; :meth:`backward` its exact adjoint.

    Parameters
    ----------
    dim : int
        $d$, the length of each input vector (rows of $\mathbf{X}$).
    num_outputs : int
        $m$, the output vectors (columns of $\mathbf{Q}$).
    normalization : {None, "linear", "lipschitz"}, default None
        None: $g = \mathbf{Q}^\top \mathbf{X}$; ``"linear"``: Eq. (17); ``"lipschitz"``:
        Eq. (15).
    alpha : float, default 1.0
        Eq. (15)'s score bound $\alpha \ge 0$ (1 is the paper's choice, Sec. 5, Thm 3); read
        only by ``"lipschitz"``.

    Shapes
    ------
    - **input**: ``x`` $(d, n)$; ``params`` ``{"Q": (d, m)}``
    - **output**: $(d, m)$
    - **backward**: ``d_out`` $(d, m)$; returns ``(d_x (d, n), {"Q": (d, m)})``
    - **jvp**: ``d_x`` $(d, n)$; returns $(d, m)$
    """

    dim: int  # d, length of each input vector (rows of X)
    num_outputs: int  # m, output vectors (columns of Q)
    normalization: str | None = None  # None | "linear" (Eq. 17) | "lipschitz" (Eq. 15)
    alpha: float = 1.0  # Eq. 15 score bound; 1 is the paper's choice (Sec. 5, Thm 3)

    def __post_init__(self) -> None:
        positive_int("Attention", "dim", self.dim)
        positive_int("Attention", "num_outputs", self.num_outputs)
        check_normalization("Attention", self.normalization, (None, "linear", "lipschitz"))
        check_alpha("Attention", self.alpha)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{"Q": (d, m)}``: one query vector per output, as columns."""
        return {"Q": (self.dim, self.num_outputs)}

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Glorot-uniform ``Q``: ``U(-b, b)``, ``b = sqrt(6 / (d + m))``, drawn on the host."""
        shape = self.param_shapes()["Q"]
        return {"Q": asarray(glorot(rng, shape, shape), backend=backend, dtype=dtype)}

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, AttentionCache]:
        """``Att(X) = X softmax(g(X))^T``: x (d, n) -> out (d, m), and the cache."""
        check_with_params(params, self.param_shapes(), "Attention", x, self.dim)
        out, cache = self.forward_unchecked(params, x)
        check_overflow(out, "Attention.forward: its output", x.dtype)
        return out, cache

    def forward_unchecked(self, params: dict[str, Any], x: Any) -> tuple[Any, AttentionCache]:
        q = params["Q"]
        # F1 raw scores g~ = Q^T X: (m, d) @ (d, n) -> (m, n)
        raw = q.T @ x
        # F2 normalised scores g (m, n)
        norm = denominator = None
        if self.normalization == "linear":
            scores, norm = linear_norm(raw, x, q)
        elif self.normalization == "lipschitz":
            scores, norm = lipschitz_norm(raw, x, q, self.alpha)
        else:
            scores = raw
        if norm is not None:
            denominator = norm.denominator
        # F3 row-wise softmax (m, n)
        probabilities = softmax_rows(scores)
        # F4 out = X P^T: (d, n) @ (n, m) -> (d, m)
        out = x @ probabilities.T
        return out, AttentionCache(x, raw, scores, probabilities, denominator, norm)

    def backward(
        self, params: dict[str, Any], cache: AttentionCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_x (d, n), {"Q": (d, m)})``."""
        x = cache.x
        check_cotangent(d_out, (self.dim, self.num_outputs), x.dtype, x, name="d_out")
        return backward_checked(
            lambda: self.backward_unchecked(params, cache, d_out), "Attention", x.dtype
        )

    def backward_unchecked(
        self, params: dict[str, Any], cache: AttentionCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        x, q, probabilities = cache.x, params["Q"], cache.probabilities
        # B4 (of F4): (d, m) @ (m, n) -> (d, n); (m, d) @ (d, n) -> (m, n)
        d_x = d_out @ probabilities
        d_probabilities = d_out.T @ x
        # B3 (of F3)
        d_scores = softmax_rows_derivative(probabilities, d_probabilities)  # (m, n)
        # B2 (of F2) through the denominator: it reads raw, X and Q
        if self.normalization == "linear":
            d_raw, d_x_norm, d_q = linear_norm_backward(cache.norm, d_scores)
            d_x = d_x + d_x_norm
        elif self.normalization == "lipschitz":
            d_raw, d_x_norm, d_q = lipschitz_norm_backward(cache.norm, d_scores)
            d_x = d_x + d_x_norm
        else:
            d_raw, d_q = d_scores, 0
        # B1 (of F1) raw = Q^T X: (d, m) @ (m, n) -> (d, n); (d, n) @ (n, m) -> (d, m)
        d_x = d_x + q @ d_raw
        d_q = d_q + x @ d_raw.T
        return d_x, {"Q": d_q}

    def jvp(self, params: dict[str, Any], cache: AttentionCache, d_x: Any) -> Any:
        """``D Att_X (H)`` (Eq. 8) for ``H = d_x (d, n)``, ``Q`` fixed: ``(d, m)``."""
        check_tangent(d_x, cache.x)
        return self._jvp(params, cache, d_x)

    def _jvp(self, params: dict[str, Any], cache: AttentionCache, d_x: Any) -> Any:
        x, probabilities = cache.x, cache.probabilities
        # J1 (of F1): (m, d) @ (d, n) -> (m, n)
        d_raw = params["Q"].T @ d_x
        # J2 (of F2)
        if self.normalization == "linear":
            d_scores = linear_norm_jvp(cache.norm, d_raw, d_x)
        elif self.normalization == "lipschitz":
            d_scores = lipschitz_norm_jvp(cache.norm, d_raw, d_x)
        else:
            d_scores = d_raw
        # J3 (of F3) (m, n)
        d_probabilities = softmax_rows_derivative(probabilities, d_scores)
        # J4 (of F4) Eq. 8: H P^T + X (D softmax)^T, (d, m)
        return d_x @ probabilities.T + x @ d_probabilities.T
