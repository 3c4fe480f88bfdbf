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
from refimpl.nn.kernel_attention import (
    AllPairSoftmax,
    AllPairSoftmaxCache,
    KernelizedSoftmax,
    KernelizedSoftmaxCache,
)
from refimpl.nn.layernorm import LayerNorm, LayerNormCache
from refimpl.nn.pairnorm import PairNorm, PairNormCache
from refimpl.nn.random_features import (
    PositiveRandomFeatures,
    RandomFeaturesCache,
    draw_projection,
)

__all__ = [
    "AllPairSoftmax",
    "AllPairSoftmaxCache",
    "Attention",
    "AttentionCache",
    "GATCache",
    "GATConv",
    "KernelizedSoftmax",
    "KernelizedSoftmaxCache",
    "LayerNorm",
    "LayerNormCache",
    "MultiHeadAttention",
    "MultiHeadAttentionCache",
    "PairNorm",
    "PairNormCache",
    "PositiveRandomFeatures",
    "RandomFeaturesCache",
    "TransformerAttention",
    "TransformerAttentionCache",
    "draw_projection",
]
