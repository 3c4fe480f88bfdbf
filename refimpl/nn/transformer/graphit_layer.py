"""``GraphiTLayer``: one layer of GraphiT-GT (Mialon et al. 2021, built on Dwivedi & Bresson's
GT) as the massive-activation study ran it (``GraphiT_GT_Layer`` of
``gnn-lspe/layers/graphit_gt_layer.py``): :class:`~refimpl.nn.transformer.graphit_attention.
GraphiTAttention` on the nodes, then one node :class:`~refimpl.nn.transformer.stream.
TransformerStream` (dropout, ``O_h``, residual, norm, FFN ``D -> 2D -> D``, residual, norm)::

    F1  (a, t) = GraphiTAttention(h, pairs, e, kernel, real)   (N, D), (P, D)  attention_h
    F2  out = TransformerStream(a, h)                          (N, D)  dropout .. batch_norm2_h

``a`` and ``t`` are what the study logs (``malog_h['attention']``, ``malog_e['attention']``:
``cache.attention_out``, ``cache.attention.scores``). The edge features pass through unchanged
(the released layer returns ``(h, None)`` and the net hands every layer the same embedded
``e``), so ``t`` feeds nothing further. Parameters: ``attention.*`` then ``stream.*``; state
(BatchNorm's running statistics): ``stream.*``; noise keys: the stream's ``dropout1``,
``dropout2``. The body is :class:`~refimpl.nn.transformer.attention_stream.
AttentionStreamLayer`, shared with SAN's layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from refimpl.fields import check_bool, check_positive_int
from refimpl.graph import Graph
from refimpl.nn.transformer.attention_stream import AttentionStreamCache, AttentionStreamLayer
from refimpl.nn.transformer.graphit_attention import GraphiTAttention
from refimpl.nn.transformer.stream import TransformerStream

__all__ = ["GraphiTLayer", "GraphiTLayerCache"]

GraphiTLayerCache = AttentionStreamCache  # .attention is a GraphiTAttentionCache


@dataclass(frozen=True)
class GraphiTLayer(AttentionStreamLayer):
    r"""GraphiT-GT's attention and the released node stream around it: ``out =
    TransformerStream(GraphiTAttention(h, pairs, e, kernel, real), h)``
    (``GraphiT_GT_Layer.forward``; module docstring).

    With $a$ = :class:`~refimpl.nn.GraphiTAttention` $(h, e)$ and the released node stream
    (:class:`~refimpl.nn.TransformerStream`, $x = h$):

    $$
    z = \operatorname{Norm}_1\left(x + \operatorname{Drop}(a) W_O^\top + b_O\right), \quad
    y = \operatorname{Norm}_2\left(z + \operatorname{Drop}\left(\operatorname{ReLU}(z W_1^\top
    + b_1)\right) W_2^\top + b_2\right)
    $$

    Parameters
    ----------
    channels : int
        ``D`` (the released ``out_dim``), in and out.
    heads : int, default 8
        ``H``, dividing ``D`` (the study's configs).
    full_graph : bool, default False
        Attend over all pairs (``Q_2, K_2, E_2`` on non-edges); False: the input edges, as
        every GraphiT config of the study (:class:`~refimpl.nn.GraphiTAttention`).
    adaptive_edge_PE : bool, default True
        Multiply the weights by the pair's kernel value; read only with ``full_graph``.
    bias : bool, default False
        Biases on the attention's linear maps (the released ``use_bias``).
    explicit_bias : bool, default False
        The released explicit-bias branch (refused with ``full_graph``, where it fails).
    dropout : float in [0, 1), default 0.0
        The stream's two dropouts (the released ``dropout``).
    norm : {"batch", "layer", "none", "layer+batch"}, default "batch"
        The stream's norms (``"batch"``: the released ``batch_norm=True``).
    residual : bool, default True
        The stream's two residual connections, as released.

    Shapes
    ------
    ``h (N, D)``, pairs graph with ``P`` pairs, ``e (P, D)``, ``kernel (P,)`` (only where the
    attention reads it), ``real (P,)`` -> ``out (N, D)``.
    """

    SCORES_OUTPUT: ClassVar[bool] = True

    channels: int
    heads: int = 8
    full_graph: bool = False
    adaptive_edge_PE: bool = True
    bias: bool = False
    explicit_bias: bool = False
    dropout: float = 0.0
    norm: str = "batch"  # the released default (layer_norm=False, batch_norm=True)
    residual: bool = True
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_int(self.channels, "GraphiTLayer channels")
        flags = ("full_graph", "adaptive_edge_PE", "bias", "explicit_bias", "residual")
        for name in flags:  # in the layer's name
            object.__setattr__(self, name, check_bool(getattr(self, name), f"GraphiTLayer {name}"))
        attention = GraphiTAttention(
            self.channels, self.heads, self.full_graph, self.adaptive_edge_PE, self.bias,
            self.explicit_bias,
        )  # fmt: skip
        stream = TransformerStream(
            self.channels, dropout=self.dropout, norm=self.norm, residual=self.residual
        )
        object.__setattr__(self, "blocks", {"attention": attention, "stream": stream})

    def forward(
        self,
        params: dict[str, Any],
        h: Any,
        graph: Graph,
        e: Any,
        kernel: Any = None,
        real: Any = None,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> tuple[Any, AttentionStreamCache]:
        """``out (N, D)`` for ``h (N, D)`` over the pairs ``graph`` (``e (P, D)``, ``kernel
        (P,)``, ``real (P,)``, as :meth:`GraphiTAttention.forward` takes them); ``state``
        keyed ``stream.*`` (None: the initial statistics, training only)."""
        return self._forward_layer(params, h, (graph, e, kernel, real), training, rng, noise, state)
