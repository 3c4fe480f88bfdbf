"""The three LipschitzNorm score normalisations, each a forward / backward / jvp triple.

LipschitzNorm (Dasoulas et al. 2021) divides raw scores ``g~(X)`` (shape ``(m, n)``)
by one scalar ``c(X)`` (Eq. 13, ``g = g~ / c``):

* ``lipschitz_norm`` (Eq. 15, with ``g~ = Q^T X`` and ``L = ||Q||_*``, the exact
  ``L_{F,(2,inf)}`` of ``Q^T X``, proof of Cor. 1)::

      g = alpha g~ / max{ ||g~||_(2,inf), ||X^T||_(inf,2) ||Q||_* }

* ``linear_norm`` (Eq. 17)::  ``g = Q^T X / (||Q||_F ||X^T||_(inf,2))``
* ``transformer_norm`` (Eq. 19, ``X = (Q||K||V)``)::

      g = Q^T K / max{uv, uw, vw},  u = ||Q||_F, v = ||K^T||_(inf,2), w = ||V^T||_(inf,2)

Norms (Sec. 3.1 and the proof of Lemma 1): ``||M||_(inf,2) = max_i ||M_i,:||_2``
(so ``||X^T||_(inf,2)`` is the largest column norm of ``X``, the longest input
vector) and ``||M||_(2,inf) = sqrt(sum_i max_j M_ij^2)``. ``X`` is ``(d, n)``, one
input vector per column; ``Q`` is ``(d, m)`` (Eq. 15/17) or ``(d, n)`` (Eq. 19).

Each ``*_norm(raw, ...)`` returns ``(scores, cache)``; ``*_backward(cache,
d_scores)`` returns the gradients of ``<d_scores, scores>`` with respect to
``raw`` and to the arrays the denominator reads; ``*_jvp(cache, d_raw, ...)``
returns the forward-mode derivative of the scores for tangents of those same
arrays (the block turns its input tangent into ``d_raw``; parameters fixed).
The blocks in :mod:`refimpl.nn.lipschitz.multi_head_attention` chain ``raw`` to ``X`` and ``Q``.

Conventions
-----------
* **Ties.** Every ``max`` (the longest column, the largest ``|M_ij|`` of each row,
  the ``max{.,.}`` of Eq. 15, ``max{uv, uw, vw}`` of Eq. 19) is differentiated
  through ONE argument: the first maximiser in ``np.argmax`` order (columns left
  to right; ``[||g~||_(2,inf), ||X^T|| L]``; ``[uv, uw, vw]``). Backward and jvp
  use the same choice, so they stay adjoint at ties; at a tie this is one valid
  one-sided derivative (a subgradient), not the two-sided one, which does not exist.
* **The spectral norm** ``||Q||_*`` has gradient ``u1 v1^T`` (top singular
  pair). At a repeated top singular value that pair is whichever the SVD returns
  (still a subgradient). It enters only the gradient for ``Q``: jvps hold
  parameters fixed.
* **Zero denominator.** ``c = 0`` only when ``g~ = 0`` too (``X = 0`` or ``Q = 0``
  for Eq. 15/17; two of ``u, v, w`` zero for Eq. 19, and then ``Q = 0`` or ``K = 0``).
  There ``g`` is defined as ``0`` (uniform attention) and its derivative as ``0``
  with respect to everything. (``g`` has no limit there: it is invariant under
  ``X -> tX``.) A norm at a zero argument is given derivative ``0``, a valid
  subgradient; with ``c > 0`` only nonzero norms are differentiated.
* **Rounding.** ``|g~_ij| <= c`` holds exactly in the proofs (Sec. 9.6-9.8) but
  a dot product and a product of norms round differently, so ``g~ / c`` can
  exceed ``1`` by an ulp. It is clipped to ``[-1, 1]``, which only moves it toward
  the exact value; derivatives treat the clip as the identity. Hence ``|g| <= 1``
  (Eq. 17, 19) and ``|g| <= alpha`` (Eq. 15, ``alpha`` multiplies after the clip)
  hold exactly in floating point.
* There is no eps anywhere: the denominators are used as they are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.nn.overflow import check_overflow
from refimpl.validation import check_array

__all__ = [
    "LinearNormCache",
    "LipschitzNormCache",
    "TransformerNormCache",
    "inf2_norm",
    "largest_pair_product",
    "largest_pair_product_backward",
    "linear_norm",
    "linear_norm_backward",
    "linear_norm_jvp",
    "lipschitz_norm",
    "lipschitz_norm_backward",
    "lipschitz_norm_jvp",
    "transformer_norm",
    "transformer_norm_backward",
    "transformer_norm_jvp",
    "two_inf_norm",
]

# Eq. 19's products, as indices into (u, v, w), in max{uv, uw, vw} order.
_PAIRS = ((0, 1), (0, 2), (1, 2))


# -- the norms ----------------------------------------------------------------------------------
def inf2_norm(m: Any) -> float:
    """``||M||_(inf,2) = max_i ||M_i,:||_2``, the largest row norm (0 for no rows).

    ``||X^T||_(inf,2) = inf2_norm(X.T)`` is the largest column norm of ``X``.
    """
    xp = check_array(m, "m", ndim=2)
    if m.shape[0] == 0:
        return 0.0
    return float(xp.max(xp.sqrt(xp.sum(m * m, axis=1))))


def two_inf_norm(m: Any) -> float:
    """``||M||_(2,inf) = sqrt(sum_i max_j M_ij^2)``: the L2 norm of the row-wise max-abs."""
    xp = check_array(m, "m", ndim=2)
    if m.size == 0:
        return 0.0
    return float(xp.sqrt(xp.sum(xp.max(xp.abs(m), axis=1) ** 2)))


def _max_column_norm(x: Any) -> tuple[Any, int]:
    """``||X^T||_(inf,2)`` (0-d) and the first column attaining it."""
    xp = get_array_module(x)
    norms = xp.sqrt(xp.sum(x * x, axis=0))  # (n,)
    index = int(xp.argmax(norms))
    return norms[index], index


def _max_column_norm_jvp(x: Any, value: Any, index: int, h: Any) -> Any:
    xp = get_array_module(x)
    if not bool(value > 0):
        return xp.zeros((), dtype=x.dtype)
    return xp.sum(x[:, index] * h[:, index]) / value


def _max_column_norm_vjp(x: Any, value: Any, index: int, d_value: Any) -> Any:
    d_x = get_array_module(x).zeros_like(x)  # (d, n): only the chosen column moves the max
    if bool(value > 0):
        d_x[:, index] = d_value * x[:, index] / value
    return d_x


def _row_abs_max(m: Any) -> tuple[Any, Any, Any]:
    """``||M||_(2,inf)`` (0-d), per row the first column of the largest ``|M_ij|`` (rows,),
    and those signed entries (rows,)."""
    xp = get_array_module(m)
    columns = xp.argmax(xp.abs(m), axis=1)  # (rows,)
    picked = xp.take_along_axis(m, columns[:, None], axis=1)[:, 0]  # (rows,)
    return xp.sqrt(xp.sum(picked * picked)), columns, picked


def _row_abs_max_jvp(value: Any, columns: Any, picked: Any, d_m: Any) -> Any:
    xp = get_array_module(d_m)
    if not bool(value > 0):
        return xp.zeros((), dtype=d_m.dtype)
    d_picked = xp.take_along_axis(d_m, columns[:, None], axis=1)[:, 0]  # (rows,)
    return xp.sum(picked * d_picked) / value


def _row_abs_max_vjp(value: Any, columns: Any, picked: Any, d_value: Any, like: Any) -> Any:
    xp = get_array_module(like)
    d_m = xp.zeros_like(like)  # (rows, n): the adjoint of take_along_axis is a scatter
    if bool(value > 0):
        d_m[xp.arange(like.shape[0]), columns] = d_value * picked / value
    return d_m


def _frobenius(q: Any) -> Any:
    xp = get_array_module(q)
    return xp.sqrt(xp.sum(q * q))


def _spectral(q: Any) -> tuple[Any, Any, Any]:
    """``||Q||_*`` and the top singular pair ``(u1 (d,), v1 (m,))``: d||Q||_* = u1^T dQ v1."""
    xp = get_array_module(q)
    left, singular, right_t = xp.linalg.svd(q, full_matrices=False)  # (d, k), (k,), (k, m)
    return singular[0], left[:, 0], right_t[0]


# -- g = g~ / c, shared by all three ------------------------------------------------------------
def _ratio(raw: Any, denominator: Any) -> Any:
    xp = get_array_module(raw)
    # the norms square their inputs: an infinite c from finite ones would zero every score
    check_overflow(denominator, "LipschitzNorm: the score denominator", raw.dtype)
    if not bool(denominator > 0):
        return xp.zeros_like(raw)  # the zero-denominator convention
    return xp.clip(raw / denominator, -1.0, 1.0)  # clip: rounding only (module docstring)


def _ratio_backward(ratio: Any, denominator: Any, d_ratio: Any) -> tuple[Any, Any]:
    """``(d_raw, d_c)`` for ``ratio = raw / c``: ``d_raw = d_ratio / c``,
    ``d_c = -<d_ratio, ratio> / c``."""
    xp = get_array_module(ratio)
    if not bool(denominator > 0):
        return xp.zeros_like(ratio), xp.zeros((), dtype=ratio.dtype)
    return d_ratio / denominator, -xp.sum(d_ratio * ratio) / denominator


def _ratio_jvp(ratio: Any, denominator: Any, d_raw: Any, d_c: Any) -> Any:
    """``D(raw / c) = (d_raw - ratio d_c) / c`` (Sec. 9.5, Eq. 38)."""
    if not bool(denominator > 0):
        return get_array_module(ratio).zeros_like(ratio)
    return (d_raw - ratio * d_c) / denominator


# -- Eq. 17 -------------------------------------------------------------------------------------
class LinearNormCache(NamedTuple):
    """What :func:`linear_norm_backward` and :func:`linear_norm_jvp` read."""

    ratio: Any  # (m, n) the scores g
    denominator: Any  # 0-d c = ||Q||_F ||X^T||_(inf,2)
    q_norm: Any  # 0-d ||Q||_F
    x_norm: Any  # 0-d ||X^T||_(inf,2)
    x_argmax: int  # the (first) longest column of X
    x: Any  # (d, n)
    q: Any  # (d, m)


def linear_norm(raw: Any, x: Any, q: Any) -> tuple[Any, LinearNormCache]:
    """LipschitzNorm Eq. 17: ``g = raw / (||Q||_F ||X^T||_(inf,2))`` for ``raw = Q^T X``."""
    # F1 the two norms, F2 c (Sec. 5 "Implementation details", steps 1-3)
    q_norm = _frobenius(q)
    x_norm, x_argmax = _max_column_norm(x)
    denominator = q_norm * x_norm
    # F3 g = raw / c (m, n)
    ratio = _ratio(raw, denominator)
    return ratio, LinearNormCache(ratio, denominator, q_norm, x_norm, x_argmax, x, q)


def linear_norm_backward(cache: LinearNormCache, d_scores: Any) -> tuple[Any, Any, Any]:
    """Gradients ``(d_raw (m, n), d_x (d, n), d_q (d, m))`` through the denominator."""
    # B3 (of F3)
    d_raw, d_c = _ratio_backward(cache.ratio, cache.denominator, d_scores)
    # B2 (of F2) c = ||Q||_F ||X^T||, B1 (of F1) the norms
    d_x = _max_column_norm_vjp(cache.x, cache.x_norm, cache.x_argmax, d_c * cache.q_norm)
    d_q = cache.q * (d_c * cache.x_norm / cache.q_norm) if bool(cache.q_norm > 0) else 0 * cache.q
    return d_raw, d_x, d_q


def linear_norm_jvp(cache: LinearNormCache, d_raw: Any, d_x: Any) -> Any:
    """``D g`` for tangents ``d_raw`` of ``raw`` and ``d_x`` of ``X`` (``Q`` fixed)."""
    # J1 (of F1), J2 (of F2)
    d_c = cache.q_norm * _max_column_norm_jvp(cache.x, cache.x_norm, cache.x_argmax, d_x)
    # J3 (of F3)
    return _ratio_jvp(cache.ratio, cache.denominator, d_raw, d_c)


# -- Eq. 15 -------------------------------------------------------------------------------------
class LipschitzNormCache(NamedTuple):
    """What :func:`lipschitz_norm_backward` and :func:`lipschitz_norm_jvp` read."""

    ratio: Any  # (m, n) raw / c, so g = alpha * ratio
    denominator: (
        Any  # 0-d c = max{||g~||_(2,inf), ||X^T||_(inf,2) ||Q||_*} (= alpha c(X), Sec. 9.6)
    )
    alpha: float
    branch: int  # argument of the max taken: 0 ||g~||_(2,inf), 1 ||X^T||_(inf,2) ||Q||_*
    raw_norm: Any  # 0-d ||g~||_(2,inf)
    raw_columns: Any  # (m,) per row the (first) column of the largest |g~_ij|
    raw_picked: Any  # (m,) those entries g~_ij
    x_norm: Any  # 0-d ||X^T||_(inf,2)
    x_argmax: int
    spectral: Any  # 0-d ||Q||_*
    singular_pair: tuple  # (u1 (d,), v1 (m,)): the gradient of ||Q||_* is outer(u1, v1)
    x: Any  # (d, n)


def lipschitz_norm(raw: Any, x: Any, q: Any, alpha: float = 1.0) -> tuple[Any, LipschitzNormCache]:
    """LipschitzNorm Eq. 15 with ``L = ||Q||_*``: ``g = alpha raw / max{||raw||_(2,inf),
    ||X^T||_(inf,2) ||Q||_*}`` for ``raw = Q^T X``, ``alpha >= 0``."""
    if not alpha >= 0:  # also refuses NaN
        raise ValueError(f"alpha must be >= 0 (LipschitzNorm Eq. 15), got {alpha}")
    xp = get_array_module(raw)
    # F1 the norms: ||g~||_(2,inf), ||X^T||_(inf,2), L = ||Q||_*
    raw_norm, raw_columns, raw_picked = _row_abs_max(raw)
    x_norm, x_argmax = _max_column_norm(x)
    spectral, left, right = _spectral(q)
    # F2 c = max{a, b}, differentiated through the first maximiser
    candidates = xp.stack([raw_norm, x_norm * spectral])  # (2,)
    branch = int(xp.argmax(candidates))
    denominator = candidates[branch]
    # F3 ratio = raw / c (m, n), F4 g = alpha ratio
    ratio = _ratio(raw, denominator)
    cache = LipschitzNormCache(
        ratio,
        denominator,
        alpha,
        branch,
        raw_norm,
        raw_columns,
        raw_picked,
        x_norm,
        x_argmax,
        spectral,
        (left, right),
        x,
    )
    return alpha * ratio, cache


def lipschitz_norm_backward(cache: LipschitzNormCache, d_scores: Any) -> tuple[Any, Any, Any]:
    """Gradients ``(d_raw (m, n), d_x (d, n), d_q (d, m))`` through the denominator."""
    xp = get_array_module(d_scores)
    # B4 (of F4), B3 (of F3)
    d_raw, d_c = _ratio_backward(cache.ratio, cache.denominator, cache.alpha * d_scores)
    # B2 (of F2) only the chosen argument of the max receives d_c; B1 (of F1) its norms
    d_x = xp.zeros_like(cache.x)
    left, right = cache.singular_pair
    d_q = xp.zeros((left.shape[0], right.shape[0]), dtype=d_raw.dtype)
    if cache.branch == 0:
        d_raw = d_raw + _row_abs_max_vjp(
            cache.raw_norm, cache.raw_columns, cache.raw_picked, d_c, d_raw
        )
    elif bool(cache.denominator > 0):
        d_x = _max_column_norm_vjp(cache.x, cache.x_norm, cache.x_argmax, d_c * cache.spectral)
        d_q = (d_c * cache.x_norm) * (left[:, None] * right[None, :])  # (d, m)
    return d_raw, d_x, d_q


def lipschitz_norm_jvp(cache: LipschitzNormCache, d_raw: Any, d_x: Any) -> Any:
    """``D g`` for tangents ``d_raw`` of ``raw`` and ``d_x`` of ``X`` (``Q`` fixed)."""
    # J1 (of F1), J2 (of F2): the chosen argument's derivative
    if cache.branch == 0:
        d_c = _row_abs_max_jvp(cache.raw_norm, cache.raw_columns, cache.raw_picked, d_raw)
    else:
        d_c = cache.spectral * _max_column_norm_jvp(cache.x, cache.x_norm, cache.x_argmax, d_x)
    # J3 (of F3), J4 (of F4)
    return cache.alpha * _ratio_jvp(cache.ratio, cache.denominator, d_raw, d_c)


# -- Eq. 19 -------------------------------------------------------------------------------------
def largest_pair_product(u: Any, v: Any, w: Any) -> tuple[Any, Any]:
    """Eq. 19's denominator ``max{uv, uw, vw}``, elementwise over arrays of one shape.

    Returns ``(product, branch)``: ``branch`` (int array of that shape) is the
    product taken, ``0`` uv, ``1`` uw, ``2`` vw, the first maximiser at a tie.
    Shared by :func:`transformer_norm` (0-d norms) and the per-target form of
    :mod:`refimpl.nn.transformer.transformer_conv` (``(N, H)`` norms).
    """
    xp = get_array_module(u, v, w)
    norms = (u, v, w)
    products = xp.stack([norms[i] * norms[j] for i, j in _PAIRS])  # (3, *S)
    branch = xp.argmax(products, axis=0)  # (*S,) first maximiser
    return xp.max(products, axis=0), branch


def largest_pair_product_backward(norms: tuple, branch: Any, d_product: Any) -> tuple:
    """Adjoint of :func:`largest_pair_product`: ``(d_u, d_v, d_w)``, each ``d_product``'s shape.

    Only the chosen product receives ``d_product``, by ``d(ab) = b da + a db``;
    ``branch`` is an int or an int array (as returned by the forward).
    """
    xp = get_array_module(d_product)
    d_norms = [xp.zeros_like(d_product) for _ in range(3)]
    for pair, (i, j) in enumerate(_PAIRS):
        # A bare int branch gives a Python bool, which cupy.where refuses (it calls .astype).
        won = xp.asarray(branch == pair)
        chosen = xp.where(won, d_product, 0)  # d_product where this product won
        d_norms[i] = d_norms[i] + chosen * norms[j]
        d_norms[j] = d_norms[j] + chosen * norms[i]
    return tuple(d_norms)


class TransformerNormCache(NamedTuple):
    """What :func:`transformer_norm_backward` and :func:`transformer_norm_jvp` read."""

    ratio: Any  # (n, n) the scores g
    denominator: Any  # 0-d c = max{uv, uw, vw}
    branch: int  # product taken: 0 uv, 1 uw, 2 vw
    norms: tuple  # 0-d (u, v, w) = (||Q||_F, ||K^T||_(inf,2), ||V^T||_(inf,2))
    k_argmax: int  # (first) longest column of K
    v_argmax: int  # (first) longest column of V
    q: Any  # (d, n) queries
    k: Any  # (d, n) keys
    v: Any  # (d, n) values


def transformer_norm(raw: Any, q: Any, k: Any, v: Any) -> tuple[Any, TransformerNormCache]:
    """LipschitzNorm Eq. 19: ``g = raw / max{uv, uw, vw}`` for ``raw = Q^T K``."""
    # F1 u = ||Q||_F, v = ||K^T||_(inf,2), w = ||V^T||_(inf,2)
    k_norm, k_argmax = _max_column_norm(k)
    v_norm, v_argmax = _max_column_norm(v)
    norms = (_frobenius(q), k_norm, v_norm)
    # F2 c = max{uv, uw, vw} (the largest times the second largest), first maximiser
    denominator, branch = largest_pair_product(*norms)
    branch = int(branch)
    # F3 g = raw / c (n, n)
    ratio = _ratio(raw, denominator)
    cache = TransformerNormCache(ratio, denominator, branch, norms, k_argmax, v_argmax, q, k, v)
    return ratio, cache


def transformer_norm_backward(
    cache: TransformerNormCache, d_scores: Any
) -> tuple[Any, Any, Any, Any]:
    """Gradients ``(d_raw (n, n), d_q, d_k, d_v (d, n) each)`` through the denominator."""
    # B3 (of F3)
    d_raw, d_c = _ratio_backward(cache.ratio, cache.denominator, d_scores)
    # B2 (of F2) only the chosen product receives d_c
    d_norms = largest_pair_product_backward(cache.norms, cache.branch, d_c)
    # B1 (of F1) the norms (each zero when its d_norm is: c = 0 gives d_c = 0)
    u = cache.norms[0]
    d_q = cache.q * (d_norms[0] / u) if bool(u > 0) else 0 * cache.q
    d_k = _max_column_norm_vjp(cache.k, cache.norms[1], cache.k_argmax, d_norms[1])
    d_v = _max_column_norm_vjp(cache.v, cache.norms[2], cache.v_argmax, d_norms[2])
    return d_raw, d_q, d_k, d_v


def transformer_norm_jvp(
    cache: TransformerNormCache, d_raw: Any, d_q: Any, d_k: Any, d_v: Any
) -> Any:
    """``D g`` for tangents ``d_raw`` of ``raw`` and ``d_q, d_k, d_v`` of ``Q, K, V``."""
    xp = get_array_module(d_raw)
    # J1 (of F1) du, dv, dw
    u = cache.norms[0]
    d_u = xp.sum(cache.q * d_q) / u if bool(u > 0) else xp.zeros((), dtype=d_raw.dtype)
    d_norms = (
        d_u,
        _max_column_norm_jvp(cache.k, cache.norms[1], cache.k_argmax, d_k),
        _max_column_norm_jvp(cache.v, cache.norms[2], cache.v_argmax, d_v),
    )
    # J2 (of F2) the chosen product
    i, j = _PAIRS[cache.branch]
    d_c = d_norms[i] * cache.norms[j] + cache.norms[i] * d_norms[j]
    # J3 (of F3)
    return _ratio_jvp(cache.ratio, cache.denominator, d_raw, d_c)
