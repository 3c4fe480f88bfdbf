"""Segment maxima by ``maximum.at``, and the integer keys that order as floats do.

The engine under :func:`refimpl.kernels.segment.segment_max` and ``segment_softmax`` (that
module's docstring says why the device backends take the maximum over integer keys).
``segments`` here is a :class:`~refimpl.kernels.segment.Segments` (typed ``Any``: that module
imports this one).
"""

from __future__ import annotations

import math
from typing import Any

from refimpl.backend import get_array_module

__all__ = ["order_keys", "running_maxima"]


def running_maxima(values: Any, segments: Any) -> tuple[Any, Any, Any]:
    """Per-segment maxima, flattened, by ``maximum.at`` (over :func:`order_keys` off NumPy).

    Empty segments hold ``-inf``; callers that expose the maxima replace it.

    Parameters
    ----------
    values : array
        ``(E, *F)``, floating-point.
    segments : Segments
        The items grouped by segment.

    Returns
    -------
    tuple of array
        ``(maxima, flat, positions)``: ``(N*F,)``, ``values`` as ``(E, F)``, and each entry's
        flat position in ``maxima``, ``(E, F)``.
    """
    xp = segments.xp
    flat = values.reshape(segments.num_items, math.prod(values.shape[1:]))  # (E, F); F explicit
    num_features = flat.shape[1]  # for E = 0
    positions = segments.flat_positions(num_features)  # (E, F)
    size = segments.num_segments * num_features
    if segments.backend == "numpy":
        maxima = xp.full(size, -xp.inf, dtype=values.dtype)
        xp.maximum.at(maxima, positions.ravel(), flat.ravel())
        return maxima, flat, positions
    # the maximum of keys that order as the floats do (module docstring), then back
    import numpy as np  # the key of -inf, a host constant

    keys = order_keys(flat.ravel())
    bottom = int(order_keys(np.full(1, -np.inf, dtype=values.dtype))[0])
    maxima_keys = xp.full(size, bottom, dtype=keys.dtype)
    xp.maximum.at(maxima_keys, positions.ravel(), keys)
    return order_keys(maxima_keys).view(values.dtype), flat, positions


def order_keys(values: Any) -> Any:
    """Integers that order as the floats ``values`` do, and back (the map is its own inverse).

    ``values`` float32 or float64 (1-D) gives int32 or int64 keys; int keys give the
    float bits back (view them as the float dtype). The sign bit is kept and, for
    negative numbers, the other bits are flipped, so a larger magnitude becomes a smaller
    key. ``-0.0`` orders just below ``+0.0``.

    Parameters
    ----------
    values : array
        1-D float32 or float64 (to keys), or int32 or int64 keys (back to float bits).

    Returns
    -------
    array
        1-D int32 or int64 of ``values``' size.
    """
    xp = get_array_module(values)
    bits = values.dtype.itemsize * 8
    key_type = {32: xp.int32, 64: xp.int64}[bits]
    signed = values.view(key_type)
    low_bits = (1 << (bits - 1)) - 1  # every bit but the sign
    negative_mask = xp.bitwise_and(xp.right_shift(signed, bits - 1), low_bits)  # 0 or low_bits
    return xp.bitwise_xor(signed, negative_mask)
