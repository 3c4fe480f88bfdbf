"""What the checks compare: the measured ``||D Att_X||_F`` and the paper's bounds on it.

Measured: :func:`jacobian_norm`, the largest singular value of a block's
Jacobian (:mod:`refimpl.jacobian`, an exact SVD). Bounding: the (F, (2,inf))
operator norm of Sec. 3.1, *exactly*, on the host and independently of
:mod:`refimpl.nn.lipschitz.score_norms` (:func:`two_inf_operator_norm`), and the bounds of
Thm 2 and 3 (Eq. 14, 16), Cor 1 and 2 (Eq. 18, 20), Eq. 21 and Thm 1's pointwise
form. An upper bound is widened by :func:`rounding_allowance`, whose reasoning
is in the package docstring (:mod:`proofs_check.lipschitz`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from proofs_check.lipschitz.forms import Case, Form
from proofs_check.registry import Context
from refimpl.jacobian import attention_jacobian, operator_norm_exact

__all__ = [
    "EQ21_CONSTANT",
    "cor1_bound",
    "cor2_bound",
    "eq21_bound",
    "form_bound",
    "jacobian_norm",
    "rounding_allowance",
    "thm1_bound",
    "thm3_bound",
    "two_inf_operator_norm",
]

EQ21_CONSTANT = 11.0  # Eq. 21: e^sqrt3 + 2 sqrt6 = 10.55 (Cor 2 at m = n), rounded up
_SELECTIONS_MAX = 5000  # n^m row selections enumerated by two_inf_operator_norm
_EPS = float(np.finfo(np.float64).eps)


# -- norms (host, independent of refimpl.nn.lipschitz.score_norms) ---------------------------
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
    """Relative allowance ``(size(J) + 64) eps`` on an upper bound (package docstring)."""
    return (jacobian_size + 64) * _EPS


# -- the measured quantity ------------------------------------------------------------------------
def jacobian_norm(block: Any, params: dict[str, Any], x: Any) -> tuple[float, int]:
    """``(||D block_X||_F, size of the Jacobian)``, by an exact SVD."""
    jacobian = attention_jacobian(block, params, x)
    return operator_norm_exact(jacobian), int(jacobian.size)


def _measure(ctx: Context, case: Case) -> tuple[float, int]:
    d, m, _ = case.dims
    params = {} if case.q is None else {"Q": ctx.asarray(case.q)}
    return jacobian_norm(case.form.block(d, m), params, ctx.asarray(case.x))


# -- the bounds -----------------------------------------------------------------------------------
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


def form_bound(form: Form, m: int, n: int) -> float:
    """The paper's bound on ``L_F`` for a normalised form (Eq. 16, 18 or 20)."""
    if form.normalization is None:
        raise ValueError("unnormalised attention has no Lipschitz bound (it is not Lipschitz)")
    if form.kind == "transformer":
        return cor2_bound(m, n)
    if form.normalization == "linear":
        return cor1_bound(m, n)
    return thm3_bound(form.alpha, m, n)
