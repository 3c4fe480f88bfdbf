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

A forward that draws its mask from NumPy's PCG64 (:mod:`refimpl.kernels.pcg64_draws`) draws
it in the same launch (:func:`draw_keep_and_scale`): each entry's ``u_i`` by
``pcg64_draws``' K1-K3, then

    D1  keep[i] = u_i >= p, written for the backward; then K1 with it

so the draw costs no launch of its own; :func:`draw_keep_and_scale_twin` is its twin.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from refimpl.backend import backend_name
from refimpl.kernels.pcg64_draws import DEVICE_SOURCE, Draws, keep_mask_twin, take_draws

__all__ = [
    "DRAW_SOURCE",
    "SOURCE",
    "cuda_sources",
    "draw_keep_and_scale",
    "draw_keep_and_scale_twin",
    "keep_and_scale",
    "keep_and_scale_twin",
]

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

DRAW_SOURCE = (
    DEVICE_SOURCE
    + r"""
typedef REFIMPL_T T;  // float or double, one module per dtype

extern "C" __global__ void refimpl_draw_keep_and_scale(REFIMPL_PCG64_PARAMS, const T* x,
                                                       const T scale, T* y, bool* keep)
REFIMPL_PCG64_FOR_EACH(
    const bool kept = u >= p;  // D1
    keep[i] = kept;
    y[i] = (x[i] * (kept ? (T)1 : (T)0)) * scale;  // K1
)
"""
)

_C_TYPES = {"float32": "float", "float64": "double"}


def cuda_sources() -> dict[str, str]:
    """:data:`SOURCE` and :data:`DRAW_SOURCE` once per dtype, by name (what CuPy compiles, and
    the PTX test)."""
    sources = {}
    for name, c in _C_TYPES.items():
        sources[f"dropout_{name}"] = f"#define REFIMPL_T {c}\n{SOURCE}"
        sources[f"dropout_draw_{name}"] = f"#define REFIMPL_T {c}\n{DRAW_SOURCE}"
    return sources


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


def draw_keep_and_scale_twin(
    x: np.ndarray, draws: Draws, p: float, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """D1 and K1 on NumPy: the mask drawn as :func:`refimpl.kernels.pcg64_draws.keep_mask_twin`
    draws it, then :func:`keep_and_scale_twin`.

    Parameters
    ----------
    x : float array (*S,)
        The input.
    draws : Draws
        What the launch reads (:func:`refimpl.kernels.pcg64_draws.take_draws`).
    p : float
        The drop probability, a double.
    scale : float
        ``1 / (1 - p)``, rounded to ``x``'s dtype.

    Returns
    -------
    tuple
        ``(y, keep)``: ``(x * keep) * scale`` and the bool mask, both ``(*S,)``.
    """
    keep = keep_mask_twin(draws, p).reshape(x.shape)
    return keep_and_scale_twin(x, keep, scale), keep


@functools.cache
def _module(dtype_name: str, draws: bool = False) -> Any:
    if dtype_name not in _C_TYPES:
        raise TypeError(
            f"the fused dropout kernel takes float32 or float64 inputs, got {dtype_name}; "
            "cast the input, or run the dropout outside fused_kernels()"
        )
    import cupy

    name = f"dropout_draw_{dtype_name}" if draws else f"dropout_{dtype_name}"
    return cupy.RawModule(code=cuda_sources()[name], options=("--fmad=false",))


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


def draw_keep_and_scale(
    xp: Any, x: Any, rng: np.random.Generator, p: float, scale: float
) -> tuple[Any, Any]:
    """D1 and K1 in one launch on a device backend: the keep-mask ``rng.random(x.shape) >= p``
    drawn on the device (bitwise the host's draw, ``rng`` advanced as it advances) and
    ``(x * keep) * scale``.

    Parameters
    ----------
    xp : module
        ``x``'s array module (CuPy or the strict stand-in).
    x : float array (*S,)
        The input.
    rng : numpy.random.Generator
        Over ``PCG64`` (:func:`refimpl.kernels.pcg64_draws.draws_on_device`).
    p : float
        The drop probability.
    scale : float
        ``1 / (1 - p)``.

    Returns
    -------
    tuple
        ``(y, keep)``: ``y`` of ``x``'s shape and dtype, ``keep`` the ``(*S,)`` bool mask.
    """
    strict = backend_name(xp) == "strict"
    # the module before the draw: a dtype it refuses leaves rng where it was
    module = None if strict else _module(np.dtype(x.dtype).name, draws=True)
    draws = take_draws(rng, x.size)
    if strict:
        return xp.run_kernel(draw_keep_and_scale_twin, x, draws, float(p), scale)
    x = xp.ascontiguousarray(x)
    y, keep = xp.empty_like(x), xp.empty(x.shape, dtype=xp.bool_)
    if x.size > 0:
        kernel = module.get_function("refimpl_draw_keep_and_scale")
        kernel((draws.blocks,), (BLOCK,),
               (*draws.kernel_arguments(p), x, x.dtype.type(scale), y, keep))  # fmt: skip
    return y, keep
