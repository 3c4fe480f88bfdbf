"""Models: stacks of layers with their own forward/backward (see DESIGN.md's layer protocol)."""

from refimpl.models.gat import GAT, INITIALISERS, GATLayerCache, GATModelCache

__all__ = ["GAT", "INITIALISERS", "GATLayerCache", "GATModelCache"]
