"""Graph: validation at construction, self-loops, degrees, conversions, caching."""

from __future__ import annotations

from collections import Counter

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl import graph as graph_module
from refimpl.backend import array_module, asarray, to_numpy
from refimpl.kernels.segment import Segments
from refimpl.nn import GATConv
from refimpl.testing import strict
from refimpl.testing.strategies import graphs
from refimpl.testing.strict import StrictArray


def _edges(graph: Graph) -> list[tuple[int, int]]:
    """The edge list (u, v) in order, as Python ints."""
    src, dst = to_numpy(graph.edge_index)
    return list(zip(src.tolist(), dst.tolist(), strict=True))


# -- construction and validation -----------------------------------------------------------------


def test_construction_keeps_edges_in_order():
    graph = Graph(np.array([[0, 2, 2], [1, 1, 0]], dtype=np.int32), 3)
    assert graph.edge_index.dtype == np.int64
    assert graph.edge_index.flags.c_contiguous
    assert _edges(graph) == [(0, 1), (2, 1), (2, 0)]
    assert (graph.num_nodes, graph.num_edges) == (3, 3)
    assert repr(graph) == "Graph(num_nodes=3, num_edges=3)"
    assert _edges(Graph([[0, 1], [1, 0]], 2)) == [(0, 1), (1, 0)]  # nested lists
    assert _edges(Graph(np.array([[0, 1], [1, 2]]).T.T, np.int64(3))) == [(0, 1), (1, 2)]


def test_construction_copies_the_input():
    # A Graph is immutable: writing to the caller's array afterwards changes nothing.
    edge_index = np.array([[0, 1], [1, 2]], dtype=np.int64)
    graph = Graph(edge_index, 3)
    edge_index[0, 0] = 2
    assert _edges(graph) == [(0, 1), (1, 2)]


@pytest.mark.parametrize(
    "edge_index",
    [
        np.zeros((3, 2), dtype=np.int64),
        np.zeros(4, dtype=np.int64),
        np.zeros((2, 2, 1), dtype=int),
        [[0, 1]],
    ],
    ids=["(E,2)", "1-D", "3-D", "one-row"],
)
def test_wrong_shape_is_a_value_error(edge_index):
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\)"):
        Graph(edge_index, 3)


def test_edge_list_shape_error_suggests_transpose():
    with pytest.raises(ValueError, match=r"got \(3, 2\); transpose an \(E, 2\) edge list"):
        Graph(np.array([[0, 1], [1, 2], [2, 0]]), 3)


@pytest.mark.parametrize(
    "edge_index",
    [np.array([[0.0, 1.0], [1.0, 0.0]]), [[0.0, 1.0], [1.0, 0.0]], np.array([[True], [False]])],
    ids=["float-array", "float-list", "bool"],
)
def test_non_integer_edge_index_is_a_type_error(edge_index):
    with pytest.raises(TypeError, match="edge_index must be an integer array, got dtype"):
        Graph(edge_index, 2)


def test_negative_index_is_a_value_error():
    with pytest.raises(ValueError, match=r"negative node index \(-1\).*\[0, 3\)"):
        Graph([[0, -1], [1, 2]], 3)


def test_index_out_of_range_is_a_value_error():
    with pytest.raises(ValueError, match=r"node index 3, out of range for num_nodes=3"):
        Graph([[0, 1], [3, 2]], 3)
    Graph([[0, 1], [2, 2]], 3)  # the largest valid index is fine


@pytest.mark.parametrize("num_nodes", [-1, -2])
def test_negative_num_nodes_is_a_value_error(num_nodes):
    with pytest.raises(ValueError, match=r"num_nodes must be >= 0"):
        Graph([], num_nodes)


def test_the_empty_graph_is_a_graph():
    # PyG's layers return an empty output on it (issue 22); so must ours
    empty = Graph([], 0)
    assert (empty.num_nodes, empty.num_edges) == (0, 0)
    assert empty.in_degree().shape == (0,)
    assert empty.remove_self_loops().add_self_loops().num_edges == 0
    assert Graph.from_networkx(nx.DiGraph()).num_nodes == 0


@pytest.mark.parametrize("num_nodes", [3.0, "3", True, None, np.float64(3)])
def test_non_int_num_nodes_is_a_type_error(num_nodes):
    with pytest.raises(TypeError, match="num_nodes must be an int"):
        Graph([[0], [1]], num_nodes)


@pytest.mark.parametrize(
    "edge_index",
    [[], [[], []], np.zeros((2, 0), dtype=np.int64), np.zeros((2, 0), dtype=np.uint8)],
    ids=["[]", "[[],[]]", "int64", "uint8"],
)
def test_empty_edge_list_is_fine(edge_index):
    graph = Graph(edge_index, 4)
    assert graph.num_edges == 0
    assert graph.edge_index.shape == (2, 0)
    assert graph.edge_index.dtype == np.int64
    np.testing.assert_array_equal(graph.in_degree(), [0, 0, 0, 0])
    np.testing.assert_array_equal(graph.to_dense_adjacency(), np.zeros((4, 4)))


def test_validation_on_the_strict_backend():
    with pytest.raises(ValueError, match="negative node index"):
        Graph(strict.asarray([[0, -1], [1, 0]]), 2)
    with pytest.raises(TypeError, match="integer array"):
        Graph(strict.asarray([[0.0], [1.0]]), 2)
    with pytest.raises(ValueError, match=r"shape \(2, E\)"):
        Graph(strict.asarray([0, 1]), 2)


# -- self-loops ------------------------------------------------------------------------------------


def test_add_self_loops_appends_one_per_node_and_keeps_existing():
    graph = Graph([[0, 1, 2], [1, 1, 0]], 3)  # 1 -> 1 already there
    looped = graph.add_self_loops()
    assert _edges(looped) == [(0, 1), (1, 1), (2, 0), (0, 0), (1, 1), (2, 2)]
    assert _edges(graph) == [(0, 1), (1, 1), (2, 0)]  # the original is untouched
    assert _edges(graph.remove_self_loops().add_self_loops()) == [
        (0, 1),
        (2, 0),
        (0, 0),
        (1, 1),
        (2, 2),
    ]


def test_remove_self_loops():
    graph = Graph([[0, 1, 1, 2, 2], [1, 1, 1, 0, 2]], 3)
    assert _edges(graph.remove_self_loops()) == [(0, 1), (2, 0)]
    np.testing.assert_array_equal(graph.is_self_loop(), [False, True, True, False, True])
    assert graph.remove_self_loops().remove_self_loops().num_edges == 2


@given(graph=graphs())
def test_self_loop_operations_against_edge_lists(graph):
    edges = _edges(graph)
    assert _edges(graph.remove_self_loops()) == [(u, v) for u, v in edges if u != v]
    assert _edges(graph.add_self_loops()) == edges + [(v, v) for v in range(graph.num_nodes)]


# -- degrees ---------------------------------------------------------------------------------------


@given(graph=graphs())
def test_degrees_against_naive_counts(graph):
    edges = _edges(graph)
    incoming = Counter(v for _, v in edges)
    outgoing = Counter(u for u, _ in edges)
    assert graph.in_degree().tolist() == [incoming[v] for v in range(graph.num_nodes)]
    assert graph.out_degree().tolist() == [outgoing[u] for u in range(graph.num_nodes)]
    assert int(graph.in_degree().sum()) == graph.num_edges


def test_degrees_count_duplicates_and_self_loops():
    graph = Graph([[0, 0, 1, 2], [1, 1, 1, 1]], 3)
    assert graph.in_degree().tolist() == [0, 4, 0]
    assert graph.out_degree().tolist() == [2, 1, 1]


# -- networkx and scipy ----------------------------------------------------------------------------


def test_from_networkx_undirected_gives_both_directions_and_loops_once():
    nx_graph = nx.Graph([(0, 1), (1, 2), (2, 2)])
    nx_graph.add_node(3)  # isolated
    graph = Graph.from_networkx(nx_graph)
    assert graph.num_nodes == 4
    assert sorted(_edges(graph)) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)]


def test_from_networkx_directed_as_is():
    graph = Graph.from_networkx(nx.DiGraph([(0, 1), (2, 1), (1, 1)]))
    assert _edges(graph) == [(0, 1), (1, 1), (2, 1)]  # networkx order: by source


def test_from_networkx_multigraph_keeps_parallel_edges():
    directed = Graph.from_networkx(nx.MultiDiGraph([(0, 1), (0, 1), (1, 0)]))
    assert sorted(_edges(directed)) == [(0, 1), (0, 1), (1, 0)]
    undirected = Graph.from_networkx(nx.MultiGraph([(0, 1), (0, 1), (1, 1)]))
    assert sorted(_edges(undirected)) == [(0, 1), (0, 1), (1, 0), (1, 0), (1, 1)]


@pytest.mark.parametrize(
    "nodes", [["a", "b"], [1, 2], [0, "a"], [0, 2]], ids=["strings", "from-one", "mixed", "gap"]
)
def test_from_networkx_needs_integer_labels_from_zero(nodes):
    nx_graph = nx.Graph()
    nx_graph.add_nodes_from(nodes)
    with pytest.raises(
        ValueError,
        match=r"nodes must be the integers 0\.\.N-1.*"
        r"convert_node_labels_to_integers",
    ):
        Graph.from_networkx(nx_graph)


def test_from_scipy_sparse_drops_explicit_zeros():
    data = np.array([1.0, 0.0, 2.5, -1.0])
    rows, cols = np.array([0, 1, 2, 2]), np.array([1, 2, 0, 2])
    adjacency = sp.csr_matrix((data, (rows, cols)), shape=(4, 4))
    assert adjacency.nnz == 4  # the zero is stored explicitly
    graph = Graph.from_scipy_sparse(adjacency)
    assert graph.num_nodes == 4
    assert sorted(_edges(graph)) == [(0, 1), (2, 0), (2, 2)]  # A[u, v] != 0 is u -> v
    assert graph.edge_index.dtype == np.int64
    assert Graph.from_scipy_sparse(sp.coo_array(adjacency)).num_edges == 3


def test_from_scipy_sparse_refuses_non_square_and_dense():
    with pytest.raises(ValueError, match=r"adjacency must be square, got shape \(2, 3\)"):
        Graph.from_scipy_sparse(sp.csr_matrix(np.ones((2, 3))))
    with pytest.raises(TypeError, match=r"expected a scipy\.sparse matrix, got ndarray"):
        Graph.from_scipy_sparse(np.eye(3))


@given(graph=graphs())
def test_scipy_round_trip_through_dense_adjacency(graph):
    dense = graph.to_dense_adjacency()
    rebuilt = Graph.from_scipy_sparse(sp.csr_matrix(dense))  # one edge per non-zero pair
    assert sorted(_edges(rebuilt)) == sorted(set(_edges(graph)))


def test_to_dense_adjacency_counts_duplicates():
    graph = Graph([[0, 0, 0, 2, 1], [1, 1, 1, 2, 0]], 3)
    np.testing.assert_array_equal(graph.to_dense_adjacency(), [[0, 3, 0], [1, 0, 0], [0, 0, 1]])


@given(graph=graphs())
def test_to_dense_adjacency_against_naive_counts(graph):
    counts = Counter(_edges(graph))
    expected = [[counts[(u, v)] for v in range(graph.num_nodes)] for u in range(graph.num_nodes)]
    assert graph.to_dense_adjacency().tolist() == expected


def test_to_dense_adjacency_refuses_huge_graphs():
    with pytest.raises(
        ValueError,
        match=r"for small graphs \(num_nodes <= 10000\); "
        r"this one has 10001 nodes",
    ):
        Graph([], 10_001).to_dense_adjacency()


def test_to_dense_adjacency_takes_a_graph_at_the_limit(monkeypatch):
    # The limit itself is allowed ("num_nodes <= limit"); at 10_000 nodes that is 800 MB, so
    # the limit is lowered to check the boundary.
    monkeypatch.setattr(graph_module, "_DENSE_LIMIT", 3)
    np.testing.assert_array_equal(Graph([[0], [2]], 3).to_dense_adjacency(), np.eye(3, k=2))
    with pytest.raises(ValueError, match="num_nodes <= 3"):
        Graph([], 4).to_dense_adjacency()


# -- backends and caching --------------------------------------------------------------------------


def test_to_backend_round_trip():
    graph = Graph([[0, 1, 1], [2, 2, 0]], 3)
    assert graph.to_backend("numpy") is graph
    on_strict = graph.to_backend("strict")
    assert isinstance(on_strict.edge_index, StrictArray)
    assert on_strict.to_backend("strict") is on_strict
    assert (on_strict.num_nodes, on_strict.num_edges) == (3, 3)
    back = on_strict.to_backend("numpy")
    assert isinstance(back.edge_index, np.ndarray)
    np.testing.assert_array_equal(back.edge_index, graph.edge_index)
    # Everything a Graph does also runs on the strict backend, never touching NumPy.
    assert isinstance(on_strict.in_degree(), StrictArray)
    assert to_numpy(on_strict.in_degree()).tolist() == [1, 0, 2]
    assert to_numpy(on_strict.out_degree()).tolist() == [1, 2, 0]
    assert _edges(on_strict.add_self_loops()) == _edges(graph.add_self_loops())
    assert _edges(on_strict.remove_self_loops()) == _edges(graph.remove_self_loops())
    np.testing.assert_array_equal(
        to_numpy(on_strict.to_dense_adjacency()), graph.to_dense_adjacency()
    )


def test_edge_index_on_is_cached():
    graph = Graph([[0, 1], [1, 0]], 2)
    assert graph.edge_index_on(np) is graph.edge_index  # its own module: no copy
    on_strict = graph.edge_index_on(strict)
    assert isinstance(on_strict, StrictArray)
    assert graph.edge_index_on(strict) is on_strict
    np.testing.assert_array_equal(to_numpy(on_strict), graph.edge_index)


@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_segments_are_cached_per_module(backend):
    graph = Graph([[0, 1, 2], [1, 2, 2]], 3)
    xp = array_module(backend)
    dst, src = graph.dst_segments(xp), graph.src_segments(xp)
    assert isinstance(dst, Segments) and isinstance(src, Segments)
    assert graph.dst_segments(xp) is dst
    assert graph.src_segments(xp) is src
    assert dst.xp is xp and src.xp is xp
    assert to_numpy(dst.index).tolist() == [1, 2, 2]
    assert to_numpy(src.index).tolist() == [0, 1, 2]
    assert dst.num_segments == src.num_segments == 3
    assert graph.add_self_loops() is graph.add_self_loops()
    assert graph.remove_self_loops() is graph.remove_self_loops()


@given(graph=graphs(), data=st.data())
def test_subgraph_against_the_dense_adjacency(graph, data):
    """A[nodes][:, nodes] of the dense counts, edge order kept."""
    nodes = np.array(
        data.draw(st.permutations(range(graph.num_nodes)).map(lambda p: p[: len(p) // 2 + 1]))
    )
    sub = graph.subgraph(nodes)
    dense = to_numpy(graph.to_dense_adjacency())  # [v, u] = number of edges u -> v
    np.testing.assert_array_equal(to_numpy(sub.to_dense_adjacency()), dense[np.ix_(nodes, nodes)])
    src, dst = graph.edge_index
    kept = np.isin(src, nodes) & np.isin(dst, nodes)
    position = {int(v): i for i, v in enumerate(nodes)}
    expected = [[position[int(u)] for u in src[kept]], [position[int(v)] for v in dst[kept]]]
    np.testing.assert_array_equal(sub.edge_index.reshape(2, -1), np.array(expected).reshape(2, -1))


@pytest.mark.parametrize(
    ("nodes", "match"),
    [
        ([], "non-empty 1-d int"),
        ([0.5], "non-empty 1-d int"),
        ([0, 3], r"lie in \[0, 3\)"),
        ([1, 1], "distinct"),
    ],
)
def test_subgraph_refuses_bad_nodes(nodes, match):
    with pytest.raises(ValueError, match=match):
        Graph([[0, 1], [1, 2]], 3).subgraph(np.array(nodes))


# -- read-only arrays ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_writing_to_edge_index_after_a_forward_cannot_make_segments_stale(backend):
    # Graph.edge_index was the graph's own writable array: writing to it after a forward
    # left the cached segments (built from it) describing other edges, and the next forward
    # mixed the two. test_construction_copies_the_input guarded only the caller's array.
    xp = array_module(backend)
    graph = Graph(asarray(np.array([[0, 1, 2], [1, 2, 0]]), backend=backend), 3)
    conv = GATConv(2, 2, heads=1)
    params = conv.init_params(np.random.default_rng(0), backend=backend)
    x = asarray(np.random.default_rng(1).standard_normal((3, 2)), backend=backend)
    before, _ = conv.forward(params, x, graph)
    for array in (graph.edge_index, graph.edge_index_on(xp), graph.dst_segments(xp).index):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 0
    other = strict if backend == "numpy" else np
    with pytest.raises(ValueError, match="read-only"):
        graph.edge_index_on(other)[0, 0] = 0  # the cached copy on another backend too
    after, _ = conv.forward(params, x, graph)
    np.testing.assert_array_equal(to_numpy(after), to_numpy(before))
    assert _edges(graph) == [(0, 1), (1, 2), (2, 0)]


def test_without_a_write_flag_edge_index_is_handed_out_as_a_copy(monkeypatch):
    # CuPy arrays have no write flag: there the graph keeps its array private and hands
    # out copies. Simulated on the CPU by a _freeze that cannot freeze (CuPy's answer).
    monkeypatch.setattr(graph_module, "_freeze", lambda array: None)
    graph = Graph([[0, 1], [1, 2]], 3)
    handed = graph.edge_index
    handed[0, 0] = 2
    assert graph.edge_index is not handed and _edges(graph) == [(0, 1), (1, 2)]
    on_strict = graph.edge_index_on(strict)
    on_strict[0, 0] = 2
    assert to_numpy(graph.edge_index_on(strict)).tolist() == [[0, 1], [1, 2]]
    assert to_numpy(graph.dst_segments(np).index).tolist() == [1, 2]
    # decided per array: a NumPy graph's copy on such a backend is handed out as a copy too
    monkeypatch.undo()
    graph = Graph([[0, 1], [1, 2]], 3)
    monkeypatch.setattr(graph_module, "_freeze", lambda array: None)
    graph.edge_index_on(strict)[0, 0] = 2
    assert to_numpy(graph.edge_index_on(strict)).tolist() == [[0, 1], [1, 2]]
    assert graph.edge_index_on(np) is graph.edge_index  # its own array is read-only


def test_construction_copies_once_into_c_order_without_aliasing():
    edges = np.array([[0, 1], [1, 2], [2, 0]], dtype=np.int32).T  # (2, 3), not C-contiguous
    graph = Graph(edges, 3)
    assert graph.edge_index.flags.c_contiguous and graph.edge_index.dtype == np.int64
    assert not np.shares_memory(graph.edge_index, edges)
    same_dtype = np.array([[0, 1], [1, 2]], dtype=np.int64)
    assert not np.shares_memory(Graph(same_dtype, 3).edge_index, same_dtype)
    # what is computed on call belongs to the caller and leaves the graph alone
    degrees = graph.in_degree()
    degrees[0] = 7
    assert graph.in_degree().tolist() == [1, 1, 1]
