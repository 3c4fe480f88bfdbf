"""Per-head contractions over the channel axis, as batched matrix products.

Attention layers score and differentiate per head with two contractions,
adjoint to each other in the per-head vector:

    dot_per_head(values, vectors)       s[m, h]  = sum_c values[m, h, c] * vectors[h, c]
                                        (M, H, C), (H, C) -> (M, H)
    sum_per_head(coefficients, values)  g[h, c]  = sum_m coefficients[m, h] * values[m, h, c]
                                        (M, H), (M, H, C) -> (H, C)

so ``d vectors = sum_per_head(d_s, values)`` and ``d values = scale_per_head(d_s, vectors)``,
``d_s[..., None] * vectors`` (repeated over the channels first: NumPy runs a broadcast
over the last axis in inner loops of ``C`` elements, several times slower).
A third sums the channels (with two arrays multiplied first, the aggregation's
coefficient gradient, ``d[m, h] = sum_c a[m, h, c] b[m, h, c]``):

    sum_channels(values)                t[m, h]  = sum_c values[m, h, c]
                                        (M, H, C) -> (M, H)

The contractions run as matrix-vector products (``matmul`` on the head-major
view, which BLAS takes without a copy; for ``sum_channels`` one product with a
vector of ones) rather than ``einsum``, which does not call BLAS for them. The sums
run in a different order than ``einsum``'s, so the two differ by rounding only;
``scale_per_head`` has no sum and is exact.
"""

from __future__ import annotations

from typing import Any

from refimpl.backend import get_array_module

__all__ = ["dot_per_head", "scale_per_head", "sum_channels", "sum_per_head"]


def dot_per_head(values: Any, vectors: Any) -> Any:
    """``(M, H)``: each row's channels dotted with its head's vector.

    Parameters
    ----------
    values : array
        ``(M, H, C)``.
    vectors : array
        ``(H, C)``, one per head.

    Returns
    -------
    array
        ``(M, H)``, ``s[m, h] = sum_c values[m, h, c] * vectors[h, c]``.
    """
    xp = get_array_module(values, vectors)
    by_head = xp.matmul(values.transpose(1, 0, 2), vectors[:, :, None])  # (H, M, 1)
    return by_head[:, :, 0].T


def sum_per_head(coefficients: Any, values: Any) -> Any:
    """``(H, C)``: per head, the rows of ``values`` weighted by ``coefficients`` and summed.

    Parameters
    ----------
    coefficients : array
        ``(M, H)``, one weight per row and head.
    values : array
        ``(M, H, C)``.

    Returns
    -------
    array
        ``(H, C)``, ``g[h, c] = sum_m coefficients[m, h] * values[m, h, c]``.
    """
    xp = get_array_module(coefficients, values)
    by_head = xp.matmul(coefficients.T[:, None, :], values.transpose(1, 0, 2))  # (H, 1, C)
    return by_head[:, 0, :]


def scale_per_head(coefficients: Any, vectors: Any) -> Any:
    """``(M, H, C)``: ``coefficients[m, h] * vectors[h, c]`` (the adjoint of
    :func:`dot_per_head` in its values).

    Parameters
    ----------
    coefficients : array
        ``(M, H)``.
    vectors : array
        ``(H, C)``, one per head.

    Returns
    -------
    array
        ``(M, H, C)``, a new array.
    """
    xp = get_array_module(coefficients, vectors)
    (rows, heads), channels = coefficients.shape, vectors.shape[1]
    repeated = xp.repeat(coefficients, channels, axis=1).reshape(rows, heads, channels)
    if repeated.dtype != xp.result_type(repeated, vectors):
        return repeated * vectors
    return xp.multiply(repeated, vectors, out=repeated)


def sum_channels(values: Any) -> Any:
    """``(M, H)``: each row's and head's channels of ``values (M, H, C)`` summed, by one
    product with a vector of ones (``einsum`` and ``sum`` over a short last axis both walk
    it in short, slow inner loops).

    Parameters
    ----------
    values : array
        ``(M, H, C)``.

    Returns
    -------
    array
        ``(M, H)``, ``t[m, h] = sum_c values[m, h, c]``.
    """
    xp = get_array_module(values)
    rows, heads, channels = values.shape
    flat = values.reshape(rows * heads, channels)  # (M H, C)
    return (flat @ xp.ones(channels, dtype=values.dtype)).reshape(rows, heads)
