"""ELU and its backward as one device kernel each, beside their NumPy twin.

:class:`refimpl.ops.activations.ELU` makes each step one array operation, a device launch
each (about 8 forward, 8 backward). These kernels make the same operations on each entry,
in the same order and in the input's dtype, in one launch each way:

    forward   E1  y = max(x, 0) + expm1(min(x, 0)) * alpha
    backward  E2  slope = exp(min(x, 0)) * alpha
              E3  d_x = d_y * ((x > 0 ? 1 - slope : 0) + slope)

E3 is the literal ``select_by_mask(x > 0, 1.0, slope)`` written out: ``(1 - slope)`` times the
mask, plus ``slope``, so where ``x > 0`` the factor is ``(1 - alpha) + alpha`` as there.
:func:`elu_forward_twin` and :func:`elu_backward_twin` are the twins (elementwise NumPy in
the kernels' order, so bitwise the literal ELU on the host); the strict stand-in runs each as
one launch (``strict.run_kernel``). On a device the kernels call CUDA's ``expm1`` and
``exp``, not NumPy's: there they agree with the literal path to those functions' rounding,
not bitwise. Compiled with ``--fmad=false``; no sums, no atomics.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from refimpl.backend import backend_name

__all__ = ["SOURCE", "cuda_sources", "elu_backward", "elu_backward_twin", "elu_forward",
           "elu_forward_twin"]  # fmt: skip

BLOCK = 256  # threads per block, one entry each

SOURCE = r"""
typedef REFIMPL_T T;  // float or double, one module per dtype

extern "C" __global__ void refimpl_elu_forward(const T* x, const T alpha, const long long n,
                                               T* y) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const T v = x[i];
    // E1 the literal max(x, 0) + expm1(min(x, 0)) * alpha
    y[i] = (v > (T)0 ? v : (T)0) + expm1(v < (T)0 ? v : (T)0) * alpha;
}

extern "C" __global__ void refimpl_elu_backward(const T* x, const T* d_y, const T alpha,
                                                const long long n, T* d_x) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const T v = x[i];
    // E2 the slope below 0, E3 the literal select_by_mask(x > 0, 1, slope)
    const T slope = exp(v < (T)0 ? v : (T)0) * alpha;
    d_x[i] = d_y[i] * ((v > (T)0 ? (T)1 - slope : (T)0) + slope);
}
"""

_C_TYPES = {"float32": "float", "float64": "double"}


def cuda_sources() -> dict[str, str]:
    """:data:`SOURCE` once per dtype, by name (what CuPy compiles, and the PTX test)."""
    return {f"elu_{name}": f"#define REFIMPL_T {c}\n{SOURCE}" for name, c in _C_TYPES.items()}


def elu_forward_twin(x: np.ndarray, alpha: float) -> np.ndarray:
    """E1 on NumPy, as :class:`refimpl.ops.activations.ELU`'s forward orders it.

    Parameters
    ----------
    x : float array (*S,)
        The input; its dtype is every operation's.
    alpha : float
        ELU's scale below 0.

    Returns
    -------
    array (*S,)
        ``y``.
    """
    t = x.dtype.type
    zero = np.zeros_like(x)
    return np.maximum(x, zero) + np.expm1(np.minimum(x, zero)) * t(alpha)


def elu_backward_twin(x: np.ndarray, d_y: np.ndarray, alpha: float) -> np.ndarray:
    """E2-E3 on NumPy, as :class:`refimpl.ops.activations.ELU`'s backward orders it.

    Parameters
    ----------
    x : float array (*S,)
        The forward's input.
    d_y : float array (*S,)
        The cotangent of its output.
    alpha : float
        ELU's scale below 0.

    Returns
    -------
    array (*S,)
        ``d_x``.
    """
    t = x.dtype.type
    slope = np.exp(np.minimum(x, np.zeros_like(x))) * t(alpha)  # E2
    return d_y * (np.where(x > 0, t(1) - slope, t(0)) + slope)  # E3


@functools.cache
def _module(dtype_name: str) -> Any:
    import cupy

    return cupy.RawModule(code=cuda_sources()[f"elu_{dtype_name}"], options=("--fmad=false",))


def _launch(xp: Any, name: str, dtype: Any, n: int, *arguments: Any) -> None:
    if n > 0:
        kernel = _module(np.dtype(dtype).name).get_function(name)
        kernel(((n + BLOCK - 1) // BLOCK,), (BLOCK,), arguments)


def elu_forward(xp: Any, x: Any, alpha: float) -> Any:
    """E1 in one launch on a device backend (CuPy's kernel, or the twin on the strict
    stand-in): ``y`` of ``x``'s shape and dtype.

    Parameters
    ----------
    xp : module
        ``x``'s array module (CuPy or the strict stand-in).
    x : float array (*S,)
        The input.
    alpha : float
        ELU's scale below 0.
    """
    if backend_name(xp) == "strict":
        return xp.run_kernel(elu_forward_twin, x, alpha)
    x = xp.ascontiguousarray(x)
    y = xp.empty_like(x)
    _launch(xp, "refimpl_elu_forward", x.dtype, x.size, x, x.dtype.type(alpha),
            np.int64(x.size), y)  # fmt: skip
    return y


def elu_backward(xp: Any, x: Any, d_y: Any, alpha: float) -> Any:
    """E2-E3 in one launch on a device backend: ``d_x`` of ``x``'s shape and dtype.

    Parameters
    ----------
    xp : module
        ``x``'s array module (CuPy or the strict stand-in).
    x : float array (*S,)
        The forward's input.
    d_y : float array (*S,)
        The cotangent of its output.
    alpha : float
        ELU's scale below 0.
    """
    if backend_name(xp) == "strict":
        return xp.run_kernel(elu_backward_twin, x, d_y, alpha)
    x, d_y = xp.ascontiguousarray(x), xp.ascontiguousarray(d_y)
    d_x = xp.empty_like(x)
    _launch(xp, "refimpl_elu_backward", x.dtype, x.size, x, d_y, x.dtype.type(alpha),
            np.int64(x.size), d_x)  # fmt: skip
    return d_x
