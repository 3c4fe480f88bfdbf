"""GATv2's attention and aggregation fused into CUDA kernels over CSR rows, with no ``(E, H, C)``.

What :class:`refimpl.nn.gat.conv.GATConv` version ``"v2"`` computes from the transformed
features ``h_src = W_s h_u``, ``h_dst = W_t h_v`` (N, H, C) (Brody et al. 2022 Eq. 7,
GAT-balance Eq. 2, one node set, no LipschitzNorm or edge features): the literal path
(:mod:`refimpl.nn.gat.v2`) writes ``pre = W_s h_u + W_t h_v`` per edge, (E, H, C), and
passes over it; these kernels recompute ``pre`` per edge and channel from the two per-node
rows where they need it, so no ``(E, H, C)`` array is ever written (at N = 1e6, E = 1e7,
H C = 64 the literal path's float32 ``pre`` alone is 2.6 GB):

    forward, one thread per target and head (v, h), over v's incoming edges in item order
      F1  e_j = sum_c att[h, c] LeakyReLU(h_src[u_j, h, c] + h_dst[v, h, c])   c = 0, 1, ...
          (into alpha, kept there until F3), top = max_j e_j
      F2  x_j = exp(e_j - top) (into alpha), total = sum_j x_j      left to right, from 0
      F3  alpha_j = x_j / total                                     (E, H), before dropout
      F4  out[v, h, c] = sum_j h_src[u_j, h, c] * kept_j   per c, kept_j = (alpha_j keep_j) scale
    backward over targets, thread (v, h)
      B4  g_j = (sum_c d_out[v, h, c] h_src[u_j, h, c] * keep_j) * scale   (d alpha, in d_e)
          weighted = sum_j alpha_j g_j
      B3  d_e_j = alpha_j (g_j - weighted)                                (E, H)
      B2  m_dst[v, h, c] = sum_j d_e_j f_jc,  f = 1 if pre > 0 else slope  (the target side's M)
    backward over sources, thread (u, h, c), over u's outgoing edges (the transpose CSR)
      B4  d_agg = sum_j d_out[v_j, h, c] * kept_j
      B2  m = sum_j d_e_j f_jc (+ m_dst[u, h, c] with shared weights: both ends in one M)
      B1  m_src[u, h, c] = m,  d_h_src[u, h, c] = d_agg + m * att[h, c]

``M`` is :mod:`refimpl.nn.gat.v2`'s per-node sum: ``d h = M * att`` and ``d att = sum over
sides and nodes of h * M``, both left to the caller (array operations on (N, H, C)), as is
``d_h_dst = m_dst * att``. The branch ``pre > 0`` is the literal's own (``pre`` is the same
sum of the same two floats), so the LeakyReLU's derivative at the kink is the slope on both.

Every float sum is a sequential loop over one CSR row (the row's items in item order, as
:meth:`~refimpl.kernels.segment.Segments.csr_structure` groups them) or over the channels in
index order; each thread writes only its own entries (a row's ``alpha`` and ``d_e`` entries
belong to its one target), so there are no atomics and a run repeats bit for bit. Compiled
with ``--fmad=false`` so that the host twin (:mod:`refimpl.kernels.gatv2_fused_twin`), which
rounds after every operation, is bitwise the device (where ``exp`` is the same function).
CuPy compiles with ``-ftz=true``; no test relies on subnormals.

Not bitwise the literal layer: it computes the score as ``(1 - s) att . relu(pre) + s (g_u +
g_v)`` by BLAS products, and ``M`` as ``(1 - s) S(d_e [pre > 0]) + s S(d_e)``, other roundings
of the same sums. ``tests/kernels/test_gatv2_fused.py`` states and tests the bound: every
difference within ``FORWARD_RTOL`` of the size of the terms summed (the score's
``sum_c |att| (|h_src| + |h_dst|)``, carried through the softmax; ``d_e``'s terms through
``M``, ``d att`` and ``d h``).

The LeakyReLU and dropout's keep-and-scale are the GATv1 kernels' device functions
(:data:`refimpl.kernels.gat_fused.SOURCE`), compiled into this module from that source.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from refimpl.kernels import gat_fused

__all__ = ["BLOCK", "SOURCE", "cuda_sources", "fused_backward", "fused_forward"]

BLOCK = 128  # threads per block

SOURCE = r"""
// T, REFIMPL_EXP, leaky_relu and kept: the GATv1 kernels' prelude (cuda_sources prepends it)

__device__ T gatv2_score(const T* message, const T* target, const T* vector, const int channels,
                         const T slope) {
    T e = 0;  // the channels in index order
    for (int c = 0; c < channels; ++c) e += vector[c] * leaky_relu(message[c] + target[c], slope);
    return e;
}

extern "C" __global__ void refimpl_gatv2_forward(
    const T* h_src, const T* h_dst, const T* att, const long long* src, const int* order,
    const int* indptr, const unsigned char* keep, const int has_keep, const T scale,
    const T slope, const long long num_dst, const int heads, const int channels, T* alpha,
    T* out) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (v, h)
    if (i >= num_dst * heads) return;
    const int h = (int)(i % heads), begin = indptr[i / heads], end = indptr[i / heads + 1];
    const T* target = h_dst + i * channels;
    const T* vector = att + (long long)h * channels;
    // F1 each edge's score (in alpha until F3) and the row's largest
    T top = 0;
    for (int j = begin; j < end; ++j) {
        const long long e = order[j], k = e * heads + h;
        const T score = gatv2_score(h_src + (src[e] * heads + h) * channels, target, vector,
                                    channels, slope);
        alpha[k] = score;
        if (j == begin || score > top) top = score;
    }
    // F2 the exponentials (in alpha) and the softmax's denominator
    T total = 0;
    for (int j = begin; j < end; ++j) {
        const long long k = order[j] * (long long)heads + h;
        alpha[k] = REFIMPL_EXP(alpha[k] - top);
        total += alpha[k];
    }
    // F3 the coefficients
    for (int j = begin; j < end; ++j) {
        const long long k = order[j] * (long long)heads + h;
        alpha[k] = alpha[k] / total;
    }
    // F4 dropout and the aggregation, channel by channel
    for (int c = 0; c < channels; ++c) {
        T sum = 0;
        for (int j = begin; j < end; ++j) {
            const long long e = order[j], k = e * heads + h;
            sum += h_src[(src[e] * heads + h) * channels + c] * kept(alpha[k], keep, has_keep, k,
                                                                     scale);
        }
        out[i * channels + c] = sum;
    }
}

extern "C" __global__ void refimpl_gatv2_backward_targets(
    const T* d_out, const T* h_src, const T* h_dst, const T* alpha, const long long* src,
    const int* order, const int* indptr, const unsigned char* keep, const int has_keep,
    const T scale, const T slope, const long long num_dst, const int heads, const int channels,
    T* d_e, T* m_dst) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (v, h)
    if (i >= num_dst * heads) return;
    const int h = (int)(i % heads), begin = indptr[i / heads], end = indptr[i / heads + 1];
    const T* grad = d_out + i * channels;
    const T* target = h_dst + i * channels;
    // B4 d alpha (in d_e until B3 overwrites it) and sum_j alpha_j d alpha_j
    T weighted = 0;
    for (int j = begin; j < end; ++j) {
        const long long e = order[j], k = e * heads + h;
        const T* message = h_src + (src[e] * heads + h) * channels;
        T d_kept = 0;
        for (int c = 0; c < channels; ++c) d_kept += grad[c] * message[c];
        d_e[k] = has_keep ? (d_kept * (T)keep[k]) * scale : d_kept;
        weighted += alpha[k] * d_e[k];
    }
    // B3 the softmax's backward
    for (int j = begin; j < end; ++j) {
        const long long k = order[j] * (long long)heads + h;
        d_e[k] = alpha[k] * (d_e[k] - weighted);
    }
    // B2 the target side's M, channel by channel
    for (int c = 0; c < channels; ++c) {
        T m = 0;
        for (int j = begin; j < end; ++j) {
            const long long e = order[j], k = e * heads + h;
            const T pre = h_src[(src[e] * heads + h) * channels + c] + target[c];
            m += d_e[k] * (pre > 0 ? (T)1 : slope);
        }
        m_dst[i * channels + c] = m;
    }
}

extern "C" __global__ void refimpl_gatv2_backward_sources(
    const T* d_out, const T* h_src, const T* h_dst, const T* att, const T* alpha, const T* d_e,
    const T* m_dst, const int shared, const long long* dst, const int* order, const int* indptr,
    const unsigned char* keep, const int has_keep, const T scale, const T slope,
    const long long num_src, const int heads, const int channels, T* d_h_src, T* m_src) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (u, h, c)
    if (i >= num_src * heads * channels) return;
    const long long uh = i / channels;  // (u, h)
    const int c = (int)(i % channels), h = (int)(uh % heads);
    const int begin = indptr[uh / heads], end = indptr[uh / heads + 1];
    // B4 the aggregation's gradient; B2 the source side's M
    T sum = 0, m = 0;
    for (int j = begin; j < end; ++j) {
        const long long e = order[j], k = e * heads + h, target = (dst[e] * heads + h) * channels;
        sum += d_out[target + c] * kept(alpha[k], keep, has_keep, k, scale);
        const T pre = h_src[i] + h_dst[target + c];
        m += d_e[k] * (pre > 0 ? (T)1 : slope);
    }
    if (shared) m = m + m_dst[i];  // one map W_s: both ends' M in one array, the source's first
    // B1 the source side's d h
    m_src[i] = m;
    d_h_src[i] = sum + m * att[(long long)h * channels + c];
}
"""


def cuda_sources() -> dict[str, str]:
    """Every translation unit this module compiles, by name: :data:`SOURCE` once per dtype
    after the GATv1 kernels' device functions (``leaky_relu`` and ``kept``,
    :data:`refimpl.kernels.gat_fused.DEVICE_FUNCTIONS`)."""
    return {
        f"gatv2_fused_{name}": gat_fused.dtype_defines(name) + gat_fused.DEVICE_FUNCTIONS + SOURCE
        for name in ("float32", "float64")
    }


@functools.cache
def _module(dtype_name: str) -> Any:
    import cupy

    code = cuda_sources()[f"gatv2_fused_{dtype_name}"]
    return cupy.RawModule(code=code, options=("--fmad=false",))


def _launch(name: str, dtype: Any, threads: int, *arguments: Any) -> None:
    if threads > 0:
        kernel = _module(np.dtype(dtype).name).get_function(name)
        kernel(((threads + BLOCK - 1) // BLOCK,), (BLOCK,), arguments)


def fused_forward(
    h_src: Any,
    h_dst: Any,
    att: Any,
    src: Any,
    dst_csr: tuple[Any, Any],
    keep: Any,
    scale: float,
    slope: float,
) -> tuple[Any, Any]:
    """F1-F4 on CuPy arrays: ``(alpha (E, H), out (N, H, C))``.

    Parameters
    ----------
    h_src, h_dst : float arrays (N, H, C)
        ``W_s h_u`` and ``W_t h_v`` (the same array with shared weights); their dtype is
        every operation's.
    att : float array (H, C)
        The attention vector.
    src : int array (E,)
        Each edge's source.
    dst_csr : tuple of two int32 arrays (E,), (N + 1,)
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
    out : array (N, H, C)
        The aggregated messages; zero for a target without incoming edges.
    """
    import cupy

    num_dst, heads, channels = h_dst.shape
    order, indptr = dst_csr
    t = h_dst.dtype.type
    alpha = cupy.empty((src.shape[0], heads), dtype=h_dst.dtype)
    out = cupy.empty((num_dst, heads, channels), dtype=h_dst.dtype)
    keep, has_keep = gat_fused._keep_arguments(keep, cupy)
    _launch(
        "refimpl_gatv2_forward", h_dst.dtype, num_dst * heads,
        cupy.ascontiguousarray(h_src), cupy.ascontiguousarray(h_dst),
        cupy.ascontiguousarray(att), src.astype(cupy.int64, copy=False), order, indptr, keep,
        has_keep, t(scale), t(slope), np.int64(num_dst), np.int32(heads), np.int32(channels),
        alpha, out,
    )  # fmt: skip
    return alpha, out


def fused_backward(
    d_out: Any,
    h_src: Any,
    h_dst: Any,
    att: Any,
    alpha: Any,
    edges: tuple[Any, Any],
    csrs: tuple[tuple[Any, Any], tuple[Any, Any]],
    keep: Any,
    scale: float,
    slope: float,
) -> tuple[Any, Any, Any, Any]:
    """B4-B1 on CuPy arrays: ``(d_h_src (N, H, C), m_src (N, H, C), m_dst (N, H, C),
    d_e (E, H))``: the sources' gradient (aggregation and score), the two sides' ``M`` (one,
    in ``m_src``, where ``h_dst is h_src``) and the scores' gradient.

    Parameters
    ----------
    d_out : float array (N, H, C)
        The cotangent of :func:`fused_forward`'s ``out``.
    h_src, h_dst : float arrays (N, H, C)
        As given to :func:`fused_forward`; ``h_dst is h_src`` means one map, both ends' ``M``
        summed into ``m_src``.
    att : float array (H, C)
        The attention vector.
    alpha : float array (E, H)
        :func:`fused_forward`'s coefficients.
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

    num_dst, heads, channels = h_dst.shape
    num_src, (src, dst), (dst_csr, src_csr) = h_src.shape[0], edges, csrs
    shared, t = np.int32(h_dst is h_src), h_dst.dtype.type
    d_out, att = cupy.ascontiguousarray(d_out), cupy.ascontiguousarray(att)
    h_src, h_dst = cupy.ascontiguousarray(h_src), cupy.ascontiguousarray(h_dst)
    d_e = cupy.empty(alpha.shape, dtype=alpha.dtype)
    m_dst = cupy.empty((num_dst, heads, channels), dtype=alpha.dtype)
    d_h_src = cupy.empty((num_src, heads, channels), dtype=alpha.dtype)
    m_src = cupy.empty((num_src, heads, channels), dtype=alpha.dtype)
    keep, has_keep = gat_fused._keep_arguments(keep, cupy)
    _launch(
        "refimpl_gatv2_backward_targets", alpha.dtype, num_dst * heads,
        d_out, h_src, h_dst, alpha, src.astype(cupy.int64, copy=False), *dst_csr, keep,
        has_keep, t(scale), t(slope), np.int64(num_dst), np.int32(heads), np.int32(channels),
        d_e, m_dst,
    )  # fmt: skip
    _launch(
        "refimpl_gatv2_backward_sources", alpha.dtype, num_src * heads * channels,
        d_out, h_src, h_dst, att, alpha, d_e, m_dst, shared,
        dst.astype(cupy.int64, copy=False), *src_csr, keep, has_keep, t(scale), t(slope),
        np.int64(num_src), np.int32(heads), np.int32(channels), d_h_src, m_src,
    )  # fmt: skip
    return d_h_src, m_src, m_dst, d_e
