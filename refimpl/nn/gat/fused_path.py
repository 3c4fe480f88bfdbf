"""GATConv's fused device path: score, softmax, dropout and aggregation in the GAT kernels.

Inside ``with fused_kernels():`` a :class:`~refimpl.nn.gat.conv.GATConv` layer the kernels
cover (GATv1 here and GATv2 in :mod:`refimpl.nn.gat.fused_path_v2`, on one node set, without
LipschitzNorm or edge features; any other layer runs its literal path) replaces on a device
backend its steps F2-F7 (per-edge score, LeakyReLU, segment softmax, attention dropout,
aggregation) and their backward B7-B2 by the kernels (for GATv1 those of
:mod:`refimpl.kernels.gat_fused`): on CuPy the CUDA kernels themselves, on the strict
stand-in their NumPy twins (:mod:`refimpl.kernels.gat_fused_twin`), each run as the one
launch the kernel is (``strict.run_kernel``). The rest of the layer (the transform F1, the
per-node score halves, the heads, residual and bias F8-F9, and their backward) is the
literal layer's. NumPy always takes the literal path, which stays the reference; outside the
block every backend does. The switch is an execution choice, not part of a layer's
configuration: golden files and crosscheck configs do not record it. :class:`FusedELU` is
the ``GAT`` model's ELU inside the block: one kernel each way on a device
(:mod:`refimpl.kernels.elu_fused`), the literal ELU on NumPy.

    F2  score_src = att_src . W h_u,  score_dst = att_dst . W h_v     (N, H) each
    F6' the attention dropout's keep-mask (E, H), drawn as the literal layer draws it
    F3-F7  alpha (E, H), aggregated (N, H, C): one kernel over the targets' CSR rows

    B7-B3  d_h (aggregation), d_score_src, d_score_dst: one kernel over targets, one over
           sources (the edges grouped by source)
    B2  d att_src = sum_k d_score_src[k] W h_k (a BLAS product, as the literal layer's),
        d W h_k += d_score_src[k] att_src (dst alike): one kernel (gat_fused_scores.py)

What is equal: the forward is bitwise the literal layer's (the kernels make its operations
in its order); the backward is bitwise where ``d alpha`` sums at most two channels per head
(two terms round once in any order) and otherwise within ``FORWARD_RTOL`` of it (the
literal layer sums the channels by a BLAS product, the kernel one by one):
``tests/kernels/test_gat_fused.py`` and ``tests/nn/gat/test_fused_path.py``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import backend_name, get_array_module
from refimpl.graph import Graph
from refimpl.kernels import gat_fused
from refimpl.kernels import gat_fused_twin as twin
from refimpl.kernels.elu_fused import elu_backward, elu_forward
from refimpl.kernels.gat_fused_scores import score_halves_backward
from refimpl.ops.activations import ELU, ELUCache
from refimpl.ops.dropout import Dropout, DropoutCache
from refimpl.ops.fused_switch import fused_kernels, fused_kernels_on
from refimpl.ops.heads import dot_per_head, sum_per_head
from refimpl.validation import check_array, check_cotangent, check_input

__all__ = [
    "FusedELU",
    "FusedScoreCache",
    "FusedV2ScoreCache",
    "fused_attention",
    "fused_attention_backward",
    "fused_kernels",
    "fused_kernels_on",
    "takes_fused_path",
]  # fused_kernels and fused_kernels_on: from refimpl.ops.fused_switch


class FusedScoreCache(NamedTuple):
    """What the fused backward reads beside the layer's cache (``GATCache.score``).

    Attributes
    ----------
    score_src, score_dst : array, (N, H)
        The score's per-node halves ``att_src . W h_u`` and ``att_dst . W h_v``.
    """

    score_src: Any
    score_dst: Any


class FusedV2ScoreCache(NamedTuple):
    """The fused GATv2 forward's mark in ``GATCache.score`` (:mod:`refimpl.nn.gat.
    fused_path_v2`): its backward reads the layer's ``h_src``, ``h_dst`` and ``alpha`` and
    recomputes ``pre`` per edge, so nothing else.

    Attributes
    ----------
    shared : bool
        Both ends read one map (``h_dst is h_src``, ``share_weights``): one ``M``.
    """

    shared: bool


def takes_fused_path(conv: Any, xp: Any, bipartite: bool) -> bool:
    """Whether ``conv`` (a ``GATConv``) runs the fused kernels on ``xp``'s backend: inside
    :func:`fused_kernels`, on CuPy or the strict stand-in (never on NumPy), for GATv1 or
    GATv2 (either ``share_weights``; :mod:`refimpl.nn.gat.fused_path_v2`) on one node set
    (``bipartite``: an input pair) without LipschitzNorm or edge features."""
    covered = conv.version in ("v1", "v2") and conv.lipschitz_norm is None
    covered = covered and conv.edge_dim is None
    return fused_kernels_on() and covered and not bipartite and backend_name(xp) != "numpy"


def fused_attention(
    conv: Any,
    params: dict[str, Any],
    h_src: Any,
    h_dst: Any,
    graph: Graph,
    training: bool,
    rng: np.random.Generator | None,
    mask: Any,
) -> tuple[Any, FusedScoreCache, Any, DropoutCache]:
    """Steps F2-F7 of ``GATConv.forward_unchecked`` by the kernels.

    Parameters
    ----------
    conv : GATConv
        The layer (GATv1, :func:`takes_fused_path`).
    params : dict
        Its parameters; read here: ``att_src``, ``att_dst`` (H, C).
    h_src, h_dst : array, (N, H, C)
        The transformed features ``W x`` (one array where one map reads one ``x``).
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
    score : FusedScoreCache
        The score halves.
    alpha : array, (E, H)
        The coefficients, before dropout.
    dropout_cache : DropoutCache
        The keep-mask used (None outside training or at ``dropout = 0``) and its scale.
    """
    xp = get_array_module(h_src)
    src, dst = graph.src_segments(xp), graph.dst_segments(xp)
    # F2 the score's per-node halves (N, H), as the literal v1 score computes them
    score_src = dot_per_head(h_src, params["att_src"])
    score_dst = dot_per_head(h_dst, params["att_dst"])
    # F6' the keep-mask (E, H), drawn before the kernel reads it
    shape = (graph.num_edges, conv.heads)
    dropout_cache = attention_keep_mask(Dropout(conv.dropout), shape, h_src, training, rng, mask)
    keep, scale = dropout_cache.mask, dropout_cache.scale
    # F3-F7 one kernel over the targets' CSR rows
    if backend_name(xp) == "strict":
        alpha, aggregated = xp.run_kernel(
            twin.forward, score_src, score_dst, h_src, src.index, *dst.csr_structure(), keep,
            scale, conv.negative_slope,
        )  # fmt: skip
    else:
        alpha, aggregated = gat_fused.fused_forward(
            score_src, score_dst, h_src, src.index, dst.csr_structure(), keep, scale,
            conv.negative_slope,
        )  # fmt: skip
    return aggregated, FusedScoreCache(score_src, score_dst), alpha, dropout_cache


def fused_attention_backward(
    conv: Any, params: dict[str, Any], cache: Any, d_aggregated: Any
) -> tuple[Any, Any, dict[str, Any]]:
    """Steps B7-B2 of ``GATConv``'s backward by the kernels: ``(d_h_src (N, H, C),
    d_h_dst (N, H, C), {"att_src", "att_dst"})`` from ``d_aggregated (N, H, C)``, the
    gradient of :func:`fused_attention`'s output; ``cache`` is the layer's ``GATCache``."""
    xp = get_array_module(d_aggregated)
    graph, score, dropout = cache.graph, cache.score, cache.dropout_cache
    src, dst = graph.src_segments(xp), graph.dst_segments(xp)
    slope, keep = conv.negative_slope, dropout.mask
    # B7-B3 one kernel over the targets (d_pre, d_score_dst), one over the sources
    if backend_name(xp) == "strict":
        d_pre, d_score_dst = xp.run_kernel(
            twin.backward_targets, d_aggregated, cache.h_src, cache.alpha, score.score_src,
            score.score_dst, src.index, *dst.csr_structure(), keep, dropout.scale, slope,
        )  # fmt: skip
        d_h_src, d_score_src = xp.run_kernel(
            twin.backward_sources, d_aggregated, cache.alpha, d_pre, dst.index,
            *src.csr_structure(), keep, dropout.scale, cache.h_src.shape[0],
        )  # fmt: skip
    else:
        d_h_src, d_score_src, d_score_dst = gat_fused.fused_backward(
            d_aggregated, cache.h_src, cache.alpha, score.score_src, score.score_dst,
            (src.index, dst.index), (dst.csr_structure(), src.csr_structure()), keep,
            dropout.scale, slope,
        )  # fmt: skip
    # B2 (of F2) the score halves: the attention vectors and W h both receive gradient
    d_att = {
        "att_src": sum_per_head(d_score_src, cache.h_src),
        "att_dst": sum_per_head(d_score_dst, cache.h_dst),
    }
    d_h_src, d_h_dst = score_halves_backward(
        xp, d_h_src, d_score_src, d_score_dst, params["att_src"], params["att_dst"]
    )  # one kernel: d_h_src + scale_per_head(d_score_src, att_src), scale_per_head(dst)
    return d_h_src, d_h_dst, d_att


def attention_keep_mask(
    dropout: Dropout,
    shape: tuple[int, int],
    like: Any,
    training: bool,
    rng: np.random.Generator | None,
    mask: Any,
) -> DropoutCache:
    """The attention dropout's cache as the literal layer's ``Dropout.forward`` of ``alpha``
    ``(E, H)`` makes it, without applying it (the kernel does): the given ``mask``, or
    ``rng.random(shape) >= p`` moved to ``like``'s backend; mask None outside training or at
    ``p = 0``, where ``rng`` is not advanced."""
    scale = 1.0 / (1.0 - dropout.p)
    if not training or dropout.p == 0:
        return DropoutCache(None, scale, shape, like.dtype)
    xp = get_array_module(like)
    if mask is None:
        if rng is None:
            raise ValueError(
                f"GATConv(dropout={dropout.p}) in training mode needs randomness: pass "
                "rng=numpy.random.default_rng(seed) or attn_dropout_mask=, or training=False"
            )
        mask = xp.asarray(rng.random(shape) >= dropout.p)  # (E, H) bool
    check_array(mask, "attn_dropout_mask", shape=shape, floating=False)
    if mask.dtype.kind != "b":
        raise TypeError(
            f"attn_dropout_mask must be a boolean array (True = keep), got dtype {mask.dtype}"
        )
    get_array_module(like, mask)  # TypeError if the mask is on another backend
    return DropoutCache(mask, scale, shape, like.dtype)


class FusedELU(ELU):
    """:class:`~refimpl.ops.activations.ELU` in one launch each way on a device backend
    (:mod:`refimpl.kernels.elu_fused`), with the same checks; the literal ELU on NumPy.
    Bitwise the literal ELU on the strict stand-in; on CuPy within the rounding of CUDA's
    ``expm1`` and ``exp``."""

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, ELUCache]:
        xp = get_array_module(x)
        if backend_name(xp) == "numpy":
            return super().forward(params, x)
        check_input(x)
        return elu_forward(xp, x, self.alpha), ELUCache(x)

    def backward(
        self, params: dict[str, Any], cache: ELUCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        xp = get_array_module(cache.x)
        if backend_name(xp) == "numpy":
            return super().backward(params, cache, d_y)
        check_cotangent(d_y, cache.x.shape, cache.x.dtype, cache.x)
        return elu_backward(xp, cache.x, d_y, self.alpha), {}
