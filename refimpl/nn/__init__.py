"""Layers, grouped by paper or family, every one a forward/backward pair (the layer protocol:
docs/design.md)."""

from refimpl.nn.gat.conv import GATCache, GATConv
from refimpl.nn.lipschitz.multi_head_attention import (
    Attention,
    AttentionCache,
    MultiHeadAttention,
    MultiHeadAttentionCache,
    TransformerAttention,
    TransformerAttentionCache,
)
from refimpl.nn.lipschitz.neighbourhood_norm import TransformerLipschitzCache
from refimpl.nn.nodeformer.all_pair_softmax import AllPairSoftmax, AllPairSoftmaxCache
from refimpl.nn.nodeformer.conv import NodeFormerCache, NodeFormerConv
from refimpl.nn.nodeformer.edge_loss import EdgeLossCache, NodeFormerEdgeLoss
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax, KernelizedSoftmaxCache
from refimpl.nn.nodeformer.random_features import (
    PositiveRandomFeatures,
    RandomFeaturesCache,
    draw_projection,
)
from refimpl.nn.norms.layernorm import LayerNorm, LayerNormCache
from refimpl.nn.norms.pairnorm import PairNorm, PairNormCache
from refimpl.nn.transformer.graph_transformer_layer import (
    GraphTransformerLayer,
    GraphTransformerLayerCache,
)
from refimpl.nn.transformer.transformer_conv import TransformerConv, TransformerConvCache

__all__ = [
    "AllPairSoftmax",
    "AllPairSoftmaxCache",
    "Attention",
    "AttentionCache",
    "EdgeLossCache",
    "GATCache",
    "GATConv",
    "GraphTransformerLayer",
    "GraphTransformerLayerCache",
    "KernelizedSoftmax",
    "KernelizedSoftmaxCache",
    "LayerNorm",
    "LayerNormCache",
    "MultiHeadAttention",
    "MultiHeadAttentionCache",
    "NodeFormerCache",
    "NodeFormerConv",
    "NodeFormerEdgeLoss",
    "PairNorm",
    "PairNormCache",
    "PositiveRandomFeatures",
    "RandomFeaturesCache",
    "TransformerAttention",
    "TransformerAttentionCache",
    "TransformerConv",
    "TransformerConvCache",
    "TransformerLipschitzCache",
    "draw_projection",
]
