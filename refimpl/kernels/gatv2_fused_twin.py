"""Literal twin of the fused GATv2 kernels (:mod:`refimpl.kernels.gatv2_fused`): the threads'
loops in NumPy, one thread after another, in each thread's own order.

Each function mirrors one kernel of :data:`~refimpl.kernels.gatv2_fused.SOURCE` line for
line (its steps F1-F4, B4-B1 keep the kernel's numbers): the same index arithmetic, the same
loop bounds over the CSR rows and the channels, every operation on NumPy scalars of the
inputs' dtype ``T`` so that float32 rounds after each one as the device does (compiled with
``--fmad=false``). So the twin is the kernels' bits, not the literal layer's; how far those
are apart is stated in the kernels' module.

NumPy on the host, never fast. Like :mod:`refimpl.kernels.gat_fused_twin`, whose LeakyReLU
and keep-and-scale it shares (the kernels share theirs), it imports nothing else of refimpl:
the two twins move together. ``tests/kernels/test_gatv2_fused.py`` holds it to
:class:`refimpl.nn.gat.conv.GATConv` (version ``"v2"``) on the strict stand-in.
"""

from __future__ import annotations

import numpy as np

from refimpl.kernels.gat_fused_twin import _kept, _leaky_relu

__all__ = ["backward_sources", "backward_targets", "forward"]


def _score(
    rows: tuple[np.ndarray, np.ndarray, np.ndarray],
    offsets: tuple[int, int, int],
    channels: int,
    slope: np.generic,
) -> np.generic:
    """``gatv2_score``: ``sum_c att[h, c] LeakyReLU(h_src[u, h, c] + h_dst[v, h, c])``, the
    channels in index order; ``rows`` the flat ``h_src``, ``h_dst``, ``att`` and ``offsets``
    where ``(u, h)``, ``(v, h)`` and ``h`` start in them."""
    (hs, hd, vector), (message, target, head) = rows, offsets
    e = vector.dtype.type(0)
    for c in range(channels):
        e = e + vector[head + c] * _leaky_relu(hs[message + c] + hd[target + c], slope)
    return e


def forward(
    h_src: np.ndarray,
    h_dst: np.ndarray,
    att: np.ndarray,
    src: np.ndarray,
    order: np.ndarray,
    indptr: np.ndarray,
    keep: np.ndarray | None,
    scale: float,
    slope: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``refimpl_gatv2_forward``: ``(alpha (E, H), out (N, H, C))``.

    Parameters
    ----------
    h_src, h_dst : float arrays (N, H, C)
        ``W_s h_u`` and ``W_t h_v``; their dtype is every operation's.
    att : float array (H, C)
        The attention vector.
    src : int array (E,)
        Each edge's source.
    order, indptr : int arrays (E,), (N + 1,)
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
    out : array (N, H, C)
        The aggregated messages.
    """
    t = h_dst.dtype.type
    num_dst, heads, channels = h_dst.shape
    scale, slope = t(scale), t(slope)
    hs, hd, vector = h_src.ravel(), h_dst.ravel(), att.ravel()  # the kernel's flat reads
    keep = None if keep is None else keep.ravel()
    alpha = np.empty(len(src) * heads, dtype=h_dst.dtype)
    out = np.empty(num_dst * heads * channels, dtype=h_dst.dtype)
    for i in range(num_dst * heads):  # one pass per thread (v, h)
        h = i % heads
        begin, end = int(indptr[i // heads]), int(indptr[i // heads + 1])
        # F1 each edge's score (in alpha until F3) and the row's largest
        top = t(0)
        for j in range(begin, end):
            e = int(order[j])
            message = (int(src[e]) * heads + h) * channels
            offsets = (message, i * channels, h * channels)
            score = _score((hs, hd, vector), offsets, channels, slope)
            alpha[e * heads + h] = score
            if j == begin or score > top:
                top = score
        # F2 the exponentials (in alpha) and the softmax's denominator
        total = t(0)
        for j in range(begin, end):
            k = int(order[j]) * heads + h
            alpha[k] = np.exp(alpha[k] - top)
            total = total + alpha[k]
        # F3 the coefficients
        for j in range(begin, end):
            k = int(order[j]) * heads + h
            alpha[k] = alpha[k] / total
        # F4 dropout and the aggregation, channel by channel
        for c in range(channels):
            total_c = t(0)
            for j in range(begin, end):
                e = int(order[j])
                k, message = e * heads + h, (int(src[e]) * heads + h) * channels
                total_c = total_c + hs[message + c] * _kept(alpha[k], keep, k, scale)
            out[i * channels + c] = total_c
    return alpha.reshape(len(src), heads), out.reshape(num_dst, heads, channels)


def backward_targets(
    d_out: np.ndarray,
    h_src: np.ndarray,
    h_dst: np.ndarray,
    alpha: np.ndarray,
    src: np.ndarray,
    order: np.ndarray,
    indptr: np.ndarray,
    keep: np.ndarray | None,
    scale: float,
    slope: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``refimpl_gatv2_backward_targets``: ``(d_e (E, H), m_dst (N, H, C))``.

    Parameters
    ----------
    d_out : float array (N, H, C)
        The cotangent of :func:`forward`'s ``out``.
    h_src, h_dst : float arrays (N, H, C)
        As given to :func:`forward`.
    alpha : float array (E, H)
        :func:`forward`'s coefficients.
    src : int array (E,)
        Each edge's source.
    order, indptr : int arrays (E,), (N + 1,)
        The edges grouped by target, in item order.
    keep : bool array (E, H) or None
        Dropout's keep-mask (None: none).
    scale : float
        Dropout's ``1 / (1 - p)``.
    slope : float
        LeakyReLU's negative slope.
    """
    t = alpha.dtype.type
    num_dst, heads, channels = h_dst.shape
    scale, slope = t(scale), t(slope)
    grads, hs, hd, a_flat = d_out.ravel(), h_src.ravel(), h_dst.ravel(), alpha.ravel()
    keep = None if keep is None else keep.ravel()
    d_e = np.empty(alpha.size, dtype=alpha.dtype)
    m_dst = np.empty(num_dst * heads * channels, dtype=alpha.dtype)
    for i in range(num_dst * heads):  # one pass per thread (v, h)
        h = i % heads
        begin, end = int(indptr[i // heads]), int(indptr[i // heads + 1])
        # B4 d alpha (in d_e until B3 overwrites it) and sum_j alpha_j d alpha_j
        weighted = t(0)
        for j in range(begin, end):
            e = int(order[j])
            k, message = e * heads + h, (int(src[e]) * heads + h) * channels
            d_kept = t(0)
            for c in range(channels):
                d_kept = d_kept + grads[i * channels + c] * hs[message + c]
            d_e[k] = d_kept if keep is None else (d_kept * t(keep[k])) * scale
            weighted = weighted + a_flat[k] * d_e[k]
        # B3 the softmax's backward
        for j in range(begin, end):
            k = int(order[j]) * heads + h
            d_e[k] = a_flat[k] * (d_e[k] - weighted)
        # B2 the target side's M, channel by channel
        for c in range(channels):
            m = t(0)
            for j in range(begin, end):
                e = int(order[j])
                k, message = e * heads + h, (int(src[e]) * heads + h) * channels
                pre = hs[message + c] + hd[i * channels + c]
                m = m + d_e[k] * (t(1) if pre > 0 else slope)
            m_dst[i * channels + c] = m
    return d_e.reshape(alpha.shape), m_dst.reshape(num_dst, heads, channels)


def backward_sources(
    d_out: np.ndarray,
    h_src: np.ndarray,
    h_dst: np.ndarray,
    att: np.ndarray,
    alpha: np.ndarray,
    d_e: np.ndarray,
    m_dst: np.ndarray,
    shared: bool,
    dst: np.ndarray,
    order: np.ndarray,
    indptr: np.ndarray,
    keep: np.ndarray | None,
    scale: float,
    slope: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``refimpl_gatv2_backward_sources``: ``(d_h_src (N, H, C), m_src (N, H, C))``.

    Parameters
    ----------
    d_out : float array (N, H, C)
        The cotangent of :func:`forward`'s ``out``.
    h_src, h_dst : float arrays (N, H, C)
        As given to :func:`forward`.
    att : float array (H, C)
        The attention vector.
    alpha : float array (E, H)
        :func:`forward`'s coefficients.
    d_e, m_dst : float arrays (E, H), (N, H, C)
        :func:`backward_targets`' results.
    shared : bool
        One map (``h_dst is h_src``): ``m_dst`` is added into ``m_src``.
    dst : int array (E,)
        Each edge's target.
    order, indptr : int arrays (E,), (N + 1,)
        The edges grouped by source, in item order.
    keep : bool array (E, H) or None
        Dropout's keep-mask (None: none).
    scale : float
        Dropout's ``1 / (1 - p)``.
    slope : float
        LeakyReLU's negative slope.
    """
    t = alpha.dtype.type
    num_src, heads, channels = h_src.shape
    scale, slope = t(scale), t(slope)
    grads, hs, hd, vector = d_out.ravel(), h_src.ravel(), h_dst.ravel(), att.ravel()
    a_flat, d_e_flat, m_dst_flat = alpha.ravel(), d_e.ravel(), m_dst.ravel()
    keep = None if keep is None else keep.ravel()
    d_h_src = np.empty(num_src * heads * channels, dtype=alpha.dtype)
    m_src = np.empty(num_src * heads * channels, dtype=alpha.dtype)
    for i in range(num_src * heads * channels):  # one pass per thread (u, h, c)
        uh, c = i // channels, i % channels
        h = uh % heads
        begin, end = int(indptr[uh // heads]), int(indptr[uh // heads + 1])
        # B4 the aggregation's gradient; B2 the source side's M
        total, m = t(0), t(0)
        for j in range(begin, end):
            e = int(order[j])
            k, target = e * heads + h, (int(dst[e]) * heads + h) * channels
            total = total + grads[target + c] * _kept(a_flat[k], keep, k, scale)
            pre = hs[i] + hd[target + c]
            m = m + d_e_flat[k] * (t(1) if pre > 0 else slope)
        if shared:
            m = m + m_dst_flat[i]
        # B1 the source side's d h
        m_src[i] = m
        d_h_src[i] = total + m * vector[h * channels + c]
    shape = (num_src, heads, channels)
    return d_h_src.reshape(shape), m_src.reshape(shape)
