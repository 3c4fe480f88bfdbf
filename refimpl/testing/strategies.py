"""Hypothesis strategies for graph layers: the small graphs where graph-attention bugs show.

The cases that find the bugs people ship in GAT code are structural: a node with no incoming
edge (self-loops must reach it), duplicate edges (each its own coefficient), an existing
self-loop (replaced, not doubled), a single node, the empty graph, two node sets of different
sizes (a bipartite layer's loops). These strategies draw them, and shrink towards the
smallest graph that still fails. refimpl's own tests draw from them too.

Structure (sizes, edges, flags) is drawn by Hypothesis; float values are filled from a seeded
generator (:func:`seeds`), which avoids the repeated-value ties that
``hypothesis.extra.numpy.arrays`` produces by default and keeps shrinking about structure.

Examples
--------
::

    from hypothesis import given
    from refimpl.testing import strategies as rst

    @given(graph=rst.graphs(max_nodes=5), seed=rst.seeds())
    def test_my_layer_on_small_graphs(graph, seed):
        x = np.random.default_rng(seed).standard_normal((graph.num_nodes, 3))
        ...  # graph.edge_index is the (2, E) int64 edge list, row 0 the sources

    @given(config=rst.layer_configs("GATv2Conv", heads=1))
    def test_every_gatv2_option(config):
        conv = GATv2Conv(**config["kwargs"])  # PyG's constructor arguments
        ...

Needs Hypothesis (the ``test`` extra).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

from refimpl.graph import Graph

__all__ = [
    "LAYERS",
    "GraphBatch",
    "bipartite_graphs",
    "edge_features",
    "graph_batches",
    "graphs",
    "layer_configs",
    "node_features",
    "seeds",
]

# The PyG layers refimpl checks (refimpl.interop.crosscheck), whose options layer_configs draws.
LAYERS = ("GATConv", "GATv2Conv", "TransformerConv")
# fill_value choices for the self-loops' edge features: PyG's reductions and constants.
# Reductions fail inside PyG on a bipartite graph with more targets than sources (an index
# out of range), so bipartite configurations draw the constants only.
_REDUCTIONS = ("mean", "add", "max", "min", "mul")
_CONSTANTS = (0.5, None)


def seeds() -> st.SearchStrategy[int]:
    """A seed for ``numpy.random.default_rng`` that fills the values of a drawn structure."""
    return st.integers(0, 2**32 - 1)


def _edge_list(edges: list[tuple[int, int]]) -> np.ndarray:
    return np.array(edges, dtype=np.int64).reshape(-1, 2).T  # (2, E), also for E = 0


@st.composite
def graphs(
    draw: st.DrawFn,
    min_nodes: int = 1,
    max_nodes: int = 7,
    max_edges: int = 16,
    self_loops: bool | None = None,
) -> Graph:
    """Small directed multigraphs: isolated nodes, duplicate edges, optional self-loops.

    Parameters
    ----------
    min_nodes, max_nodes : int
        The node count ``N`` is drawn in ``[min_nodes, max_nodes]``; ``min_nodes=0`` admits
        the empty graph.
    max_edges : int
        Edges drawn (one more may be a forced duplicate, one more a forced self-loop).
    self_loops : bool or None
        None lets Hypothesis decide; True guarantees at least one (when there is a node);
        False removes them all.

    Returns
    -------
    Graph
        ``edge_index`` (2, E) int64, row 0 the sources; shrinks towards one node, no edges.
    """
    num_nodes = draw(st.integers(min_nodes, max_nodes))
    if num_nodes == 0:
        return Graph(_edge_list([]), 0)
    node = st.integers(0, num_nodes - 1)
    edges = draw(st.lists(st.tuples(node, node), max_size=max_edges))
    if self_loops is True:
        edges.append((draw(node),) * 2)
    elif self_loops is False:
        edges = [(u, v) for u, v in edges if u != v]
    if edges and draw(st.booleans()):  # force a duplicate edge
        edges.append(edges[draw(st.integers(0, len(edges) - 1))])
    return Graph(_edge_list(edges), num_nodes)


@st.composite
def bipartite_graphs(
    draw: st.DrawFn, max_src: int = 6, max_dst: int = 5, max_edges: int = 14
) -> Graph:
    """Bipartite graphs (sources and targets two node sets, PyG's ``size=(N_src, N_dst)``).

    Isolated nodes on either side, duplicate edges, and edges ``i -> i`` (self-loops in PyG's
    sense, which a layer with ``add_self_loops`` replaces by loops for the ``min(N_src,
    N_dst)`` nodes both sets have). ``graph.num_nodes`` is ``N_src``,
    ``graph.num_dst_nodes`` ``N_dst``; shrinks towards one node on each side, no edges.
    """
    num_src, num_dst = draw(st.integers(1, max_src)), draw(st.integers(1, max_dst))
    edge = st.tuples(st.integers(0, num_src - 1), st.integers(0, num_dst - 1))
    edges = draw(st.lists(edge, max_size=max_edges))
    if edges and draw(st.booleans()):  # force a duplicate edge
        edges.append(edges[draw(st.integers(0, len(edges) - 1))])
    return Graph(_edge_list(edges), num_src, num_dst_nodes=num_dst)


@st.composite
def node_features(
    draw: st.DrawFn, num_nodes: int, channels: int, scale: float | tuple[float, float] = 1.0
) -> np.ndarray:
    """``(num_nodes, channels)`` float64 features: standard normal values times a magnitude.

    ``scale`` is the magnitude, or a range ``(low, high)`` from which a power of ten is drawn
    (``scale=(1e-3, 1e3)`` reaches the small and large activations where a softmax without
    its max shift, or a LeakyReLU on the wrong side, goes wrong). Values come from a drawn
    seed, so no two entries tie.
    """
    if isinstance(scale, tuple):
        low, high = (int(np.round(np.log10(s))) for s in scale)
        scale = 10.0 ** draw(st.integers(min(low, high), max(low, high)))
    rng = np.random.default_rng(draw(seeds()))
    return scale * rng.standard_normal((num_nodes, channels))


def edge_features(
    num_edges: int, edge_dim: int, scale: float | tuple[float, float] = 1.0
) -> st.SearchStrategy[np.ndarray]:
    """``(num_edges, edge_dim)`` float64 edge features, one row per edge of ``edge_index``
    (:func:`node_features` with edges for nodes)."""
    return node_features(num_edges, edge_dim, scale)


class GraphBatch(NamedTuple):
    """Several small graphs as one disjoint union, as a data loader collates them."""

    graph: Graph  # the union: graph g's nodes follow those of graphs 0..g-1
    batch: np.ndarray  # (N,) int64: the graph each node belongs to (PyG's ``batch``)
    num_graphs: int


@st.composite
def graph_batches(
    draw: st.DrawFn, max_graphs: int = 4, max_nodes: int = 6, max_rings: int = 2
) -> GraphBatch:
    """Batches of small molecule-like graphs: connected, undirected (each bond stored as two
    directed edges), no self-loops, a tree of bonds plus up to ``max_rings`` ring closures.

    A batch has 1 to ``max_graphs`` graphs of 1 to ``max_nodes`` atoms; a one-atom graph
    has no edge (an isolated node). Shrinks towards one graph of one atom.
    """
    edges: list[tuple[int, int]] = []
    batch: list[int] = []
    num_graphs = draw(st.integers(1, max_graphs))
    for g in range(num_graphs):
        offset, size = len(batch), draw(st.integers(1, max_nodes))
        bonds = {(draw(st.integers(0, atom - 1)), atom) for atom in range(1, size)}  # a tree
        if size > 2:
            atom = st.integers(0, size - 1)
            rings = draw(st.lists(st.tuples(atom, atom), max_size=max_rings))
            bonds |= {(min(u, v), max(u, v)) for u, v in rings if u != v}
        for u, v in sorted(bonds):
            edges += [(offset + u, offset + v), (offset + v, offset + u)]
        batch += [g] * size
    graph = Graph(_edge_list(edges), len(batch))
    return GraphBatch(graph, np.array(batch, dtype=np.int64), num_graphs)


def _option(draw: st.DrawFn, fixed: dict[str, Any], name: str, default: Any) -> Any:
    """``fixed[name]`` (drawn if it is a strategy) or a draw of ``default`` (a strategy)."""
    value = fixed.pop(name, default)
    return draw(value) if isinstance(value, st.SearchStrategy) else value


@st.composite
def layer_configs(
    draw: st.DrawFn,
    layer: str = "GATConv",
    *,
    bipartite: bool = False,
    max_channels: int = 3,
    max_heads: int = 3,
    **fixed: Any,
) -> dict[str, Any]:
    """Configurations of a PyG layer refimpl checks, drawn from PyG's option space.

    Parameters
    ----------
    layer : {"GATConv", "GATv2Conv", "TransformerConv"}
        PyG's class name.
    bipartite : bool
        ``in_channels`` a pair ``[F_src, F_dst]`` (PyG's bipartite layers).
    max_channels, max_heads : int
        Bounds of the drawn ``in_channels``, ``out_channels`` and ``heads``.
    **fixed
        Constructor arguments to hold (``heads=1``) or to draw from a strategy of your own
        (``negative_slope=st.sampled_from([0.2])``); the rest are drawn.

    Returns
    -------
    dict
        ``{"framework": "pyg", "layer": layer, "kwargs": {...}}``: the ``config`` entry of a
        crosscheck file (:mod:`refimpl.interop.crosscheck`), ``kwargs`` PyG's constructor
        arguments (``GATv2Conv(**config["kwargs"])``). Drawn: channels, heads, ``concat``,
        ``dropout`` (0 or 0.5; comparisons run in evaluation mode), ``bias``, ``edge_dim``
        (None, 1 or 2) with ``fill_value``, and per layer ``negative_slope``,
        ``add_self_loops``, ``residual``, ``share_weights`` (v2), ``beta`` and
        ``root_weight`` (TransformerConv).
    """
    if layer not in LAYERS:
        raise ValueError(f"layer_configs: layer must be one of {list(LAYERS)}, got {layer!r}")
    fixed = dict(fixed)
    size = st.integers(1, max_channels)
    in_channels = [draw(size), draw(size)] if bipartite else draw(size)
    kwargs: dict[str, Any] = {
        "in_channels": _option(draw, fixed, "in_channels", st.just(in_channels)),
        "out_channels": _option(draw, fixed, "out_channels", size),
        "heads": _option(draw, fixed, "heads", st.integers(1, max_heads)),
        "concat": _option(draw, fixed, "concat", st.booleans()),
        "dropout": _option(draw, fixed, "dropout", st.sampled_from([0.0, 0.5])),
        "bias": _option(draw, fixed, "bias", st.booleans()),
        "edge_dim": _option(draw, fixed, "edge_dim", st.sampled_from([None, 1, 2])),
    }
    if layer == "TransformerConv":
        kwargs["root_weight"] = _option(draw, fixed, "root_weight", st.booleans())
        kwargs["beta"] = _option(draw, fixed, "beta", st.booleans()) and kwargs["root_weight"]
    else:
        fills = _CONSTANTS if bipartite else _REDUCTIONS + _CONSTANTS
        kwargs["negative_slope"] = _option(
            draw, fixed, "negative_slope", st.sampled_from([0.2, 0.01, 0.5])
        )
        kwargs["add_self_loops"] = _option(draw, fixed, "add_self_loops", st.booleans())
        kwargs["residual"] = _option(draw, fixed, "residual", st.booleans())
        if layer == "GATv2Conv":
            kwargs["share_weights"] = _option(
                draw, fixed, "share_weights", st.just(False) if bipartite else st.booleans()
            )
        if kwargs["edge_dim"] is not None or "fill_value" in fixed:
            kwargs["fill_value"] = _option(draw, fixed, "fill_value", st.sampled_from(fills))
    if fixed:
        raise ValueError(
            f"layer_configs: {layer} has no option {sorted(fixed)[0]!r} refimpl checks; "
            f"its options: {sorted(kwargs)}"
        )
    return {"framework": "pyg", "layer": layer, "kwargs": kwargs}
