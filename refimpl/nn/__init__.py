"""Layers, one module each, every one a forward/backward pair (see DESIGN.md's layer protocol)."""

from refimpl.nn.gat import GATCache, GATConv

__all__ = ["GATCache", "GATConv"]
