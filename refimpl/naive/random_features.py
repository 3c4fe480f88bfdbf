"""Literal twin of the positive random features, NodeFormer Eq. 4, forward and backward.

For ``x`` in ``R^d`` and the rows ``w_i`` of ``omega (m, d)``::

    phi(x)_i = exp(w_i^T x - ||x||^2 / 2) / sqrt(m)                          (Eq. 4)

so ``d phi_i / d x = phi_i (w_i - x)``. Rows of ``x`` are nodes: ``(N, d) -> (N, m)``.
``omega`` is noise and gets no gradient.

Two entry points:

* :func:`prf` / :func:`prf_backward`: Eq. 4 as printed, what the kernelised-softmax twin
  (:mod:`refimpl.naive.kernel_attention`) builds its ratios from.
* :func:`positive_random_features_forward` / ``_backward``: the twin of the production
  block ``PositiveRandomFeatures``, whose features carry a max-shift ``c`` inside the
  exponent (``"row"``: one per node, ``"global"``: one for the array, ``None``: 0)::

      phi_ui = exp(a_ui - c) / sqrt(m),  a_ui = w_i^T x_u - ||x_u||^2 / 2

  The backward differentiates ``c`` too (through its first maximiser, ``numpy.argmax``
  order), unless the layer holds it (``hold_shift=True``).

NumPy on the host, float64, no shared code with :mod:`refimpl.nn.nodeformer.random_features`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "PositiveRandomFeaturesTwinCache",
    "positive_random_features_backward",
    "positive_random_features_forward",
    "prf",
    "prf_backward",
]


def prf(x: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """``phi(x)`` of Eq. 4 as printed, no shift: ``(N, d), (m, d) -> (N, m)``."""
    m = omega.shape[0]
    exponent = x @ omega.T - 0.5 * np.sum(x * x, axis=1, keepdims=True)  # (N, m)
    return np.exp(exponent) / math.sqrt(m)  # (N, m)


def prf_backward(x: np.ndarray, omega: np.ndarray, phi: np.ndarray, d_phi: np.ndarray) -> Any:
    """Vjp of :func:`prf` in ``x``: ``d_x_u = sum_i d_phi_ui phi_ui (w_i - x_u)``, ``(N, d)``."""
    d_exponent = d_phi * phi  # (N, m): d exp(a) = exp(a) d a
    return _exponent_backward(x, omega, d_exponent)


def _exponent_backward(x: np.ndarray, omega: np.ndarray, d_exponent: np.ndarray) -> Any:
    """Vjp of ``a_ui = w_i^T x_u - ||x_u||^2 / 2``: ``d_x_u = sum_i d_a_ui (w_i - x_u)``."""
    # (N, m, d): w_i - x_u for every node u and feature i
    directions = omega[None, :, :] - x[:, None, :]
    return np.einsum("ui,uid->ud", d_exponent, directions)  # (N, d)


class PositiveRandomFeaturesTwinCache(NamedTuple):
    """What :func:`positive_random_features_backward` reads."""

    x: np.ndarray  # (N, d)
    omega: np.ndarray  # (m, d)
    phi: np.ndarray  # (N, m) the shifted features
    argmax: Any  # per row (N,) for "row", flat index u* m + i* for "global", None for None


def positive_random_features_forward(
    layer: Any, params: dict, x: np.ndarray, omega: np.ndarray
) -> tuple[np.ndarray, PositiveRandomFeaturesTwinCache]:
    """``phi (N, m)`` of Eq. 4 shifted by ``c``; ``layer`` is a ``PositiveRandomFeatures``,
    read for ``stabilizer`` only. ``params`` is ``{}`` (the block has none)."""
    m = omega.shape[0]
    # F1 exponents a_ui = w_i^T x_u - ||x_u||^2 / 2  (N, m)
    a = x @ omega.T - 0.5 * np.sum(x * x, axis=1, keepdims=True)
    # F2 the shift c: (N, 1) per row, (1, 1) for the array, or 0
    if layer.stabilizer == "row":
        argmax = np.argmax(a, axis=1)  # (N,) first maximiser
        c = np.array([[a[u, i]] for u, i in enumerate(argmax)])  # (N, 1)
    elif layer.stabilizer == "global":
        argmax = int(np.argmax(a))  # u* m + i*
        c = np.array([[a.flat[argmax]]])  # (1, 1)
    else:
        argmax, c = None, np.zeros((1, 1))
    # F3 phi = exp(a - c) / sqrt(m)  (N, m)
    phi = np.exp(a - c) / math.sqrt(m)
    return phi, PositiveRandomFeaturesTwinCache(x, omega, phi, argmax)


def positive_random_features_backward(
    layer: Any, params: dict, cache: PositiveRandomFeaturesTwinCache, d_phi: np.ndarray
) -> tuple[np.ndarray, dict]:
    """Gradient of ``<d_phi, phi>`` in ``x``: ``(d_x (N, d), {})``."""
    x, omega, phi, argmax = cache
    # B3 (of F3) d_a = d_phi phi; d_c = -sum of d_phi phi over the features c shifts
    d_a = d_phi * phi  # (N, m)
    # B2 (of F2) c is a_{u* i*}: its gradient lands on that exponent (unless held)
    if layer.stabilizer is not None and not layer.hold_shift:
        d_a = d_a.copy()
        if layer.stabilizer == "row":
            d_c = -np.sum(d_phi * phi, axis=1)  # (N,)
            for u, i in enumerate(argmax):
                d_a[u, i] += d_c[u]
        else:
            u, i = divmod(argmax, omega.shape[0])
            d_a[u, i] += -np.sum(d_phi * phi)
    # B1 (of F1) d_x_u = sum_i d_a_ui (w_i - x_u)  (N, d)
    return _exponent_backward(x, omega, d_a), {}
