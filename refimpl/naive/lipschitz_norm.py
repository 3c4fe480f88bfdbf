"""Literal twin of GAT's neighbour-wise LipschitzNorm: per edge and head, forward and backward.

LipschitzNorm Eq. 15/17, neighbour-wise and per head (LipschitzNorm Sec. 5): a score
is divided by ``||a_h||`` times the largest norm of a score input in the target's
neighbourhood, so that every normalised score lies in ``[-1, 1]``. For the edge
``e = u -> v`` and head ``h``:

    F1  ||a_h||                                   v1: ||[att_src_h; att_dst_h]||, v2: ||att_h||
    F2  r_e  v1 paper:           sqrt(max_{k in N(v)} ||W h_k||^2 + ||W h_v||^2)
             v1 reference-code:  sqrt(max_{k in N(v)} ||W h_k||^2 + ||W h_u||^2)
             v2 paper:           max_{k in N(v)} ||x_kv||,  x_kv = W_s h_k + W_t h_v
    F3  D_e = factor ||a_h|| r_e + eps            factor, eps = 1, 0 (paper); 4, 1e-12 (code)
    F4  raw_e / D_e

Conventions (as :mod:`refimpl.nn.lipschitz.neighbourhood_norm` states them): a vanished ``D`` (then
the raw score is 0 too) divides by 1 and passes no gradient through ``D``; a
neighbourhood maximum sends its gradient to one edge, the first in edge order; a
norm of a zero vector (and ``sqrt`` at 0) has the zero subgradient.

Shares no code with ``refimpl.nn.lipschitz.neighbourhood_norm``; NumPy on the host, float64.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "LipschitzTwinCache",
    "gat_v1_lipschitz_backward",
    "gat_v1_lipschitz_forward",
    "gat_v2_lipschitz_backward",
    "gat_v2_lipschitz_forward",
]


class LipschitzTwinCache(NamedTuple):
    """The quantities F1-F4 name, per edge and head."""

    factor: float  # 4 for "reference-code", else 1
    att_norm: np.ndarray  # (H,) ||a_h||
    widest: np.ndarray  # (E, H) the edge k of N(v) attaining the maximum in r_e
    radius: np.ndarray  # (E, H) r_e
    denominator: np.ndarray  # (E, H) D_e, 1 where it vanished
    nonzero: np.ndarray  # (E, H) D_e > 0
    normalised: np.ndarray  # (E, H) raw_e / D_e


def _widest_in_neighbourhood(norms: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """For each edge ``u -> v`` and head: the first edge into ``v`` of largest ``norms`` (E, H)."""
    widest = np.zeros(norms.shape, dtype=np.int64)
    for e, (_, v) in enumerate(edges):
        into_v = np.flatnonzero(edges[:, 1] == v)
        widest[e] = into_v[np.argmax(norms[into_v], axis=0)]  # argmax: first of equals
    return widest


def _divide(
    raw: np.ndarray,
    factor: float,
    eps: float,
    att_norm: np.ndarray,
    widest: np.ndarray,
    radius: np.ndarray,
) -> tuple[np.ndarray, LipschitzTwinCache]:
    """F3 and F4, shared by both versions, given F1's ``||a_h||`` and F2's ``r_e``."""
    # F3 D_e = factor ||a_h|| r_e + eps (E, H); 1 where it vanishes
    denominator = factor * att_norm * radius + eps
    nonzero = denominator > 0
    denominator = np.where(nonzero, denominator, 1.0)
    # F4 (E, H)
    normalised = raw / denominator
    return normalised, LipschitzTwinCache(
        factor, att_norm, widest, radius, denominator, nonzero, normalised
    )


def _divide_backward(
    cache: LipschitzTwinCache, d_normalised: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B4 (of F4) and B3 (of F3): ``(d_raw, d_radius (E, H), d_att_norm (H,))``."""
    d_raw = d_normalised / cache.denominator
    d_denominator = np.where(
        cache.nonzero, -d_normalised * cache.normalised / cache.denominator, 0.0
    )
    d_att_norm = cache.factor * np.einsum("eh,eh->h", d_denominator, cache.radius)
    d_radius = cache.factor * d_denominator * cache.att_norm
    return d_raw, d_radius, d_att_norm


def _unit(vectors: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """``vectors / norms`` over the last axis, 0 where the norm is 0 (the zero subgradient)."""
    safe = np.where(norms > 0, norms, 1.0)
    return np.where(norms[..., None] > 0, vectors / safe[..., None], 0.0)


def gat_v1_lipschitz_forward(
    raw: np.ndarray,
    mode: str,
    att_src: np.ndarray,
    att_dst: np.ndarray,
    h: np.ndarray,
    edges: np.ndarray,
) -> tuple[np.ndarray, LipschitzTwinCache]:
    """GATv1: ``raw (E, H) = att_src . W h_u + att_dst . W h_v`` over ``D_e``; ``h = W x``
    (N, H, C), ``edges`` (E, 2) rows ``(u, v)``. Returns ``(raw / D (E, H), cache)``."""
    factor, eps = (4.0, 1e-12) if mode == "reference-code" else (1.0, 0.0)
    # F1 ||a_h|| (H,)
    att_norm = np.sqrt(
        np.einsum("hc,hc->h", att_src, att_src) + np.einsum("hc,hc->h", att_dst, att_dst)
    )
    # F2 r_e = sqrt(max_k ||W h_k||^2 + ||W h_own||^2), own = v (paper) or u (code) (E, H)
    squares = np.einsum("ehc,ehc->eh", h[edges[:, 0]], h[edges[:, 0]])  # ||W h_u||^2 (E, H)
    widest = _widest_in_neighbourhood(squares, edges)  # (E, H)
    own = h[edges[:, 0]] if mode == "reference-code" else h[edges[:, 1]]  # (E, H, C)
    radius = np.sqrt(
        np.take_along_axis(squares, widest, axis=0) + np.einsum("ehc,ehc->eh", own, own)
    )
    return _divide(raw, factor, eps, att_norm, widest, radius)


def gat_v1_lipschitz_backward(
    cache: LipschitzTwinCache,
    d_normalised: np.ndarray,
    mode: str,
    att_src: np.ndarray,
    att_dst: np.ndarray,
    h: np.ndarray,
    edges: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Adjoint of :func:`gat_v1_lipschitz_forward`: ``(d_raw (E, H), d_h (N, H, C),
    d_att_src, d_att_dst (H, C))``, the last three through ``D`` only."""
    # B4, B3 (of F4, F3)
    d_raw, d_radius, d_att_norm = _divide_backward(cache, d_normalised)
    # B2 (of F2) r = sqrt(q): d_q = d_r / (2 r), 0 at r = 0; q's two terms are squares of W h
    safe = np.where(cache.radius > 0, cache.radius, 1.0)
    d_q = np.where(cache.radius > 0, d_radius / (2 * safe), 0.0)  # (E, H)
    d_h = np.zeros_like(h)
    for e, (u, v) in enumerate(edges):
        own = u if mode == "reference-code" else v
        d_h[own] += 2 * d_q[e][:, None] * h[own]
        for head in range(h.shape[1]):
            k = edges[cache.widest[e, head], 0]  # the source attaining the maximum
            d_h[k, head] += 2 * d_q[e, head] * h[k, head]
    # B1 (of F1) d||a|| / da = a / ||a||
    d_att_src = d_att_norm[:, None] * _unit(att_src, cache.att_norm)
    d_att_dst = d_att_norm[:, None] * _unit(att_dst, cache.att_norm)
    return d_raw, d_h, d_att_src, d_att_dst


def gat_v2_lipschitz_forward(
    raw: np.ndarray, att: np.ndarray, pre: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, LipschitzTwinCache]:
    """GATv2 ("paper" only): ``raw (E, H) = att . LeakyReLU(x_uv)`` over ``D_e``, with
    ``pre`` the score inputs ``x_uv`` (E, H, C). Returns ``(raw / D (E, H), cache)``."""
    # F1 ||a_h|| (H,)
    att_norm = np.sqrt(np.einsum("hc,hc->h", att, att))
    # F2 r_e = max_{k in N(v)} ||x_kv|| (E, H)
    norms = np.sqrt(np.einsum("ehc,ehc->eh", pre, pre))  # ||x_uv|| (E, H)
    widest = _widest_in_neighbourhood(norms, edges)
    radius = np.take_along_axis(norms, widest, axis=0)
    return _divide(raw, 1.0, 0.0, att_norm, widest, radius)


def gat_v2_lipschitz_backward(
    cache: LipschitzTwinCache, d_normalised: np.ndarray, att: np.ndarray, pre: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adjoint of :func:`gat_v2_lipschitz_forward`: ``(d_raw (E, H), d_pre (E, H, C),
    d_att (H, C))``, the last two through ``D`` only."""
    # B4, B3 (of F4, F3)
    d_raw, d_radius, d_att_norm = _divide_backward(cache, d_normalised)
    # B2 (of F2) each r_e is the norm of x_k for k = widest; d||x|| / dx = x / ||x||
    norms = np.sqrt(np.einsum("ehc,ehc->eh", pre, pre))  # (E, H)
    unit = _unit(pre, norms)  # (E, H, C)
    d_pre = np.zeros_like(pre)
    for e in range(pre.shape[0]):
        for head in range(pre.shape[1]):
            k = cache.widest[e, head]
            d_pre[k, head] += d_radius[e, head] * unit[k, head]
    # B1 (of F1)
    d_att = d_att_norm[:, None] * _unit(att, cache.att_norm)
    return d_raw, d_pre, d_att
