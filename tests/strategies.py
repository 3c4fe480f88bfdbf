"""Hypothesis strategies shared by the tests: graphs with the edge cases that matter.

Structure (sizes, edges, flags) is drawn by Hypothesis; float values are filled
from a seeded generator (``seeds()``), which avoids the repeated-value ties that
``hypothesis.extra.numpy.arrays`` produces by default.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from refimpl import Graph


@st.composite
def graphs(
    draw: st.DrawFn,
    min_nodes: int = 1,
    max_nodes: int = 7,
    max_edges: int = 16,
    self_loops: bool | None = None,
) -> Graph:
    """Small directed multigraphs: isolated nodes, duplicate edges, optional self-loops.

    ``self_loops=None`` lets Hypothesis decide; ``True`` guarantees at least one
    (when there is an edge slot for it); ``False`` removes them all.
    """
    num_nodes = draw(st.integers(min_nodes, max_nodes))
    node = st.integers(0, num_nodes - 1)
    edges = draw(st.lists(st.tuples(node, node), max_size=max_edges))
    if self_loops is True:
        edges.append((draw(node),) * 2)
    elif self_loops is False:
        edges = [(u, v) for u, v in edges if u != v]
    if edges and draw(st.booleans()):  # force a duplicate edge
        edges.append(edges[draw(st.integers(0, len(edges) - 1))])
    edge_index = np.array(edges, dtype=np.int64).reshape(-1, 2).T
    return Graph(edge_index, num_nodes)


@st.composite
def bipartite_graphs(
    draw: st.DrawFn, max_src: int = 6, max_dst: int = 5, max_edges: int = 14
) -> Graph:
    """Bipartite graphs (sources and targets two node sets, PyG's ``size=(N_src, N_dst)``):
    isolated nodes on either side, duplicate edges, and edges ``i -> i`` (self-loops in
    PyG's sense, which a layer with ``add_self_loops`` replaces)."""
    num_src, num_dst = draw(st.integers(1, max_src)), draw(st.integers(1, max_dst))
    edge = st.tuples(st.integers(0, num_src - 1), st.integers(0, num_dst - 1))
    edges = draw(st.lists(edge, max_size=max_edges))
    if edges and draw(st.booleans()):  # force a duplicate edge
        edges.append(edges[draw(st.integers(0, len(edges) - 1))])
    edge_index = np.array(edges, dtype=np.int64).reshape(-1, 2).T
    return Graph(edge_index, num_src, num_dst_nodes=num_dst)


def seeds() -> st.SearchStrategy[int]:
    """A seed for ``numpy.random.default_rng`` that fills the values of a drawn structure."""
    return st.integers(0, 2**32 - 1)
