"""Per-head contractions over the channel axis, as batched matrix products.

Attention layers score and differentiate per head with two contractions,
adjoint to each other in the per-head vector:

    dot_per_head(values, vectors)       s[m, h]  = sum_c values[m, h, c] * vectors[h, c]
                                        (M, H, C), (H, C) -> (M, H)
    sum_per_head(coefficients, values)  g[h, c]  = sum_m coefficients[m, h] * values[m, h, c]
                                        (M, H), (M, H, C) -> (H, C)

so ``d vectors = sum_per_head(d_s, values)`` and ``d values = d_s[..., None] * vectors``.
Both run as one matrix-vector product per head (``matmul`` on the head-major
view, which BLAS takes without a copy) rather than ``einsum``, which does not
call BLAS for this contraction. The sums run in a
different order than ``einsum``'s, so the two differ by rounding only.
"""

from __future__ import annotations

from typing import Any

from refimpl.backend import get_array_module

__all__ = ["dot_per_head", "sum_per_head"]


def dot_per_head(values: Any, vectors: Any) -> Any:
    """``(M, H)``: each row's channels dotted with its head's vector, ``values (M, H, C)``,
    ``vectors (H, C)``."""
    xp = get_array_module(values, vectors)
    by_head = xp.matmul(values.transpose(1, 0, 2), vectors[:, :, None])  # (H, M, 1)
    return by_head[:, :, 0].T


def sum_per_head(coefficients: Any, values: Any) -> Any:
    """``(H, C)``: per head, the rows of ``values (M, H, C)`` weighted by ``coefficients (M, H)``
    and summed."""
    xp = get_array_module(coefficients, values)
    by_head = xp.matmul(coefficients.T[:, None, :], values.transpose(1, 0, 2))  # (H, 1, C)
    return by_head[:, 0, :]
