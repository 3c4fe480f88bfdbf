"""Models: stacks of layers with their own forward/backward (see DESIGN.md's layer protocol)."""

from refimpl.models.gat import GAT, GATLayerCache, GATModelCache
from refimpl.models.nodeformer import NodeFormer, NodeFormerLayerCache, NodeFormerModelCache

__all__ = [
    "GAT",
    "GATLayerCache",
    "GATModelCache",
    "NodeFormer",
    "NodeFormerLayerCache",
    "NodeFormerModelCache",
]
