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

__all__ = [
    "Attention",
    "AttentionCache",
    "GATCache",
    "GATConv",
    "MultiHeadAttention",
    "MultiHeadAttentionCache",
    "TransformerAttention",
    "TransformerAttentionCache",
]
