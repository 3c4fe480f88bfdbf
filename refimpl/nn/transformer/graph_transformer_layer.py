"""``GraphTransformerLayer``: one layer of the graph transformer of the massive-activations
supplement (Sec. 2, Eq. 3-13), attention masked to the graph and computed over edges.

With ``D = channels``, ``H = heads``, ``d_k = D / H`` and the per-edge features
``e_uv`` (``edge_dim`` columns, or none)::

    F1  a = TransformerConv(h, e)        (N, D)  Eq. 3-8, 12-13: per head h,
            q_v = W^Q h_v, k_uv = W^K h_u + W^E e_uv, val_uv = W^V h_u + W^E e_uv,
            alpha_uv = softmax over u in N(v) of q_v . k_uv / sqrt(d_k),
            head_v = sum_u alpha_uv val_uv; heads concatenated
    F2  a = a W^O^T + b^O                (N, D)  Eq. 9, output projection
    F3  a = Dropout(a)
    F4  z = LayerNorm_1(h + a)           (N, D)  Eq. 11 (residual, then LayerNorm)
    F5  f = ReLU(z W_1^T + b_1)          (N, d_ff) Eq. 10
    F6  f = f W_2^T + b_2                (N, D)  Eq. 10
    F7  f = Dropout(f)
    F8  out = LayerNorm_2(z + f)         (N, D)  Eq. 11

The mask of Eq. 7 (``M_ij = 0`` on edges and on the diagonal) is the edge set:
attention is a softmax over each node's incoming edges, so the layer attends
over whatever graph it is given. Eq. 7 includes ``i = j``; the model
(:class:`refimpl.models.GraphTransformer`) adds one self-loop per node with its
own edge type before the first layer, so the layer itself adds none (as PyG's
``TransformerConv``, whose conventions F1 follows: see
:mod:`refimpl.nn.transformer.transformer_conv`). Eq. 12 prints a scalar ``f(e_ij)`` added
to ``q_i^T k_j``; here (as in PyG) it is the bilinear ``q_i . W^E e_ij``, and Eq. 13's
``g`` is the same ``W^E``. Dwivedi & Bresson's GT with edge features does otherwise: it
multiplies the scaled ``k_j * q_i`` channel by channel by ``W^E e_ij`` before summing the
channels, clamps the sum to ``[-5, 5]`` before ``exp``, adds no edge term to the values,
and carries the products on as an edge stream with its own output projection, FFN and norms
(:class:`~refimpl.nn.transformer.gt_layer.GTLayer`). ``lipschitz_norm="paper"`` replaces
``1 / sqrt(d_k)`` in F1 by LipschitzNorm Eq. 19 per head and per target neighbourhood.
Because the masked softmax of Eq. 6-8 is a softmax over each target's incoming edges,
duplicate edges each get their own coefficient (the dense mask would count them once) and a
node with no incoming edge aggregates to zero (Eq. 7 never has an empty row). PyG's root
weight ``W_skip`` (with its ``beta`` gate) is UniMP's own skip, not part of Eq. 3-13: F1 runs
without it (``root_weight=False``), and Eq. 11's residual takes its place.

Eq. 3-5 have no biases: ``qkv_bias=False`` by default (Dwivedi & Bresson's GT
likewise), while ``W^O`` and the FFN carry biases (Eq. 9 has none printed, the
reference implementations have one).

Parameters, in order: ``attention.{TransformerConv names}`` (``W_q``, ``W_k``,
``W_v``, ``W_e`` with edge features, biases with ``qkv_bias``), ``output.W (D,
D)``, ``output.b``, ``norm1.weight``, ``norm1.bias``, ``ffn1.W (d_ff, D)``,
``ffn1.b``, ``ffn2.W (D, d_ff)``, ``ffn2.b``, ``norm2.weight``, ``norm2.bias``
(the norms only with ``layer_norm``).

Randomness: ``noise`` keys ``attn_dropout`` ``(E, H)``, ``dropout1`` ``(N, D)``
(F3) and ``dropout2`` ``(N, D)`` (F7), keep-masks drawn from ``rng`` in that
order when not given and used (training with the probability > 0);
``cache.noise`` holds the masks used, so ``forward(noise=cache.noise)`` replays a
step exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from refimpl.fields import check_bool, check_positive_int, check_probability
from refimpl.graph import Graph
from refimpl.nn.norms.layernorm import LayerNorm, LayerNormCache
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.nn.stacks import block_backward, flat_param_shapes, init_flat_params, split_params
from refimpl.nn.transformer.transformer_conv import TransformerConv, TransformerConvCache
from refimpl.ops.activations import ReLU, SignCache
from refimpl.ops.dropout import Dropout, DropoutCache, recorded_dropout
from refimpl.ops.linear import Linear, LinearCache
from refimpl.validation import check_block_inputs, check_cotangent, check_rng

__all__ = ["GraphTransformerLayer", "GraphTransformerLayerCache"]


class GraphTransformerLayerCache(NamedTuple):
    """What :meth:`GraphTransformerLayer.backward` reads (None for a step switched off).

    Attributes
    ----------
    attention : TransformerConvCache
        F1, the attention.
    output : LinearCache
        F2, the output projection ``W^O``.
    dropout1 : DropoutCache
        F3.
    norm1 : LayerNormCache or None
        F4 (None without ``layer_norm``).
    ffn1 : LinearCache
        F5, the FFN's first linear.
    relu : SignCache
        F5, its ReLU.
    ffn2 : LinearCache
        F6, the FFN's second linear.
    dropout2 : DropoutCache
        F7.
    norm2 : LayerNormCache or None
        F8 (None without ``layer_norm``).
    out : (N, D) array
        The layer's output, kept for the massive-activation diagnostics.
    noise : dict
        The keep-masks used, as ``forward(noise=...)`` takes them.
    """

    attention: TransformerConvCache
    output: LinearCache
    dropout1: DropoutCache
    norm1: LayerNormCache | None
    ffn1: LinearCache
    relu: SignCache
    ffn2: LinearCache
    dropout2: DropoutCache
    norm2: LayerNormCache | None
    out: Any
    noise: dict[str, Any]


@dataclass(frozen=True)
class GraphTransformerLayer:
    r"""The massive-activations supplement's graph-transformer layer (Sec. 2, Eq. 3-13).

    Masked multi-head attention, output projection, FFN, residuals and LayerNorms (F1-F8 of
    the module docstring). Per head $i$ with $d_k = D / H$ channels, over the edges
    $u \to v$ given (the mask $M$ of Eq. 7) and edge features $e_{uv}$ (Eq. 12-13):

    $$
    A_i = \operatorname{softmax}\left(\frac{Q_i K_i^\top + f(e)}{\sqrt{d_k}} + M\right),
    \quad Q_i = H W_i^Q, \ K_i = H W_i^K, \ V_i = H W_i^V \qquad \text{(Eq. 3-7, 12)}
    $$

    $$
    H' = \operatorname{Concat}(A_1 V_1, \dots, A_H V_H) W^O \qquad \text{(Eq. 8-9, 13)}
    $$

    $$
    Z = \operatorname{LayerNorm}(H + H'), \quad
    H_{out} = \operatorname{LayerNorm}(Z + \max(0, Z W_1 + b_1) W_2 + b_2)
    \qquad \text{(Eq. 10-11)}
    $$

    with $f(e_{uv}) = q_v^\top W^E e_{uv}$ and $V$'s edge term $W^E e_{uv}$ (as PyG's
    ``TransformerConv``, which computes the attention: :class:`~refimpl.nn.TransformerConv`).

    Parameters
    ----------
    channels : int
        ``D``, the layer's width (in and out); divisible by ``heads``.
    heads : int, default 4
        ``H``, attention heads of ``d_k = D / H`` channels.
    ffn_channels : int or None, default None
        ``d_ff``, the FFN's hidden width; None: ``2 D`` (Dwivedi & Bresson's GT).
    edge_dim : int or None, default None
        Columns of ``e_uv``; None: no edge features (Eq. 6 alone).
    dropout : float in [0, 1), default 0.0
        Dropout after the output projection (F3) and the FFN (F7), in training.
    attn_dropout : float in [0, 1), default 0.0
        Dropout on the attention coefficients (PyG's ``TransformerConv.dropout``).
    layer_norm : bool, default True
        Eq. 11's LayerNorms; False: the residuals alone.
    qkv_bias : bool, default False
        Biases on ``W^Q``, ``W^K``, ``W^V`` (Eq. 3-5 print none; PyG's ``bias``).
    lipschitz_norm : {None, "paper"}, default None
        None: ``1 / sqrt(d_k)`` (Eq. 6); "paper": LipschitzNorm (Dasoulas et al. 2021)
        Eq. (19) per head and target neighbourhood.

    Shapes
    ------
    - **forward** ``h (N, D)``, ``edge_attr (E, edge_dim)``, masks ``noise["attn_dropout"]
      (E, H)``, ``noise["dropout1"]``, ``noise["dropout2"] (N, D)`` -> ``(N, D)``.
    - **backward** ``d_out (N, D)`` -> ``d_h (N, D)`` (with ``edge_dim``, the pair
      ``(d_h, d_edge_attr (E, edge_dim))``), ``d_params`` shaped as ``params``.
    - N nodes, E edges, H heads, D = ``channels``.
    """

    channels: int  # D = d'
    heads: int = 4  # H; d_k = D / H
    ffn_channels: int | None = None  # d_ff; None: 2 D (Dwivedi & Bresson's GT)
    edge_dim: int | None = None  # columns of e_uv; None: no edge features (Eq. 6)
    dropout: float = 0.0  # F3 and F7
    attn_dropout: float = 0.0  # on the attention coefficients (PyG's ``dropout``)
    layer_norm: bool = True  # Eq. 11's LayerNorm (off: the residual alone)
    qkv_bias: bool = False  # Eq. 3-5 have none
    lipschitz_norm: str | None = None  # None (1 / sqrt(d_k), Eq. 6) | "paper" (Eq. 19)
    # the parameterised blocks by parameter prefix, in parameter order; derived
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("channels", "heads"):
            check_positive_int(getattr(self, name), f"GraphTransformerLayer {name}")
        if self.ffn_channels is not None:  # 0 would mean the default, 2 D, silently
            check_positive_int(self.ffn_channels, "GraphTransformerLayer ffn_channels")
        for name in ("layer_norm", "qkv_bias"):  # "False" would read as true
            flag = check_bool(getattr(self, name), f"GraphTransformerLayer {name}")
            object.__setattr__(self, name, flag)
        if self.channels % self.heads:
            raise ValueError(
                f"GraphTransformerLayer channels ({self.channels}) must be divisible by heads "
                f"({self.heads}): each head is d_k = D / H wide (Eq. 3-5)"
            )
        for name in ("dropout", "attn_dropout"):
            check_probability(getattr(self, name), f"GraphTransformerLayer {name}")
        d, d_ff = self.channels, self.ffn_channels or 2 * self.channels
        blocks: dict[str, Any] = {
            "attention": TransformerConv(  # raises on a bad edge_dim or lipschitz_norm
                d,
                d // self.heads,
                heads=self.heads,
                concat=True,
                dropout=self.attn_dropout,
                edge_dim=self.edge_dim,
                bias=self.qkv_bias,
                root_weight=False,  # the residual of Eq. 11 is F4's, not PyG's skip
                lipschitz_norm=self.lipschitz_norm,
            ),
            "output": Linear(d, d),
        }
        if self.layer_norm:
            blocks["norm1"] = LayerNorm(d, "node")
        blocks["ffn1"] = Linear(d, d_ff)
        blocks["ffn2"] = Linear(d_ff, d)
        if self.layer_norm:
            blocks["norm2"] = LayerNorm(d, "node")
        object.__setattr__(self, "blocks", blocks)

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``{block}.{name}`` and shapes, in order (module docstring)."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Each block's own initialisation, drawn from ``rng`` in parameter order: the
        attention as PyG's ``TransformerConv``, Glorot-uniform linears with zero biases,
        LayerNorm ones and zeros."""
        return init_flat_params(self.blocks, rng, backend, dtype)

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        h: Any,
        graph: Graph,
        edge_attr: Any = None,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
    ) -> tuple[Any, GraphTransformerLayerCache]:
        """``out (N, D)`` for ``h (N, D)`` on ``graph`` (its edges are the attention mask) with
        ``edge_attr (E, edge_dim)``; masks from ``noise`` or drawn from ``rng``. Raises
        :class:`~refimpl.validation.NonFiniteError` where the output overflows the dtype."""
        check_block_inputs(params, self.param_shapes(), "GraphTransformerLayer", h, self.channels)
        check_bool(training, "GraphTransformerLayer training")
        check_rng(rng, "GraphTransformerLayer rng")
        noise = dict(noise or {})
        unknown = sorted(set(noise) - {"attn_dropout", "dropout1", "dropout2"})
        if unknown:
            raise ValueError(
                f"noise has unknown keys {unknown}; GraphTransformerLayer takes 'attn_dropout' "
                "(E, H), 'dropout1' and 'dropout2' (N, D) keep-masks"
            )
        blocks, used = self.blocks, {}
        sub = lambda prefix: split_params(blocks, params, prefix)  # noqa: E731
        dropout = Dropout(self.dropout)

        def drop(key: str, x: Any) -> tuple[Any, DropoutCache]:
            return recorded_dropout(dropout, key, x, training, rng, noise, used)

        # F1 masked multi-head attention over the edges (N, D)
        a, attention = blocks["attention"].forward(
            sub("attention"),
            h,
            graph,
            edge_attr,
            training=training,
            rng=rng,
            attn_dropout_mask=noise.get("attn_dropout"),
        )
        if attention.dropout_cache.mask is not None:
            used["attn_dropout"] = attention.dropout_cache.mask
        # F2 output projection W^O (N, D)
        a, output = blocks["output"].forward(sub("output"), a)
        # F3 dropout
        a, dropout1 = drop("dropout1", a)
        # F4 residual and LayerNorm (N, D)
        z, norm1 = h + a, None
        if self.layer_norm:
            z, norm1 = blocks["norm1"].forward(sub("norm1"), z)
        # F5 FFN hidden layer (N, d_ff)
        f, ffn1 = blocks["ffn1"].forward(sub("ffn1"), z)
        f, relu = ReLU().forward({}, f)
        # F6 FFN output layer (N, D)
        f, ffn2 = blocks["ffn2"].forward(sub("ffn2"), f)
        # F7 dropout
        f, dropout2 = drop("dropout2", f)
        # F8 residual and LayerNorm (N, D)
        out, norm2 = z + f, None
        if self.layer_norm:
            out, norm2 = blocks["norm2"].forward(sub("norm2"), out)
        cache = GraphTransformerLayerCache(
            attention, output, dropout1, norm1, ffn1, relu, ffn2, dropout2, norm2, out, used
        )
        check_overflow(out, "GraphTransformerLayer.forward: its output", h.dtype)
        return out, cache

    # -- backward ----------------------------------------------------------------------
    def backward(
        self,
        params: dict[str, Any],
        cache: GraphTransformerLayerCache,
        d_out: Any,
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_h, d_params)``, or ``((d_h, d_edge_attr),
        d_params)`` with edge features (the protocol of ``check_gradients``). Raises
        :class:`~refimpl.validation.NonFiniteError` where a gradient overflows the dtype."""
        check_cotangent(d_out, cache.out.shape, cache.out.dtype, cache.out, name="d_out")
        return backward_checked(
            lambda: self._backward(params, cache, d_out), "GraphTransformerLayer", d_out.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: GraphTransformerLayerCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """B8-B1 of :meth:`backward` on a checked cotangent."""
        blocks, d_params = self.blocks, {}
        dropout = Dropout(self.dropout)

        # B8 (of F8) LayerNorm; the residual sends the same gradient to z and f
        d_z = d_out
        if cache.norm2 is not None:
            d_z = block_backward(blocks, params, "norm2", cache.norm2, d_z, d_params)
        # B7 (of F7) dropout
        d_f, _ = dropout.backward({}, cache.dropout2, d_z)
        # B6 (of F6), B5 (of F5) the FFN
        d_f = block_backward(blocks, params, "ffn2", cache.ffn2, d_f, d_params)
        d_f, _ = ReLU().backward({}, cache.relu, d_f)
        d_f = block_backward(blocks, params, "ffn1", cache.ffn1, d_f, d_params)
        d_z = d_z + d_f
        # B4 (of F4) LayerNorm; the residual again
        d_h = d_z
        if cache.norm1 is not None:
            d_h = block_backward(blocks, params, "norm1", cache.norm1, d_h, d_params)
        # B3 (of F3), B2 (of F2) dropout and output projection
        d_a, _ = dropout.backward({}, cache.dropout1, d_h)
        d_a = block_backward(blocks, params, "output", cache.output, d_a, d_params)
        # B1 (of F1) the attention, whose input also feeds the residual of F4
        d_inputs = block_backward(blocks, params, "attention", cache.attention, d_a, d_params)
        if self.edge_dim is None:
            return d_h + d_inputs, {name: d_params[name] for name in params}
        d_x, d_edge_attr = d_inputs
        return (d_h + d_x, d_edge_attr), {name: d_params[name] for name in params}
