"""``SANLayer``: one layer of SAN (Kreuzer et al. 2021) as the massive-activation study ran it
(``SAN_GT_Layer`` of ``gnn-lspe/layers/san_gt_layer.py``, ``GraphTransformerLayer`` of
``SAN/layers/graph_transformer_layer.py``): :class:`~refimpl.nn.transformer.san_attention.
SANAttention` on the nodes, then one node :class:`~refimpl.nn.transformer.stream.
TransformerStream` (dropout, ``O_h``, residual, norm, FFN, residual, norm)::

    F1  a = SANAttention(h, pairs, e, real)         (N, D)  attention_h
    F2  out = TransformerStream(a, h)               (N, D)  dropout .. batch_norm2_h

The edge features pass through unchanged (the released layer returns ``e``, or None): every
layer reads the embedded ``e``. Parameters: ``attention.*`` then ``stream.*``; state (BatchNorm's
running statistics): ``stream.*``; noise keys: the stream's ``dropout1``, ``dropout2``. The
body is :class:`~refimpl.nn.transformer.attention_stream.AttentionStreamLayer`, shared with
GraphiT-GT's layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refimpl.fields import check_bool, check_positive_int
from refimpl.graph import Graph
from refimpl.nn.transformer.attention_stream import AttentionStreamCache, AttentionStreamLayer
from refimpl.nn.transformer.san_attention import SANAttention
from refimpl.nn.transformer.stream import TransformerStream

__all__ = ["SANLayer", "SANLayerCache"]

SANLayerCache = AttentionStreamCache  # .attention is a SANAttentionCache


@dataclass(frozen=True)
class SANLayer(AttentionStreamLayer):
    r"""SAN's attention and the released node stream around it: ``out = TransformerStream(
    SANAttention(h, pairs, e, real), h)`` (``SAN_GT_Layer.forward``; module docstring).

    With $a$ = :class:`~refimpl.nn.SANAttention` $(h, e)$ and the released node stream
    (:class:`~refimpl.nn.TransformerStream`, $x = h$):

    $$
    z = \operatorname{Norm}_1\left(x + \operatorname{Drop}(a) W_O^\top + b_O\right), \quad
    y = \operatorname{Norm}_2\left(z + \operatorname{Drop}\left(\operatorname{ReLU}(z W_1^\top
    + b_1)\right) W_2^\top + b_2\right)
    $$

    Parameters
    ----------
    channels : int
        ``D`` (``hidden_dim``), in and out.
    heads : int, default 8
        ``H``, dividing ``D`` (the study's configs).
    full_graph : bool, default True
        Attend over all pairs with SAN's $\gamma$ weights; False: the input edges, no
        $\gamma$ (:class:`~refimpl.nn.SANAttention`).
    gamma : float >= 0, default 0.1
        The non-edge pairs' weight $\gamma / (\gamma + 1)$ (its start with ``learn_gamma``).
    learn_gamma : bool, default False
        Make $\gamma$ a parameter ``gamma (1,)``, clamped to ``[0, 1]`` (gnn-lspe's ``SANNet``).
    bias : bool, default False
        Biases on the attention's linear maps (the released ``use_bias``).
    dropout : float in [0, 1), default 0.0
        The stream's two dropouts (the ZINC configs).
    norm : {"batch", "layer", "none", "layer+batch"}, default "batch"
        The stream's norms (the configs: ``"batch"``).
    residual : bool, default True
        The stream's two residual connections.

    Shapes
    ------
    ``h (N, D)``, pairs graph with ``P`` pairs, ``e (P, D)``, ``real (P,)`` -> ``out (N, D)``.
    """

    channels: int
    heads: int = 8
    full_graph: bool = True
    gamma: float = 0.1
    learn_gamma: bool = False
    bias: bool = False
    dropout: float = 0.0
    norm: str = "batch"
    residual: bool = True
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_int(self.channels, "SANLayer channels")
        for name in ("full_graph", "learn_gamma", "bias", "residual"):  # in the layer's name
            object.__setattr__(self, name, check_bool(getattr(self, name), f"SANLayer {name}"))
        attention = SANAttention(
            self.channels, self.heads, self.full_graph, self.gamma, self.learn_gamma, self.bias
        )
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
        real: Any = None,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> tuple[Any, AttentionStreamCache]:
        """``out (N, D)`` for ``h (N, D)`` over the pairs ``graph`` (``e (P, D)``, ``real
        (P,)``); ``state`` keyed ``stream.*`` (None: the initial statistics, training only)."""
        return self._forward_layer(params, h, (graph, e, real), training, rng, noise, state)
