"""GATConv's fused device path for GATv2: score, softmax, dropout and aggregation in the kernels.

Inside ``with fused_kernels():`` a :class:`~refimpl.nn.gat.conv.GATConv` layer of version
``"v2"`` on one node set, without LipschitzNorm or edge features (``share_weights`` either
way; :func:`refimpl.nn.gat.fused_path.takes_fused_path` decides) replaces on a device backend
its steps F2-F7 (per-edge ``pre``, LeakyReLU and score, segment softmax, attention dropout,
aggregation) and their backward B7-B2 by the kernels of :mod:`refimpl.kernels.gatv2_fused`:
on CuPy the CUDA kernels, on the strict stand-in their NumPy twins
(:mod:`refimpl.kernels.gatv2_fused_twin`), each run as the one launch it is. No ``(E, H, C)``
array is written (the literal path keeps ``pre``, its sign and the gathered ``W_s h_u``);
the rest of the layer (the transforms F1, heads, residual and bias F8-F9) is the literal
layer's, and so is the dropout mask, drawn as the literal layer draws it
(:func:`~refimpl.nn.gat.fused_path.attention_keep_mask`).

    F6' the attention dropout's keep-mask (E, H)
    F2-F7  alpha (E, H), aggregated (N, H, C): one kernel over the targets' CSR rows

    B7-B2  d_e (E, H) and the target side's M: one kernel over the targets; the
           aggregation's d h_src, the source side's M and d h_src: one over the sources
    B2  d att = sum over sides and nodes of h * M, d h_dst = M_dst * att (v2.py's)

What is equal: the kernels' twin is the kernels bit for bit; against the literal layer the
score and ``M`` are other roundings of the same sums (the literal splits the LeakyReLU into
BLAS products), held within ``FORWARD_RTOL`` of the size of the terms summed:
``tests/kernels/test_gatv2_fused.py`` and ``tests/nn/gat/test_fused_path_v2.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.backend import backend_name, get_array_module
from refimpl.graph import Graph
from refimpl.kernels import gatv2_fused
from refimpl.kernels import gatv2_fused_twin as twin
from refimpl.nn.gat.fused_path import FusedV2ScoreCache, attention_keep_mask
from refimpl.ops.dropout import Dropout, DropoutCache

__all__ = ["fused_attention_v2", "fused_attention_v2_backward"]


def fused_attention_v2(
    conv: Any,
    params: dict[str, Any],
    h_src: Any,
    h_dst: Any,
    graph: Graph,
    training: bool,
    rng: np.random.Generator | None,
    mask: Any,
) -> tuple[Any, FusedV2ScoreCache, Any, DropoutCache]:
    """Steps F2-F7 of ``GATConv.forward_unchecked`` (version ``"v2"``) by the kernels.

    Parameters
    ----------
    conv : GATConv
        The layer (GATv2, :func:`~refimpl.nn.gat.fused_path.takes_fused_path`).
    params : dict
        Its parameters; read here: ``att`` (H, C).
    h_src, h_dst : array, (N, H, C)
        ``W_s x (+ b_s)`` and ``W_t x (+ b_t)``: one array with ``share_weights``.
    graph : Graph
        The graph attended over (``conv.prepare_graph``'s), ``E`` edges.
    training : bool
        Attention dropout is active only in training.
    rng : numpy.random.Generator or None
        Draws the keep-mask as the literal layer does, ``rng.random((E, H)) >= p``.
    mask : bool array (E, H) or None
        The keep-mask itself (True = keep); overrides ``rng``.

    Returns
    -------
    aggregated : array, (N, H, C)
        The attention-weighted messages, before the heads are combined.
    score : FusedV2ScoreCache
        The mark of this path.
    alpha : array, (E, H)
        The coefficients, before dropout.
    dropout_cache : DropoutCache
        The keep-mask used (None outside training or at ``dropout = 0``) and its scale.
    """
    xp = get_array_module(h_src)
    src, dst = graph.src_segments(xp), graph.dst_segments(xp)
    # F6' the keep-mask (E, H), drawn before the kernel reads it
    shape = (graph.num_edges, conv.heads)
    dropout_cache = attention_keep_mask(Dropout(conv.dropout), shape, h_src, training, rng, mask)
    keep, scale = dropout_cache.mask, dropout_cache.scale
    # F2-F7 one kernel over the targets' CSR rows
    arguments = (h_src, h_dst, params["att"], src.index)
    if backend_name(xp) == "strict":
        alpha, aggregated = xp.run_kernel(
            twin.forward, *arguments, *dst.csr_structure(), keep, scale, conv.negative_slope
        )
    else:
        alpha, aggregated = gatv2_fused.fused_forward(
            *arguments, dst.csr_structure(), keep, scale, conv.negative_slope
        )
    return aggregated, FusedV2ScoreCache(h_dst is h_src), alpha, dropout_cache


def fused_attention_v2_backward(
    conv: Any, params: dict[str, Any], cache: Any, d_aggregated: Any
) -> tuple[Any, Any, dict[str, Any]]:
    """Steps B7-B2 of ``GATConv``'s backward (version ``"v2"``) by the kernels: ``(d_h_src
    (N, H, C), d_h_dst (N, H, C) or None, {"att"})`` from ``d_aggregated (N, H, C)``, the
    gradient of :func:`fused_attention_v2`'s output; ``cache`` is the layer's ``GATCache``.
    ``d_h_dst`` is None with shared weights: ``d_h_src`` holds both ends' (as
    :func:`refimpl.nn.gat.v2.scores_backward`)."""
    xp = get_array_module(d_aggregated)
    graph, dropout, shared = cache.graph, cache.dropout_cache, cache.score.shared
    src, dst = graph.src_segments(xp), graph.dst_segments(xp)
    h_src, h_dst, att, slope = cache.h_src, cache.h_dst, params["att"], conv.negative_slope
    # B7-B3 one kernel over the targets (d_e, M_dst), one over the sources (d h_src, M_src)
    if backend_name(xp) == "strict":
        d_e, m_dst = xp.run_kernel(
            twin.backward_targets, d_aggregated, h_src, h_dst, cache.alpha, src.index,
            *dst.csr_structure(), dropout.mask, dropout.scale, slope,
        )  # fmt: skip
        d_h_src, m_src = xp.run_kernel(
            twin.backward_sources, d_aggregated, h_src, h_dst, att, cache.alpha, d_e, m_dst,
            shared, dst.index, *src.csr_structure(), dropout.mask, dropout.scale, slope,
        )  # fmt: skip
    else:
        d_h_src, m_src, m_dst, _ = gatv2_fused.fused_backward(
            d_aggregated, h_src, h_dst, att, cache.alpha, (src.index, dst.index),
            (dst.csr_structure(), src.csr_structure()), dropout.mask, dropout.scale, slope,
        )  # fmt: skip
    # B2 (of F2) d att = sum over sides and nodes of h * M (H, C); d h_dst = M_dst * att
    d_att = (h_src * m_src).sum(axis=0)
    if shared:  # m_src holds both ends' M, d_h_src both ends' gradient
        return d_h_src, None, {"att": d_att}
    return d_h_src, m_dst * att, {"att": d_att + (h_dst * m_dst).sum(axis=0)}
