"""The per-channel affine map ``y = weight * x_hat + bias`` that LayerNorm and BatchNorm end
with: its parameter shapes and torch's initialisation, written once for both."""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.backend import asarray

__all__ = ["affine_init", "affine_shapes"]


def affine_shapes(channels: int, affine: bool) -> dict[str, tuple[int, ...]]:
    """``weight (C,)`` and ``bias (C,)``, or none without ``affine``.

    Parameters
    ----------
    channels : int
        ``C``.
    affine : bool
        Whether the map is learned.
    """
    return {"weight": (channels,), "bias": (channels,)} if affine else {}


def affine_init(channels: int, affine: bool, backend: str | None, dtype: Any) -> dict[str, Any]:
    """``weight`` ones and ``bias`` zeros, as torch and PyG (no randomness), on ``backend``.

    Parameters
    ----------
    channels : int
        ``C``.
    affine : bool
        Whether the map is learned (``{}`` if not).
    backend : str or None
        The array backend (None: the current one).
    dtype : dtype
        The parameters' dtype.
    """
    if not affine:
        return {}
    return {
        "weight": asarray(np.ones(channels), backend=backend, dtype=dtype),
        "bias": asarray(np.zeros(channels), backend=backend, dtype=dtype),
    }
