"""LipschitzNorm Lemma 3 (Eq. 12) and Eq. 28, the step of Lemma 1's proof: softmax facts.

Neither involves a block. Lemma 3 bounds ``||softmax(g)||_F`` by the size of
the scores; Eq. 28 bounds ``A`` times the softmax derivative by
``||A^T||_(inf,2) ||B||_(2,inf)``, with the constant 1 the proof's variance
argument gives (the printed ``sqrt 2`` rests on a false step: erratum
``lipschitznorm.lemma1.proof.convex_hull_factor``). :func:`row_softmax` is
looked up when a check runs, so a test can swap in a broken one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from proofs_check import softmax
from proofs_check.lipschitz.bounds import rounding_allowance
from proofs_check.lipschitz.cases import attention_cases
from proofs_check.lipschitz.forms import ALPHAS, Form, score_split
from proofs_check.registry import Context, WorstCase, check
from proofs_check.softmax import frobenius_allowance, row_softmax
from refimpl.backend import to_numpy
from refimpl.nn.lipschitz.score_norms import inf2_norm, two_inf_norm

__all__ = ["EQ28_CONSTANT", "eq28_ratio"]

EQ28_CONSTANT = 1.0  # Eq. 28's constant as the proof's variance argument gives it (printed: sqrt2)


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
