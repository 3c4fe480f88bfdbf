"""Kim et al. (2020): without normalisation ``||D Att_X||`` grows without bound (Sec. 4).

At inputs whose scores tie along every row (:func:`proofs_check.lipschitz.tied_case`)
the softmax stays uniform under ``X -> tX`` and never saturates, so the second
term of Eq. 8 grows like ``t`` (like ``t^2`` for the transformer, Eq. 7), while
every normalised score is invariant under the scaling and gives a flat curve.
The check is a lower bound on the growth ratio.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from proofs_check.lipschitz.bounds import jacobian_norm
from proofs_check.lipschitz.cases import tied_case
from proofs_check.lipschitz.forms import Case
from proofs_check.registry import Context, WorstCase, check

__all__ = ["GROWTH_AT_LEAST", "GROWTH_SCALE", "growth_curve"]

GROWTH_SCALE = 1e3  # X -> tX up to this t in the growth check
# Tied scores make the second term of Eq. 8 exactly linear in t (quadratic for the
# transformer), so the norm at t = 1e3 is ~1e3 (or ~1e6) times that at t = 1; an
# exponent-free bound such as Cor 1 gives a ratio of exactly 1 (the normalised
# scores are invariant under X -> tX). 100 separates the two by an order of magnitude.
GROWTH_AT_LEAST = 100.0


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
