"""The fused GAT path's step B2 into ``W h`` as one device kernel, beside its NumPy twin.

After the fused backward kernels (:mod:`refimpl.kernels.gat_fused`) the score's per-node
halves send their gradients into the messages ``W h`` (GAT-balance Eq. 2, GATv1's
``att_src . W h_u + att_dst . W h_v``). The literal layer does it in five array operations
(:func:`refimpl.ops.heads.scale_per_head` twice, a repeat and a product each, and a sum);
this kernel does the same operations on each entry, in the same order and dtype:

    B2  d_h_src[n, h, c] = d_h[n, h, c] + d_score_src[n, h] * att_src[h, c]
        d_h_dst[n, h, c] = d_score_dst[n, h] * att_dst[h, c]

with ``d_h`` the aggregation's gradient of ``W h_u``. One thread per entry, no sums, so
the kernel is bitwise its twin and the literal path (compiled with ``--fmad=false``: a
contracted ``a + b * c`` would round once). The strict stand-in runs
:func:`score_halves_backward_twin` as the one launch the kernel is.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from refimpl.backend import backend_name

__all__ = ["SOURCE", "cuda_sources", "score_halves_backward", "score_halves_backward_twin"]

BLOCK = 256  # threads per block, one entry each

SOURCE = r"""
typedef REFIMPL_T T;  // float or double, one module per dtype

extern "C" __global__ void refimpl_gat_score_halves_backward(
    const T* d_h, const T* d_score_src, const T* d_score_dst, const T* att_src,
    const T* att_dst, const long long n, const int heads, const int channels, T* d_h_src,
    T* d_h_dst) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (n, h, c)
    if (i >= n * heads * channels) return;
    const long long nh = i / channels;              // (n, h)
    const int hc = (int)(i % ((long long)heads * channels));  // (h, c)
    // B2 the literal d_h + scale_per_head(d_score_src, att_src), scale_per_head(dst)
    d_h_src[i] = d_h[i] + d_score_src[nh] * att_src[hc];
    d_h_dst[i] = d_score_dst[nh] * att_dst[hc];
}
"""

_C_TYPES = {"float32": "float", "float64": "double"}


def cuda_sources() -> dict[str, str]:
    """:data:`SOURCE` once per dtype, by name (what CuPy compiles, and the PTX test)."""
    return {
        f"gat_fused_scores_{name}": f"#define REFIMPL_T {c}\n{SOURCE}"
        for name, c in _C_TYPES.items()
    }


def score_halves_backward_twin(
    d_h: np.ndarray,
    d_score_src: np.ndarray,
    d_score_dst: np.ndarray,
    att_src: np.ndarray,
    att_dst: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """B2 on NumPy, entry by entry in the kernel's order.

    Parameters
    ----------
    d_h : float array (N, H, C)
        The aggregation's gradient of ``W h_u``.
    d_score_src, d_score_dst : float arrays (N, H)
        The gradients of the score's per-node halves.
    att_src, att_dst : float arrays (H, C)
        The attention vectors.

    Returns
    -------
    d_h_src, d_h_dst : arrays (N, H, C)
        ``d_h + d_score_src att_src`` and ``d_score_dst att_dst``.
    """
    d_h_src = d_h + d_score_src[:, :, None] * att_src[None]
    return d_h_src, d_score_dst[:, :, None] * att_dst[None]


@functools.cache
def _module(dtype_name: str) -> Any:
    import cupy

    code = cuda_sources()[f"gat_fused_scores_{dtype_name}"]
    return cupy.RawModule(code=code, options=("--fmad=false",))


def score_halves_backward(
    xp: Any, d_h: Any, d_score_src: Any, d_score_dst: Any, att_src: Any, att_dst: Any
) -> tuple[Any, Any]:
    """B2 in one launch on a device backend (CuPy's kernel, or the twin on the strict
    stand-in): ``(d_h_src, d_h_dst)`` as :func:`score_halves_backward_twin`'s.

    Parameters
    ----------
    xp : module
        The arrays' module (CuPy or the strict stand-in).
    d_h : float array (N, H, C)
        The aggregation's gradient of ``W h_u``.
    d_score_src, d_score_dst : float arrays (N, H)
        The gradients of the score's per-node halves.
    att_src, att_dst : float arrays (H, C)
        The attention vectors.
    """
    arguments = (d_h, d_score_src, d_score_dst, att_src, att_dst)
    if backend_name(xp) == "strict":
        return xp.run_kernel(score_halves_backward_twin, *arguments)
    d_h, d_score_src, d_score_dst, att_src, att_dst = map(xp.ascontiguousarray, arguments)
    (num_nodes, heads, channels), threads = d_h.shape, d_h.size
    d_h_src, d_h_dst = xp.empty_like(d_h), xp.empty_like(d_h)
    if threads > 0:
        kernel = _module(np.dtype(d_h.dtype).name).get_function("refimpl_gat_score_halves_backward")
        kernel(
            ((threads + BLOCK - 1) // BLOCK,), (BLOCK,),
            (d_h, d_score_src, d_score_dst, att_src, att_dst, np.int64(num_nodes),
             np.int32(heads), np.int32(channels), d_h_src, d_h_dst),
        )  # fmt: skip
    return d_h_src, d_h_dst
