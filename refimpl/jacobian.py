"""Jacobians of blocks and their operator norms, from forward- and reverse-mode derivatives.

LipschitzNorm (Sec. 3.2, Eq. 1) bounds the Lipschitz constant of a map ``f``
by the supremum over ``X`` of the operator norm of its derivative ``D f_X``.
For the Frobenius norm on inputs and outputs (the paper's ``L_F``) that norm is
the largest singular value of the Jacobian matrix. This module turns any pair
of derivative callables into that matrix and that number:

* ``jvp(h) -> D f_X(h)``: a tangent of the input's shape to one of the output's
  (forward mode, the blocks' ``jvp``);
* ``vjp(c) -> D f_X^T(c)``: a cotangent of the output's shape to one of the
  input's (reverse mode, the first entry of the blocks' ``backward``).

Conventions
-----------
* **Layout.** ``J[k, l] = d out.flat[k] / d in.flat[l]``, both flattened in C
  (row-major) order, so ``J @ h.ravel() == jvp(h).ravel()`` and
  ``c.ravel() @ J == vjp(c).ravel()``. ``J`` has shape ``(out.size, in.size)``.
* **Norm.** ``||D f_X||_F`` (Frobenius to Frobenius) is the spectral norm of
  ``J``: the largest singular value, ``0`` for an empty ``J``.
* **Cost.** The callables are black boxes, so assembling ``J`` takes one call
  per basis vector: ``in.size`` jvps (columns) or ``out.size`` vjps (rows);
  :func:`attention_jacobian` picks the cheaper one. Power iteration
  (:func:`operator_norm_power`) needs one jvp and one vjp per step and never
  forms ``J``: use it when ``J`` would be large.
* **Backend and dtype.** Basis vectors and starting vectors are made in the
  array module ``xp`` (the global backend's when ``None``) and ``dtype`` given
  by the caller; random numbers are drawn on the host from the caller's
  ``numpy.random.Generator`` and moved, so every backend sees the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import array_module, get_array_module

__all__ = [
    "PowerIteration",
    "attention_jacobian",
    "attention_jacobian_norm",
    "block_derivatives",
    "jacobian_central_differences",
    "jacobian_from_jvp",
    "jacobian_from_vjp",
    "operator_norm_exact",
    "operator_norm_power",
]

Linear = Callable[[Any], Any]  # a linear map between arrays: a jvp or a vjp


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _basis(shape: tuple[int, ...], xp: ModuleType, dtype: Any) -> Any:
    """The standard basis of arrays of ``shape``: ``(size, *shape)``, entry k the k-th unit."""
    size = _size(shape)
    return xp.eye(size, dtype=dtype).reshape((size, *shape))  # (size, *shape)


def jacobian_from_jvp(
    jvp: Linear, shape_in: tuple[int, ...], *, xp: ModuleType | None = None, dtype: Any = np.float64
) -> Any:
    """The Jacobian ``(out.size, in.size)`` column by column: column ``l`` is ``jvp(e_l)``.

    ``shape_in`` is the input's shape; the output's is read from the first call
    (an empty input gives a ``(0, 0)`` matrix: no call tells the output's size).

    Parameters
    ----------
    jvp : callable
        ``jvp(h) -> D f_X(h)``, linear, from an array of ``shape_in``.
    shape_in : tuple of int
        The input's shape.
    xp : module or None, default None
        The array module the basis is made in (the global backend's when ``None``).
    dtype : dtype, default numpy.float64
        The basis vectors' dtype.

    Returns
    -------
    array
        ``J``, ``(out.size, in.size)`` (module docstring, Layout).
    """
    xp = array_module() if xp is None else xp
    shape_in = tuple(int(s) for s in shape_in)
    basis = _basis(shape_in, xp, dtype)  # (in.size, *shape_in)
    if basis.shape[0] == 0:
        return xp.zeros((0, 0), dtype=dtype)
    # One call per input entry: the callable is a black box (module docstring, Cost).
    columns = [jvp(basis[k]).reshape(-1) for k in range(basis.shape[0])]  # in.size x (out.size,)
    return xp.stack(columns, axis=1)  # (out.size, in.size)


def jacobian_from_vjp(
    vjp: Linear,
    shape_out: tuple[int, ...],
    *,
    xp: ModuleType | None = None,
    dtype: Any = np.float64,
) -> Any:
    """The Jacobian ``(out.size, in.size)`` row by row: row ``k`` is ``vjp(e_k)``.

    ``shape_out`` is the output's shape; the input's is read from the first call
    (an empty output gives a ``(0, 0)`` matrix).

    Parameters
    ----------
    vjp : callable
        ``vjp(c) -> D f_X^T(c)``, linear, from an array of ``shape_out``.
    shape_out : tuple of int
        The output's shape.
    xp : module or None, default None
        The array module the basis is made in (the global backend's when ``None``).
    dtype : dtype, default numpy.float64
        The basis vectors' dtype.

    Returns
    -------
    array
        ``J``, ``(out.size, in.size)`` (module docstring, Layout).
    """
    xp = array_module() if xp is None else xp
    shape_out = tuple(int(s) for s in shape_out)
    basis = _basis(shape_out, xp, dtype)  # (out.size, *shape_out)
    if basis.shape[0] == 0:
        return xp.zeros((0, 0), dtype=dtype)
    rows = [vjp(basis[k]).reshape(-1) for k in range(basis.shape[0])]  # out.size x (in.size,)
    return xp.stack(rows, axis=0)  # (out.size, in.size)


def jacobian_central_differences(f: Callable[[Any], Any], x: Any, step: float = 1e-6) -> Any:
    """``J[:, l] = (f(x + step e_l) - f(x - step e_l)) / (2 step)``, for checking the others.

    Truncation error ``O(step^2)`` times the third derivative, rounding error
    ``O(u |f| / step)``: about ``1e-10`` relative in float64 at the default step
    for the smooth maps here. Meaningless within ``step`` of a kink (a tie in a
    ``max``).

    Parameters
    ----------
    f : callable
        The map, from an array of ``x``'s shape to an array.
    x : array
        The point, floating-point; not modified.
    step : float, default 1e-6
        The difference step.

    Returns
    -------
    array
        ``(out.size, x.size)`` in ``x``'s dtype and backend (``(0, 0)`` for an empty ``x``).
    """
    xp = get_array_module(x)
    basis = _basis(tuple(x.shape), xp, x.dtype) * step  # (x.size, *x.shape)
    columns = [
        (f(x + basis[k]) - f(x - basis[k])).reshape(-1) / (2 * step) for k in range(basis.shape[0])
    ]
    if not columns:
        return xp.zeros((0, 0), dtype=x.dtype)
    return xp.stack(columns, axis=1)  # (out.size, x.size)


def operator_norm_exact(jacobian: Any) -> float:
    """``||J||_2``, the largest singular value (the Frobenius -> Frobenius norm of ``D f_X``).

    Computed by the SVD of the backend (LAPACK ``gesdd`` on NumPy), whose
    singular values are exact to a few ``eps * ||J||_2 * max(shape)``; ``0.0``
    for a matrix without entries.

    Parameters
    ----------
    jacobian : array
        ``J``, 2-D ``(out.size, in.size)``, on any backend.

    Returns
    -------
    float
        The largest singular value.
    """
    xp = get_array_module(jacobian)
    if jacobian.ndim != 2:
        raise ValueError(
            f"jacobian must be 2-D (out.size, in.size), got shape {tuple(jacobian.shape)}; "
            "flatten it with .reshape(out_size, in_size)"
        )
    if jacobian.size == 0:
        return 0.0
    return float(xp.linalg.svd(jacobian, compute_uv=False)[0])


class PowerIteration(NamedTuple):
    """The outcome of :func:`operator_norm_power`.

    ``norm = ||J v||`` for the unit vector ``right``: a certified *lower* bound
    on ``||J||_2`` whatever the convergence. ``residual = ||J^T J v - norm^2
    v|| / norm^2`` (``0`` when ``J v = 0``): ``norm^2`` lies within ``residual *
    norm^2`` of an eigenvalue of ``J^T J`` (the symmetric Bauer-Fike bound), and
    a small residual with a random start makes that eigenvalue the top one
    unless the start was orthogonal to its eigenvector.

    Attributes
    ----------
    norm : float
        ``||J v||`` for the final unit ``v``: at most ``||J||_2``.
    residual : float
        The relative eigen-residual of ``v`` for ``J^T J``.
    iterations : int
        The ``J^T J`` products taken.
    converged : bool
        Whether ``residual <= tol``.
    right : array
        ``v``, of the input's shape, unit norm: the (approximate) top right singular vector.
    left : array
        ``J v / ||J v||``, of the output's shape (zeros when ``J v = 0``).
    """

    norm: float  # ||J v|| for the final unit v: <= ||J||_2
    residual: float  # relative eigen-residual of v for J^T J
    iterations: int  # J^T J products taken
    converged: bool  # residual <= tol
    right: Any  # v, shape_in, unit Frobenius norm: the (approximate) top right singular vector
    left: Any  # J v / ||J v||, the output's shape (zeros when J v = 0)


def _frobenius(a: Any) -> float:
    xp = get_array_module(a)
    return float(xp.sqrt(xp.sum(a * a)))


def operator_norm_power(
    jvp: Linear,
    vjp: Linear,
    shape_in: tuple[int, ...],
    rng: np.random.Generator,
    iters: int = 1000,
    tol: float = 1e-10,
    *,
    xp: ModuleType | None = None,
    dtype: Any = np.float64,
) -> PowerIteration:
    """``||D f_X||_F`` by power iteration on ``J^T J = vjp o jvp``, without forming ``J``.

    ``v <- J^T J v / ||J^T J v||`` from a standard normal start drawn from
    ``rng``, until the relative eigen-residual (see :class:`PowerIteration`)
    is at most ``tol`` or ``iters`` products were taken. The error of
    ``norm^2`` shrinks like ``(sigma_2 / sigma_1)^(2k)``: fast for a gap,
    slow for a nearly repeated top singular value, where ``converged`` may
    stay ``False`` while ``norm`` is already accurate (the Rayleigh quotient
    errs by about ``residual^2 / gap``).

    Parameters
    ----------
    jvp : callable
        ``jvp(h) -> J h``, from an array of ``shape_in``.
    vjp : callable
        ``vjp(c) -> J^T c``, from an array of the output's shape.
    shape_in : tuple of int
        The input's shape.
    rng : numpy.random.Generator
        Draws the standard normal start (on the host).
    iters : int, default 1000
        The most ``J^T J`` products taken, ``>= 1``.
    tol : float, default 1e-10
        The relative eigen-residual at which to stop.
    xp : module or None, default None
        The array module of the start (the global backend's when ``None``).
    dtype : dtype, default numpy.float64
        The start's dtype.

    Returns
    -------
    PowerIteration
        The estimate, its residual and the singular vectors.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    xp = array_module() if xp is None else xp
    shape_in = tuple(int(s) for s in shape_in)
    v = xp.asarray(rng.standard_normal(shape_in).astype(dtype))  # shape_in
    size = _frobenius(v)
    if size == 0.0:  # an empty input (or a zero draw): nothing to iterate
        out = jvp(v)
        return PowerIteration(0.0, 0.0, 0, True, v, xp.zeros_like(out))
    v = v / size
    for step in range(1, iters + 1):
        jv = jvp(v)  # shape_out
        norm = _frobenius(jv)
        if norm == 0.0:  # v in the null space: J = 0 on a random start, almost surely J = 0
            return PowerIteration(0.0, 0.0, step, True, v, xp.zeros_like(jv))
        jtjv = vjp(jv)  # shape_in, J^T J v
        eigenvalue = norm * norm  # the Rayleigh quotient <v, J^T J v> for unit v
        residual = _frobenius(jtjv - eigenvalue * v) / eigenvalue
        if residual <= tol or step == iters:
            return PowerIteration(norm, residual, step, residual <= tol, v, jv / norm)
        v = jtjv / _frobenius(jtjv)
    raise AssertionError("unreachable: the loop returns at step == iters")


# -- blocks --------------------------------------------------------------------------------------
def block_derivatives(
    block: Any, params: dict[str, Any], x: Any
) -> tuple[Linear | None, Linear, tuple[int, ...]]:
    """``(jvp, vjp, out_shape)`` of ``x -> block.forward(params, x)[0]`` at ``x``.

    ``jvp`` is ``None`` when the block has no ``jvp`` method; ``vjp`` is the
    input part of ``backward`` (parameters held fixed, as in ``D Att_X``).

    Parameters
    ----------
    block : Any
        A block with the layer protocol (``forward``, ``backward``, optionally ``jvp``).
    params : dict of str to array
        Its parameters.
    x : array
        The input at which to differentiate.

    Returns
    -------
    tuple
        ``(jvp, vjp, out_shape)``: two callables (``jvp`` may be ``None``), the output's shape.
    """
    out, cache = block.forward(params, x)
    has_jvp = callable(getattr(block, "jvp", None))

    def vjp(cotangent: Any) -> Any:
        d_x, _ = block.backward(params, cache, cotangent)
        return d_x

    def jvp(tangent: Any) -> Any:
        return block.jvp(params, cache, tangent)

    return (jvp if has_jvp else None), vjp, tuple(out.shape)


def attention_jacobian(block: Any, params: dict[str, Any], x: Any, mode: str = "auto") -> Any:
    """The Jacobian ``(out.size, x.size)`` of a block's output in its input, at ``x``.

    ``mode``: ``"jvp"`` (columns), ``"vjp"`` (rows) or ``"auto"`` (the one
    needing fewer calls; vjp when the block has no jvp). Works for every block
    with the layer protocol: :class:`refimpl.nn.lipschitz.multi_head_attention.Attention` (``x`` of
    shape ``(d, n)``, output ``(d, m)``), ``TransformerAttention`` and
    ``MultiHeadAttention``.

    Parameters
    ----------
    block : Any
        A block with the layer protocol.
    params : dict of str to array
        Its parameters.
    x : array
        The input at which to differentiate.
    mode : {"auto", "jvp", "vjp"}, default "auto"
        How to assemble ``J`` (above).

    Returns
    -------
    array
        ``(out.size, x.size)`` in ``x``'s dtype and backend.
    """
    if mode not in ("auto", "jvp", "vjp"):
        raise ValueError(f"mode must be 'auto', 'jvp' or 'vjp', got {mode!r}")
    jvp, vjp, out_shape = block_derivatives(block, params, x)
    xp = get_array_module(x)
    if mode == "jvp" and jvp is None:
        raise ValueError(f"{type(block).__name__} has no jvp method; use mode='vjp'")
    if mode == "auto":
        mode = "jvp" if jvp is not None and x.size < _size(out_shape) else "vjp"
    if mode == "jvp":
        return jacobian_from_jvp(jvp, tuple(x.shape), xp=xp, dtype=x.dtype)
    return jacobian_from_vjp(vjp, out_shape, xp=xp, dtype=x.dtype)


def attention_jacobian_norm(
    block: Any,
    params: dict[str, Any],
    x: Any,
    method: str = "exact",
    rng: np.random.Generator | None = None,
    **power_options: Any,
) -> float:
    """``||D block_X||_F``: ``"exact"`` (SVD of :func:`attention_jacobian`) or ``"power"``.

    ``"power"`` runs :func:`operator_norm_power` on the block's ``jvp`` and ``backward`` and
    returns its estimate, a lower bound on the norm; a block without ``jvp`` needs ``"exact"``.

    Parameters
    ----------
    block : Any
        A block with the layer protocol.
    params : dict of str to array
        Its parameters.
    x : array
        The input at which to differentiate.
    method : {"exact", "power"}, default "exact"
        The SVD of the assembled ``J``, or power iteration.
    rng : numpy.random.Generator or None, default None
        For ``"power"``: draws the start; ``None`` takes ``default_rng(0)``.
    **power_options : Any
        For ``"power"``: ``iters`` and ``tol`` of :func:`operator_norm_power`.

    Returns
    -------
    float
        The norm (a lower bound with ``"power"``).
    """
    if method == "exact":
        return operator_norm_exact(attention_jacobian(block, params, x))
    if method != "power":
        raise ValueError(f"method must be 'exact' or 'power', got {method!r}")
    jvp, vjp, _ = block_derivatives(block, params, x)
    if jvp is None:
        raise ValueError(f"{type(block).__name__} has no jvp method; use method='exact'")
    rng = np.random.default_rng(0) if rng is None else rng
    result = operator_norm_power(
        jvp, vjp, tuple(x.shape), rng, xp=get_array_module(x), dtype=x.dtype, **power_options
    )
    return result.norm
