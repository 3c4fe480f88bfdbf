"""Attention forms, their inputs, and the paper's score function split as ``g = g~ / c``.

A :class:`Form` names one block of :mod:`refimpl.nn.lipschitz.multi_head_attention` (linear, Eq. 4,
or transformer, Eq. 7, with its normalisation); a :class:`Case` is one input to
it, with a label saying why it is there.

The score side is computed independently of the blocks, on the host, by
:func:`score_split`: ``g = g~ / c`` (Eq. 13) with ``D g = (D g~ - g grad c^T) /
c`` (Eq. 38) as dense matrices, and the (F, (2,inf)) operator norm *exactly*
(:func:`proofs_check.lipschitz.two_inf_operator_norm`). So the checks of Lemma 1
and Thm 2 test the block's ``D Att_X`` against bounds built from the paper's
score function, not from the block's own. Every ``max`` is differentiated
through its first maximiser, as in :mod:`refimpl.nn.lipschitz.score_norms`; at an exact
tie that is a one-sided derivative, which satisfies the same pointwise bounds
(the proofs are pointwise, and the branch function meets the assumptions at
``X``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.nn.lipschitz.multi_head_attention import Attention, TransformerAttention

__all__ = ["ALPHAS", "Case", "Form", "ScoreSplit", "score_split"]

ALPHAS = (0.0, 0.5, 1.0, 2.0)  # Thm 3's alpha: 0 (uniform), the paper's 1, and either side


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
        # The top singular value as refimpl.nn.lipschitz.score_norms takes it (same LAPACK call), so
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
