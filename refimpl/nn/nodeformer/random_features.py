"""Positive random features (NodeFormer Eq. 4) and the projection ``omega`` they are drawn from.

For ``x`` in ``R^d`` and a projection ``omega`` ``(m, d)`` with rows ``w_i``::

    phi(x) = exp(-||x||^2 / 2) / sqrt(m) * [exp(w_1^T x), ..., exp(w_m^T x)]      (Eq. 4)

so that ``E_w[phi(x)^T phi(y)] = exp(x^T y)`` when every row is ``N(0, I_d)``
(NodeFormer Prop. 1, Eq. 18). Rows of ``x`` are nodes: ``x (N, d) -> phi (N, m)``.
``omega`` is noise, drawn by :func:`draw_projection` (or passed in, e.g. replayed
from another framework) and held fixed: nothing here differentiates it.

Stabiliser
----------
``exp(w^T x)`` overflows for large ``x``. Performer and the NodeFormer code
subtract a max inside the exponent; here the shift ``c`` is taken over the whole
exponent ``a_i(x) = w_i^T x - ||x||^2 / 2``, and the features become
``exp(a_i(x) - c) / sqrt(m)``, every entry ``<= 1 / sqrt(m)``:

* ``stabilizer="row"`` (queries): ``c_u = max_i a_i(x_u)``, one per row. The
  largest feature of every row is exactly ``1 / sqrt(m)``, so no row underflows
  to all zeros.
* ``stabilizer="global"`` (keys): one ``c = max_{u,i} a_i(x_u)`` for the array.
* ``None``: ``c = 0``, Eq. 4 as printed.

What cancels: the kernelised softmax (Eq. 5, 7) is a ratio,
``phi(q_u)^T sum_v phi(k_v) v_v^T / phi(q_u)^T sum_w phi(k_w)``. A factor
``e^{-c_u}`` on the features of *query* ``u`` multiplies its numerator and its
denominator and cancels; one factor ``e^{-c}`` common to *all keys* factors out
of both sums and cancels (per Gumbel sample, a factor common to all keys of that
sample cancels in that sample's ratio, Eq. 7 / Alg. 1 line 8, because each
sample is normalised before the average). What does not cancel: a per-*key*
factor ``e^{-c_v}`` re-weights key ``v`` (that is what ``e^{g_v / tau}`` does
on purpose), so a row shift on keys changes the attention; and nothing cancels
in ``phi`` itself or in the kernel estimate ``phi(x)^T phi(y) ~ exp(x^T y)``
(Prop. 1), which the shifts scale by ``e^{-c_x - c_y}``.

Which function the backward differentiates
------------------------------------------
``PositiveRandomFeatures(stabilizer, hold_shift=False)`` (default): the features
exactly as returned, shift included: ``c`` is a max, so the derivative routes
through its first maximiser in ``argmax`` order (at a tie this is one of the
one-sided derivatives, as everywhere in refimpl). For ``"row"`` the
``||x||^2`` terms cancel and ``d phi_i / d x = phi_i (w_i - w_{i*})``.

``hold_shift=True``: the derivative of ``x -> positive_random_features(x, omega,
shift=cache.shift)``, the shift frozen at its forward value. That is not the
derivative of ``phi`` as returned, but it is the exact derivative of every
consumer in which the shift cancels (the ratios above, the edge probabilities of
Eq. 12), and it is what :mod:`refimpl.nn.nodeformer.kernel_attention` uses.

Differences from the authors' ``softmax_kernel_transformation``: they shift by
the max of ``omega x`` alone (ours adds ``-||x||^2/2`` inside the max: the two
differ by a per-row factor for ``"row"`` and by another global constant for
``"global"``, so the ratios agree), they add ``1e-6`` to every feature (which
does not cancel; we add nothing), and their ``x`` carries NodeFormerConv's
``d^{-1/4}`` scaling (applied by the caller here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module
from refimpl.fields import check_bool, check_positive_int
from refimpl.validation import check_cotangent, check_input, check_like, check_params

__all__ = [
    "PROJECTION_KINDS",
    "STABILIZERS",
    "PositiveRandomFeatures",
    "RandomFeaturesCache",
    "draw_gumbel",
    "draw_projection",
    "feature_exponent",
    "positive_random_features",
    "positive_random_features_backward",
]

PROJECTION_KINDS = ("iid", "orthogonal")
STABILIZERS = (None, "row", "global")


def draw_projection(rng: np.random.Generator, m: int, d: int, kind: str = "iid") -> np.ndarray:
    """Draw the projection ``omega`` ``(m, d)`` of Eq. 4: host ``float64``, rows ``N(0, I_d)``.

    Parameters
    ----------
    rng : numpy.random.Generator
        The generator the draws come from, in the order below.
    m : int
        The number of random features (rows).
    d : int
        The width of the inputs the features are taken of (columns).
    kind : {"iid", "orthogonal"}, default "iid"
        Independent Gaussian rows, or orthogonal blocks as below.

    Returns
    -------
    numpy.ndarray, (m, d)
        On the host; move it to a device and dtype with
        ``refimpl.backend.asarray(omega, backend=..., dtype=...)``.

    Notes
    -----
    ``kind="iid"``: ``omega = rng.standard_normal((m, d))`` (NodeFormer Eq. 4).

    ``kind="orthogonal"``: orthogonal random features (Performer's
    ``gaussian_orthogonal_random_matrix``, NodeFormer's ``create_projection_matrix``),
    drawn in this order from ``rng``, so any framework can replay it:

    1. for ``b = 0, ..., ceil(m / d) - 1``: ``G_b = rng.standard_normal((d, d))``;
       ``Q_b, R_b = qr(G_b)``; ``Q_b <- Q_b diag(s)`` with ``s_j = sign(R_b[j, j])``
       (``+1`` where that is 0). Block ``b`` is ``Q_b^T``: its rows are the columns
       of ``Q_b``, mutually orthogonal unit vectors. The last block keeps only its
       first ``m - d (ceil(m / d) - 1)`` rows.
    2. ``lengths = ||rows of rng.standard_normal((m, d))||``: independent ``chi_d``.
    3. ``omega = lengths[:, None] * vstack(blocks)``.

    The sign correction in step 1 makes ``Q_b`` Haar-distributed (Mezzadri 2007)
    and unique, so every row is marginally ``N(0, I_d)`` (a uniform direction
    times an independent ``chi_d`` length) and Prop. 1 holds row by row, whatever
    QR routine replays it. Performer and the NodeFormer code omit it; with
    LAPACK's Householder QR their ``Q[0, 0] = -|G[0, 0]| / ||G[:, 0]|| <= 0``
    always, so the first row of every block is not isotropic. The authors also
    reseed torch before each block; here one generator's stream runs through.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator, got {type(rng).__name__}; "
            "use numpy.random.default_rng(seed)"
        )
    for name, value in (("m", m), ("d", d)):
        check_positive_int(value, f"draw_projection {name}")  # bounded: 2**62 is no array
    if kind == "iid":
        return rng.standard_normal((m, d))
    if kind != "orthogonal":
        raise ValueError(f"projection kind must be one of {PROJECTION_KINDS}, got {kind!r}")
    num_blocks = -(-m // d)  # ceil(m / d)
    # one (B, d, d) draw is the B (d, d) draws of step 1 in order; QR is batched
    q, r = np.linalg.qr(rng.standard_normal((num_blocks, d, d)))  # (B, d, d) each
    signs = np.where(np.diagonal(r, axis1=1, axis2=2) < 0, -1.0, 1.0)  # (B, d)
    blocks = (q * signs[:, None, :]).transpose(0, 2, 1)  # (B, d, d): signed columns as rows
    directions = blocks.reshape(num_blocks * d, d)[:m]  # (m, d) unit rows
    lengths = np.linalg.norm(rng.standard_normal((m, d)), axis=1)  # (m,) chi_d
    return lengths[:, None] * directions


def feature_exponent(x: Any, omega: Any, scale: float = 1.0, transposed: bool = False) -> Any:
    """The exponent of Eq. 4 at ``s x`` (``s = scale``), ``a_i(s x_u) = s w_i^T x_u - s^2
    ||x_u||^2 / 2``, without forming ``s x``: ``(..., d) -> (..., m)`` (rows ``(N, d)``, or
    per head ``(N, H, d)``); ``transposed=True``: ``a^T (m, N)`` of rows ``(N, d)``,
    computed in that orientation (C-contiguous).

    Parameters
    ----------
    x : array, (..., d)
        The rows the features are taken of.
    omega : array, (m, d)
        The projection.
    scale : float, default 1.0
        ``s``, the factor on ``x``.
    transposed : bool, default False
        Return ``a^T (m, N)`` (``x`` must then be ``(N, d)``).
    """
    xp = get_array_module(x, omega)
    weights = omega if scale == 1.0 else scale * omega  # (m, d)
    half_squared_norms = (0.5 * scale * scale) * xp.einsum("...d,...d->...", x, x)  # (...)
    if transposed:
        return weights @ x.T - half_squared_norms  # (m, d) @ (d, N) -> (m, N), minus (N,)
    return x @ weights.T - half_squared_norms[..., None]  # (..., m), minus (..., 1)


def positive_random_features(x: Any, omega: Any, shift: Any = 0.0) -> Any:
    """Eq. 4 with a constant shift: ``exp(a(x) - shift) / sqrt(m)``, ``(N, d) -> (N, m)``.

    ``shift`` broadcasts against ``(N, m)``: a scalar, ``(N, 1)`` per row or
    ``(1, 1)``. No validation (see :class:`PositiveRandomFeatures` for the block).

    Parameters
    ----------
    x : array, (N, d)
        The rows the features are taken of.
    omega : array, (m, d)
        The projection.
    shift : float or array, default 0.0
        ``c``, subtracted from every exponent.
    """
    xp = get_array_module(x, omega)
    return xp.exp(feature_exponent(x, omega) - shift) * (1.0 / math.sqrt(omega.shape[0]))


def positive_random_features_backward(x: Any, omega: Any, features: Any, d_features: Any) -> Any:
    """Vjp of :func:`positive_random_features` in ``x`` with ``omega`` and ``shift`` constant.

    ``d phi_ui / d x_u = phi_ui (w_i - x_u)``, so
    ``d_x = (d_phi * phi) omega - rowsum(d_phi * phi) x``: ``(N, d)``.

    Parameters
    ----------
    x, omega : array, (N, d) and (m, d)
        As given to :func:`positive_random_features`.
    features : array, (N, m)
        Its output ``phi``.
    d_features : array, (N, m)
        The gradient of ``phi``.
    """
    return feature_exponent_backward(x, omega, d_features * features)  # d a = d_phi phi


def feature_exponent_backward(
    x: Any, omega: Any, d_exponent: Any, scale: float = 1.0, out: Any = None
) -> Any:
    """Vjp of :func:`feature_exponent` in ``x``: ``a = s x omega^T - s^2 ||x||^2 / 2`` gives
    ``d_x = d_a (s omega) - s^2 rowsum(d_a) x``, ``(..., m) -> (..., d)``; written into
    ``out`` when given.

    Parameters
    ----------
    x, omega : array, (..., d) and (m, d)
        As given to :func:`feature_exponent`.
    d_exponent : array, (..., m)
        The gradient of the exponent ``a``.
    scale : float, default 1.0
        As given to it.
    out : array, (..., d), optional
        Where to write ``d_x``.
    """
    xp = get_array_module(x, d_exponent)
    weights = omega if scale == 1.0 else scale * omega  # (m, d)
    d_x = xp.matmul(d_exponent, weights, out=out)  # (..., m) @ (m, d) -> (..., d)
    # rowsum(d_a) as a product with ones: a sum over the short last axis (m) is slower
    row_sums = d_exponent @ xp.ones(d_exponent.shape[-1], dtype=d_exponent.dtype)  # (...)
    d_x -= (scale * scale * row_sums[..., None]) * x  # (..., 1) * (..., d)
    return d_x


class RandomFeaturesCache(NamedTuple):
    """What :meth:`PositiveRandomFeatures.backward` reads.

    Attributes
    ----------
    x : array, (N, d)
        The input.
    omega : array, (m, d)
        The projection, held fixed.
    features : array, (N, m)
        The stabilised ``phi(x)``.
    shift : array
        The ``c`` subtracted: ``(N, 1)`` for ``"row"``, ``(1, 1)`` for ``"global"``, a 0-d
        zero for None.
    argmax : array or None
        ``i*`` per row ``(N,)`` for ``"row"``, the 0-d flat index ``u* m + i*`` for
        ``"global"``, None for None.
    """

    x: Any
    omega: Any
    features: Any
    shift: Any
    argmax: Any


@dataclass(frozen=True)
class PositiveRandomFeatures:
    r"""Positive random features $\phi$ (NodeFormer Eq. (4)), stabilised, with their backward.

    For $\mathbf{x} \in \mathbb{R}^d$ and a projection $\boldsymbol{\omega}$ $(m, d)$ with rows
    $\mathbf{w}_i$, less a shift $c$ (the stabiliser) that cancels in the attention's ratios:

    $$
    \phi(\mathbf{x}) = \frac{e^{-c}}{\sqrt{m}} \exp(-\lVert \mathbf{x} \rVert^2 / 2)
    [\exp(\mathbf{w}_1^\top \mathbf{x}), \dots, \exp(\mathbf{w}_m^\top \mathbf{x})]
    $$

    so that, with $c = 0$ and Gaussian rows, $\mathbb{E}[\phi(\mathbf{x})^\top
    \phi(\mathbf{y})] = \exp(\mathbf{x}^\top \mathbf{y})$ (Prop. 1, Eq. (18)). The module
    docstring gives the shift, what cancels, and which function the backward differentiates.

    Parameters
    ----------
    stabilizer : {None, "row", "global"}, default None
        $c$: 0 (Eq. (4) as printed); per row, $c_u = \max_i (\mathbf{w}_i^\top \mathbf{x}_u -
        \lVert \mathbf{x}_u \rVert^2 / 2)$ (for queries, as the authors' code); or one maximum
        over the whole array (for keys).
    hold_shift : bool, default False
        The backward holds $c$ constant: exact only for a consumer in which it cancels.

    Shapes
    ------
    - **input**: ``x`` $(N, d)$; ``omega`` $(m, d)$ (noise: no gradient; ``x``'s dtype and
      backend)
    - **output**: $\phi$ $(N, m)$
    - **backward**: ``d_phi`` $(N, m)$; returns ``(d_x (N, d), {})``
    """

    stabilizer: str | None = None  # None (Eq. 4) | "row" (authors' queries) | "global" (keys)
    hold_shift: bool = False  # backward holds the shift constant: exact only where it cancels

    def __post_init__(self) -> None:
        if self.stabilizer not in STABILIZERS:
            raise ValueError(
                f"PositiveRandomFeatures stabilizer must be one of {STABILIZERS}, "
                f"got {self.stabilizer!r}"
            )
        hold_shift = check_bool(self.hold_shift, "PositiveRandomFeatures hold_shift")
        object.__setattr__(self, "hold_shift", hold_shift)

    def forward(
        self, params: dict[str, Any], x: Any, omega: Any
    ) -> tuple[Any, RandomFeaturesCache]:
        """``phi(x)``: x (N, d), omega (m, d) -> (N, m), and the cache."""
        check_params(params, {}, "PositiveRandomFeatures")
        xp = check_features_input(x, omega, "PositiveRandomFeatures")
        m = omega.shape[0]
        # F1 the exponent of Eq. 4 (N, m)
        exponent = feature_exponent(x, omega)
        # F2 the shift c (held or differentiated in the backward, see the module docstring)
        if self.stabilizer == "row":
            argmax = xp.argmax(exponent, axis=1)  # (N,) first maximiser
            shift = xp.max(exponent, axis=1, keepdims=True)  # (N, 1)
        elif self.stabilizer == "global":
            argmax = xp.argmax(exponent)  # 0-d flat index u* m + i*
            shift = xp.max(exponent).reshape(1, 1)  # (1, 1)
        else:
            argmax, shift = None, xp.zeros((), dtype=x.dtype)
        # F3 phi = exp(a - c) / sqrt(m)  (N, m)
        features = xp.exp(exponent - shift) * (1.0 / math.sqrt(m))
        return features, RandomFeaturesCache(x, omega, features, shift, argmax)

    def backward(
        self, params: dict[str, Any], cache: RandomFeaturesCache, d_features: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradient of ``<d_phi, phi>`` in ``x``: ``(d_x (N, d), {})``."""
        x, omega, features = cache.x, cache.omega, cache.features
        check_cotangent(d_features, features.shape, x.dtype, x, name="d_phi")
        xp = get_array_module(d_features, x)
        # B3 (of F3) and B1 (of F1) with c constant: d_x = (d_phi phi) omega - rowsum(d_phi phi) x
        d_x = positive_random_features_backward(x, omega, features, d_features)  # (N, d)
        if self.hold_shift or self.stabilizer is None:
            return d_x, {}
        # B2 (of F2): c = a_{i*}(x_{u*}) at the first maximiser, d c / d x_{u*} = w_{i*} - x_{u*};
        # it enters every feature it shifts with weight -1
        weighted = d_features * features  # (N, m)
        if self.stabilizer == "row":
            d_shift = xp.sum(weighted, axis=1, keepdims=True)  # (N, 1)
            d_x = d_x - d_shift * (omega[cache.argmax] - x)  # (N, 1) * ((N, d) - (N, d))
        else:
            m = omega.shape[0]
            row, column = cache.argmax // m, cache.argmax % m  # u*, i*
            is_row = (xp.arange(x.shape[0]) == row)[:, None]  # (N, 1) one-hot of u*
            d_shift = xp.sum(weighted)  # 0-d
            d_x = d_x - is_row * (d_shift * (omega[column] - x[row]))  # (N, 1) * (d,)
        return d_x, {}


def check_features_input(x: Any, omega: Any, owner: str, name: str = "x") -> Any:
    """``x`` (N, d) and ``omega`` (m, d): finite, N, d, m >= 1, one dtype and backend; returns
    ``x``'s array module.

    Parameters
    ----------
    x : array, (N, d)
        The input checked.
    omega : array, (m, d)
        The projection checked against it.
    owner : str
        The block named in the messages.
    name : str, default "x"
        The input's name in the messages.
    """
    xp = check_input(x, name, shape=(None, None))
    n, d = x.shape
    if n == 0 or d == 0:
        raise ValueError(
            f"{owner}: {name} has shape {(n, d)}; it needs N >= 1 rows, d >= 1 columns"
        )
    check_input(omega, "omega", ndim=2)
    if omega.shape[1] != d or omega.shape[0] == 0:
        raise ValueError(
            f"{owner}: omega has shape {tuple(omega.shape)} but must be (m, d) = (m, {d}) with "
            f"m >= 1 (d = {name}.shape[1]); draw it with draw_projection(rng, m, {d})"
        )
    check_like({"omega": omega}, x, name, owner, "draw_projection returns float64 on the host: ")
    return xp


_TINY = 2.0**-1074  # smallest positive float64: U = 0 would give g = -inf
_GUMBEL_CHUNK = 1 << 16  # draws per chunk (512 KB of float64)


def draw_gumbel(rng: np.random.Generator, shape: tuple, dtype: Any = np.float64) -> np.ndarray:
    """Standard Gumbel noise ``g = -log(-log(U))`` (NodeFormer Sec. 3.2) in ``dtype`` on the
    host, the draws :class:`~refimpl.nn.nodeformer.conv.NodeFormerConv` takes from ``rng``;
    ``U = max(rng.random(shape), 2^-1074)`` drawn and transformed in float64, in chunks of
    ``_GUMBEL_CHUNK`` (1e7 draws at N = 1e6 would otherwise make a float64 array twice the
    result's size). ``rng.random`` fills in C order, so the chunks draw the same values as
    one call.

    Parameters
    ----------
    rng : numpy.random.Generator
        The generator ``U`` is drawn from.
    shape : tuple of int
        The noise's shape, e.g. ``(N, H, K)``.
    dtype : dtype, default numpy.float64
        The result's dtype.
    """
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, _GUMBEL_CHUNK):
        u = rng.random(min(_GUMBEL_CHUNK, flat.size - start))
        np.maximum(u, _TINY, out=u)
        np.negative(np.log(u, out=u), out=u)
        np.negative(np.log(u, out=u), out=u)
        flat[start : start + u.size] = u
    return out
