"""Random matrices the initialisation schemes of :mod:`refimpl.init` are built from.

Host float64 draws from a ``numpy.random.Generator``, as ``torch.nn.init`` makes them.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["glorot_normal", "orthogonal"]


def glorot_normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """A ``(rows, cols)`` Glorot (Xavier) normal draw, ``std = sqrt(2 / (rows + cols))``.

    Parameters
    ----------
    rng : numpy.random.Generator
        The generator the entries are drawn from.
    shape : tuple of int
        ``(rows, cols)`` of the matrix (fan-out, fan-in).

    Returns
    -------
    numpy.ndarray
        ``(rows, cols)`` float64.
    """
    return rng.normal(0.0, math.sqrt(2.0 / (shape[0] + shape[1])), size=shape)


def orthogonal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """A random ``(rows, cols)`` matrix with orthonormal rows (``rows <= cols``) or columns.

    As ``torch.nn.init.orthogonal_``: QR of a standard normal matrix, with the
    signs of ``R``'s diagonal moved into ``Q`` so the draw is Haar distributed.

    Parameters
    ----------
    rng : numpy.random.Generator
        The generator the standard normal matrix is drawn from.
    shape : tuple of int
        ``(rows, cols)`` of the matrix, any positive sizes.

    Returns
    -------
    numpy.ndarray
        ``(rows, cols)`` float64, with orthonormal rows if ``rows <= cols``, else orthonormal
        columns.
    """
    rows, cols = shape
    gaussian = rng.standard_normal((rows, cols) if rows >= cols else (cols, rows))
    q, r = np.linalg.qr(gaussian)  # q (max, min) with orthonormal columns
    q = q * np.where(np.diag(r) < 0, -1.0, 1.0)  # Haar measure (Mezzadri 2007)
    return q if rows >= cols else q.T
