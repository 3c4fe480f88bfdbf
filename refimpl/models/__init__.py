"""Models: stacks of layers with their own forward/backward (the layer protocol: docs/design.md)."""

from refimpl.models.gat import GAT, GATLayerCache, GATModelCache
from refimpl.models.graph_transformer import GraphTransformer, GraphTransformerCache
from refimpl.models.nodeformer import NodeFormer, NodeFormerLayerCache, NodeFormerModelCache

__all__ = [
    "GAT",
    "GATLayerCache",
    "GATModelCache",
    "GraphTransformer",
    "GraphTransformerCache",
    "NodeFormer",
    "NodeFormerLayerCache",
    "NodeFormerModelCache",
]
