"""GATv2's attention score and its backward (Brody et al. 2022; GAT-balance Eq. 2).

For an edge ``u -> v`` and head ``h``, with ``W_s h_u``, ``W_t h_v`` the transformed
features (N, H, C) (one array when ``share_weights``):

    e_uv = att . LeakyReLU(W_s h_u + W_t h_v [+ W_e a_uv])

with the bracket only for a layer with edge features ``a_uv`` (PyG's ``edge_dim``; ``W_e`` is
``lin_edge.weight``), and LipschitzNorm (``lipschitz_norm="paper"``) dividing the score.
The literal twin, which computes exactly this line per edge, is :mod:`refimpl.naive.gat_v2`;
the code here reaches the same numbers by another route, so that no pass but one writes
over ``(E, H, C)``:

* Forward: ``LeakyReLU(p) = s p + (1 - s) relu(p)``, and ``att . p`` splits into
  per-node terms ``g_src[u] + g_dst[v]`` with ``g = h . att`` (and a per-edge one for edge
  features), so only ``relu(pre)``
  needs a pass over the edges (a literal LeakyReLU takes three).
* Backward: ``d_pre = d_e att f`` with ``f = s + (1 - s) [pre > 0]``, and everything
  that reads ``d_pre`` is linear over edges, so per side the per-node sum
  ``M = S(d_e f) = (1 - s) S(d_e [pre > 0]) + s S(d_e)`` (N, H, C) gives
  ``d h = M * att`` and ``d att = sum over sides and nodes of h * M``. Literally::

      d_pre = d_e[..., None] * att * where(pre > 0, 1, s)     # (E, H, C)
      d att = sum_e d_e[..., None] * LeakyReLU(pre)            # (H, C)
      d h_src = S_src(d_pre);  d h_dst = S_dst(d_pre)          # (N, H, C)

    F2  pre = W_s h_u + W_t h_v  (+ W_e a_uv)                         (E, H, C)
    F3  relu(pre), and g = h . att per node                           (E, H, C), (N, H)
    F4  e = (1 - s) att . relu(pre) + s (g_src[u] + g_dst[v])         (E, H)
    F4' e <- e / D  (LipschitzNorm, refimpl.nn.lipschitz.neighbourhood_norm)

    B4' through the quotient and its denominator (into pre and att)
    B4, B3  M per side, d h = M * att, d att = sum h * M
    B2  the gathers' adjoint is in M; the edge term's per edge, d W_e a_e = d_e att f
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.kernels.segment import Segments, gather, segment_sum, segment_sum_pair
from refimpl.nn.lipschitz.neighbourhood_norm import (
    NeighbourNormCache,
    neighbour_lipschitz_norm,
    neighbour_lipschitz_norm_backward,
)
from refimpl.ops.activations import positive_part
from refimpl.ops.heads import dot_per_head

__all__ = ["ScoreCache", "scores", "scores_backward"]


class ScoreCache(NamedTuple):
    """What :func:`scores_backward` reads, beside the layer's ``h_src`` and ``h_dst``.

    Attributes
    ----------
    pre : array, (E, H, C)
        ``W_s h_u + W_t h_v``, the LeakyReLU's input.
    positive : array, (E, H, C)
        ``pre > 0``, the LeakyReLU's branch.
    h_src_edges : array, (E, H, C)
        ``W_s h_u`` per edge, reused by the aggregation's backward.
    lipschitz : NeighbourNormCache or None
        LipschitzNorm's cache, with ``lipschitz_norm`` set.
    """

    pre: Any
    positive: Any
    h_src_edges: Any
    lipschitz: NeighbourNormCache | None


def scores(
    params: dict[str, Any],
    h_src: Any,
    h_dst: Any,
    src: Segments,
    dst: Segments,
    negative_slope: float,
    lipschitz_norm: str | None,
    h_edge: Any = None,
) -> tuple[Any, ScoreCache]:
    """``e`` (E, H) from ``h_src = W_s x`` and ``h_dst = W_t x`` (N, H, C; the same array
    when the weights are shared) and, with edge features, their projection ``h_edge = W_e a``
    (E, H, C); and what the backward reads.

    Parameters
    ----------
    params : dict
        The layer's parameters; read here: ``att`` (H, C), and LipschitzNorm's.
    h_src, h_dst : array, (N_s, H, C) and (N_t, H, C)
        The sources' and the targets' transformed features (with their biases).
    src, dst : Segments
        The edges' sources and targets (``E`` edges of the attended graph).
    negative_slope : float
        The LeakyReLU's slope below 0.
    lipschitz_norm : {None, "paper"}
        LipschitzNorm's form, dividing the score.
    h_edge : array, (E, H, C), optional
        The edge features' projection ``W_e a``; None without edge features.

    Returns
    -------
    e : array, (E, H)
        The scores.
    cache : ScoreCache
        What :func:`scores_backward` reads.
    """
    # F2 W_s h_u + W_t h_v (+ W_e a_uv) per edge (E, H, C)
    h_src_edges = gather(h_src, src)
    pre = gather(h_dst, dst)
    pre += h_src_edges  # in place on the fresh gather: one allocation less
    if h_edge is not None:
        pre += h_edge
    # F3 relu(pre) (E, H, C) and g = h . att per node (N, H); F4 the score (E, H)
    slope = negative_slope
    positive = pre > 0
    e = dot_per_head(positive_part(pre), params["att"])
    e *= 1 - slope
    node_scores_src = dot_per_head(h_src, params["att"])  # g (N, H)
    node_scores_dst = node_scores_src if h_dst is h_src else dot_per_head(h_dst, params["att"])
    e += slope * (gather(node_scores_src, src) + gather(node_scores_dst, dst))
    if h_edge is not None:
        e += slope * dot_per_head(h_edge, params["att"])  # the edge's own linear part
    lipschitz = None
    if lipschitz_norm is not None:
        # F4' LipschitzNorm of the score (E, H)
        e, lipschitz = neighbour_lipschitz_norm(
            e, lipschitz_norm, "v2", params, None, pre, src, dst
        )
    return e, ScoreCache(pre, positive, h_src_edges, lipschitz)


def scores_backward(
    params: dict[str, Any],
    cache: ScoreCache,
    h_src: Any,
    h_dst: Any,
    d_scores: Any,
    d_h_src: Any,
    src: Segments,
    dst: Segments,
    negative_slope: float,
    share_weights: bool,
    h_edge: Any = None,
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(d_h_src, d_h_dst, d_h_edge, {"att"})``: ``d_h_src`` (N, H, C) is the aggregation's
    gradient with the score's added; ``d_h_dst`` the score's alone (``None`` with shared
    weights, whose one side collects both ends); ``d_h_edge`` (E, H, C) that of ``h_edge``
    (None without edge features).

    Parameters
    ----------
    params : dict
        As given to :func:`scores`.
    cache : ScoreCache
        From :func:`scores`.
    h_src, h_dst : array, (N_s, H, C) and (N_t, H, C)
        As given to :func:`scores`.
    d_scores : array, (E, H)
        The gradient of the scores ``e``.
    d_h_src : array, (N_s, H, C)
        The aggregation's gradient of ``h_src``, to which the score's is added.
    src, dst : Segments
        As given to :func:`scores`.
    negative_slope : float
        As given to :func:`scores`.
    share_weights : bool
        ``h_dst`` is ``h_src`` (one map of one ``x``): both ends' gradients go to
        ``d_h_src``.
    h_edge : array, (E, H, C), optional
        As given to :func:`scores`.
    """
    xp = get_array_module(d_scores)
    d_pre_norms, d_att = None, {}
    if cache.lipschitz is not None:
        # B4' (of F4') LipschitzNorm: the quotient and its denominator
        d_scores, d_pre_norms, d_att = neighbour_lipschitz_norm_backward(
            cache.lipschitz, d_scores, params, None, cache.pre, src, dst
        )
    # B4 (of F4) and B3 (of F3), summed per node: M per side (the module docstring); one
    # side when W_t = W_s, as both ends read one h. S(d_e [pre > 0]) reads the mask with
    # d_e as the sum matrix's entries, so no pass writes over (E, H, C).
    if share_weights:
        sides = [(partial(segment_sum_pair, first=src, second=dst), h_src)]
    else:
        sides = [
            (partial(segment_sum, segments=src), h_src),
            (partial(segment_sum, segments=dst), h_dst),
        ]
    slope, d_h_sides = negative_slope, []
    d_params = {"att": xp.zeros_like(params["att"])}
    for segment_sum_of, h_side in sides:
        summed = (1 - slope) * segment_sum_of(cache.positive, weights=d_scores)
        summed += slope * segment_sum_of(d_scores)[..., None]  # M (N, H, C)
        d_params["att"] += (h_side * summed).sum(axis=0)
        d_h_side = summed * params["att"]
        if d_pre_norms is not None:
            d_h_side += segment_sum_of(d_pre_norms)
        d_h_sides.append(d_h_side)
    for name, d_through_norm in d_att.items():
        d_params[name] += d_through_norm
    # B2 (of F2) the gathers' adjoint is in M; add the aggregation's d_h_src (B7)
    d_h_src = d_h_src + d_h_sides[0]
    d_h_dst = d_h_sides[1] if len(d_h_sides) > 1 else None
    d_h_edge = None
    if h_edge is not None:  # the edge's term per edge: d_e f (E, H, C), f the LeakyReLU slope
        d_leaky = d_scores[..., None] * xp.where(cache.positive, 1.0, slope)
        d_params["att"] += (d_leaky * h_edge).sum(axis=0)
        d_h_edge = d_leaky * params["att"]
    return d_h_src, d_h_dst, d_h_edge, d_params
