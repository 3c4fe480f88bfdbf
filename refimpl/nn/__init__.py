"""Layers, one module each, every one a forward/backward pair (see DESIGN.md's layer protocol)."""

from refimpl.nn.attention import (
    Attention,
    AttentionCache,
    MultiHeadAttention,
    MultiHeadAttentionCache,
    TransformerAttention,
    TransformerAttentionCache,
)
from refimpl.nn.gat import GATCache, GATConv
from refimpl.nn.graph_transformer import GraphTransformerLayer, GraphTransformerLayerCache
from refimpl.nn.kernel_attention import (
    AllPairSoftmax,
    AllPairSoftmaxCache,
    KernelizedSoftmax,
    KernelizedSoftmaxCache,
)
from refimpl.nn.layernorm import LayerNorm, LayerNormCache
from refimpl.nn.lipschitz_norm import TransformerLipschitzCache
from refimpl.nn.nodeformer import NodeFormerCache, NodeFormerConv
from refimpl.nn.nodeformer_edge_loss import EdgeLossCache, NodeFormerEdgeLoss
from refimpl.nn.pairnorm import PairNorm, PairNormCache
from refimpl.nn.random_features import (
    PositiveRandomFeatures,
    RandomFeaturesCache,
    draw_projection,
)
from refimpl.nn.transformer_conv import TransformerConv, TransformerConvCache

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
