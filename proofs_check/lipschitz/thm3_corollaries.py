"""LipschitzNorm Thm 3 (Eq. 16), Cor 1 (Eq. 18) and Cor 2 (Eq. 20): the bounds on ``L_F``.

One check per normalised form: Eq. 15 scores for every alpha of
:data:`proofs_check.lipschitz.ALPHAS`, Eq. 17 scores, and the transformer's
Eq. 19 scores. Each evaluates the form's fixed adversarial cases, ``ctx.cases``
random ones, and last the ends of ``ASCENTS`` gradient ascents of ``||D Att_X||`` from
random starts (:mod:`proofs_check.lipschitz.search`), whose best is the check's tightness.
"""

from __future__ import annotations

from collections.abc import Callable

from proofs_check.lipschitz.bounds import (
    _measure,
    cor1_bound,
    cor2_bound,
    rounding_allowance,
    thm3_bound,
)
from proofs_check.lipschitz.cases import attention_cases
from proofs_check.lipschitz.forms import ALPHAS, Form
from proofs_check.lipschitz.search import _ascent_case
from proofs_check.registry import Context, WorstCase, check

__all__ = ["ASCENTS", "ASCENT_STEPS"]  # the checks are registered, not exported

# Restarts and steps of the adversarial search that ends each check (search.py): enough to
# reach the tightness floors the tests assert (documented there), short enough for the report
# (its time is in the LipschitzNorm guide).
ASCENTS = 6
ASCENT_STEPS = 40


def _bound_check(ctx: Context, form: Form, bound: Callable[[int, int], float]) -> WorstCase:
    worst = WorstCase("upper")
    # the fixed and random cases, then ASCENTS gradient ascents of ||D Att_X|| from random starts
    ascents = [_ascent_case(ctx.rng, form, ASCENT_STEPS) for _ in range(ASCENTS)]
    cases = [*attention_cases(ctx.rng, form, ctx.cases), *ascents]
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
