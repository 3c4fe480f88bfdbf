"""GATv1's attention and aggregation fused into CUDA kernels over CSR rows, bit for bit the literal.

What :class:`refimpl.nn.gat.conv.GATConv` computes from the per-node score halves
``score_src = att_src . W h_u`` and ``score_dst = att_dst . W h_v`` (N, H) and the messages
``h_src = W h_u`` (N, H, C) (GAT-balance Eq. 1-2, v1 without LipschitzNorm or edge features),
in three kernels instead of some twenty array operations, with no ``(E, H, C)`` intermediate:

    forward, one thread per target, head and channel (v, h, c), over v's incoming edges in
    item order (the C threads of (v, h) repeat F1-F2: the same reads, broadcast in a warp)
      F1  top   = max_j e_j,   e_j = LeakyReLU(score_src[u_j, h] + score_dst[v, h])
      F2  total = sum_j exp(e_j - top)                          left to right, from 0
      F3  alpha_j = exp(e_j - top) / total                      (E, H), before dropout
          kept_j  = (alpha_j * keep_j) * scale                  the given keep-mask, 1 / (1 - p)
          out[v, h, c] = sum_j h_src[u_j, h, c] * kept_j         left to right, from 0
    backward over targets, thread (v, h)
      B3  g_j = (sum_c d_out[v, h, c] h_src[u_j, h, c] * keep_j) * scale   (d alpha)
          weighted = sum_j alpha_j g_j
      B2  d_pre_j = (1 if pre_j > 0 else slope) * (alpha_j (g_j - weighted))   (E, H)
      B1  d_score_dst[v, h] = sum_j d_pre_j
    backward over sources, thread (u, h, c), over u's outgoing edges (the transpose CSR)
      B3  d_h_src[u, h, c] = sum_j d_out[v_j, h, c] * kept_j
      B1  d_score_src[u, h] = sum_j d_pre_j

Every float sum is a sequential loop over one CSR row (the row's items in item order, as
:meth:`~refimpl.kernels.segment.Segments.csr_structure` groups them), each thread writes only
its own entries, so there are no atomics and a run repeats bit for bit. The operations are the
literal path's own, in its order (the strict stand-in's segment sums add left to right in item
order, :mod:`refimpl.kernels.device_sums`), so the forward is bitwise the literal's wherever
``exp`` is the same function (CuPy's ``exp`` and this source call CUDA's). One sum is not:
the literal ``d alpha`` sums the channels by a BLAS product (:func:`refimpl.ops.heads.
sum_channels`), whose order BLAS picks, so the backward is held at a stated tolerance.
The source is compiled with ``--fmad=false``: a contracted ``a * b + c`` rounds once and
would break the equality. CuPy compiles every kernel with ``-ftz=true``, these and the
literal path's alike, so subnormals flush the same on both; the host twin keeps them, and no
test relies on them.

:mod:`refimpl.kernels.gat_fused_twin` runs the same loops in NumPy on the host, thread by
thread (``tests/kernels/test_gat_fused.py`` holds it to the literal layer on the strict
stand-in, and the PTX test compiles :data:`SOURCE` for atomics). Only CuPy launches the
kernels; the layer keeps the literal path as the reference.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = [
    "BLOCK", "DEVICE_FUNCTIONS", "SOURCE", "cuda_sources", "dtype_defines", "fused_backward",
    "fused_forward",
]  # fmt: skip

BLOCK = 128  # threads per block: consecutive channels of a row, so the reads coalesce

DEVICE_FUNCTIONS = r"""
typedef REFIMPL_T T;  // float or double, one module per dtype; REFIMPL_EXP: expf or exp

__device__ T leaky_relu(const T pre, const T slope) {
    const T scaled = slope * pre;  // the literal max(x, s x) (min for s > 1)
    if (slope <= (T)1) return pre > scaled ? pre : scaled;
    return pre < scaled ? pre : scaled;
}

__device__ T kept(const T alpha, const unsigned char* keep, const int has_keep, const long long k,
                  const T scale) {
    return has_keep ? (alpha * (T)keep[k]) * scale : alpha;  // the literal (x * mask) * scale
}
"""  # the LeakyReLU and dropout's keep-and-scale, shared with the GATv2 kernels

SOURCE = (
    DEVICE_FUNCTIONS
    + r"""
extern "C" __global__ void refimpl_gat_forward(
    const T* score_src, const T* score_dst, const T* h_src, const long long* src,
    const int* order, const int* indptr, const unsigned char* keep, const int has_keep,
    const T scale, const T slope, const long long num_dst, const int heads, const int channels,
    T* alpha, T* out) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (v, h, c)
    if (i >= num_dst * heads * channels) return;
    const long long vh = i / channels;  // (v, h): its C threads run the same row loops
    const int c = (int)(i % channels), h = (int)(vh % heads);
    const int begin = indptr[vh / heads], end = indptr[vh / heads + 1];
    const T target = score_dst[vh];
    // F1 the largest score of the row
    T top = 0;
    for (int j = begin; j < end; ++j) {
        const T e = leaky_relu(score_src[src[order[j]] * heads + h] + target, slope);
        if (j == begin || e > top) top = e;
    }
    // F2 the softmax's denominator
    T total = 0;
    for (int j = begin; j < end; ++j) {
        const T e = leaky_relu(score_src[src[order[j]] * heads + h] + target, slope);
        total += REFIMPL_EXP(e - top);
    }
    // F3 the coefficients (written by channel 0), dropout, and channel c of the aggregation
    T sum = 0;
    for (int j = begin; j < end; ++j) {
        const long long e = order[j], u = src[e], k = e * heads + h;
        const T a = REFIMPL_EXP(leaky_relu(score_src[u * heads + h] + target, slope) - top) / total;
        if (c == 0) alpha[k] = a;
        sum += h_src[(u * heads + h) * channels + c] * kept(a, keep, has_keep, k, scale);
    }
    out[i] = sum;
}

extern "C" __global__ void refimpl_gat_backward_targets(
    const T* d_out, const T* h_src, const T* alpha, const T* score_src, const T* score_dst,
    const long long* src, const int* order, const int* indptr, const unsigned char* keep,
    const int has_keep, const T scale, const T slope, const long long num_dst, const int heads,
    const int channels, T* d_pre, T* d_score_dst) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (v, h)
    if (i >= num_dst * heads) return;
    const int h = (int)(i % heads), begin = indptr[i / heads], end = indptr[i / heads + 1];
    const T* grad = d_out + i * channels;
    // B3 d alpha (kept in d_pre until B2 overwrites it) and sum_j alpha_j d alpha_j
    T weighted = 0;
    for (int j = begin; j < end; ++j) {
        const long long e = order[j], k = e * heads + h;
        const T* message = h_src + (src[e] * heads + h) * channels;
        T d_kept = 0;
        for (int c = 0; c < channels; ++c) d_kept += grad[c] * message[c];
        d_pre[k] = has_keep ? (d_kept * (T)keep[k]) * scale : d_kept;
        weighted += alpha[k] * d_pre[k];
    }
    // B2 the softmax's and the LeakyReLU's backward; B1 their sum per target
    T total = 0;
    for (int j = begin; j < end; ++j) {
        const long long e = order[j], k = e * heads + h;
        const T pre = score_src[src[e] * heads + h] + score_dst[i];
        d_pre[k] = (pre > 0 ? (T)1 : slope) * (alpha[k] * (d_pre[k] - weighted));
        total += d_pre[k];
    }
    d_score_dst[i] = total;
}

extern "C" __global__ void refimpl_gat_backward_sources(
    const T* d_out, const T* alpha, const T* d_pre, const long long* dst, const int* order,
    const int* indptr, const unsigned char* keep, const int has_keep, const T scale,
    const long long num_src, const int heads, const int channels, T* d_h_src,
    T* d_score_src) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (u, h, c)
    if (i >= num_src * heads * channels) return;
    const long long uh = i / channels;  // (u, h)
    const int c = (int)(i % channels), h = (int)(uh % heads);
    const int begin = indptr[uh / heads], end = indptr[uh / heads + 1];
    T sum = 0, total = 0;
    for (int j = begin; j < end; ++j) {
        const long long e = order[j], k = e * heads + h;
        const T weight = kept(alpha[k], keep, has_keep, k, scale);
        sum += d_out[(dst[e] * heads + h) * channels + c] * weight;
        if (c == 0) total += d_pre[k];
    }
    d_h_src[i] = sum;
    if (c == 0) d_score_src[uh] = total;
}
"""
)

# C type and exponential per dtype: CuPy's exp of float32 is CUDA's expf, of float64 its exp.
_C_TYPES = {"float32": ("float", "expf"), "float64": ("double", "exp")}


def dtype_defines(dtype_name: str) -> str:
    """The lines that fix a translation unit's dtype.

    Parameters
    ----------
    dtype_name : {"float32", "float64"}
        The arrays' dtype.

    Returns
    -------
    str
        ``#define`` lines of ``REFIMPL_T`` (``float`` or ``double``) and ``REFIMPL_EXP``
        (``expf`` or ``exp``, CuPy's exponential of that dtype).
    """
    c_type, exp = _C_TYPES[dtype_name]
    return f"#define REFIMPL_T {c_type}\n#define REFIMPL_EXP {exp}\n"


def cuda_sources() -> dict[str, str]:
    """Every translation unit this module compiles, by name: :data:`SOURCE` once per dtype
    (what CuPy compiles, and the PTX test with ``nvcc``)."""
    return {f"gat_fused_{name}": dtype_defines(name) + SOURCE for name in _C_TYPES}


@functools.cache
def _module(dtype_name: str) -> Any:
    import cupy

    return cupy.RawModule(code=cuda_sources()[f"gat_fused_{dtype_name}"], options=("--fmad=false",))


def _launch(name: str, dtype: Any, threads: int, *arguments: Any) -> None:
    if threads > 0:
        kernel = _module(np.dtype(dtype).name).get_function(name)
        kernel(((threads + BLOCK - 1) // BLOCK,), (BLOCK,), arguments)


def _keep_arguments(keep: Any, xp: Any) -> tuple[Any, np.int32]:
    if keep is None:  # no dropout: a placeholder the kernels never read
        return xp.zeros(1, dtype=xp.uint8), np.int32(0)
    return xp.ascontiguousarray(keep).view(xp.uint8), np.int32(1)


def fused_forward(
    score_src: Any,
    score_dst: Any,
    h_src: Any,
    src: Any,
    dst_csr: tuple[Any, Any],
    keep: Any,
    scale: float,
    slope: float,
) -> tuple[Any, Any]:
    """F1-F3 on CuPy arrays: ``(alpha (E, H), out (N_dst, H, C))``.

    Parameters
    ----------
    score_src, score_dst : float arrays (N_src, H), (N_dst, H)
        The score's per-node halves (:func:`refimpl.ops.heads.dot_per_head`); their dtype is
        every operation's.
    h_src : float array (N_src, H, C)
        The messages ``W h_u``.
    src : int array (E,)
        Each edge's source.
    dst_csr : tuple of two int32 arrays (E,), (N_dst + 1,)
        ``(order, indptr)``: the edges grouped by target (:meth:`Segments.csr_structure`).
    keep : bool array (E, H) or None
        Attention dropout's keep-mask (None: no dropout).
    scale : float
        Dropout's ``1 / (1 - p)``.
    slope : float
        LeakyReLU's negative slope.

    Returns
    -------
    alpha : array (E, H)
        The attention coefficients, before dropout.
    out : array (N_dst, H, C)
        The aggregated messages; zero for a target without incoming edges.
    """
    import cupy

    (num_dst, heads), channels = score_dst.shape, h_src.shape[2]
    order, indptr = dst_csr
    t = score_dst.dtype.type
    alpha = cupy.empty((src.shape[0], heads), dtype=score_dst.dtype)
    out = cupy.empty((num_dst, heads, channels), dtype=score_dst.dtype)
    keep, has_keep = _keep_arguments(keep, cupy)
    _launch(
        "refimpl_gat_forward", score_dst.dtype, num_dst * heads * channels,
        cupy.ascontiguousarray(score_src), cupy.ascontiguousarray(score_dst),
        cupy.ascontiguousarray(h_src), src.astype(cupy.int64, copy=False), order, indptr, keep,
        has_keep, t(scale), t(slope), np.int64(num_dst), np.int32(heads), np.int32(channels),
        alpha, out,
    )  # fmt: skip
    return alpha, out


def fused_backward(
    d_out: Any,
    h_src: Any,
    alpha: Any,
    score_src: Any,
    score_dst: Any,
    edges: tuple[Any, Any],
    csrs: tuple[tuple[Any, Any], tuple[Any, Any]],
    keep: Any,
    scale: float,
    slope: float,
) -> tuple[Any, Any, Any]:
    """B3-B1 on CuPy arrays: ``(d_h_src (N_src, H, C), d_score_src (N_src, H),
    d_score_dst (N_dst, H))``, the aggregation's and the score halves' gradients.

    Parameters
    ----------
    d_out : float array (N_dst, H, C)
        The cotangent of :func:`fused_forward`'s ``out``.
    h_src : float array (N_src, H, C)
        The messages.
    alpha : float array (E, H)
        :func:`fused_forward`'s coefficients.
    score_src, score_dst : float arrays (N_src, H), (N_dst, H)
        The score's per-node halves.
    edges : tuple of two int arrays (E,)
        ``(src, dst)``: each edge's source and target.
    csrs : tuple of two (order, indptr) pairs
        The edges grouped by target and by source (:meth:`Segments.csr_structure`).
    keep : bool array (E, H) or None
        Attention dropout's keep-mask (None: no dropout).
    scale : float
        Dropout's ``1 / (1 - p)``.
    slope : float
        LeakyReLU's negative slope.
    """
    import cupy

    (num_dst, heads), (num_src, _, channels) = score_dst.shape, h_src.shape
    (src, dst), (dst_csr, src_csr) = edges, csrs
    t = score_dst.dtype.type
    d_out, h_src = cupy.ascontiguousarray(d_out), cupy.ascontiguousarray(h_src)
    d_pre = cupy.empty(alpha.shape, dtype=alpha.dtype)
    d_score_dst = cupy.empty((num_dst, heads), dtype=alpha.dtype)
    d_h_src = cupy.empty((num_src, heads, channels), dtype=alpha.dtype)
    d_score_src = cupy.empty((num_src, heads), dtype=alpha.dtype)
    keep, has_keep = _keep_arguments(keep, cupy)
    _launch(
        "refimpl_gat_backward_targets", alpha.dtype, num_dst * heads,
        d_out, h_src, alpha, cupy.ascontiguousarray(score_src),
        cupy.ascontiguousarray(score_dst), src.astype(cupy.int64, copy=False), *dst_csr, keep,
        has_keep, t(scale), t(slope), np.int64(num_dst), np.int32(heads), np.int32(channels),
        d_pre, d_score_dst,
    )  # fmt: skip
    _launch(
        "refimpl_gat_backward_sources", alpha.dtype, num_src * heads * channels,
        d_out, alpha, d_pre, dst.astype(cupy.int64, copy=False), *src_csr, keep, has_keep,
        t(scale), np.int64(num_src), np.int32(heads), np.int32(channels), d_h_src, d_score_src,
    )  # fmt: skip
    return d_h_src, d_score_src, d_score_dst
