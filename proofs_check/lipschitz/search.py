"""Adversarial search: how close does ``||D Att_X||_F`` come to the paper's bound?

:func:`tightness` maximises the exact ``||D Att_X||_F`` over ``X`` (and the
queries ``Q``) for a normalised form, by random restarts each followed by a
gradient ascent (:func:`_ascend`). The gradient of the top singular value is a
central difference of the block's own backward along the top right singular
vector (:func:`_norm_and_gradient`): no autodiff and no second-derivative code.
The value found is exact at the point returned, hence a lower bound on ``L_F``.
``scripts/lipschitz_tightness.py`` prints the table; the checks of Thm 3, Cor 1
and Cor 2 end their fixed cases with a short ascent (:func:`_ascent_case`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from proofs_check.lipschitz.bounds import form_bound
from proofs_check.lipschitz.forms import Case, Form
from refimpl.backend import to_numpy
from refimpl.jacobian import attention_jacobian

__all__ = ["Tightness", "tightness"]


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
