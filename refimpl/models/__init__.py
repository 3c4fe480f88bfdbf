"""Models: stacks of layers with their own forward/backward (see DESIGN.md's layer protocol)."""

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
