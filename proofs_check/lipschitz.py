"""LipschitzNorm's Lipschitz bounds (Sec. 3-5, proofs in Sec. 9) on the true Jacobian.

Every check measures ``||D Att_X||_F``, the Frobenius -> Frobenius operator norm
of the derivative of a block of :mod:`refimpl.nn.attention` at an input ``X``:
the largest singular value of the block's Jacobian, assembled from its ``jvp``
or ``backward`` and decomposed by an exact SVD (:mod:`refimpl.jacobian`; sizes
are small). The bound is the paper's. Lemma 2 and Eq. 10 are checked in
:mod:`proofs_check.softmax`; here are

=======================  =============================================================
``lipschitz.lemma3``     ``||softmax(g)||_F <= e^a sqrt(m/n)`` for ``|g_ij| <= a`` (Eq. 12)
``lipschitz.eq28``       ``||A Dsoftmax_M(B)^T||_F <= ||A^T||_(inf,2) ||B||_(2,inf)``: the
                         step of Lemma 1's proof, with constant 1 (printed: sqrt 2)
``lipschitz.lemma1``     ``||D Att_X|| <= ||S||_F + sqrt2 ||h(X)^T||_(inf,2)
                         |||D g_X|||_(F,(2,inf))`` (Eq. 9; ``h(X) = X``, or ``V``, Remark 1)
``lipschitz.thm2``       ``||D Att_X|| <= e^a* sqrt(m/n) + a* sqrt8`` with ``a*`` the
                         smallest ``a`` meeting assumptions (1)-(3) at ``X`` (Eq. 14)
``lipschitz.thm3.*``     Eq. 15 scores: ``L_F <= e^a sqrt(m/n) + a sqrt8`` (Eq. 16)
``lipschitz.cor1``       Eq. 17 scores: ``L_F <= e sqrt(m/n) + sqrt8`` (Eq. 18)
``lipschitz.cor2``       Eq. 19 scores: ``L_F <= e^sqrt3 sqrt(m/n) + 2 sqrt6`` (Eq. 20)
``lipschitz.thm1``       multi-head: ``||D MultAtt_X|| <= ||W_O||_* (sum_k ||D Att_{W_k X}||^2
                         ||W_k||_*^2)^(1/2)``, the pointwise form of the proof of Eq. 6
``lipschitz.eq21``       normalised heads, ``m = n``: ``L_F(MultAtt) <= 11 ||W_O||_*
                         (sum_k ||W_k||_*^2)^(1/2)`` (Eq. 21)
``lipschitz.unnormalised_growth``  Kim et al. (2020), a lower bound: without
                         normalisation ``||D Att_{tX}||`` grows without bound in ``t``
=======================  =============================================================

Norms and shapes (Sec. 3.1 and the proof of Lemma 1): ``X`` is ``(d, n)``, one
input vector per *column*; scores ``(m, n)``; ``||M||_(inf,2) = max_i
||M_i,:||_2`` (so ``||X^T||_(inf,2)`` is the longest input vector);
``||M||_(2,inf) = sqrt(sum_i max_j M_ij^2)``; ``|||L|||_(F,(2,inf)) = max_H
||L(H)||_(2,inf) / ||H||_F``.

The score side is computed independently of the blocks, on the host, by
:func:`score_split`: ``g = g~ / c`` (Eq. 13) with ``D g = (D g~ - g grad c^T) /
c`` (Eq. 38) as dense matrices, and the (F, (2,inf)) operator norm *exactly*
(:func:`two_inf_operator_norm`). So the checks of Lemma 1 and Thm 2 test the
block's ``D Att_X`` against bounds built from the paper's score function, not
from the block's own. Every ``max`` is differentiated through its first
maximiser, as in :mod:`refimpl.nn.score_norms`; at an exact tie that is a
one-sided derivative, which satisfies the same pointwise bounds (the proofs
are pointwise, and the branch function meets the assumptions at ``X``).

Cases: fixed adversarial ones first (``n = 1``, ``m = 1``, ``m > n``, ``m < n``,
``X`` scaled by ``1e2`` and ``1e3``, column norms tied to the last bit or to
``1e-9``, columns aligned with the queries so scores reach their bound, tied
scores at scale 1 and ``1e3`` (where an unnormalised block's norm is ~1e3:
Kim et al.'s direction; at generic inputs the softmax saturates instead), a
zero column, every branch of the ``max`` in Eq. 15 and 19 and ties between
them, and the end of a short gradient ascent of ``||D Att_X||``), then
``ctx.cases`` random ones.

Rounding allowance: an upper bound ``B`` is reported as ``B (1 + (size(J) +
64) eps)``. The computed ``||D Att_X||`` carries the SVD's error (a few ``eps
||J|| max(shape)``, Golub & Van Loan Sec. 8.6) plus that of ``J``'s entries (a
few ulps of sums of ``n`` terms each); ``size(J) eps`` exceeds both. Equality is
attained by ``alpha = 0`` (uniform attention: ``||D Att_X|| = sqrt(m/n)``, the
bound), by Eq. 28's constant, by Lemma 1 where ``D g_X = 0`` (``d = n = 1``)
and by Thm 1's pointwise form (one head, rank-one maps).

Findings: every bound holds; Lemma 1 (so Thm 2, 3, Cor 1, 2) holds with
``sqrt2`` replaced by 1 (erratum ``lipschitznorm.lemma1.proof.convex_hull_factor``);
the adversarial search (:func:`tightness`, ``scripts/lipschitz_tightness.py``)
reaches 0.2-0.5 of Eq. 16/18 and 0.11-0.16 of Eq. 20.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from proofs_check import softmax
from proofs_check.registry import Context, WorstCase, check
from proofs_check.softmax import frobenius_allowance, row_softmax
from refimpl.backend import to_numpy
from refimpl.jacobian import attention_jacobian, operator_norm_exact
from refimpl.nn.attention import Attention, MultiHeadAttention, TransformerAttention
from refimpl.nn.score_norms import inf2_norm, two_inf_norm

__all__ = [
    "ALPHAS",
    "EQ21_CONSTANT",
    "EQ28_CONSTANT",
    "GROWTH_AT_LEAST",
    "GROWTH_SCALE",
    "Case",
    "Form",
    "MultiHeadCase",
    "ScoreSplit",
    "Tightness",
    "attention_cases",
    "cor1_bound",
    "cor2_bound",
    "eq21_bound",
    "eq28_ratio",
    "form_bound",
    "growth_curve",
    "inf2_norm",
    "jacobian_norm",
    "lemma1_bound",
    "multihead_cases",
    "rounding_allowance",
    "score_split",
    "thm1_bound",
    "thm2_alpha",
    "thm3_bound",
    "tied_case",
    "tightness",
    "two_inf_norm",
    "two_inf_operator_norm",
]

ALPHAS = (0.0, 0.5, 1.0, 2.0)  # Thm 3's alpha: 0 (uniform), the paper's 1, and either side
EQ28_CONSTANT = 1.0  # Eq. 28's constant as the proof's variance argument gives it (printed: sqrt2)
EQ21_CONSTANT = 11.0  # Eq. 21: e^sqrt3 + 2 sqrt6 = 10.55 (Cor 2 at m = n), rounded up
GROWTH_SCALE = 1e3  # X -> tX up to this t in the growth check
# Tied scores make the second term of Eq. 8 exactly linear in t (quadratic for the
# transformer), so the norm at t = 1e3 is ~1e3 (or ~1e6) times that at t = 1; an
# exponent-free bound such as Cor 1 gives a ratio of exactly 1 (the normalised
# scores are invariant under X -> tX). 100 separates the two by an order of magnitude.
GROWTH_AT_LEAST = 100.0
_SELECTIONS_MAX = 5000  # n^m row selections enumerated by two_inf_operator_norm
_EPS = float(np.finfo(np.float64).eps)


# -- norms (host, independent of refimpl.nn.score_norms) ----------------------------------------
def two_inf_operator_norm(jacobian: np.ndarray, m: int, n: int) -> float:
    """``|||L|||_(F,(2,inf)) = max_H ||L(H)||_(2,inf) / ||H||_F``, exactly, for ``L`` given by
    its ``(m n, P)`` matrix (row ``i n + j`` is the output entry ``(i, j)``).

    ``||L(H)||_(2,inf)^2 = sum_i max_j L(H)_ij^2 = max_s ||J_s h||^2`` over the
    ``n^m`` selections ``s`` of one column per row, ``J_s`` the ``m`` rows
    ``(i, s_i)``; swapping the two maxima, the norm is ``max_s ||J_s||_2``. Each
    ``||J_s||_2^2`` is the top eigenvalue of the ``m x m`` block of the Gram
    matrix ``J J^T``, all taken at once by a batched ``eigvalsh``. Raises for
    more than 5000 selections.
    """
    if m == 0 or n == 0 or jacobian.size == 0:
        return 0.0
    if n**m > _SELECTIONS_MAX:
        raise ValueError(f"{n}^{m} row selections is too many to enumerate; use smaller m, n")
    gram = jacobian @ jacobian.T  # (m n, m n)
    selections = np.array(list(itertools.product(range(n), repeat=m)))  # (n^m, m)
    rows = np.arange(m) * n + selections  # (n^m, m): flat index of entry (i, s_i)
    blocks = gram[rows[:, :, None], rows[:, None, :]]  # (n^m, m, m)
    top = np.linalg.eigvalsh(blocks)[:, -1]  # (n^m,)
    return float(np.sqrt(max(float(top.max()), 0.0)))


def _spectral(matrix: np.ndarray) -> float:
    return float(np.linalg.norm(matrix, 2)) if matrix.size else 0.0


def rounding_allowance(jacobian_size: int) -> float:
    """Relative allowance ``(size(J) + 64) eps`` on an upper bound (module docstring)."""
    return (jacobian_size + 64) * _EPS


# -- the bounds ----------------------------------------------------------------------------------
def thm3_bound(alpha: float, m: int, n: int) -> float:
    """Eq. 14 and 16: ``e^alpha sqrt(m/n) + alpha sqrt8``."""
    return float(np.exp(alpha) * np.sqrt(m / n) + alpha * np.sqrt(8.0))


def cor1_bound(m: int, n: int) -> float:
    """Eq. 18: ``e sqrt(m/n) + sqrt8``."""
    return float(np.e * np.sqrt(m / n) + np.sqrt(8.0))


def cor2_bound(m: int, n: int) -> float:
    """Eq. 20: ``e^sqrt3 sqrt(m/n) + 2 sqrt6``."""
    return float(np.exp(np.sqrt(3.0)) * np.sqrt(m / n) + 2.0 * np.sqrt(6.0))


def eq21_bound(w_out: np.ndarray, w_in: np.ndarray) -> float:
    """Eq. 21: ``11 ||W_O||_* sqrt(sum_k ||W_k||_*^2)``; ``w_in`` is ``(h, rows, d_I)``."""
    heads = np.sqrt(sum(_spectral(w) ** 2 for w in w_in))
    return float(EQ21_CONSTANT * _spectral(w_out) * heads)


def thm1_bound(w_out: np.ndarray, w_in: np.ndarray, head_norms: np.ndarray) -> float:
    """Pointwise Thm 1 (proof of Eq. 6, Sec. 9.1): ``||W_O||_* sqrt(sum_k ||D Att_{W_k X}||^2
    ||W_k||_*^2)``; ``head_norms[k] = ||D Att_{W_k X}||``. Eq. 6 replaces each head's norm
    by ``L_F(Att)``, their supremum, so this is the tighter of the two."""
    squares = [(h * _spectral(w)) ** 2 for h, w in zip(head_norms, w_in, strict=True)]
    return float(_spectral(w_out) * np.sqrt(sum(squares)))


# -- the forms and their score functions ---------------------------------------------------------
@dataclass(frozen=True)
class Form:
    """One attention form: ``kind`` "linear" (Eq. 4, ``g~ = Q^T X``) or "transformer"
    (Eq. 7, ``X = (Q||K||V)``), and its normalisation (None, "linear" = Eq. 17,
    "lipschitz" = Eq. 15 or, for the transformer, Eq. 19)."""

    kind: str = "linear"  # "linear" | "transformer"
    normalization: str | None = None  # None | "linear" (Eq. 17) | "lipschitz" (Eq. 15 / 19)
    alpha: float = 1.0  # Eq. 15 only

    @property
    def label(self) -> str:
        name = {None: "none", "linear": "Eq17", "lipschitz": "Eq15"}[self.normalization]
        if self.kind == "transformer":
            return "transformer " + ("Eq7" if self.normalization is None else "Eq19")
        return f"linear {name}" + (
            f" a={self.alpha:g}" if self.normalization == "lipschitz" else ""
        )

    def block(self, d: int, m: int) -> Any:
        """The block (looked up at call time, so a test can swap in a broken one)."""
        if self.kind == "transformer":
            return TransformerAttention(d, self.normalization)
        return Attention(d, m, self.normalization, self.alpha)


class Case(NamedTuple):
    """One input: host arrays ``x`` ``(d, n)`` (``(3d, n)`` for the transformer) and ``q``
    ``(d, m)`` (``None`` for the transformer), with a label saying why it is there."""

    form: Form
    x: np.ndarray
    q: np.ndarray | None
    label: str

    @property
    def dims(self) -> tuple[int, int, int]:
        """``(d, m, n)``."""
        n = self.x.shape[1]
        if self.form.kind == "transformer":
            return self.x.shape[0] // 3, n, n
        return self.x.shape[0], self.q.shape[1], n


class ScoreSplit(NamedTuple):
    """``g = g~ / c`` (Eq. 13) at ``X`` and the derivatives Thm 2 reads, on the host.

    ``P`` is ``X.size``; derivatives are matrices in the layout of
    :mod:`refimpl.jacobian` (rows: score entries ``i n + j``; columns: ``X``'s
    entries in C order).
    """

    raw: np.ndarray  # (m, n) g~(X)
    raw_jacobian: np.ndarray  # (m n, P) D g~_X
    c: float  # c(X) > 0
    c_gradient: np.ndarray  # (P,) grad c(X): |||D c_X|||_(F,1) = ||grad c||_2
    values: np.ndarray  # h(X) (d, n): X itself, or V (Remark 1)

    @property
    def scores(self) -> np.ndarray:
        """``g = g~ / c`` (m, n)."""
        return self.raw / self.c

    @property
    def jacobian(self) -> np.ndarray:
        """``D g_X = (D g~_X - g grad c^T) / c`` (Eq. 38), ``(m n, P)``."""
        return (self.raw_jacobian - np.outer(self.scores.ravel(), self.c_gradient)) / self.c


def _longest_column(x: np.ndarray) -> tuple[float, np.ndarray]:
    """``||X^T||_(inf,2)`` and its gradient (d, n): the first longest column, normalised."""
    norms = np.sqrt((x * x).sum(axis=0))  # (n,)
    j = int(np.argmax(norms))
    gradient = np.zeros_like(x)
    if norms[j] > 0:
        gradient[:, j] = x[:, j] / norms[j]
    return float(norms[j]), gradient


def score_split(form: Form, x: np.ndarray, q: np.ndarray | None = None) -> ScoreSplit:
    """The form's score function split as ``g~ / c`` at ``X`` (host arrays), as Thm 2 reads it.

    * linear, none: ``g~ = Q^T X``, ``c = 1``;
    * Eq. 17: ``g~ = Q^T X``, ``c = ||Q||_F ||X^T||_(inf,2)``;
    * Eq. 15: ``g~ = alpha Q^T X``, ``c = max{||Q^T X||_(2,inf), ||X^T||_(inf,2) ||Q||_*}``
      (Sec. 9.6 writes ``c / alpha`` and ``g~ = Q^T X``: the same ``g``, and
      assumptions (1)-(3) scale alike, without dividing by ``alpha = 0``);
    * transformer, Eq. 7: ``g~ = Q^T K``, ``c = sqrt(d)``, values ``V``;
    * Eq. 19: ``g~ = Q^T K``, ``c = max{uv, uw, vw}``, values ``V``.

    Ties go to the first maximiser (module docstring). Raises if ``c = 0``
    (``X = 0`` or ``Q = 0``), where ``g`` has no derivative.
    """
    if form.kind == "transformer":
        return _transformer_split(form, x)
    d, n = x.shape
    m = q.shape[1]
    raw = q.T @ x  # (m, n)
    # d raw_ij / d X_ab = Q_ai delta_jb: (m, n, d, n) -> (m n, d n)
    raw_jacobian = np.einsum("ai,jb->ijab", q, np.eye(n)).reshape(m * n, d * n)
    if form.normalization is None:
        c, c_gradient = 1.0, np.zeros(d * n)
    elif form.normalization == "linear":
        q_norm = float(np.sqrt((q * q).sum()))
        x_norm, x_gradient = _longest_column(x)
        c, c_gradient = q_norm * x_norm, q_norm * x_gradient.ravel()
    else:
        # ||g~||_(2,inf) through each row's (first) largest |g~_ij|
        columns = np.argmax(np.abs(raw), axis=1)  # (m,)
        picked = raw[np.arange(m), columns]  # (m,)
        raw_norm = float(np.sqrt((picked * picked).sum()))
        x_norm, x_gradient = _longest_column(x)
        # The top singular value as refimpl.nn.score_norms takes it (same LAPACK call), so
        # that a tie between the two arguments of the max, to the last bit, breaks alike.
        spectral = float(np.linalg.svd(q, full_matrices=False)[1][0])
        if raw_norm >= x_norm * spectral:  # np.argmax order: the first argument on a tie
            c = raw_norm
            weights = np.zeros((m, n))  # d||g~||_(2,inf) / d g~: picked / ||g~|| at (i, s_i)
            weights[np.arange(m), columns] = picked / raw_norm if raw_norm > 0 else 0.0
            c_gradient = raw_jacobian.T @ weights.ravel()  # (d n,)
        else:
            c, c_gradient = x_norm * spectral, spectral * x_gradient.ravel()
        raw, raw_jacobian = form.alpha * raw, form.alpha * raw_jacobian
    if not c > 0:
        raise ValueError("c(X) = 0 (X = 0 or Q = 0): the scores have no derivative there")
    return ScoreSplit(raw, raw_jacobian, float(c), c_gradient, x)


def _transformer_split(form: Form, x: np.ndarray) -> ScoreSplit:
    d3, n = x.shape
    d = d3 // 3
    q, k, v = x[:d], x[d : 2 * d], x[2 * d :]  # (d, n) each
    raw = q.T @ k  # (n, n)
    eye = np.eye(n)
    # d raw_ij / d Q_ab = delta_ib K_aj; d raw_ij / d K_ab = Q_ai delta_jb; V does not enter.
    jacobian = np.zeros((n, n, 3, d, n))  # (i, j, part, a, b)
    jacobian[:, :, 0] = np.einsum("ib,aj->ijab", eye, k)
    jacobian[:, :, 1] = np.einsum("ai,jb->ijab", q, eye)
    raw_jacobian = jacobian.reshape(n * n, 3 * d * n)
    gradient = np.zeros((3, d, n))  # grad c in (part, a, b)
    if form.normalization is None:
        c = float(np.sqrt(d))
    else:
        u = float(np.sqrt((q * q).sum()))
        v_norm, v_gradient = _longest_column(k)
        w_norm, w_gradient = _longest_column(v)
        norms = (u, v_norm, w_norm)
        gradients = (q / u if u > 0 else np.zeros_like(q), v_gradient, w_gradient)
        pairs = ((0, 1), (0, 2), (1, 2))  # uv, uw, vw, in that order on ties
        products = [norms[i] * norms[j] for i, j in pairs]
        i, j = pairs[int(np.argmax(products))]
        c = norms[i] * norms[j]
        gradient[i] += norms[j] * gradients[i]
        gradient[j] += norms[i] * gradients[j]
    if not c > 0:
        raise ValueError("c(X) = 0: the scores have no derivative there")
    return ScoreSplit(raw, raw_jacobian, c, gradient.ravel(), v)


# -- the measured quantity -----------------------------------------------------------------------
def jacobian_norm(block: Any, params: dict[str, Any], x: Any) -> tuple[float, int]:
    """``(||D block_X||_F, size of the Jacobian)``, by an exact SVD."""
    jacobian = attention_jacobian(block, params, x)
    return operator_norm_exact(jacobian), int(jacobian.size)


def _measure(ctx: Context, case: Case) -> tuple[float, int]:
    d, m, _ = case.dims
    params = {} if case.q is None else {"Q": ctx.asarray(case.q)}
    return jacobian_norm(case.form.block(d, m), params, ctx.asarray(case.x))


# -- the cases -----------------------------------------------------------------------------------
def _orthogonal_complement_noise(rng: np.random.Generator, q: np.ndarray, n: int) -> np.ndarray:
    """``n`` random columns orthogonal to every column of ``q`` ``(d, k)``, ``k < d``."""
    basis, _ = np.linalg.qr(q, mode="complete")  # (d, d): first rank(q) columns span q
    rank = np.linalg.matrix_rank(q)
    return basis[:, rank:] @ rng.standard_normal((q.shape[0] - rank, n))  # (d, n)


def _linear_fixed(rng: np.random.Generator, form: Form, scaled: bool) -> Iterator[Case]:
    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape)

    for d, m, n, label in ((3, 2, 1, "n = 1"), (3, 1, 6, "m = 1"), (2, 4, 2, "m > n")):
        yield Case(form, normal(d, n), normal(d, m), label)
    yield Case(form, normal(3, 5), normal(3, 2), "m < n")
    if scaled:
        for scale in (1e2, 1e3):
            yield Case(form, scale * normal(3, 4), normal(3, 3), f"X * {scale:g}")
    x = normal(3, 5)
    x[:, 1] = x[::-1, 0]  # the same squares summed in another order: tied to the last bit
    x[:, 2] = x[:, 0] * (1 + 1e-9)  # tied to 1e-9
    yield Case(form, x, normal(3, 2), "tied column norms")
    q, _ = np.linalg.qr(normal(3, 3))  # orthonormal queries
    yield Case(form, 2.0 * q, q, "columns = queries (|g| at its bound; Eq. 15's first branch)")
    q1 = normal(3, 1)
    x = np.concatenate([3 * q1, normal(3, 3)], axis=1)
    yield Case(form, x, q1, "m = 1, longest column along q (Eq. 15's branches tie)")
    q = normal(4, 2)
    x = normal(4, 1) + _orthogonal_complement_noise(rng, q, 5)  # every row's scores tied
    yield Case(form, x, q, "tied scores")
    if scaled:  # Kim et al.: without normalisation, ||D Att_X|| grows like the scale here
        yield Case(form, 1e3 * x, q, "tied scores, X * 1e3")
    x = normal(3, 4)
    x[:, 2] = 0.0
    yield Case(form, x, normal(3, 3), "a zero column")


def _linear_random(rng: np.random.Generator, form: Form) -> Case:
    d, m, n = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 7))
    column_scales = 10.0 ** rng.uniform(-1, 1, size=n)  # (n,): unequal input norms
    x = rng.standard_normal((d, n)) * column_scales
    return Case(form, x, rng.standard_normal((d, m)) * 10.0 ** rng.uniform(-1, 1), "random")


def _transformer_fixed(rng: np.random.Generator, form: Form, scaled: bool) -> Iterator[Case]:
    def stacked(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return np.concatenate([q, k, v], axis=0)  # (3d, n)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape)

    yield Case(form, normal(6, 1), None, "n = 1")
    yield Case(form, normal(3, 4), None, "d = 1")
    if scaled:
        for scale in (1e2, 1e3):
            yield Case(form, scale * normal(6, 3), None, f"X * {scale:g}")
    for small, label in ((2, "uv"), (1, "uw"), (0, "vw")):  # shrink one factor: the other two win
        parts = [normal(2, 4) for _ in range(3)]
        parts[small] *= 1e-2
        yield Case(form, stacked(*parts), None, f"c = {label}")
    q, k, v = normal(2, 4), normal(2, 4), normal(2, 4)
    q /= np.sqrt((q * q).sum())
    k /= inf2_norm(k.T)
    v /= inf2_norm(v.T)
    yield Case(form, stacked(q, k, v), None, "u = v = w (all three products tie)")
    k = normal(2, 4)
    k[:, 1] = k[::-1, 0]
    yield Case(form, stacked(normal(2, 4), k, normal(2, 4)), None, "tied key norms")
    q = np.outer(normal(3), normal(4))  # rank one: keys can differ orthogonally to all queries
    k = normal(3, 1) + _orthogonal_complement_noise(rng, q, 4)
    yield Case(form, stacked(q, k, normal(3, 4)), None, "tied scores")
    if scaled:  # Eq. 7: ||D Att_X|| grows like the square of the scale here
        yield Case(form, 1e3 * stacked(q, k, normal(3, 4)), None, "tied scores, X * 1e3")
    yield Case(form, stacked(np.zeros((2, 3)), normal(2, 3), normal(2, 3)), None, "Q = 0")


def _transformer_random(rng: np.random.Generator, form: Form) -> Case:
    d, n = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    parts = [rng.standard_normal((d, n)) * 10.0 ** rng.uniform(-1, 1) for _ in range(3)]
    return Case(form, np.concatenate(parts, axis=0), None, "random")


def attention_cases(
    rng: np.random.Generator, form: Form, random: int, scaled: bool = True
) -> Iterator[Case]:
    """The adversarial cases for ``form`` (module docstring), then ``random`` random ones
    (``d <= 4``, ``m <= 4``, ``n <= 6``; transformer ``d <= 3``, ``n <= 5``; input vectors
    and queries of norms spread over two decades).

    ``scaled=False`` leaves out ``X * 1e2`` and ``X * 1e3`` (for unnormalised
    scores, where Thm 2's ``e^a`` would overflow).
    """
    transformer = form.kind == "transformer"
    fixed = _transformer_fixed if transformer else _linear_fixed
    draw = _transformer_random if transformer else _linear_random
    yield from fixed(rng, form, scaled)
    for _ in range(random):
        yield draw(rng, form)


def _mixed_cases(ctx: Context, forms: tuple[Form, ...], scaled_none: bool) -> Iterator[Case]:
    """Every form's adversarial cases, and ``ctx.cases`` random ones shared among the forms."""
    for k, form in enumerate(forms):
        share = ctx.cases // len(forms) + (k < ctx.cases % len(forms))
        scaled = scaled_none or form.normalization is not None
        yield from attention_cases(ctx.rng, form, share, scaled)


# -- Lemma 3, Eq. 28 -----------------------------------------------------------------------------
def _bounded_score_matrices(ctx: Context) -> Iterator[np.ndarray]:
    """Score matrices for Lemma 3: the softmax checks' cases, extremal ``+-a`` rows, and the
    scores of the normalised blocks (``|g| <= alpha`` by construction)."""
    for scores in softmax.score_matrices(ctx):
        yield to_numpy(scores)
    rng = ctx.rng
    for alpha, (m, n) in itertools.product((0.0, 0.3, 1.0, 3.0, 30.0), ((1, 1), (4, 9), (5, 2))):
        extremal = np.full((m, n), -alpha)  # one entry +a, the rest -a: Eq. 35 with equality
        extremal[np.arange(m), rng.integers(0, n, m)] = alpha
        yield extremal
    for alpha in ALPHAS:
        form = Form("linear", "lipschitz", alpha)
        for case in attention_cases(rng, form, random=2):
            yield score_split(form, case.x, case.q).scores


@check(
    id="lipschitz.lemma3",
    paper="LipschitzNorm",
    statement="|g_ij| <= a => ||softmax(g)||_F <= e^a sqrt(m/n) (Lemma 3, Eq. 12), in logs",
)
def lemma3(ctx: Context) -> WorstCase:
    """LipschitzNorm Lemma 3 (Eq. 12) with ``a = max |g_ij|``, the tightest ``a`` allowed.

    Compared in logarithms, ``log ||S||_F - log sqrt(m/n) <= a``, so scores of
    ``+-1e3`` (``e^a`` overflows) still give a finite bound. Attained at ``a = 0``
    (uniform rows), so the bound is ``a`` plus the relative rounding allowance
    of ``||S||_F`` (:func:`proofs_check.softmax.frobenius_allowance`).
    """
    worst = WorstCase("upper")
    for scores in _bounded_score_matrices(ctx):
        m, n = scores.shape
        alpha = float(np.abs(scores).max())
        norm = float(np.sqrt((row_softmax(scores) ** 2).sum()))
        worst.add(np.log(norm) - 0.5 * np.log(m / n), alpha + frobenius_allowance(m, n))
    return worst


def eq28_ratio(a: np.ndarray, scores: np.ndarray, b: np.ndarray) -> float:
    """``||A Dsoftmax_M(B)^T||_F / (||A^T||_(inf,2) ||B||_(2,inf))`` (0 when the denominator is).

    ``A`` ``(d, n)``, ``M`` and ``B`` ``(m, n)``; ``Dsoftmax_M(B)_jk = S_jk (B_jk -
    sum_l S_jl B_jl)`` (Eq. 30).
    """
    s = row_softmax(scores)  # (m, n)
    derivative = s * (b - (s * b).sum(axis=1, keepdims=True))  # (m, n)
    lhs = float(np.sqrt(((a @ derivative.T) ** 2).sum()))  # (d, m)
    denominator = inf2_norm(a.T) * two_inf_norm(b)
    return lhs / denominator if denominator > 0 else 0.0


@check(
    id="lipschitz.eq28",
    paper="LipschitzNorm",
    statement="||A Dsoftmax_M(B)^T||_F <= 1 * ||A^T||_(inf,2) ||B||_(2,inf) (Eq. 28; "
    "printed sqrt2, see errata)",
)
def eq28(ctx: Context) -> WorstCase:
    """The step of Lemma 1's proof (Eq. 28), with the constant 1 instead of ``sqrt 2``.

    Jensen leaves ``sum_jk S_jk B_jk^2 ||A_k - c_j||^2`` with ``c_j = sum_k S_jk
    A_k``; bounding ``B_jk^2`` by ``||B_j||_inf^2`` leaves the variance
    ``sum_k S_jk ||A_k - c_j||^2 <= sum_k S_jk ||A_k||^2 <= ||A^T||_(inf,2)^2``.
    (The printed proof bounds each ``||A_k - c_j||^2`` by ``2 max ||A_k||^2``,
    which is false; the lemma survives, see :mod:`proofs_check.errata`.) The
    constant 1 is attained (``A = [v, -v]``, ``S = (1/2, 1/2)``, ``B = (1, -1)``),
    so the bound is ``1 + (m n d + 64) eps``. ``measured`` is the ratio.
    """
    rng = ctx.rng
    worst = WorstCase("upper")
    v = rng.standard_normal((3, 1))
    cases = [
        (np.hstack([v, -v]), np.zeros((1, 2)), np.array([[1.0, -1.0]])),  # attains 1
        (np.hstack([v, -v, 0 * v]), np.array([[0.0, 0.0, -1e3]]), np.array([[2.0, -2.0, 5.0]])),
        (rng.standard_normal((2, 1)), rng.standard_normal((3, 1)), rng.standard_normal((3, 1))),
        (
            rng.standard_normal((2, 5)),
            1e3 * rng.standard_normal((3, 5)),
            rng.standard_normal((3, 5)),
        ),
    ]
    for _ in range(ctx.cases):
        d, m, n = (int(k) for k in rng.integers(1, 7, size=3))
        scale = 10.0 ** rng.uniform(-2, 2)
        a = rng.standard_normal((d, n)) * 10.0 ** rng.uniform(-1, 1, size=n)
        cases.append((a, scale * rng.standard_normal((m, n)), rng.standard_normal((m, n))))
    for a, scores, b in cases:
        m, n = scores.shape
        worst.add(eq28_ratio(a, scores, b), EQ28_CONSTANT + rounding_allowance(m * n * a.shape[0]))
    return worst


# -- Lemma 1, Thm 2 ------------------------------------------------------------------------------
_SCORE_FORMS = (
    Form("linear", None),
    Form("linear", "linear"),
    Form("linear", "lipschitz", 0.5),
    Form("linear", "lipschitz", 2.0),
    Form("transformer", None),
    Form("transformer", "lipschitz"),
)


def lemma1_bound(split: ScoreSplit, constant: float = np.sqrt(2.0)) -> float:
    """Eq. 9: ``||softmax(g)||_F + constant ||h(X)^T||_(inf,2) |||D g_X|||_(F,(2,inf))``.

    The printed constant is ``sqrt 2``; :func:`eq28_ratio`'s argument gives 1.
    ``h(X)`` is ``X`` (Eq. 4) or ``V`` (the transformer, Remark 1).
    """
    m, n = split.raw.shape
    softmax_norm = float(np.sqrt((row_softmax(split.scores) ** 2).sum()))
    derivative = two_inf_operator_norm(split.jacobian, m, n)
    return softmax_norm + constant * inf2_norm(split.values.T) * derivative


@check(
    id="lipschitz.lemma1",
    paper="LipschitzNorm",
    statement="||D Att_X||_F <= ||S||_F + sqrt2 ||X^T||_(inf,2) |||D g_X|||_(F,(2,inf)) "
    "(Lemma 1, Eq. 9)",
)
def lemma1(ctx: Context) -> WorstCase:
    """LipschitzNorm Lemma 1 (Eq. 9) for six score functions (:data:`_SCORE_FORMS`).

    ``|||D g_X|||_(F,(2,inf))`` is computed exactly (:func:`two_inf_operator_norm`)
    from the independent ``D g_X`` of :func:`score_split`; for the transformer
    ``X^T`` becomes ``V^T`` (Remark 1). Equality holds where ``D g_X = 0`` and
    ``softmax(g)`` has rank one (``||S||_2 = ||S||_F``): ``d = n = 1`` with Eq. 15
    or 17, whose scores are then constant in ``X``; hence the allowance.
    """
    worst = WorstCase("upper")
    for case in _mixed_cases(ctx, _SCORE_FORMS, scaled_none=True):
        measured, size = _measure(ctx, case)
        bound = lemma1_bound(score_split(case.form, case.x, case.q))
        worst.add(measured, bound * (1 + rounding_allowance(size)))
    return worst


def thm2_alpha(split: ScoreSplit) -> float:
    """The smallest ``a`` meeting Thm 2's assumptions (1)-(3) at ``X`` (Eq. 14; Remark 1):

    ``max{ ||g~||_inf / c, ||h^T|| |||D g~||| / c, ||h^T|| ||grad c|| ||g~||_(2,inf) / c^2 }``

    with ``h = X`` (or ``V``), ``||h^T|| = ||h^T||_(inf,2)``, ``|||D g~||| =
    |||D g~_X|||_(F,(2,inf))`` (exact) and ``|||D c_X|||_(F,1) = ||grad c||_2``.
    The proof of Thm 2 (Sec. 9.5) is pointwise: at any ``X`` where (1)-(3) hold
    with ``a``, ``||D Att_X|| <= e^a sqrt(m/n) + a sqrt8``.
    """
    m, n = split.raw.shape
    values = inf2_norm(split.values.T)
    first = float(np.abs(split.raw).max()) / split.c
    second = values * two_inf_operator_norm(split.raw_jacobian, m, n) / split.c
    gradient = float(np.sqrt((split.c_gradient**2).sum()))
    third = values * gradient * two_inf_norm(split.raw) / split.c**2
    return max(first, second, third)


@check(
    id="lipschitz.thm2",
    paper="LipschitzNorm",
    statement="(1)-(3) hold with a at X => ||D Att_X||_F <= e^a sqrt(m/n) + a sqrt8 "
    "(Thm 2, Eq. 14), a smallest",
)
def thm2(ctx: Context) -> WorstCase:
    """LipschitzNorm Thm 2 (Eq. 14), pointwise, for six score functions split as ``g~ / c``.

    At each ``X`` the smallest admissible ``a`` (:func:`thm2_alpha`) gives the
    tightest bound the theorem allows there: Eq. 15 scores have ``a <= alpha``
    (Thm 3's proof), unnormalised ones ``a ~ ||X||^2`` (left out when scaled up:
    ``e^a`` overflows).
    """
    worst = WorstCase("upper")
    for case in _mixed_cases(ctx, _SCORE_FORMS, scaled_none=False):
        measured, size = _measure(ctx, case)
        _, m, n = case.dims
        alpha = thm2_alpha(score_split(case.form, case.x, case.q))
        worst.add(measured, thm3_bound(alpha, m, n) * (1 + rounding_allowance(size)))
    return worst


# -- Thm 3, Cor 1, Cor 2 -------------------------------------------------------------------------
def _bound_check(ctx: Context, form: Form, bound: Callable[[int, int], float]) -> WorstCase:
    worst = WorstCase("upper")
    cases = [*attention_cases(ctx.rng, form, ctx.cases), _ascent_case(ctx.rng, form)]
    for case in cases:
        measured, size = _measure(ctx, case)
        _, m, n = case.dims
        worst.add(measured, bound(m, n) * (1 + rounding_allowance(size)))
    return worst


def _thm3_check(alpha: float) -> Callable[[Context], WorstCase]:
    def body(ctx: Context) -> WorstCase:
        form = Form("linear", "lipschitz", alpha)
        return _bound_check(ctx, form, lambda m, n: thm3_bound(alpha, m, n))

    body.__name__ = body.__qualname__ = f"thm3_alpha_{alpha:g}".replace(".", "_")
    body.__doc__ = (
        f"LipschitzNorm Thm 3 (Eq. 16) for Eq. 15 scores with alpha = {alpha:g}, "
        "``g~ = Q^T X`` and ``L = ||Q||_*``."
    )
    return body


for _alpha in ALPHAS:
    check(
        id=f"lipschitz.thm3.alpha_{_alpha:g}",
        paper="LipschitzNorm",
        statement=f"Eq. 15 scores, alpha = {_alpha:g}: ||D Att_X||_F <= e^a sqrt(m/n) + a sqrt8 "
        "(Thm 3, Eq. 16)",
    )(_thm3_check(_alpha))


@check(
    id="lipschitz.cor1",
    paper="LipschitzNorm",
    statement="Eq. 17 scores: ||D Att_X||_F <= e sqrt(m/n) + sqrt8 (Cor 1, Eq. 18)",
)
def cor1(ctx: Context) -> WorstCase:
    """LipschitzNorm Cor 1 (Eq. 18): ``g = Q^T X / (||Q||_F ||X^T||_(inf,2))`` (Eq. 17)."""
    return _bound_check(ctx, Form("linear", "linear"), cor1_bound)


@check(
    id="lipschitz.cor2",
    paper="LipschitzNorm",
    statement="Eq. 19 scores: ||D Att_X||_F <= e^sqrt3 sqrt(m/n) + 2 sqrt6 (Cor 2, Eq. 20)",
)
def cor2(ctx: Context) -> WorstCase:
    """LipschitzNorm Cor 2 (Eq. 20): transformer scores ``Q^T K / max{uv, uw, vw}`` (Eq. 19)."""
    return _bound_check(ctx, Form("transformer", "lipschitz"), cor2_bound)


# -- Thm 1, Eq. 21 -------------------------------------------------------------------------------
class MultiHeadCase(NamedTuple):
    """A multi-head block, host parameters and input ``x`` ``(d_I, n)``."""

    block: Any  # MultiHeadAttention
    params: dict[str, np.ndarray]
    x: np.ndarray
    label: str


_HEAD_FORMS = (
    ("transformer", None, 1.0),
    ("transformer", "lipschitz", 1.0),
    ("linear", None, 1.0),
    ("linear", "linear", 1.0),
    ("linear", "lipschitz", 1.0),
)


def multihead_cases(
    rng: np.random.Generator, random: int, normalised_square: bool = False
) -> Iterator[MultiHeadCase]:
    """Multi-head cases (Eq. 5): adversarial ones, then ``random`` random ones.

    ``normalised_square=True`` keeps the heads Eq. 21 is about: normalised
    (Eq. 17, Eq. 15 with ``alpha = 1``, Eq. 19) with ``m = n``.
    """
    forms = [f for f in _HEAD_FORMS if f[1] is not None] if normalised_square else _HEAD_FORMS

    def make(form: tuple, d_in: int, d: int, d_out: int, h: int, n: int) -> tuple[Any, dict]:
        kind, normalization, alpha = form
        m = None if kind == "transformer" else (n if normalised_square else int(rng.integers(1, 4)))
        block = MultiHeadAttention(d_in, d, d_out, h, kind, normalization, m, alpha)
        params = {k: 10.0 ** rng.uniform(-0.5, 0.5) * v for k, v in block.init_params(rng).items()}
        return block, params

    for k, form in enumerate(forms):
        fixed = [(3, 2, 2, 2, 3, "h = 2"), (2, 2, 1, 1, 1, "h = 1, d_O = 1, n = 1")]
        fixed.append((4, 1, 3, 3, 4, "h = 3, d = 1"))
        for d_in, d, d_out, h, n, label in fixed:
            block, params = make(form, d_in, d, d_out, h, n)
            yield MultiHeadCase(block, params, rng.standard_normal((d_in, n)), label)
        block, params = make(form, 3, 2, 3, 2, 3)
        params["W_in"][0] *= 30.0  # one head's projection dominates sum ||W_k||_*^2
        params["W_out"][:, 0] = 0.0  # a rank-deficient output map
        yield MultiHeadCase(block, params, rng.standard_normal((3, 3)), "unequal heads")
        if form[1] is not None:
            block, params = make(form, 3, 2, 2, 2, 3)
            yield MultiHeadCase(block, params, 1e3 * rng.standard_normal((3, 3)), "X * 1e3")
            block, params = make(form, 5, 2, 2, 2, 2)
            yield MultiHeadCase(block, params, 1e3 * _tied_heads(rng, block, params), "tied, * 1e3")
        for _ in range(random // len(forms) + (k < random % len(forms))):
            d_in, d, d_out, h = (int(v) for v in rng.integers(1, 4, size=4))
            n = int(rng.integers(1, 5))
            block, params = make(form, d_in, d, d_out, h, n)
            yield MultiHeadCase(block, params, rng.standard_normal((d_in, n)), "random")


def _tied_heads(rng: np.random.Generator, block: Any, params: dict[str, np.ndarray]) -> np.ndarray:
    """An input ``(d_I, n)`` at which every head's scores tie along every row.

    Columns ``x_0 + r_j`` with ``r_j`` in the null space of every head's score
    map: ``Q_k^T W_k`` (linear heads), the key projection of ``W_k`` (transformer
    heads: the keys are then equal). Needs ``d_I`` above the total rank.
    """
    d = block.head_dim
    if block.kind == "linear":
        maps = [q.T @ w for q, w in zip(params["Q"], params["W_in"], strict=True)]  # (m, d_I)
    else:
        maps = [w[d : 2 * d] for w in params["W_in"]]  # the key rows, (d, d_I)
    stacked = np.concatenate(maps, axis=0)  # (rows, d_I)
    _, singular, right = np.linalg.svd(stacked)
    null = right[int((singular > 1e-12 * singular[0]).sum()) :]  # (k, d_I), orthonormal rows
    n = 2
    return rng.standard_normal((block.in_dim, 1)) + null.T @ rng.standard_normal((len(null), n))


def _head_norms(ctx: Context, case: MultiHeadCase) -> np.ndarray:
    """``||D Att_{W_k X}||`` for every head ``k`` (the block's own head, at its input)."""
    block, x = case.block, ctx.asarray(case.x)
    norms = []
    for k in range(block.heads):
        params = {"Q": ctx.asarray(case.params["Q"][k])} if block.kind == "linear" else {}
        head_input = ctx.asarray(case.params["W_in"][k]) @ x  # (rows, d_I) @ (d_I, n)
        norms.append(jacobian_norm(block.head, params, head_input)[0])
    return np.array(norms)


def _multihead_norm(ctx: Context, case: MultiHeadCase) -> tuple[float, int]:
    params = {k: ctx.asarray(v) for k, v in case.params.items()}
    return jacobian_norm(case.block, params, ctx.asarray(case.x))


@check(
    id="lipschitz.thm1",
    paper="LipschitzNorm",
    statement="||D MultAtt_X||_F <= ||W_O||_* (sum_k ||D Att_{W_k X}||^2 ||W_k||_*^2)^(1/2) "
    "(Thm 1, Eq. 6, pointwise)",
)
def thm1(ctx: Context) -> WorstCase:
    """LipschitzNorm Thm 1 (Eq. 6) in the pointwise form its proof (Sec. 9.1, Eq. 24) gives.

    Every head kind, normalised or not (the theorem needs no normalisation);
    each head's ``||D Att_{W_k X}||`` is measured exactly on the head block at
    ``W_k X``. Eq. 6 follows by bounding each by ``L_F(Att)``.
    """
    worst = WorstCase("upper")
    for case in multihead_cases(ctx.rng, ctx.cases):
        measured, size = _multihead_norm(ctx, case)
        bound = thm1_bound(case.params["W_out"], case.params["W_in"], _head_norms(ctx, case))
        worst.add(measured, bound * (1 + rounding_allowance(size)))
    return worst


@check(
    id="lipschitz.eq21",
    paper="LipschitzNorm",
    statement="normalised heads, m = n: ||D MultAtt_X||_F <= 11 ||W_O||_* "
    "(sum_k ||W_k||_*^2)^(1/2) (Eq. 21)",
)
def eq21(ctx: Context) -> WorstCase:
    """LipschitzNorm Eq. 21: heads normalised by Eq. 19, 17 or 15 (``alpha = 1``), ``m = n``.

    11 rounds up Cor 2's ``e^sqrt3 + 2 sqrt6 = 10.55`` at ``m = n``, which also
    covers Cor 1 and Thm 3 at ``alpha = 1`` (``e + sqrt8 = 5.55``).
    """
    worst = WorstCase("upper")
    for case in multihead_cases(ctx.rng, ctx.cases, normalised_square=True):
        measured, size = _multihead_norm(ctx, case)
        bound = eq21_bound(case.params["W_out"], case.params["W_in"])
        worst.add(measured, bound * (1 + rounding_allowance(size)))
    return worst


# -- Kim et al.: unbounded growth without normalisation --------------------------------------------
def tied_case(rng: np.random.Generator, kind: str = "linear") -> Case:
    """An unnormalised input whose scores tie along every row, at every scale ``t``.

    Linear: columns ``x_j = x_0 + r_j`` with ``r_j`` orthogonal to every query,
    so ``Q^T X`` has equal columns. Transformer: rank-one queries ``Q = q a^T``
    and keys ``k_j = k_0 + r_j`` with ``r_j`` orthogonal to ``q``. The softmax
    stays uniform under ``X -> tX`` and never saturates, so the second term of
    Eq. 8 grows like ``t`` (like ``t^2`` for the transformer) while the first
    stays ``sqrt(m/n)``. (At generic inputs the softmax saturates as ``t`` grows
    and its derivative decays: unboundedness lives near ties, as in Kim et al.
    2020.)
    """
    if kind == "transformer":
        q = np.outer(rng.standard_normal(3), rng.standard_normal(4))  # (3, 4)
        k = rng.standard_normal((3, 1)) + _orthogonal_complement_noise(rng, q, 4)
        x = np.concatenate([q, k, rng.standard_normal((3, 4))], axis=0)  # (9, 4)
        return Case(Form("transformer", None), x, None, "tied scores")
    q = rng.standard_normal((4, 2))
    x = rng.standard_normal((4, 1)) + _orthogonal_complement_noise(rng, q, 5)  # (4, 5)
    return Case(Form("linear", None), x, q, "tied scores")


def growth_curve(
    case: Case,
    scales: tuple[float, ...] = (1.0, 10.0, 100.0, GROWTH_SCALE),
    xp: ModuleType | None = None,
) -> list[tuple[float, float]]:
    """``[(t, ||D Att_{tX}||_F)]`` for the case's block at ``t X`` (the README's growth curve).

    ``xp``: the array module to run the block in (NumPy when ``None``).
    """
    xp = np if xp is None else xp
    d, m, _ = case.dims
    block = case.form.block(d, m)
    params = {} if case.q is None else {"Q": xp.asarray(case.q)}
    return [(t, jacobian_norm(block, params, xp.asarray(t * case.x))[0]) for t in scales]


@check(
    id="lipschitz.unnormalised_growth",
    paper="LipschitzNorm",
    statement="no normalisation, tied scores: ||D Att_{tX}|| at t = 1e3 >= 100 ||D Att_X|| "
    "(Kim et al. 2020; Sec. 4)",
)
def unnormalised_growth(ctx: Context) -> WorstCase:
    """Without normalisation the Jacobian norm grows without bound (lower bound, ratio >= 100).

    ``measured`` is ``||D Att_{tX}|| / ||D Att_X||`` at ``t = 1e3`` for
    :func:`tied_case` inputs, linear (Eq. 4, ``g = Q^T X``) and transformer
    (Eq. 7); a bounded derivative (any normalised score: they are invariant
    under ``X -> tX``) gives exactly 1 and fails.
    """
    worst = WorstCase("lower")
    for k in range(max(ctx.cases // 4, 2)):
        case = tied_case(ctx.rng, "transformer" if k % 2 else "linear")
        curve = growth_curve(case, (1.0, GROWTH_SCALE), ctx.xp)
        worst.add(curve[-1][1] / curve[0][1], GROWTH_AT_LEAST)
    return worst


# -- adversarial search ----------------------------------------------------------------------------
class Tightness(NamedTuple):
    """The best ``||D Att_X||`` an adversarial search found for one form and size."""

    form: Form
    dims: tuple[int, int, int]  # (d, m, n)
    bound: float  # the paper's bound for the form (Eq. 16, 18 or 20)
    best: float  # the largest ||D Att_X||_F found: an exact value at `x`, a lower bound on L_F
    x: np.ndarray  # where (host)
    q: np.ndarray | None  # with these queries (linear forms)

    @property
    def ratio(self) -> float:
        """``best / bound``: at most 1 while the bound holds; how tight it is."""
        return self.best / self.bound


def form_bound(form: Form, m: int, n: int) -> float:
    """The paper's bound on ``L_F`` for a normalised form (Eq. 16, 18 or 20)."""
    if form.normalization is None:
        raise ValueError("unnormalised attention has no Lipschitz bound (it is not Lipschitz)")
    if form.kind == "transformer":
        return cor2_bound(m, n)
    if form.normalization == "linear":
        return cor1_bound(m, n)
    return thm3_bound(form.alpha, m, n)


def _norm_and_gradient(
    form: Form, x: np.ndarray, q: np.ndarray | None, step: float = 1e-5
) -> tuple[float, np.ndarray, np.ndarray | None]:
    """``sigma = ||D Att_X||`` and its gradient in ``X`` and ``Q`` (host, float64).

    With ``(u, v)`` the top singular pair, ``sigma = <u, D Att_X(v)> = D F_X(v)``
    for ``F = <u, Att>``, so ``grad sigma = Hess F . v``: a central difference of
    the block's backward (``grad F``, both ``X`` and ``Q`` parts) along ``v``. Valid
    where ``sigma`` is simple and no ``max`` is tied; elsewhere a search direction.
    """
    d, m = (x.shape[0] // 3, x.shape[1]) if q is None else q.shape  # transformer: m = n
    block = form.block(d, m)
    params = {} if q is None else {"Q": q}
    jacobian = to_numpy(attention_jacobian(block, params, x))
    left, singular, right = np.linalg.svd(jacobian)
    u, v = left[:, 0], right[0].reshape(x.shape)
    out, _ = block.forward(params, x)
    u = u.reshape(out.shape)
    grads = []
    for sign in (1.0, -1.0):
        _, cache = block.forward(params, x + sign * step * v)
        grads.append(block.backward(params, cache, u))
    (gx_plus, gp_plus), (gx_minus, gp_minus) = grads
    grad_x = (gx_plus - gx_minus) / (2 * step)
    grad_q = None if q is None else (gp_plus["Q"] - gp_minus["Q"]) / (2 * step)
    return float(singular[0]), grad_x, grad_q


def _normalise(form: Form, x: np.ndarray, q: np.ndarray | None) -> tuple:
    # Every normalised score is invariant under X -> tX (and Eq. 15/17 under Q -> sQ):
    # keep both at unit size so the search moves only what matters.
    x = x / np.sqrt((x * x).sum())
    return x, (None if q is None else q / np.sqrt((q * q).sum()))


def _ascend(
    form: Form, x: np.ndarray, q: np.ndarray | None, steps: int, rate: float = 0.3
) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Gradient ascent of ``||D Att_X||`` from ``(x, q)`` with an adaptive step: grow it after
    a gain, halve it (and stay) after a loss. Returns the best ``(sigma, x, q)`` seen."""
    x, q = _normalise(form, x, q)
    sigma, grad_x, grad_q = _norm_and_gradient(form, x, q)
    for _ in range(steps):
        size = np.sqrt((grad_x**2).sum() + (0.0 if q is None else (grad_q**2).sum()))
        if not size > 0:
            break
        x_new = x + rate * grad_x / size
        q_new = None if q is None else q + rate * grad_q / size
        x_new, q_new = _normalise(form, x_new, q_new)
        try:
            result = _norm_and_gradient(form, x_new, q_new)
        except ValueError:  # stepped onto c = 0 (a zero query or input): step back
            result = (-np.inf, None, None)
        if result[0] > sigma:
            (sigma, grad_x, grad_q), x, q, rate = result, x_new, q_new, rate * 1.5
        else:
            rate *= 0.5
    return sigma, x, q


def _start(rng: np.random.Generator, form: Form, d: int, m: int, n: int) -> tuple:
    if form.kind == "transformer":
        return rng.standard_normal((3 * d, n)), None
    return rng.standard_normal((d, n)), rng.standard_normal((d, m))


def tightness(
    form: Form,
    dims: tuple[int, int, int],
    rng: np.random.Generator,
    restarts: int = 8,
    steps: int = 100,
) -> Tightness:
    """Maximise ``||D Att_X||_F`` over ``X`` (and ``Q``) for a normalised form: random restarts,
    each followed by :func:`_ascend`; ``dims = (d, m, n)`` (``m = n`` for the transformer).

    The best value is exact at the point returned (an SVD of the true
    Jacobian), hence a lower bound on ``L_F``: ``ratio > 1`` would disprove the
    paper's bound, ``ratio`` well below 1 says how loose it is.
    """
    d, m, n = dims
    if form.kind == "transformer" and m != n:
        raise ValueError(f"transformer attention has m = n, got dims {dims}")
    best = (-np.inf, None, None)
    for _ in range(restarts):
        found = _ascend(form, *_start(rng, form, d, m, n), steps)
        if found[0] > best[0]:
            best = found
    sigma, x, q = best
    return Tightness(form, dims, form_bound(form, m, n), sigma, x, q)


def _ascent_case(rng: np.random.Generator, form: Form, steps: int = 12) -> Case:
    """The end of a short gradient ascent of ``||D Att_X||`` (the checks' last adversarial case)."""
    d, n = int(rng.integers(1, 4)), int(rng.integers(2, 5))
    m = n if form.kind == "transformer" else int(rng.integers(1, 5))
    _, x, q = _ascend(form, *_start(rng, form, d, m, n), steps)
    return Case(form, x, q, "gradient ascent")
