"""refimpl: a reference implementation of graph attention with hand-written backward passes."""

from refimpl import backend
from refimpl.graph import Graph

__version__ = "0.1.0"
__all__ = ["Graph", "__version__", "backend"]
