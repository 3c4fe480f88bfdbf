"""``GATConv``: graph attention, GATv1 (Velickovic et al. 2018) and GATv2 (Brody et al. 2022);
the class docstring states its equations (GAT-balance Eq. 1-2), arguments, shapes, PyG names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.fields import check_bool
from refimpl.graph import Graph, with_configured_self_loops
from refimpl.kernels.segment import segment_softmax, segment_softmax_backward
from refimpl.nn.gat import v1, v2
from refimpl.nn.gat.cache import GATCache
from refimpl.nn.gat.config import check_config, check_inputs, param_shapes
from refimpl.nn.gat.fused_path import (
    FusedScoreCache,
    FusedV2ScoreCache,
    fused_attention,
    fused_attention_backward,
    takes_fused_path,
)
from refimpl.nn.gat.fused_path_v2 import fused_attention_v2, fused_attention_v2_backward
from refimpl.nn.gat.transform import input_sides, transform, transform_backward
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.ops.dropout import Dropout
from refimpl.ops.linear import weight_gradient
from refimpl.ops.loop_fill import fill_self_loops, fill_self_loops_backward
from refimpl.ops.propagate import propagate, propagate_backward
from refimpl.validation import check_cotangent, check_rng

__all__ = ["GATCache", "GATConv"]


@dataclass(frozen=True)
class GATConv:
    r"""One graph-attention layer: GATv1 or GATv2 (PyG's ``GATConv``, ``GATv2Conv``).

    For a target $v$ with incoming neighbours $\mathcal{N}(v) = \{u : (u, v) \in E\}$, per head
    and before the model's activation (GAT-balance (Mustafa et al. 2023) Eq. (1)-(2); GAT
    (Velickovic et al. 2018) Eq. (3)-(4)):

    $$
    \mathbf{x}'_v = \sum_{u \in \mathcal{N}(v)} \alpha_{uv} \mathbf{W}_s \mathbf{x}_u,
    \qquad
    \alpha_{uv} = \frac{\exp e_{uv}}{\sum_{k \in \mathcal{N}(v)} \exp e_{kv}}
    $$

    with GATv1's score (Velickovic et al. 2018 Eq. (3), $\mathbf{W}_s = \mathbf{W}_t =
    \mathbf{W}$) or GATv2's (Brody et al. 2022 Eq. (7); GAT-balance Eq. (2)):

    $$
    \begin{gathered}
    e_{uv} = \operatorname{LeakyReLU}(\mathbf{a}_s^\top \mathbf{W} \mathbf{x}_u
    + \mathbf{a}_t^\top \mathbf{W} \mathbf{x}_v) \quad \text{(v1)} \\
    e_{uv} = \mathbf{a}^\top \operatorname{LeakyReLU}(\mathbf{W}_s \mathbf{x}_u
    + \mathbf{W}_t \mathbf{x}_v) \quad \text{(v2)}
    \end{gathered}
    $$

    Heads are concatenated (Velickovic et al. 2018 Eq. (5)) or averaged (Eq. (6)), then
    $\mathbf{x}_v \mathbf{W}_{res}^\top$ (``residual``) and the bias are added. Edge features
    $\mathbf{a}_{uv}$ (``edge_dim``) add $\mathbf{a}_e^\top \mathbf{W}_e \mathbf{a}_{uv}$
    inside v1's LeakyReLU, $\mathbf{W}_e \mathbf{a}_{uv}$ beside v2's $\mathbf{W}_s
    \mathbf{x}_u$, as PyG; ``lipschitz_norm`` divides $e_{uv}$ by LipschitzNorm's
    neighbour-wise denominator (Dasoulas et al. 2021 Eq. (17), Sec. 5).

    Parameters
    ----------
    in_channels : int or (int, int)
        $F$, the input width; a pair $(F_s, F_t)$ for a bipartite graph (PyG's tuple).
    out_channels : int
        $C$, the output width per head (PyG's ``out_channels``).
    heads : int, default 1
        $H$, the number of attention heads (PyG's ``heads``).
    concat : bool, default True
        Concatenate the heads ($H C$ outputs); False averages them ($C$). PyG's ``concat``.
    version : {"v1", "v2"}, default "v1"
        The score: ``"v1"`` is PyG's ``GATConv``, ``"v2"`` its ``GATv2Conv``.
    share_weights : bool, default False
        v2: $\mathbf{W}_t = \mathbf{W}_s$ (PyG's ``share_weights``). v1 has one $\mathbf{W}$.
    negative_slope : float, default 0.2
        LeakyReLU's slope below 0, $\ge 0$ ($\le 1$ with ``lipschitz_norm``). PyG's.
    add_self_loops : bool, default True
        Replace the graph's self-loops by one per node (PyG's ``add_self_loops``).
    bias : bool, default True
        Learn an additive output bias (PyG's ``bias``; for v2 see Notes).
    dropout : float, default 0.0
        Dropout probability in $[0, 1)$ of $\alpha$ in training (PyG's ``dropout``).
    lipschitz_norm : {None, "paper", "reference-code"}, default None
        LipschitzNorm as in the paper, or as in its authors' code (v1); not with ``edge_dim``.
    residual : bool, default False
        Add $\mathbf{x}_v \mathbf{W}_{res}^\top$ (no bias of its own; PyG 2.6's ``residual``).
    edge_dim : int or None, default None
        $D$, the edge features' width (PyG's ``edge_dim``); None takes no edge features.
    fill_value : float, (D,) floats, {"mean", "add", "sum", "max", "min", "mul"} or None
        Default ``"mean"``. The added self-loops' edge features, with ``edge_dim`` (PyG's
        ``fill_value``): a constant, or a reduction of the node's incoming edge features
        (differentiable); None fills ones (:mod:`refimpl.ops.loop_fill`).
    projection_bias : bool, default False
        v2: biases $\mathbf{b}_s, \mathbf{b}_t$ in $\mathbf{W}_s \mathbf{x}_u + \mathbf{b}_s$
        and $\mathbf{W}_t \mathbf{x}_v + \mathbf{b}_t$ (PyG's ``lin_l.bias``, ``lin_r.bias``).

    Shapes
    ------
    - **input**: ``x`` $(N, F)$ or a pair $((N_s, F_s), (N_t, F_t))$; ``graph`` with $E$
      edges; ``edge_attr`` $(E, D)$, or $(E,)$ for $D = 1$ (with ``edge_dim`` only)
    - **output**: $(N, H C)$ if ``concat`` else $(N, C)$ ($N_t$ rows for a pair)
    - **backward**: ``d_out`` as the output; ``d_x`` as ``x``, or ``(d_x, d_edge_attr)``
      with ``edge_dim``; ``d_params`` keyed as ``params``
    - **attention_weights**: ``edge_index`` $(2, E')$, $\alpha$ $(E', H)$, $E'$ edges attended

    Notes
    -----
    Parameters (:meth:`param_shapes`; row $i$ of a $\mathbf{W}$ holds the weights into
    output neuron $i$, as in the papers) beside PyG's:

    | ours | shape | PyG |
    | --- | --- | --- |
    | v1 ``W`` | $(H C, F)$ | ``GATConv.lin.weight`` (``lin_src`` before 2.5) |
    | v1 ``att_src``, ``att_dst`` | $(H, C)$ | ``att_src``, ``att_dst`` $(1, H, C)$ |
    | v2 ``W_s``, ``W_t`` | $(H C, F)$ | ``GATv2Conv.lin_l.weight``, ``lin_r.weight`` |
    | v2 ``att`` | $(H, C)$ | ``att`` $(1, H, C)$ |
    | v2 ``b_s``, ``b_t`` | $(H C,)$ | ``lin_l.bias``, ``lin_r.bias`` |
    | ``W_e`` | $(H C, D)$ | ``lin_edge.weight`` |
    | v1 ``att_edge`` | $(H, C)$ | ``att_edge`` $(1, H, C)$ |
    | ``W_res`` | $(H C, F)$ or $(C, F)$ | ``res.weight`` |
    | ``bias`` | $(H C,)$ or $(C,)$ | ``bias`` |

    ``share_weights`` drops ``W_t``, ``b_t``; a bipartite v1 layer has ``W_s``, ``W_t``
    (PyG's ``lin_src``, ``lin_dst``) for ``W``. Edges as in PyG: with ``add_self_loops``,
    the non-loop edges in order, then one loop per node $0..N-1$; duplicates each get their
    own $\alpha$; a node without incoming edges aggregates to zero. LeakyReLU's derivative at 0
    is ``negative_slope`` (PyTorch's). Unlike PyG: ``GATv2Conv(bias=True)`` is ``bias=True,
    projection_bias=True``; :meth:`attention_weights` gives $\alpha$ before dropout; an
    ``edge_attr`` without ``edge_dim``, or none with it, is refused.
    """

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
        """Names and shapes of the parameters, in order (:func:`~refimpl.nn.gat.config.
        param_shapes`)."""
        return param_shapes(self)

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
        h_edge = alpha_dropped = None
        if takes_fused_path(self, xp, isinstance(x, tuple)):  # F2-F7 by the device kernels
            fused = fused_attention if self.version == "v1" else fused_attention_v2
            aggregated, score_cache, alpha, dropout_cache = fused(
                self, params, h_src, h_dst, graph, training, rng, attn_dropout_mask
            )
        else:
            # F1' the edge features' projection W_e a (E, H, C)
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
        if isinstance(cache.score, (FusedScoreCache, FusedV2ScoreCache)):  # B7-B2: the kernels
            v1_kernels = isinstance(cache.score, FusedScoreCache)
            fused = fused_attention_backward if v1_kernels else fused_attention_v2_backward
            d_h_src, d_h_dst, d_att = fused(self, params, cache, d_aggregated)
            d_h_edge = None
        else:
            d_h_src, d_h_dst, d_h_edge, d_att = self._attention_backward(
                params, cache, d_aggregated, src, dst
            )
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

    def _attention_backward(
        self, params: dict[str, Any], cache: GATCache, d_aggregated: Any, src: Any, dst: Any
    ) -> tuple[Any, Any, Any, dict[str, Any]]:
        """B7-B2 of :meth:`backward` on the literal path: ``(d_h_src, d_h_dst, d_h_edge,
        d_att)``."""
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
            return v1.scores_backward(
                params, cache.score, cache.h_src, cache.h_dst, d_scores, d_h_src, src, dst,
                self.negative_slope, cache.h_edge,
            )  # fmt: skip
        return v2.scores_backward(
            params, cache.score, cache.h_src, cache.h_dst, d_scores, d_h_src, src, dst,
            self.negative_slope, cache.h_dst is cache.h_src, cache.h_edge,
        )  # fmt: skip

    # -- inspection ----------------------------------------------------------------------
    @staticmethod
    def attention_weights(cache: GATCache) -> tuple[Any, Any]:
        """``(edge_index (2, E), alpha (E, H))``: the coefficients per edge and head, before
        dropout, over the edges actually attended (self-loops included when added)."""
        return cache.graph.edge_index_on(get_array_module(cache.alpha)), cache.alpha
