"""The estimator under check: the library's positive random features, over many projections.

:func:`kernel_estimates` evaluates Prop. 1's ``SM^_m(x, y) = phi(x)^T phi(y)`` with the
library's :func:`~refimpl.nn.nodeformer.random_features.positive_random_features` for many
independent projections at once, stacked by :func:`projection_stack` from the
library's :func:`~refimpl.nn.nodeformer.random_features.draw_projection`. Both are looked up in
this module when a check runs, so a test swaps in a broken one here.
:func:`rounding_allowance` bounds the float64 rounding of each estimate. ``TAUS`` are
the temperatures of the Thm 1, Eq. 5, Thm 2 and Eq. 7 checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from proofs_check.registry import Context
from refimpl.backend import to_numpy
from refimpl.nn.nodeformer.random_features import draw_projection, positive_random_features

__all__ = ["TAUS", "kernel_estimates", "projection_stack", "rounding_allowance"]

TAUS = (0.25, 0.5, 1.0)  # temperatures; 0.25 is the paper's (Sec. 4)


def projection_stack(rng: np.random.Generator, draws: int, m: int, d: int, kind: str) -> Any:
    """``draws`` independent projections of ``m`` rows, stacked: host ``(draws m, d)``.

    One call of :func:`draw_projection` (looked up when called, so a test can
    swap it). ``"orthogonal"`` draws ``ceil(m/d)`` whole blocks per projection and
    keeps the first ``m`` rows of each group, so every group has the distribution
    of ``draw_projection(rng, m, d, "orthogonal")`` and no block straddles two.
    """
    if kind == "iid":
        return draw_projection(rng, draws * m, d, "iid")
    per_draw = -(-m // d) * d
    stacked = draw_projection(rng, draws * per_draw, d, kind)  # (draws per_draw, d)
    return stacked.reshape(draws, per_draw, d)[:, :m].reshape(draws * m, d)


def kernel_estimates(ctx: Context, x: Any, y: Any, omega: Any, draws: int) -> np.ndarray:
    """``SM^_m(x, y)`` for each of the ``draws`` projections in ``omega``: host ``(draws,)``.

    The library's :func:`positive_random_features` of ``[x; y]`` on ``ctx``'s
    backend. It normalises by ``1/sqrt(rows) = 1/sqrt(draws m)``, so a projection's
    estimate is ``draws`` times the sum of its ``m`` products ``phi(x)_i phi(y)_i``.
    """
    features = positive_random_features(ctx.asarray(np.stack([x, y])), ctx.asarray(omega))
    products = to_numpy(features[0] * features[1]).reshape(draws, -1)  # (draws, m)
    return draws * products.sum(axis=1)


def rounding_allowance(omega: Any, x: Any, y: Any, m: int) -> float:
    """Relative rounding bound ``gamma`` on each computed ``SM^_m`` (float64).

    An exponent ``w^T x - |x|^2/2`` errs by at most ``(d + 2) u (|w||x| + |x|^2)``
    (``u = eps/2``), so ``exp`` by that plus ``u``; the ``1/sqrt(rows)`` factors,
    the product and the rescaling add ``4u``, the ``m``-term sum ``(m - 1) u``. With
    ``T = max_i |w_i| (|x| + |y|) + |x|^2 + |y|^2``: ``gamma = (m + 8 + (d + 2) T) eps``,
    twice the sum. It matters only where ``V_m = 0`` (``x = -y``, ``x = y = 0``).
    """
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    t = float(np.linalg.norm(omega, axis=1).max()) * (nx + ny) + nx**2 + ny**2
    return (m + 8 + (x.size + 2) * t) * float(np.finfo(np.float64).eps)
