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
from refimpl.nn.layernorm import LayerNorm, LayerNormCache
from refimpl.nn.pairnorm import PairNorm, PairNormCache

__all__ = [
    "Attention",
    "AttentionCache",
    "GATCache",
    "GATConv",
    "LayerNorm",
    "LayerNormCache",
    "MultiHeadAttention",
    "MultiHeadAttentionCache",
    "PairNorm",
    "PairNormCache",
    "TransformerAttention",
    "TransformerAttentionCache",
]
