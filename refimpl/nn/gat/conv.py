"""``GATConv``: graph attention, GATv1 (Velickovic et al. 2018) and GATv2 (Brody et al. 2022).

For a target node ``v`` with incoming neighbourhood ``N(v) = {u : (u, v) in E}``
and each head (GAT-balance Eq. 1-2, per head, before the activation ``phi``
that the model applies between layers):

    out_v   = sum_{u in N(v)} alpha_uv * W_s h_u                    (Eq. 1)
    alpha_uv = softmax over u in N(v) of e_uv                       (Eq. 2)
    v1: e_uv = LeakyReLU(att_src . W h_u + att_dst . W h_v)         (W_s = W_t = W)
    v2: e_uv = att . LeakyReLU(W_s h_u + W_t h_v)                   (GAT-balance Eq. 2)

Heads are concatenated (``concat=True``) or averaged; with ``residual=True`` the input's
projection ``x_v W_res^T`` is added (PyG's ``residual``: a linear skip without bias, from
PyG 2.6), then the bias; attention dropout acts on ``alpha`` in training.

PyG's options beyond the papers, each off by default so the papers' form stays the default:

* ``edge_dim``: edge features ``a_uv`` (E, edge_dim) enter the score, v1 as
  ``+ att_edge . W_e a_uv`` inside the LeakyReLU, v2 as ``+ W_e a_uv`` beside ``W_s h_u +
  W_t h_v`` (:mod:`refimpl.nn.gat.v1`, :mod:`refimpl.nn.gat.v2`); the self-loops a layer
  adds get the features ``fill_value`` makes (:mod:`refimpl.ops.loop_fill`; PyG's default
  ``"mean"`` of each node's incoming edge features, whose gradient flows back into them);
* ``projection_bias`` (v2): ``W_s h_u + b_s`` and ``W_t h_v + b_t``, PyG's
  ``lin_l.bias`` and ``lin_r.bias``, present in every ``GATv2Conv(bias=True)``: the
  biased ``W_s h_u + b_s`` is also the message.

Parameters (rows of every ``W`` are the weights *incoming* to an output neuron,
as in the papers), with PyTorch Geometric's names:

=========  =========================  =============================================
ours       shape                      PyG
=========  =========================  =============================================
v1 ``W``   ``(heads*out, in)``        ``GATConv.lin.weight`` (``lin_src`` before 2.5)
``att_src`` ``(heads, out)``          ``GATConv.att_src`` ``(1, heads, out)``
``att_dst`` ``(heads, out)``          ``GATConv.att_dst`` ``(1, heads, out)``
v2 ``W_s`` ``(heads*out, in)``        ``GATv2Conv.lin_l.weight`` (source, "j")
v2 ``W_t`` ``(heads*out, in)``        ``GATv2Conv.lin_r.weight``; absent if shared
v2 ``att`` ``(heads, out)``           ``GATv2Conv.att`` ``(1, heads, out)``
v2 ``b_s``  ``(heads*out,)``            ``lin_l.bias``; with ``projection_bias``
v2 ``b_t``  ``(heads*out,)``            ``lin_r.bias``; with it, absent if shared
``W_e``    ``(heads*out, edge_dim)``  ``lin_edge.weight``; with ``edge_dim``
v1 ``att_edge`` ``(heads, out)``      ``att_edge`` ``(1, heads, out)``; with ``edge_dim``
``W_res``  ``(heads*out, in)`` / ``(out, in)``  ``res.weight``; with ``residual=True``
``bias``   ``(heads*out,)`` / ``(out,)``  ``bias``; absent when ``bias=False``
=========  =========================  =============================================

Edge semantics, as in PyG: with ``add_self_loops=True`` existing self-loops are
removed and one loop per node is appended (``Graph.remove_self_loops().
add_self_loops()``), so edge order is "original non-loop edges, then the loops
of nodes 0..N-1"; duplicate edges each get their own coefficient; a node with
no incoming edge (possible only without self-loops) aggregates to zero, so its
output is the bias. The LeakyReLU derivative at exactly 0 is ``negative_slope``
(PyTorch's convention).

Differences from PyG: ``GATv2Conv(bias=True)`` is ``bias=True, projection_bias=True``
here (the papers' ``W_s``, ``W_t`` have no bias); ``attention_weights`` returns the
coefficients before dropout (PyG returns them after); ``edge_attr`` with ``edge_dim=None``,
or none with ``edge_dim`` set, is refused (PyG ignores the one, GATv1 the other).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.fields import check_bool
from refimpl.graph import Graph, with_configured_self_loops
from refimpl.kernels.segment import segment_softmax, segment_softmax_backward
from refimpl.nn.gat import v1, v2
from refimpl.nn.gat.config import check_config, check_inputs
from refimpl.nn.gat.transform import input_sides, transform, transform_backward
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.ops.dropout import Dropout
from refimpl.ops.linear import weight_gradient
from refimpl.ops.loop_fill import (
    LoopFillCache,
    fill_self_loops,
    fill_self_loops_backward,
)
from refimpl.ops.propagate import propagate, propagate_backward
from refimpl.validation import check_cotangent, check_rng

__all__ = ["GATCache", "GATConv"]


class GATCache(NamedTuple):
    """What ``GATConv.backward`` reads (``E`` counts the self-loops when added)."""

    x: Any  # (N, in) input features; of a bipartite input (x_src, x_dst), x_src
    graph: Graph  # the graph attended over (self-loops handled)
    h_src: Any  # (N_src, H, C) the sources' transform (refimpl.nn.gat.transform)
    h_dst: Any  # (N_dst, H, C) the targets'; the same array as h_src where one map of one x
    score: v1.ScoreCache | v2.ScoreCache  # the version's score: pre, its branch, LipschitzNorm
    alpha: Any  # (E, H) attention coefficients, before dropout
    dropout_cache: Any  # attention-dropout cache (its mask, or None outside training)
    alpha_dropped: Any  # (E, H) coefficients used in the aggregation
    edge_attr: Any = None  # (E, edge_dim) edge features over the attended edges, or None
    h_edge: Any = None  # (E, H, C) their projection W_e a, or None
    loop_fill: LoopFillCache | None = None  # the added loops' features, with edge_dim
    x_dst: Any = None  # (N_dst, F_dst) the targets' features of a bipartite input, or None
    flat_edge_attr: bool = False  # edge_attr came as (E,) (edge_dim 1): d_edge_attr too


@dataclass(frozen=True)
class GATConv:
    """One graph-attention layer; see the module docstring for the equations and names."""

    in_channels: int
    out_channels: int  # C, per head
    heads: int = 1  # H
    concat: bool = True  # concatenate heads (else average them)
    version: str = "v1"  # "v1": PyG GATConv; "v2": PyG GATv2Conv
    share_weights: bool = False  # v2: W_t = W_s (v1 always has one W)
    negative_slope: float = 0.2  # GAT paper; PyG default
    add_self_loops: bool = True  # PyG default
    bias: bool = True  # PyG default
    dropout: float = 0.0  # attention dropout probability (PyG's `dropout`)
    lipschitz_norm: str | None = None  # None | "paper" | "reference-code" (lipschitz_norm.py)
    residual: bool = False  # PyG's residual: + x W_res^T before the bias (no bias of its own)
    edge_dim: int | None = None  # edge features' width (PyG's edge_dim); None: none
    fill_value: Any = "mean"  # the added loops' edge features (refimpl.ops.loop_fill)
    projection_bias: bool = False  # v2: b_s, b_t, PyG's lin_l.bias and lin_r.bias

    def __post_init__(self) -> None:
        object.__setattr__(self, "fill_value", check_config(self))

    # -- parameters ------------------------------------------------------------------
    @property
    def in_sizes(self) -> tuple[int, int]:
        """``(F_src, F_dst)``: the sources' and the targets' feature widths."""
        sizes = self.in_channels
        return sizes if isinstance(sizes, tuple) else (sizes, sizes)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the parameters, in order."""
        hc, h, c = self.heads * self.out_channels, self.heads, self.out_channels
        f_src, f_dst = self.in_sizes
        if self.version == "v1":
            if isinstance(self.in_channels, tuple):  # bipartite: lin_src, lin_dst
                shapes = {"W_s": (hc, f_src), "W_t": (hc, f_dst)}
            else:
                shapes = {"W": (hc, f_src)}
            shapes |= {"att_src": (h, c), "att_dst": (h, c)}
        else:
            shapes = {"W_s": (hc, f_src)}
            if self.projection_bias:
                shapes["b_s"] = (hc,)
            if not self.share_weights:
                shapes["W_t"] = (hc, f_dst)
                if self.projection_bias:
                    shapes["b_t"] = (hc,)
            shapes["att"] = (h, c)
        if self.edge_dim is not None:
            shapes["W_e"] = (hc, self.edge_dim)
            if self.version == "v1":
                shapes["att_edge"] = (h, c)
        if self.residual:
            shapes["W_res"] = (hc if self.concat else c, f_dst)
        if self.bias:
            shapes["bias"] = (hc,) if self.concat else (c,)
        return shapes

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Glorot-uniform weights and attention (as PyG's ``glorot``), zero bias.

        ``W`` of shape ``(out, in)`` is drawn from ``U(-b, b)``, ``b = sqrt(6 / (in + out))``;
        attention ``(H, C)`` likewise with ``b = sqrt(6 / (H + C))`` (PyG applies glorot to
        its ``(1, H, C)`` tensor, whose last two sizes are ``H`` and ``C``); the projection
        biases ``b_s``, ``b_t`` from ``U(-1/sqrt(in), 1/sqrt(in))``, as PyG's ``Linear``.
        """
        params = {}
        for name, shape in self.param_shapes().items():
            if name == "bias":
                value = np.zeros(shape)
            elif name in ("b_s", "b_t"):
                bound = 1.0 / np.sqrt(self.in_sizes[name == "b_t"])
                value = rng.uniform(-bound, bound, size=shape)
            else:
                bound = np.sqrt(6.0 / (shape[0] + shape[1]))
                value = rng.uniform(-bound, bound, size=shape)
            params[name] = asarray(value, backend=backend, dtype=dtype)
        return params

    def prepare_graph(self, graph: Graph) -> Graph:
        """The graph the layer attends over: self-loops replaced by one per node if configured."""
        return with_configured_self_loops(graph, self.add_self_loops)

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        x: Any,
        graph: Graph,
        edge_attr: Any = None,
        training: bool = False,
        rng: np.random.Generator | None = None,
        attn_dropout_mask: Any = None,
    ) -> tuple[Any, GATCache]:
        """Apply the layer.

        Parameters
        ----------
        params : dict
            As from :meth:`init_params` (see :meth:`param_shapes`).
        x : (N, in_channels) float array, or a pair ``(x_src, x_dst)``
            The pair on a bipartite graph (PyG's): ``x_src (N_src, F_src)`` the sources'
            features, ``x_dst (N_dst, F_dst)`` the targets' (``in_channels = (F_src, F_dst)``,
            or one int for both).
        graph : Graph
            On ``N`` nodes (bipartite: ``N_src`` sources, ``num_dst_nodes = N_dst``).
        edge_attr : (E, edge_dim) float array
            With ``edge_dim`` (and only then): row ``e`` belongs to ``graph``'s edge ``e``;
            ``(E,)`` for ``edge_dim=1``, as PyG.
        training : bool
            Attention dropout is active only in training.
        rng : numpy.random.Generator, optional
            Draws the dropout mask when ``training`` and ``dropout > 0``.
        attn_dropout_mask : (E, H) bool array, optional
            The keep-mask itself (True = keep), over the edges of
            ``prepare_graph(graph)``; overrides ``rng``.

        Returns
        -------
        out : (N_dst, H*C) if ``concat`` else (N_dst, C)
        cache : GATCache
        """
        check_bool(training, "GATConv training")
        check_rng(rng, "GATConv rng")
        flat = self.edge_dim == 1 and getattr(edge_attr, "ndim", None) == 1
        if flat:
            edge_attr = edge_attr[:, None]  # PyG's view(-1, 1)
        attended = check_inputs(self, params, x, graph, edge_attr)
        loop_fill = None
        if edge_attr is not None and self.add_self_loops:
            edge_attr, loop_fill = fill_self_loops(edge_attr, graph, self.fill_value)
        out, cache = self.forward_unchecked(
            params, x, attended, training, rng, attn_dropout_mask, edge_attr
        )
        check_overflow(out, "GATConv.forward: its output", out.dtype)  # finite inputs
        return out, cache._replace(loop_fill=loop_fill, flat_edge_attr=flat)

    def forward_unchecked(
        self,
        params: dict[str, Any],
        x: Any,
        graph: Graph,
        training: bool,
        rng: np.random.Generator | None,
        attn_dropout_mask: Any,
        edge_attr: Any = None,
    ) -> tuple[Any, GATCache]:
        """:meth:`forward` on checked inputs, ``graph = prepare_graph(graph)`` and
        ``edge_attr`` over its edges (the added loops' rows filled): for a model that
        validated its parameters and input once at its own boundary."""
        x_src, x_dst = input_sides(x)
        xp = get_array_module(x_src)
        num_targets, heads, channels = x_dst.shape[0], self.heads, self.out_channels
        src, dst = graph.src_segments(xp), graph.dst_segments(xp)

        # F1 feature transforms (N_src, H, C), (N_dst, H, C) (refimpl.nn.gat.transform)
        h_src, h_dst = transform(self, params, x_src, x_dst)
        # F1' the edge features' projection W_e a (E, H, C)
        h_edge = None
        if edge_attr is not None:
            h_edge = (edge_attr @ params["W_e"].T).reshape(-1, heads, channels)
        # F2-F4 the version's score e (E, H): GAT-balance Eq. 2 (refimpl.nn.gat.v1 / v2)
        scores, score_cache = (v1 if self.version == "v1" else v2).scores(
            params, h_src, h_dst, src, dst, self.negative_slope, self.lipschitz_norm, h_edge
        )
        # F5 softmax over each target's incoming edges (E, H)
        alpha = segment_softmax(scores, dst)
        # F6 attention dropout (E, H)
        alpha_dropped, dropout_cache = Dropout(self.dropout).forward(
            {}, alpha, training=training, rng=rng, mask=attn_dropout_mask
        )
        # F7 aggregate W_s h_u over N(v) (N, H, C)
        aggregated = propagate(h_src, alpha_dropped, src, dst)
        # F8 combine heads
        if self.concat:
            out = aggregated.reshape(num_targets, heads * channels)  # (N, H*C)
        else:
            out = aggregated.mean(axis=1)  # (N, C)
        # F8' residual: the input's projection x W_res^T (N, H*C) or (N, C), as PyG adds it
        if self.residual:
            out = out + x_dst @ params["W_res"].T
        # F9 bias
        if self.bias:
            out = out + params["bias"]
        cache = GATCache(
            x_src, graph, h_src, h_dst, score_cache, alpha, dropout_cache, alpha_dropped,
            edge_attr, h_edge, x_dst=None if x_dst is x_src else x_dst,
        )  # fmt: skip
        return out, cache

    # -- backward ----------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: GATCache, d_out: Any, input_grad: bool = True
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of a scalar loss: ``(d_x (N, in), d_params keyed like params)``; with
        ``edge_dim``, ``((d_x, d_edge_attr (E, edge_dim)), d_params)``, ``d_edge_attr`` over
        the edges of the graph given to forward (shaped as its ``edge_attr``). For a pair
        ``(x_src, x_dst)``, ``d_x`` is the pair ``(d_x_src, d_x_dst)``.

        ``input_grad=False`` skips ``d_x`` and ``d_edge_attr`` (returned as ``None``): a
        network's first layer needs no gradient for the data, and it costs a full
        ``(N, H*C) @ (H*C, in)`` product.

        Raises :class:`~refimpl.validation.NonFiniteError` where a gradient overflows the
        dtype (float32 features near its largest numbers): forward can be finite where
        backward is not, as ``d alpha`` sums products of ``h`` and ``d_out``.
        """
        x, num_nodes = cache.x, (cache.x if cache.x_dst is None else cache.x_dst).shape[0]
        width = self.heads * self.out_channels if self.concat else self.out_channels
        check_cotangent(d_out, (num_nodes, width), x.dtype, x, name="d_out")
        check_bool(input_grad, "GATConv input_grad")
        return backward_checked(
            lambda: self._backward(params, cache, d_out, input_grad), "GATConv", x.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: GATCache, d_out: Any, input_grad: bool
    ) -> tuple[Any, dict[str, Any]]:
        """B9-B1 of :meth:`backward` on a checked cotangent."""
        x, graph = cache.x, cache.graph
        x_dst = x if cache.x_dst is None else cache.x_dst
        xp = get_array_module(x)
        num_nodes, heads, channels = x_dst.shape[0], self.heads, self.out_channels
        src, dst = graph.src_segments(xp), graph.dst_segments(xp)
        d_params: dict[str, Any] = {}

        # B9 (of F9) bias
        if self.bias:
            d_params["bias"] = d_out.sum(axis=0)
        # B8' (of F8') residual: W_res's gradient here, x's at B1
        if self.residual:
            d_params["W_res"] = weight_gradient(d_out, x_dst)  # d_out^T x_dst
        # B8 (of F8) heads: reshape back, or share the mean's gradient equally
        if self.concat:
            d_aggregated = d_out.reshape(num_nodes, heads, channels)
        else:
            d_aggregated = xp.broadcast_to(d_out[:, None, :] / heads, (num_nodes, heads, channels))
        # B7 (of F7) aggregation: messages and coefficients
        h_src_edges = cache.score.h_src_edges if self.version == "v2" else None  # (E, H, C)
        d_h_src, d_alpha_dropped = propagate_backward(
            cache.h_src, cache.alpha_dropped, d_aggregated, src, dst, h_src_edges
        )
        # B6 (of F6) dropout, B5 (of F5) softmax
        d_alpha, _ = Dropout(self.dropout).backward({}, cache.dropout_cache, d_alpha_dropped)
        d_scores = segment_softmax_backward(cache.alpha, d_alpha, dst)  # (E, H)
        # B4-B2 (of F4-F2) the version's score: into h_src, h_dst and the attention vectors
        if self.version == "v1":
            d_h_src, d_h_dst, d_h_edge, d_att = v1.scores_backward(
                params, cache.score, cache.h_src, cache.h_dst, d_scores, d_h_src, src, dst,
                self.negative_slope, cache.h_edge,
            )  # fmt: skip
        else:
            d_h_src, d_h_dst, d_h_edge, d_att = v2.scores_backward(
                params, cache.score, cache.h_src, cache.h_dst, d_scores, d_h_src, src, dst,
                self.negative_slope, cache.h_dst is cache.h_src, cache.h_edge,
            )  # fmt: skip
        d_params.update(d_att)
        # B1' (of F1') the edge features' projection: W_e, and the features themselves
        d_edge_attr = None
        if d_h_edge is not None:
            d_h_edge = d_h_edge.reshape(d_h_edge.shape[0], heads * channels)  # (E, H*C)
            d_params["W_e"] = d_h_edge.T @ cache.edge_attr
            if input_grad:
                d_edge_attr = d_h_edge @ params["W_e"]  # over the attended edges
                if cache.loop_fill is not None:  # back through the loops' fill
                    d_edge_attr = fill_self_loops_backward(cache.loop_fill, d_edge_attr)
                if cache.flat_edge_attr:  # (E,) as given, as torch's gradient of a view
                    d_edge_attr = d_edge_attr[:, 0]
        # B1 (of F1) feature transforms; a map both sides read receives both gradients
        d_x, d_x_dst = transform_backward(
            self, params, x, x_dst, d_h_src, d_h_dst, d_params, input_grad
        )
        if self.residual and input_grad:  # B8' (of F8'): the skip's share of d_x (d_x_dst)
            if cache.x_dst is None:
                d_x = d_x + d_out @ params["W_res"]
            else:
                d_x_dst = d_x_dst + d_out @ params["W_res"]
        if cache.x_dst is not None:
            d_x = (d_x, d_x_dst)
        d_params = {name: d_params[name] for name in params}
        return (d_x if self.edge_dim is None else (d_x, d_edge_attr)), d_params

    # -- inspection ----------------------------------------------------------------------
    @staticmethod
    def attention_weights(cache: GATCache) -> tuple[Any, Any]:
        """``(edge_index (2, E), alpha (E, H))``: the coefficients per edge and head, before
        dropout, over the edges actually attended (self-loops included when added)."""
        return cache.graph.edge_index_on(get_array_module(cache.alpha)), cache.alpha
