"""Literal twin of the CUDA kernel of :mod:`refimpl.kernels.device_sums` (its ``_BODY``, behind
``row_sums_in_order``): one loop pass per device thread, in the thread's own order.

The kernel launches one thread per output entry, ``i = n * F + f`` for ``N`` segments and
``F`` features, and thread ``i`` adds ``values[order[j] * F + f]`` for
``j = indptr[n] .. indptr[n + 1] - 1``, left to right, into an accumulator of the values'
own type ``T`` that starts at zero. This twin does exactly that, one thread after another:
the same index arithmetic on the flat ``values``, the same loop bounds, and the additions
made on NumPy scalars of the values' dtype, so float32 rounds after every addition as the
device does. Unlike the other twins it is not float64: the kernel's point is to repeat the
host's float32 and float64 sums bit for bit, so the twin keeps the precision it mirrors.

NumPy on the host, never fast. ``tests/kernels/test_device_sums.py`` holds it bitwise equal
to the host's segment sum and to ``_BODY`` itself, compiled on the CPU.
"""

from __future__ import annotations

import numpy as np

__all__ = ["row_sums_in_order"]


def row_sums_in_order(values: np.ndarray, order: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """``values (E, F)`` summed per segment, thread by thread: ``(N, F)``, N = len(indptr) - 1.

    Parameters
    ----------
    values : float array (E, F)
        The items' features; their dtype is the accumulator's and the output's.
    order : int array (E,)
        The items grouped by segment: segment ``n`` holds ``order[indptr[n]:indptr[n + 1]]``.
    indptr : int array (N + 1,)
        Segment boundaries in ``order``.

    Returns
    -------
    out : array (N, F)
        ``out[n, f] = ((0 + values[order[a], f]) + ...) + values[order[b - 1], f]`` with
        ``a, b = indptr[n], indptr[n + 1]``, each addition rounded to the values' dtype.
    """
    num_segments, num_features = len(indptr) - 1, values.shape[1]
    flat = np.ascontiguousarray(values).ravel()  # (E * F,): the kernel reads by linear index
    zero = values.dtype.type(0)  # T total = 0
    out = np.empty(num_segments * num_features, dtype=values.dtype)
    for i in range(num_segments * num_features):  # one pass per thread
        n, f = i // num_features, i % num_features
        total = zero
        for j in range(int(indptr[n]), int(indptr[n + 1])):
            total = total + flat[int(order[j]) * num_features + f]  # T + T, rounded to T
        out[i] = total
    return out.reshape(num_segments, num_features)
