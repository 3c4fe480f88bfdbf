"""LipschitzNorm Lemma 1 (Eq. 9) and Thm 2 (Eq. 14), pointwise, for six score functions.

``||D Att_X||`` is measured on the block; the bounds are built from the paper's
score function split as ``g~ / c`` (:func:`proofs_check.lipschitz.score_split`),
independently of the block, with ``|||D g_X|||_(F,(2,inf))`` computed exactly.
Thm 2 is evaluated at the smallest ``a`` that meets its assumptions at ``X``
(:func:`thm2_alpha`), the tightest bound the theorem allows there.
"""

from __future__ import annotations

import numpy as np

from proofs_check.lipschitz.bounds import (
    _measure,
    rounding_allowance,
    thm3_bound,
    two_inf_operator_norm,
)
from proofs_check.lipschitz.cases import _mixed_cases
from proofs_check.lipschitz.forms import Form, ScoreSplit, score_split
from proofs_check.registry import Context, WorstCase, check
from proofs_check.softmax import row_softmax
from refimpl.nn.lipschitz.score_norms import inf2_norm, two_inf_norm

__all__ = ["lemma1_bound", "thm2_alpha"]


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
