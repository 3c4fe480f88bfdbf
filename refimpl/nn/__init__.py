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
from refimpl.nn.norms.batchnorm import BatchNorm, BatchNormCache
from refimpl.nn.norms.layernorm import LayerNorm, LayerNormCache
from refimpl.nn.norms.pairnorm import PairNorm, PairNormCache
from refimpl.nn.readout import MLPReadout, MLPReadoutCache
from refimpl.nn.transformer.attention_stream import AttentionStreamCache
from refimpl.nn.transformer.graph_transformer_layer import (
    GraphTransformerLayer,
    GraphTransformerLayerCache,
)
from refimpl.nn.transformer.graphit_attention import GraphiTAttention, GraphiTAttentionCache
from refimpl.nn.transformer.graphit_layer import GraphiTLayer
from refimpl.nn.transformer.gt_attention import GTAttention, GTAttentionCache
from refimpl.nn.transformer.gt_layer import GTLayer, GTLayerCache
from refimpl.nn.transformer.pair_attention import PairAttention, PairAttentionCache
from refimpl.nn.transformer.san_attention import SANAttention, SANAttentionCache
from refimpl.nn.transformer.san_layer import SANLayer
from refimpl.nn.transformer.san_lpe import LearnedLaplacianPE, LearnedLaplacianPECache
from refimpl.nn.transformer.stream import StreamCache, TransformerStream
from refimpl.nn.transformer.transformer_conv import TransformerConv, TransformerConvCache

__all__ = [
    "AllPairSoftmax",
    "AllPairSoftmaxCache",
    "Attention",
    "AttentionCache",
    "AttentionStreamCache",
    "BatchNorm",
    "BatchNormCache",
    "EdgeLossCache",
    "GATCache",
    "GATConv",
    "GTAttention",
    "GTAttentionCache",
    "GTLayer",
    "GTLayerCache",
    "GraphTransformerLayer",
    "GraphTransformerLayerCache",
    "GraphiTAttention",
    "GraphiTAttentionCache",
    "GraphiTLayer",
    "KernelizedSoftmax",
    "KernelizedSoftmaxCache",
    "LayerNorm",
    "LayerNormCache",
    "LearnedLaplacianPE",
    "LearnedLaplacianPECache",
    "MLPReadout",
    "MLPReadoutCache",
    "MultiHeadAttention",
    "MultiHeadAttentionCache",
    "NodeFormerCache",
    "NodeFormerConv",
    "NodeFormerEdgeLoss",
    "PairAttention",
    "PairAttentionCache",
    "PairNorm",
    "PairNormCache",
    "PositiveRandomFeatures",
    "RandomFeaturesCache",
    "SANAttention",
    "SANAttentionCache",
    "SANLayer",
    "StreamCache",
    "TransformerAttention",
    "TransformerAttentionCache",
    "TransformerConv",
    "TransformerConvCache",
    "TransformerLipschitzCache",
    "TransformerStream",
    "draw_projection",
]
