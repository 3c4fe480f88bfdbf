"""GATv1's attention score and its backward (Velickovic et al. 2018; GAT-balance Eq. 2).

For an edge ``u -> v`` and head ``h``, with ``W h_k`` the transformed features (N, H, C):

    e_uv = LeakyReLU(att_src . W h_u + att_dst . W h_v [+ att_edge . W_e a_uv])

with the bracket only for a layer with edge features ``a_uv`` (PyG's ``edge_dim``: ``W_e`` is
``lin_edge.weight``, ``att_edge`` PyG's ``att_edge``). The dot products are per node, so
the score is a sum of two per-node halves gathered to the edges (and the edge's own term);
with ``lipschitz_norm`` set, LipschitzNorm divides the sum before the
LeakyReLU (as the released code does; LeakyReLU is positively homogeneous, so dividing
after gives the same score). :class:`refimpl.nn.gat.conv.GATConv` runs the rest of the
layer (transform, softmax, dropout, aggregation, heads, bias); the literal twin is
:mod:`refimpl.naive.gat_v1`.

    F2  score_src = att_src . W h_u,  score_dst = att_dst . W h_v     (N, H) each
    F3  pre = score_src[u] + score_dst[v]  (+ att_edge . W_e a_uv)    (E, H)
    F3' pre <- pre / D  (LipschitzNorm, refimpl.nn.lipschitz.neighbourhood_norm)
    F4  e = LeakyReLU(pre)                                            (E, H)

    B4  d_pre = d_e * (1 if pre > 0 else slope)
    B3' through the quotient and its denominator (into W h and att)
    B3  d_score_src = sum over u's outgoing edges, d_score_dst over v's incoming;
        d att_edge = sum_e d_pre W_e a_e,  d W_e a_e = d_pre att_edge
    B2  d att_src = sum_k d_score_src[k] W h_k;  d W h_k += d_score_src[k] att_src (dst alike)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.kernels.segment import Segments, gather, segment_sum
from refimpl.nn.lipschitz.neighbourhood_norm import (
    NeighbourNormCache,
    neighbour_lipschitz_norm,
    neighbour_lipschitz_norm_backward,
)
from refimpl.ops.activations import leaky_relu, leaky_relu_backward
from refimpl.ops.heads import dot_per_head, scale_per_head, sum_per_head

__all__ = ["ScoreCache", "scores", "scores_backward"]


class ScoreCache(NamedTuple):
    """What :func:`scores_backward` reads, beside the layer's ``h_src`` and ``h_dst``.

    Attributes
    ----------
    pre : array, (E, H)
        The LeakyReLU's input (after LipschitzNorm); kept to inspect kink distances.
    positive : array, (E, H)
        ``pre > 0``, the LeakyReLU's branch.
    lipschitz : NeighbourNormCache or None
        LipschitzNorm's cache, with ``lipschitz_norm`` set.
    """

    pre: Any
    positive: Any
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
    """``e`` (E, H) from ``h_src = h_dst = W x`` (N, H, C) and, with edge features, their
    projection ``h_edge = W_e a`` (E, H, C); and what the backward reads.

    Parameters
    ----------
    params : dict
        The layer's parameters; read here: ``att_src``, ``att_dst`` (H, C), ``att_edge``
        (H, C) with edge features, and LipschitzNorm's.
    h_src, h_dst : array, (N_s, H, C) and (N_t, H, C)
        The sources' and the targets' transformed features.
    src, dst : Segments
        The edges' sources and targets (``E`` edges of the attended graph).
    negative_slope : float
        The LeakyReLU's slope below 0.
    lipschitz_norm : {None, "paper", "reference-code"}
        LipschitzNorm's form, applied before the LeakyReLU.
    h_edge : array, (E, H, C), optional
        The edge features' projection ``W_e a``; None without edge features.

    Returns
    -------
    e : array, (E, H)
        The scores.
    cache : ScoreCache
        What :func:`scores_backward` reads.
    """
    # F2 per-node halves of the score (N, H), F3 their sum per edge (E, H)
    score_src = dot_per_head(h_src, params["att_src"])
    score_dst = dot_per_head(h_dst, params["att_dst"])
    pre = gather(score_src, src) + gather(score_dst, dst)
    if h_edge is not None:
        pre += dot_per_head(h_edge, params["att_edge"])  # the edge's own term (E, H)
    lipschitz = None
    if lipschitz_norm is not None:
        # F3' LipschitzNorm, before the LeakyReLU (E, H)
        pre, lipschitz = neighbour_lipschitz_norm(
            pre, lipschitz_norm, "v1", params, h_src, None, src, dst
        )
    # F4 e = LeakyReLU(pre) (E, H)
    e, positive = leaky_relu(pre, negative_slope)
    return e, ScoreCache(pre, positive, lipschitz)


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
    h_edge: Any = None,
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(d_h_src, d_h_dst, d_h_edge, {"att_src", "att_dst"[, "att_edge"]})``: ``d_h_src``
    (N, H, C) is the aggregation's gradient with the score's added; ``d_h_dst`` the score's
    alone; ``d_h_edge`` (E, H, C) that of ``h_edge`` (None without edge features).

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
    h_edge : array, (E, H, C), optional
        As given to :func:`scores`.
    """
    # B4 (of F4) LeakyReLU (E, H)
    d_pre = leaky_relu_backward(cache.positive, d_scores, negative_slope)
    d_att: dict[str, Any] = {}
    if cache.lipschitz is not None:
        # B3' (of F3') LipschitzNorm: the quotient and its denominator
        d_pre, d_h_norms, d_att = neighbour_lipschitz_norm_backward(
            cache.lipschitz, d_pre, params, h_src, None, src, dst
        )
        d_h_src = d_h_src + d_h_norms
    # B3 (of F3) the gather's adjoint: sum per source and per target (N, H)
    d_score_src, d_score_dst = segment_sum(d_pre, src), segment_sum(d_pre, dst)
    # B2 (of F2) score halves: att and h both receive gradient
    d_params = {
        "att_src": sum_per_head(d_score_src, h_src),
        "att_dst": sum_per_head(d_score_dst, h_dst),
    }
    for name, d_through_norm in d_att.items():
        d_params[name] += d_through_norm
    d_h_src = d_h_src + scale_per_head(d_score_src, params["att_src"])
    d_h_dst = scale_per_head(d_score_dst, params["att_dst"])
    d_h_edge = None
    if h_edge is not None:  # the edge's own term: att_edge and W_e a_e
        d_params["att_edge"] = sum_per_head(d_pre, h_edge)
        d_h_edge = scale_per_head(d_pre, params["att_edge"])
    return d_h_src, d_h_dst, d_h_edge, d_params
