"""The caches of :class:`refimpl.models.nodeformer.NodeFormer`: one per layer, and the model's."""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.nn.nodeformer.conv import NodeFormerCache
from refimpl.nn.nodeformer.edge_loss import EdgeLossCache
from refimpl.nn.norms.layernorm import LayerNormCache
from refimpl.ops.activations import ELUCache
from refimpl.ops.dropout import DropoutCache
from refimpl.ops.linear import LinearCache

__all__ = ["NodeFormerLayerCache", "NodeFormerModelCache"]


class NodeFormerLayerCache(NamedTuple):
    r"""One conv layer's caches (F5-F9); None for a step that is switched off.

    Attributes
    ----------
    conv : NodeFormerCache
        F5, the layer's :class:`~refimpl.nn.NodeFormerConv`.
    edge_loss : EdgeLossCache or None
        Its edge loss $\mathcal{L}_e^{(l)}$; None outside training or with $\lambda = 0$.
    norm : LayerNormCache or None
        F7, the LayerNorm's.
    activation : ELUCache or None
        F8, the ELU's.
    dropout : DropoutCache
        F9, the dropout's.
    """

    conv: NodeFormerCache
    edge_loss: EdgeLossCache | None
    norm: LayerNormCache | None
    activation: ELUCache | None
    dropout: DropoutCache


class NodeFormerModelCache(NamedTuple):
    r"""What :meth:`NodeFormer.backward` reads.

    Attributes
    ----------
    input_linear : LinearCache
        F1, the input map's.
    input_norm : LayerNormCache
        F2, its LayerNorm's.
    input_activation : ELUCache
        F3, its ELU's.
    input_dropout : DropoutCache
        F4, its dropout's.
    layers : tuple of NodeFormerLayerCache
        F5-F9, one per layer, layer 0 first.
    output : LinearCache
        F10, the output map's.
    edge_loss : 0-d array or None
        $\mathcal{L}_e$, the mean over layers of Eq. (10); None if not computed.
    noise : dict
        The draws used, as ``forward(noise=...)`` takes them.
    """

    input_linear: LinearCache
    input_norm: LayerNormCache
    input_activation: ELUCache
    input_dropout: DropoutCache
    layers: tuple[NodeFormerLayerCache, ...]
    output: LinearCache
    edge_loss: Any
    noise: dict[str, Any]
