"""LipschitzNorm Sec. 6, Eq. 22: ``L_F(Att_1 o Att_2) <= L_F(Att_1) L_F(Att_2)``.

Two Eq. 17-normalised attention blocks in sequence, ``Att_2: (d, n) -> (d, k)`` then
``Att_1: (d, k) -> (d, m)``, each with its own queries. By the chain rule the composition's
derivative at ``X`` is ``D Att_1 at Att_2(X)`` times ``D Att_2 at X``; the check measures its
exact operator norm (an SVD of the product of the blocks' own Jacobians) and holds it under
the product of the layers' bounds (Cor 1, Eq. 18), which bound each ``L_F`` (``lipschitz.cor1``).
Cases: random sizes and inputs, every other one scaled by ``1e2``, and tied scores scaled by
``1e3``, where an unnormalised layer's derivative grows without bound.
"""

from __future__ import annotations

import numpy as np

from proofs_check.lipschitz.bounds import cor1_bound, operator_norm_exact, rounding_allowance
from proofs_check.lipschitz.cases import tied_case
from proofs_check.lipschitz.forms import Form
from proofs_check.registry import Context, WorstCase, check
from refimpl.backend import to_numpy
from refimpl.jacobian import attention_jacobian

__all__ = ["composition_norm"]


def composition_norm(
    ctx: Context, x: np.ndarray, q_inner: np.ndarray, q_outer: np.ndarray
) -> tuple[float, int]:
    """``(||D (Att_1 o Att_2)_X||, size)`` for Eq. 17 blocks with queries ``q_inner (d, k)``
    and ``q_outer (d, m)``, ``x (d, n)``; the product of the two Jacobians at their inputs."""
    form = Form("linear", "linear")
    d = x.shape[0]
    inner, outer = form.block(d, q_inner.shape[1]), form.block(d, q_outer.shape[1])
    inner_params, outer_params = {"Q": ctx.asarray(q_inner)}, {"Q": ctx.asarray(q_outer)}
    hidden, _ = inner.forward(inner_params, ctx.asarray(x))  # (d, k)
    jacobian = to_numpy(attention_jacobian(outer, outer_params, hidden)) @ to_numpy(
        attention_jacobian(inner, inner_params, ctx.asarray(x))
    )  # (d m, d n)
    return operator_norm_exact(jacobian), int(jacobian.size)


@check(
    id="lipschitz.eq22.composition",
    paper="LipschitzNorm",
    statement="two Eq. 17 layers in sequence: ||D (Att_1 o Att_2)_X||_F <= L_1 L_2, the Cor 1 "
    "bounds multiplied (Eq. 22)",
)
def eq22_composition(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    rng = ctx.rng
    for case in range(max(ctx.cases // 2, 2)):
        d, n, k, m = (int(rng.integers(1, 4)), *(int(v) for v in rng.integers(1, 5, size=3)))
        scale = 10.0 ** rng.uniform(-1, 1, size=n)  # input vectors of norms over two decades
        # every other input scaled by 1e2: normalised scores do not see it, unnormalised ones
        # saturate and the derivative grows with it (lipschitz.unnormalised_growth)
        x = rng.standard_normal((d, n)) * scale * (1e2 if case % 2 else 1.0)
        q_inner, q_outer = rng.standard_normal((d, k)), rng.standard_normal((d, m))
        _add(ctx, worst, x, q_inner, q_outer)
    # tied scores scaled by 1e3 (:func:`tied_case`): flat for normalised layers, where an
    # unnormalised inner layer's derivative grows a thousandfold
    tied = tied_case(rng, "linear")
    _add(ctx, worst, 1e3 * tied.x, tied.q, rng.standard_normal((tied.x.shape[0], 2)))
    return worst


def _add(ctx: Context, worst: WorstCase, x: np.ndarray, q_inner: np.ndarray,
         q_outer: np.ndarray) -> None:  # fmt: skip
    measured, size = composition_norm(ctx, x, q_inner, q_outer)
    (_, n), k, m = x.shape, q_inner.shape[1], q_outer.shape[1]
    bound = cor1_bound(m, k) * cor1_bound(k, n)
    worst.add(measured, bound * (1 + rounding_allowance(size)))
