"""Literal twin of the fused GAT kernels (:mod:`refimpl.kernels.gat_fused`): the threads' loops
in NumPy, one thread after another, in each thread's own order.

Each function mirrors one kernel of :data:`~refimpl.kernels.gat_fused.SOURCE` line for line
(its steps F1-F3, B3-B1 keep the kernel's numbers): the same index arithmetic, the same loop
bounds over the CSR rows, every operation on NumPy scalars of the inputs' dtype ``T`` so that
float32 rounds after each one as the device does. Like the device-sum twin it keeps the
precision it mirrors instead of float64: the kernels claim the literal layer's bits.

NumPy on the host, never fast; it imports nothing of refimpl (a plain move to
``refimpl.naive`` keeps it working). ``tests/kernels/test_gat_fused.py`` holds it to
:class:`refimpl.nn.gat.conv.GATConv` on the strict stand-in.
"""

from __future__ import annotations

import numpy as np

__all__ = ["backward_sources", "backward_targets", "forward"]


def _leaky_relu(pre: np.generic, slope: np.generic) -> np.generic:
    scaled = slope * pre
    if slope <= 1:
        return pre if pre > scaled else scaled
    return pre if pre < scaled else scaled


def _kept(alpha: np.generic, keep: np.ndarray | None, k: int, scale: np.generic) -> np.generic:
    return alpha if keep is None else (alpha * alpha.dtype.type(keep[k])) * scale


def forward(
    score_src: np.ndarray,
    score_dst: np.ndarray,
    h_src: np.ndarray,
    src: np.ndarray,
    order: np.ndarray,
    indptr: np.ndarray,
    keep: np.ndarray | None,
    scale: float,
    slope: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``refimpl_gat_forward``: ``(alpha (E, H), out (N_dst, H, C))``.

    Parameters
    ----------
    score_src, score_dst : float arrays (N_src, H), (N_dst, H)
        The score's per-node halves; their dtype is every operation's.
    h_src : float array (N_src, H, C)
        The messages.
    src : int array (E,)
        Each edge's source.
    order, indptr : int arrays (E,), (N_dst + 1,)
        The edges grouped by target, in item order.
    keep : bool array (E, H) or None
        Dropout's keep-mask (None: none).
    scale : float
        Dropout's ``1 / (1 - p)``.
    slope : float
        LeakyReLU's negative slope.

    Returns
    -------
    alpha : array (E, H)
        The coefficients, before dropout.
    out : array (N_dst, H, C)
        The aggregated messages.
    """
    t = score_dst.dtype.type
    (num_dst, heads), channels = score_dst.shape, h_src.shape[2]
    scale, slope = t(scale), t(slope)
    ss, sd, hs = score_src.ravel(), score_dst.ravel(), h_src.ravel()  # the kernel's flat reads
    keep = None if keep is None else keep.ravel()
    alpha = np.empty(len(src) * heads, dtype=score_dst.dtype)
    out = np.empty(num_dst * heads * channels, dtype=score_dst.dtype)
    for i in range(num_dst * heads * channels):  # one pass per thread (v, h, c)
        vh, c = i // channels, i % channels
        h = vh % heads
        begin, end = int(indptr[vh // heads]), int(indptr[vh // heads + 1])
        target = sd[vh]
        # F1 the largest score of the row
        top = t(0)
        for j in range(begin, end):
            e = _leaky_relu(ss[int(src[order[j]]) * heads + h] + target, slope)
            if j == begin or e > top:
                top = e
        # F2 the softmax's denominator
        total = t(0)
        for j in range(begin, end):
            e = _leaky_relu(ss[int(src[order[j]]) * heads + h] + target, slope)
            total = total + np.exp(e - top)
        # F3 the coefficients (written by channel 0), dropout, and channel c of the aggregation
        total_c = t(0)
        for j in range(begin, end):
            e = int(order[j])
            u, k = int(src[e]), e * heads + h
            a = np.exp(_leaky_relu(ss[u * heads + h] + target, slope) - top) / total
            if c == 0:
                alpha[k] = a
            total_c = total_c + hs[(u * heads + h) * channels + c] * _kept(a, keep, k, scale)
        out[i] = total_c
    return alpha.reshape(len(src), heads), out.reshape(num_dst, heads, channels)


def backward_targets(
    d_out: np.ndarray,
    h_src: np.ndarray,
    alpha: np.ndarray,
    score_src: np.ndarray,
    score_dst: np.ndarray,
    src: np.ndarray,
    order: np.ndarray,
    indptr: np.ndarray,
    keep: np.ndarray | None,
    scale: float,
    slope: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``refimpl_gat_backward_targets``: ``(d_pre (E, H), d_score_dst (N_dst, H))``.

    Parameters
    ----------
    d_out : float array (N_dst, H, C)
        The cotangent of :func:`forward`'s ``out``.
    h_src : float array (N_src, H, C)
        The messages.
    alpha : float array (E, H)
        :func:`forward`'s coefficients.
    score_src, score_dst : float arrays (N_src, H), (N_dst, H)
        The score's per-node halves.
    src : int array (E,)
        Each edge's source.
    order, indptr : int arrays (E,), (N_dst + 1,)
        The edges grouped by target, in item order.
    keep : bool array (E, H) or None
        Dropout's keep-mask (None: none).
    scale : float
        Dropout's ``1 / (1 - p)``.
    slope : float
        LeakyReLU's negative slope.
    """
    t = alpha.dtype.type
    (num_dst, heads), channels = score_dst.shape, h_src.shape[2]
    scale, slope = t(scale), t(slope)
    grads, hs, a_flat = d_out.ravel(), h_src.ravel(), alpha.ravel()
    ss, sd = score_src.ravel(), score_dst.ravel()
    keep = None if keep is None else keep.ravel()
    d_pre = np.empty(alpha.size, dtype=alpha.dtype)
    d_score_dst = np.empty(num_dst * heads, dtype=alpha.dtype)
    for i in range(num_dst * heads):  # one pass per thread (v, h)
        h = i % heads
        begin, end = int(indptr[i // heads]), int(indptr[i // heads + 1])
        grad = i * channels
        # B3 d alpha (kept in d_pre until B2 overwrites it) and sum_j alpha_j d alpha_j
        weighted = t(0)
        for j in range(begin, end):
            e = int(order[j])
            k, message = e * heads + h, (int(src[e]) * heads + h) * channels
            d_kept = t(0)
            for c in range(channels):
                d_kept = d_kept + grads[grad + c] * hs[message + c]
            d_pre[k] = d_kept if keep is None else (d_kept * t(keep[k])) * scale
            weighted = weighted + a_flat[k] * d_pre[k]
        # B2 the softmax's and the LeakyReLU's backward; B1 their sum per target
        total = t(0)
        for j in range(begin, end):
            e = int(order[j])
            k = e * heads + h
            pre = ss[int(src[e]) * heads + h] + sd[i]
            d_pre[k] = (t(1) if pre > 0 else slope) * (a_flat[k] * (d_pre[k] - weighted))
            total = total + d_pre[k]
        d_score_dst[i] = total
    return d_pre.reshape(alpha.shape), d_score_dst.reshape(num_dst, heads)


def backward_sources(
    d_out: np.ndarray,
    alpha: np.ndarray,
    d_pre: np.ndarray,
    dst: np.ndarray,
    order: np.ndarray,
    indptr: np.ndarray,
    keep: np.ndarray | None,
    scale: float,
    num_src: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``refimpl_gat_backward_sources``: ``(d_h_src (N_src, H, C), d_score_src (N_src, H))``.

    Parameters
    ----------
    d_out : float array (N_dst, H, C)
        The cotangent of :func:`forward`'s ``out``.
    alpha : float array (E, H)
        :func:`forward`'s coefficients.
    d_pre : float array (E, H)
        :func:`backward_targets`' score gradients.
    dst : int array (E,)
        Each edge's target.
    order, indptr : int arrays (E,), (N_src + 1,)
        The edges grouped by source, in item order.
    keep : bool array (E, H) or None
        Dropout's keep-mask (None: none).
    scale : float
        Dropout's ``1 / (1 - p)``.
    num_src : int
        ``N_src``, the sources.
    """
    t = alpha.dtype.type
    heads, channels = alpha.shape[1], d_out.shape[2]
    scale = t(scale)
    d_out_flat, a_flat, d_pre_flat = d_out.ravel(), alpha.ravel(), d_pre.ravel()
    keep = None if keep is None else keep.ravel()
    d_h_src = np.empty(num_src * heads * channels, dtype=alpha.dtype)
    d_score_src = np.empty(num_src * heads, dtype=alpha.dtype)
    for i in range(num_src * heads * channels):  # one pass per thread (u, h, c)
        uh, c = i // channels, i % channels
        h = uh % heads
        begin, end = int(indptr[uh // heads]), int(indptr[uh // heads + 1])
        total_c, total = t(0), t(0)
        for j in range(begin, end):
            e = int(order[j])
            k = e * heads + h
            grad = d_out_flat[(int(dst[e]) * heads + h) * channels + c]
            total_c = total_c + grad * _kept(a_flat[k], keep, k, scale)
            if c == 0:
                total = total + d_pre_flat[k]
        d_h_src[i] = total_c
        if c == 0:
            d_score_src[uh] = total
    return d_h_src.reshape(num_src, heads, channels), d_score_src.reshape(num_src, heads)
