"""A bipartite layer as a block of separate inputs, for ``check_gradients``.

GATConv and TransformerConv take ``x = (x_src, x_dst)`` as one argument, which
``check_gradients`` passes through unperturbed; :class:`Bipartite` takes the two sides as
separate inputs (``forward(params, x_src, x_dst, graph, [edge_attr], ...)``) and returns
their gradients flat, so each side is checked.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl import Graph


class Bipartite(NamedTuple):
    """``conv.forward(params, (x_src, x_dst), graph, edge_attr)`` with separate inputs."""

    conv: Any  # GATConv or TransformerConv

    def forward(self, params: dict, x_src: Any, x_dst: Any, graph: Graph, *edge_attr: Any,
                **kwargs: Any) -> tuple:  # fmt: skip
        return self.conv.forward(params, (x_src, x_dst), graph, *edge_attr, **kwargs)

    def backward(self, params: dict, cache: Any, d_out: Any) -> tuple:
        d_inputs, d_params = self.conv.backward(params, cache, d_out)
        if self.conv.edge_dim is None:
            return d_inputs, d_params
        (d_x_src, d_x_dst), d_edge_attr = d_inputs
        return (d_x_src, d_x_dst, d_edge_attr), d_params
