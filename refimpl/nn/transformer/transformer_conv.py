"""``TransformerConv``: the graph transformer of Shi et al. 2021 (UniMP), as PyG's TransformerConv.

Equations, arguments and shapes: the class docstring; how it maps onto the massive-activations
supplement's Eq. 3-13: :mod:`refimpl.nn.transformer.graph_transformer_layer`; LipschitzNorm's
transformer form (ties, ``D_v = 0``, no eps): :mod:`refimpl.nn.lipschitz.neighbourhood_norm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.fields import check_bool
from refimpl.graph import Graph
from refimpl.kernels.segment import gather, segment_softmax, segment_softmax_backward, segment_sum
from refimpl.nn.lipschitz.neighbourhood_norm import (
    transformer_lipschitz_scores,
    transformer_lipschitz_scores_backward,
)
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.nn.transformer.config import check_config, check_inputs
from refimpl.nn.transformer.projections import node_projections, node_projections_backward
from refimpl.nn.transformer.root_weight import root_weight, root_weight_backward
from refimpl.nn.transformer.transformer_conv_cache import TransformerConvCache
from refimpl.ops.dropout import Dropout
from refimpl.ops.propagate import propagate, propagate_backward
from refimpl.validation import check_cotangent, check_rng

__all__ = ["TransformerConv", "TransformerConvCache"]


@dataclass(frozen=True)
class TransformerConv:
    r"""Graph transformer convolution (UniMP, Shi et al. 2021), as PyG's ``TransformerConv``.

    For a target $v$ with incoming neighbourhood $\mathcal{N}(v) = \{u : (u, v) \in E\}$, per
    head ($C$ channels; $e_{uv}$ the features of the edge $u \to v$, with ``edge_dim``):

    $$
    q_v = W_q x_v + b_q, \quad k_{uv} = W_k x_u + b_k + W_e e_{uv}, \quad
    \nu_{uv} = W_v x_u + b_v + W_e e_{uv}
    $$

    $$
    \alpha_{uv} = \operatorname{softmax}_{u \in \mathcal{N}(v)}
    \left( \frac{q_v^\top k_{uv}}{\sqrt{C}} \right), \qquad
    m_v = \sum_{u \in \mathcal{N}(v)} \alpha_{uv} \nu_{uv}
    $$

    (the massive-activations supplement's Eq. 3-8 with the edge terms of Eq. 12-13, plus PyG's
    biases), heads concatenated or averaged, then the root weight $r_v = W_{skip} x_v + b_{skip}$:

    $$
    x'_v = m_v + r_v, \quad \text{or with beta:} \quad
    x'_v = \beta_v r_v + (1 - \beta_v) m_v, \quad
    \beta_v = \sigma\left(w_\beta^\top [m_v, r_v, m_v - r_v]\right)
    $$

    LipschitzNorm (Dasoulas et al. 2021) Eq. (19) per head and target replaces $1 / \sqrt{C}$,
    with $a_v$, $w_v$ the longest key $k_{uv}$ and value $\nu_{uv}$ into $v$:

    $$
    s_{uv} = \operatorname{clip}_{[-1, 1]} \frac{q_v^\top k_{uv}}{D_v}, \quad
    D_v = \max\{\lVert q_v \rVert a_v, \lVert q_v \rVert w_v, a_v w_v\}
    $$

    Parameters
    ----------
    in_channels : int or tuple of (int, int)
        Input features; a pair ``(F_src, F_dst)`` on a bipartite graph: keys and values read
        ``x_src``, queries and the root weight ``x_dst``. PyG's ``in_channels`` (without ``-1``).
    out_channels : int
        ``C``, channels per head. PyG's ``out_channels``.
    heads : int, default 1
        ``H``, attention heads. PyG's ``heads``.
    concat : bool, default True
        Concatenate the heads (``F = H*C``); False: average them (``F = C``). PyG's ``concat``.
    beta : bool, default False
        Gate the root weight and the messages by $\beta_v$ (above); needs ``root_weight=True``
        (refused otherwise; PyG silently drops it). PyG's ``beta``.
    dropout : float in [0, 1), default 0.0
        Dropout on $\alpha$ in training (or a mask given to :meth:`forward`). PyG's ``dropout``.
    edge_dim : int or None, default None
        Columns of ``edge_attr``, added through ``W_e`` to keys and values; None: no edge
        features (``edge_attr`` refused; PyG would add it untransformed). PyG's ``edge_dim``.
    bias : bool, default True
        Biases of the query, key, value and skip linears. PyG's ``bias``.
    root_weight : bool, default True
        Add $r_v$ (PyG's ``lin_skip``); False: the output is $m_v$. PyG's ``root_weight``.
    lipschitz_norm : {None, "paper"}, default None
        None: scores scaled by $1 / \sqrt{C}$ (PyG); "paper": LipschitzNorm Eq. (19) (above),
        one node set only (no bipartite input).

    Shapes
    ------
    - **forward** ``x (N, in_channels)`` or ``(x_src (N_src, F_src), x_dst (N_dst, F_dst))``,
      ``edge_attr (E, edge_dim)``, ``attn_dropout_mask (E, H)`` bool -> ``out (N_dst, F)``.
    - **backward** ``d_out (N_dst, F)`` -> ``d_x`` shaped as ``x`` (with ``edge_dim``, the pair
      ``(d_x, d_edge_attr (E, edge_dim))``), ``d_params`` shaped as ``params``.
    - N nodes (``N_src``, ``N_dst`` of a pair), E edges, H heads, C per head, F = H*C or C.

    Notes
    -----
    Parameters (:meth:`param_shapes`) and PyG's names; biases only with ``bias``, ``W_e`` with
    ``edge_dim``, ``W_skip`` and ``b_skip`` with ``root_weight``, ``w_beta`` with ``beta``:

    | ours | shape | PyG ``TransformerConv`` |
    | --- | --- | --- |
    | ``W_q``, ``b_q`` | ``(H*C, F_dst)``, ``(H*C,)`` | ``lin_query.weight``, ``.bias`` |
    | ``W_k``, ``b_k`` | ``(H*C, F_src)``, ``(H*C,)`` | ``lin_key.weight``, ``.bias`` |
    | ``W_v``, ``b_v`` | ``(H*C, F_src)``, ``(H*C,)`` | ``lin_value.weight``, ``.bias`` |
    | ``W_e`` | ``(H*C, edge_dim)`` | ``lin_edge.weight`` (no bias) |
    | ``W_skip``, ``b_skip`` | ``(F, F_dst)``, ``(F,)`` | ``lin_skip.weight``, ``.bias`` |
    | ``w_beta`` | ``(1, 3F)`` | ``lin_beta.weight`` (no bias) |

    PyG's docstring prints the gate's input as $[r_v, m_v, r_v - m_v]$; its code (and this
    layer) concatenates $[m_v, r_v, m_v - r_v]$. :meth:`attention_weights` returns the
    coefficients before dropout, as PyG's ``return_attention_weights``. Zero gradients: ``b_k``
    without LipschitzNorm (a shift of all of a target's scores), and wherever no ``D_v`` reads
    the longest key with it; with ``C = 1`` and LipschitzNorm, the query's wherever ``D_v``
    holds $\lVert q_v \rVert$. Finite differences and autograd see rounding there.
    """

    in_channels: int | tuple[int, int]  # (F_src, F_dst) of a bipartite graph
    out_channels: int  # C, per head
    heads: int = 1  # H
    concat: bool = True  # concatenate heads (H*C) else average them (C); PyG default
    beta: bool = False  # PyG's gated skip (needs root_weight)
    dropout: float = 0.0  # attention dropout on alpha, training only; PyG default
    edge_dim: int | None = None  # edge feature size; None: no edge features
    bias: bool = True  # biases of the query/key/value/skip linears; PyG default
    root_weight: bool = True  # add W_skip x_v (PyG's lin_skip); PyG default
    lipschitz_norm: str | None = None  # None (1 / sqrt(C)) | "paper" (LipschitzNorm Eq. 19)

    def __post_init__(self) -> None:
        check_config(self)

    # -- parameters ------------------------------------------------------------------
    @property
    def in_sizes(self) -> tuple[int, int]:
        """``(F_src, F_dst)``: keys and values read the first, queries and the skip the second."""
        sizes = self.in_channels
        return sizes if isinstance(sizes, tuple) else (sizes, sizes)

    @property
    def _width(self) -> int:
        """``F``: output width, ``H*C`` (concat) or ``C`` (mean)."""
        return self.heads * self.out_channels if self.concat else self.out_channels

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the parameters, in order."""
        hc, width = self.heads * self.out_channels, self._width
        f_src, f_dst = self.in_sizes
        shapes: dict[str, tuple[int, ...]] = {}
        for name, size in (("q", f_dst), ("k", f_src), ("v", f_src)):
            shapes[f"W_{name}"] = (hc, size)
            if self.bias:
                shapes[f"b_{name}"] = (hc,)
        if self.edge_dim is not None:
            shapes["W_e"] = (hc, self.edge_dim)
        if self.root_weight:
            shapes["W_skip"] = (width, f_dst)
            if self.bias:
                shapes["b_skip"] = (width,)
        if self.beta:
            shapes["w_beta"] = (1, 3 * width)
        return shapes

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """PyG's ``Linear`` default reset: every weight and bias ``~ U(-1/sqrt(fan_in), +)``.

        That is ``kaiming_uniform(a=sqrt(5))`` for the weights (bound ``sqrt(6 / ((1 + a^2)
        fan_in)) = 1 / sqrt(fan_in)``), the bias with the same fan-in: PyG's law, not its draws.
        """
        params = {}
        f_src, f_dst = self.in_sizes
        for name, shape in self.param_shapes().items():
            # a weight (out, in) has fan-in ``in``; a bias, its linear's input width
            fan_in = shape[1] if len(shape) == 2 else (f_src if name in ("b_k", "b_v") else f_dst)
            bound = 1.0 / math.sqrt(fan_in)
            params[name] = asarray(rng.uniform(-bound, bound, size=shape), backend, dtype)
        return params

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
    ) -> tuple[Any, TransformerConvCache]:
        """Apply the layer.

        Parameters
        ----------
        params : dict
            As from :meth:`init_params` (see :meth:`param_shapes`).
        x : (N, in_channels) float array, or a pair ``(x_src, x_dst)``
            The pair on a bipartite graph (``N_src`` sources, ``N_dst`` targets).
        graph : Graph
            On ``N`` nodes, used as given (no self-loops added).
        edge_attr : (E, edge_dim) float array, optional
            Required exactly when ``edge_dim`` is set; row ``e`` belongs to edge ``e``.
        training : bool
            Attention dropout is active only in training.
        rng : numpy.random.Generator, optional
            Draws the dropout mask when ``training`` and ``dropout > 0``.
        attn_dropout_mask : (E, H) bool array, optional
            The keep-mask itself (True = keep); overrides ``rng``.

        Returns
        -------
        out : (N, H*C) if ``concat`` else (N, C)
        cache : TransformerConvCache

        Raises :class:`~refimpl.validation.NonFiniteError` where the output overflows the dtype.
        """
        check_inputs(self, params, x, graph, edge_attr)
        check_bool(training, "TransformerConv training")
        check_rng(rng, "TransformerConv rng")
        x_src, x_dst = (x[0], x[1]) if isinstance(x, tuple) else (x, x)
        xp = get_array_module(x_src)
        n, heads, channels = x_dst.shape[0], self.heads, self.out_channels
        src, dst = graph.src_segments(xp), graph.dst_segments(xp)

        # F1 queries (N_dst, H, C), keys and values (N_src, H, C) (supplement Eq. 3-5, PyG's
        # biases; refimpl.nn.transformer.projections)
        q, k, val = node_projections(self, params, x_src, x_dst)
        # F2 edge features ef = W_e e_uv (E, H, C) (supplement Eq. 12-13: one W_e for both)
        edge_features = None
        if self.edge_dim is not None:
            edge_features = (edge_attr @ params["W_e"].T).reshape(-1, heads, channels)
        # F3 per edge: the target's query, the key k_uv = k_u + ef_uv (E, H, C)
        q_edges = gather(q, dst)
        k_edges = _with_edge_term(gather(k, src), edge_features)
        # F4 raw scores q_v . k_uv (E, H)
        raw = xp.einsum("ehc,ehc->eh", q_edges, k_edges)
        lipschitz = None
        if self.lipschitz_norm is None:
            # F5 scale by 1 / sqrt(d_k) (supplement Eq. 6, PyG)
            scores = raw / math.sqrt(channels)
        else:
            # F5' LipschitzNorm Eq. 19 per target and head (E, H)
            val_edges = _with_edge_term(gather(val, src), edge_features)
            scores, lipschitz = transformer_lipschitz_scores(raw, q, k_edges, val_edges, dst)
        # F6 softmax over each target's incoming edges (E, H) (supplement Eq. 6-7)
        alpha = segment_softmax(scores, dst)
        # F7 attention dropout (E, H)
        alpha_dropped, dropout_cache = Dropout(self.dropout).forward(
            {}, alpha, training=training, rng=rng, mask=attn_dropout_mask
        )
        # F8 aggregate sum_u alpha_uv (val_u + ef_uv) (N, H, C) (supplement Eq. 8, 13), by
        # linearity as propagate(val) plus the edge term: no (E, H, C) values without edge_dim
        aggregated = propagate(val, alpha_dropped, src, dst)
        if edge_features is not None:
            aggregated = aggregated + segment_sum(alpha_dropped[..., None] * edge_features, dst)
        # F9 combine heads (N, F)
        if self.concat:
            messages = aggregated.reshape(n, heads * channels)
        else:
            messages = aggregated.mean(axis=1)
        out, skip, gate = messages, None, None
        if self.root_weight:
            # F10-F11 root weight x_r = W_skip x_v + b_skip, added or gated by beta (N, F)
            out, skip, gate = root_weight(params, x_dst, messages, self.bias, self.beta)
        cache = TransformerConvCache(
            x_src,
            graph,
            edge_attr,
            q,
            k,
            val,
            edge_features,
            alpha,
            dropout_cache,
            alpha_dropped,
            lipschitz,
            messages,
            skip,
            gate,
            None if x_dst is x_src else x_dst,
        )
        check_overflow(out, "TransformerConv.forward: its output", x_src.dtype)
        return out, cache

    # -- backward ----------------------------------------------------------------------
    def backward(
        self,
        params: dict[str, Any],
        cache: TransformerConvCache,
        d_out: Any,
        input_grad: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_inputs, d_params keyed like params)``.

        ``d_inputs`` is ``d_x (N, in)`` without ``edge_dim``, else the tuple ``(d_x, d_edge_attr
        (E, edge_dim))``; ``d_x`` is the pair ``(d_x_src, d_x_dst)`` for a pair input.
        ``input_grad=False`` returns ``None`` in place of ``d_x`` (a first layer needs none).

        Raises :class:`~refimpl.validation.NonFiniteError` where a gradient overflows the dtype.
        """
        x = cache.x
        rows = (x if cache.x_dst is None else cache.x_dst).shape[0]
        check_cotangent(d_out, (rows, self._width), x.dtype, x, name="d_out")
        check_bool(input_grad, "TransformerConv input_grad")
        return backward_checked(
            lambda: self._backward(params, cache, d_out, input_grad), "TransformerConv", x.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: TransformerConvCache, d_out: Any, input_grad: bool
    ) -> tuple[Any, dict[str, Any]]:
        """B11-B1 of :meth:`backward` on a checked cotangent."""
        x, graph = cache.x, cache.graph
        x_dst = x if cache.x_dst is None else cache.x_dst
        xp = get_array_module(x)
        n, heads, channels = x_dst.shape[0], self.heads, self.out_channels
        src, dst = graph.src_segments(xp), graph.dst_segments(xp)
        d_params: dict[str, Any] = {}

        d_messages, d_skip = d_out, None
        if self.root_weight:
            # B11 (of F11) the sum or the gate; B10 (of F10) with the projections' adjoint at B1
            d_messages, d_skip = root_weight_backward(
                params, cache.messages, cache.skip, cache.gate, d_out, d_params
            )
        # B9 (of F9) heads: reshape back, or share the mean's gradient equally (N, H, C)
        if self.concat:
            d_aggregated = d_messages.reshape(n, heads, channels)
        else:
            d_aggregated = xp.broadcast_to(d_messages[:, None, :] / heads, (n, heads, channels))
        # B8 (of F8) aggregation: node values and coefficients, then the edge term
        d_val, d_alpha_dropped = propagate_backward(
            cache.val, cache.alpha_dropped, d_aggregated, src, dst
        )
        d_edge_features = None
        if cache.edge_features is not None:
            d_edge_messages = gather(d_aggregated, dst)  # (E, H, C)
            d_alpha_dropped = d_alpha_dropped + xp.einsum(
                "ehc,ehc->eh", d_edge_messages, cache.edge_features
            )
            d_edge_features = d_edge_messages * cache.alpha_dropped[..., None]  # (E, H, C)
        # B7 (of F7) dropout, B6 (of F6) softmax (E, H)
        d_alpha, _ = Dropout(self.dropout).backward({}, cache.dropout_cache, d_alpha_dropped)
        d_scores = segment_softmax_backward(cache.alpha, d_alpha, dst)
        # (F3 recomputed) per-edge queries and keys (E, H, C)
        q_edges = gather(cache.q, dst)
        k_edges = _with_edge_term(gather(cache.k, src), cache.edge_features)
        if cache.lipschitz is None:
            # B5 (of F5)
            d_raw = d_scores / math.sqrt(channels)
            d_q = d_k_edges = None
        else:
            # B5' (of F5') LipschitzNorm: the quotient and, through D, the norms
            val_edges = _with_edge_term(gather(cache.val, src), cache.edge_features)
            d_raw, d_q, d_k_edges, d_val_edges = transformer_lipschitz_scores_backward(
                cache.lipschitz, d_scores, cache.q, k_edges, val_edges, dst
            )
            d_val = d_val + segment_sum(d_val_edges, src)
            if cache.edge_features is not None:  # val_uv = val_u + ef_uv
                d_edge_features = _accumulate(d_edge_features, d_val_edges)
        # B4 (of F4) raw = q_v . k_uv (E, H, C)
        d_q_edges = d_raw[..., None] * k_edges
        d_k_edges = _accumulate(d_k_edges, d_raw[..., None] * q_edges)
        # B3 (of F3) the gathers' adjoints (N, H, C); k_uv = k_u + ef_uv
        d_q = _accumulate(d_q, segment_sum(d_q_edges, dst))
        d_k = segment_sum(d_k_edges, src)
        if cache.edge_features is not None:
            d_edge_features = _accumulate(d_edge_features, d_k_edges)
        d_edge_attr = None
        if self.edge_dim is not None:
            # B2 (of F2) ef = e W_e^T
            d_ef = d_edge_features.reshape(-1, heads * channels)  # (E, H*C)
            d_params["W_e"] = d_ef.T @ cache.edge_attr  # (H*C, edge_dim)
            d_edge_attr = d_ef @ params["W_e"]  # (E, edge_dim)
        # B1 (of F1) the three projections and B10's root weight (F, in)
        d_x = node_projections_backward(
            self, params, x, x_dst, d_q, d_k, d_val, d_skip, d_params, input_grad
        )
        d_params = {name: d_params[name] for name in params}
        if self.edge_dim is None:
            return d_x, d_params
        return (d_x, d_edge_attr), d_params

    # -- inspection ----------------------------------------------------------------------
    @staticmethod
    def attention_weights(cache: TransformerConvCache) -> tuple[Any, Any]:
        """``(edge_index (2, E), alpha (E, H))``: the coefficients per edge and head, before
        dropout (PyG's ``return_attention_weights``)."""
        return cache.graph.edge_index_on(get_array_module(cache.alpha)), cache.alpha

    @staticmethod
    def score_vectors(cache: TransformerConvCache) -> Any:
        """``(E, H, C)``: the score terms before the sum over a head's channels.

        ``q_v * k_uv / sqrt(C)`` (or ``/ D_v`` with LipschitzNorm; 0 where ``D_v = 0``), recomputed
        from the cache; their channel sum is the score (up to rounding; the LipschitzNorm score
        is also clipped to ``[-1, 1]``, these terms are not).
        """
        xp = get_array_module(cache.q)
        src, dst = cache.graph.src_segments(xp), cache.graph.dst_segments(xp)
        terms = gather(cache.q, dst) * _with_edge_term(gather(cache.k, src), cache.edge_features)
        if cache.lipschitz is None:
            return terms / math.sqrt(cache.q.shape[2])
        return terms / gather(cache.lipschitz.denominator, dst)[..., None]


# -- small pieces ---------------------------------------------------------------------------
def _with_edge_term(node_part: Any, edge_features: Any) -> Any:
    """``node_part + ef`` per edge (E, H, C), or ``node_part`` without edge features."""
    return node_part if edge_features is None else node_part + edge_features


def _accumulate(total: Any, term: Any) -> Any:
    """``total + term``, with ``None`` as an empty total."""
    return term if total is None else total + term
