"""Dropout's keep-and-scale as one device kernel, beside its NumPy twin.

:class:`refimpl.ops.dropout.Dropout` keeps and scales in two array operations, a device
launch each (``x * mask``, then ``*= scale``), forward and backward alike. This kernel makes
the same two operations on each entry, in that order and in the input's dtype, in one
launch:

    K1  y = (x * keep) * scale        (keep read as 0 or 1, scale rounded once to the dtype)

The backward is the same kernel on the cotangent (``d_x = (d_y * keep) * scale``). No
transcendental function and no sum: on every backend bitwise the literal operations.
:func:`keep_and_scale_twin` is the twin, which the strict stand-in runs as one launch
(``strict.run_kernel``). Compiled with ``--fmad=false`` (a product times a product: nothing
to contract, but the rule is kept); no atomics.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from refimpl.backend import backend_name

__all__ = ["SOURCE", "cuda_sources", "keep_and_scale", "keep_and_scale_twin"]

BLOCK = 256  # threads per block, one entry each

SOURCE = r"""
typedef REFIMPL_T T;  // float or double, one module per dtype

extern "C" __global__ void refimpl_keep_and_scale(const T* x, const bool* keep, const T scale,
                                                  const long long n, T* y) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = (x[i] * (keep[i] ? (T)1 : (T)0)) * scale;  // K1
}
"""

_C_TYPES = {"float32": "float", "float64": "double"}


def cuda_sources() -> dict[str, str]:
    """:data:`SOURCE` once per dtype, by name (what CuPy compiles, and the PTX test)."""
    return {f"dropout_{name}": f"#define REFIMPL_T {c}\n{SOURCE}" for name, c in _C_TYPES.items()}


def keep_and_scale_twin(x: np.ndarray, keep: np.ndarray, scale: float) -> np.ndarray:
    """K1 on NumPy, as :class:`refimpl.ops.dropout.Dropout` orders it.

    Parameters
    ----------
    x : float array (*S,)
        The input (or the cotangent of the output).
    keep : bool array (*S,)
        The keep-mask.
    scale : float
        ``1 / (1 - p)``, rounded to ``x``'s dtype.

    Returns
    -------
    array (*S,)
        ``(x * keep) * scale``.
    """
    return (x * keep) * x.dtype.type(scale)


@functools.cache
def _module(dtype_name: str) -> Any:
    if dtype_name not in _C_TYPES:
        raise TypeError(
            f"the fused dropout kernel takes float32 or float64 inputs, got {dtype_name}; "
            "cast the input, or run the dropout outside fused_kernels()"
        )
    import cupy

    return cupy.RawModule(code=cuda_sources()[f"dropout_{dtype_name}"], options=("--fmad=false",))


def keep_and_scale(xp: Any, x: Any, keep: Any, scale: float) -> Any:
    """K1 in one launch on a device backend (CuPy's kernel, or the twin on the strict
    stand-in): ``(x * keep) * scale`` of ``x``'s shape and dtype.

    Parameters
    ----------
    xp : module
        ``x``'s array module (CuPy or the strict stand-in).
    x : float array (*S,)
        The input (or the cotangent of the output).
    keep : bool array (*S,)
        The keep-mask.
    scale : float
        ``1 / (1 - p)``.
    """
    if backend_name(xp) == "strict":
        return xp.run_kernel(keep_and_scale_twin, x, keep, scale)
    x, keep = xp.ascontiguousarray(x), xp.ascontiguousarray(keep)
    y = xp.empty_like(x)
    if x.size > 0:
        kernel = _module(np.dtype(x.dtype).name).get_function("refimpl_keep_and_scale")
        kernel(((x.size + BLOCK - 1) // BLOCK,), (BLOCK,),
               (x, keep, x.dtype.type(scale), np.int64(x.size), y))  # fmt: skip
    return y
