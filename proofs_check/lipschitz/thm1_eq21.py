"""LipschitzNorm Thm 1 (Eq. 6, pointwise) and Eq. 21: multi-head attention (Eq. 5).

Thm 1 needs no normalisation, so every head form is checked, against the
pointwise bound its proof gives (Sec. 9.1, Eq. 24) with each head's
``||D Att_{W_k X}||`` measured exactly on the head block at ``W_k X``. Eq. 21
is about normalised heads with ``m = n``.
"""

from __future__ import annotations

import numpy as np

from proofs_check.lipschitz.bounds import (
    eq21_bound,
    jacobian_norm,
    rounding_allowance,
    thm1_bound,
)
from proofs_check.lipschitz.cases import MultiHeadCase, multihead_cases
from proofs_check.registry import Context, WorstCase, check

__all__: list[str] = []  # the checks are registered, not exported


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
