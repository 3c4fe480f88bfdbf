"""``full_graph``: every ordered pair within each graph, real pairs and their input edges."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.data.full_graph import full_graph
from refimpl.testing.strategies import graphs


@st.composite
def batches(draw: st.DrawFn, self_loops: bool = False) -> tuple[np.ndarray, int, np.ndarray]:
    """1-4 drawn graphs as one batch (edge_index, N, batch), nodes shuffled across graphs so
    a graph's nodes need not be contiguous: isolated nodes, one-node graphs, duplicates."""
    parts = draw(st.lists(graphs(max_nodes=5, max_edges=8, self_loops=self_loops), min_size=1,
                          max_size=4))  # fmt: skip
    sizes = [g.num_nodes for g in parts]
    offsets = np.cumsum([0, *sizes[:-1]])
    edges = np.concatenate([g.edge_index + o for g, o in zip(parts, offsets, strict=True)], 1)
    batch = np.repeat(np.arange(len(parts)), sizes)
    n = int(sum(sizes))
    new = np.array(draw(st.permutations(range(n))), dtype=np.int64)  # node i becomes new[i]
    relabelled = np.empty(n, dtype=np.int64)
    relabelled[new] = batch
    return new[edges].reshape(2, -1), n, relabelled


def literal_full_graph(edges: np.ndarray, n: int, batch: np.ndarray, self_pairs: bool) -> tuple:
    """The definition, pair by pair: (u, v) in one graph, real if some edge joins them, the
    lowest such edge id."""
    pairs, real, edge_id = [], [], []
    for u in range(n):
        for v in range(n):
            if batch[u] != batch[v] or (u == v and not self_pairs):
                continue
            ids = [e for e in range(edges.shape[1]) if (edges[0, e], edges[1, e]) == (u, v)]
            pairs.append((u, v))
            real.append(bool(ids))
            edge_id.append(min(ids) if ids else -1)
    return np.array(pairs, dtype=np.int64).reshape(-1, 2).T, np.array(real), np.array(edge_id)


@settings(deadline=None)
@given(batches(), st.booleans())
def test_full_graph_matches_the_pair_by_pair_definition(drawn: tuple, self_pairs: bool) -> None:
    edges, n, batch = drawn
    expected_pairs, expected_real, expected_id = literal_full_graph(edges, n, batch, self_pairs)
    fg = full_graph(edges, n, batch, self_pairs=self_pairs)
    np.testing.assert_array_equal(fg.graph.edge_index, expected_pairs)
    np.testing.assert_array_equal(fg.real, expected_real)
    np.testing.assert_array_equal(fg.edge_id, expected_id)
    sizes = np.bincount(batch)
    assert fg.num_pairs == int((sizes * (sizes - (0 if self_pairs else 1))).sum())


@settings(deadline=None)
@given(batches(self_loops=True))
def test_self_loops_are_real_self_pairs(drawn: tuple) -> None:
    edges, n, batch = drawn
    fg = full_graph(edges, n, batch, self_pairs=True)
    src, dst = fg.graph.edge_index
    loops = edges[0][edges[0] == edges[1]]
    assert set(src[fg.real & (src == dst)].tolist()) == set(loops.tolist())


def test_hand_checked_batch_of_two_graphs() -> None:
    # Graph 0 = nodes {0, 1, 2}, edges 0->1 (twice: ids 0 and 4), 1->0, 1->2; graph 1 = {3, 4},
    # edge 3->4. Pairs of graph 0 in (u, v) order: 01 02 10 12 20 21; graph 1: 34 43.
    edges = np.array([[0, 1, 1, 3, 0], [1, 0, 2, 4, 1]])
    fg = full_graph(edges, 5, np.array([0, 0, 0, 1, 1]))
    np.testing.assert_array_equal(
        fg.graph.edge_index, [[0, 0, 1, 1, 2, 2, 3, 4], [1, 2, 0, 2, 0, 1, 4, 3]]
    )
    np.testing.assert_array_equal(fg.real, [1, 0, 1, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(fg.edge_id, [0, -1, 1, 2, -1, -1, 3, -1])
    features = np.array([[10.0], [11.0], [12.0], [13.0], [14.0]])
    np.testing.assert_array_equal(
        fg.pair_features(features, fill=-1.0).ravel(), [10, -1, 11, 12, -1, -1, 13, -1]
    )


@pytest.mark.parametrize("n", [1, 2, 5])
def test_pair_order_is_dgl_complete_graph_order(n: int) -> None:
    # The released code's full graph is dgl.from_networkx(nx.complete_graph(n)), whose edges
    # are those of the directed copy in networkx's order.
    expected = np.array(list(nx.complete_graph(n).to_directed().edges), dtype=np.int64)
    fg = full_graph(np.zeros((2, 0), dtype=np.int64), n)
    np.testing.assert_array_equal(fg.graph.edge_index, expected.reshape(-1, 2).T)
    assert not fg.real.any()


def test_empty_and_one_node_graphs_have_no_pairs() -> None:
    assert full_graph(np.zeros((2, 0), dtype=np.int64), 0).num_pairs == 0
    one_node_graphs = full_graph(np.zeros((2, 0), dtype=np.int64), 3, np.array([0, 1, 2]))
    assert one_node_graphs.num_pairs == 0
    assert full_graph([[0], [0]], 1, self_pairs=True).real.tolist() == [True]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"edge_index": [[0], [0]], "num_nodes": 2}, ValueError, "self-loop"),
        ({"edge_index": [[0], [1]], "num_nodes": 2, "batch": [0, 1]}, ValueError, "joins graph"),
        ({"edge_index": [[0], [1]], "num_nodes": 2, "batch": [0.0, 0.0]}, TypeError, "integer"),
        ({"edge_index": [[0], [1]], "num_nodes": 2, "batch": [0]}, ValueError, r"shape \(2,\)"),
        ({"edge_index": [[0], [1]], "num_nodes": 2, "batch": [0, -1]}, ValueError, ">= 0"),
        ({"edge_index": [[0], [3]], "num_nodes": 2}, ValueError, "out of range"),
        ({"edge_index": [[0], [1]], "num_nodes": 2, "self_pairs": 1}, TypeError, "self_pairs"),
    ],
)
def test_bad_input_is_one_clear_line(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        full_graph(**kwargs)


def test_too_many_pairs_is_refused_before_allocating() -> None:
    with pytest.raises(ValueError, match="number of node pairs"):
        full_graph(np.zeros((2, 0), dtype=np.int64), 50_000)


def test_graph_input_is_not_changed() -> None:
    edges = np.array([[0, 1], [1, 0]])
    before = edges.copy()
    full_graph(edges, 2)
    np.testing.assert_array_equal(edges, before)
    assert isinstance(full_graph(edges, 2).graph, Graph)
