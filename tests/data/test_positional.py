"""Laplacian positional encodings: eigen-invariants against an independently built dense
Laplacian (the eigenvectors of repeated eigenvalues are not unique, so only invariants are
tested), per-block batching, zero padding, the sign rule, the sparse path, PyG parity, and
the random sign flip. Random-walk encodings: against the study's released computation
written densely, return probabilities worked by hand, batching, and PyG's convention."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import array_module, to_numpy
from refimpl.data import positional
from refimpl.data.positional import laplacian_pe, random_sign_flip, random_walk_pe
from refimpl.testing import max_relative_error
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL

ATOL = 1e-10  # eigh / eigsh residuals are ~1e-15 here; invariants hold to rounding


def dense_laplacian(graph: Graph) -> np.ndarray:
    """``I - D^-1/2 A D^-1/2`` of the undirected simple graph, ``D^-1/2 = 0`` where ``D = 0``."""
    counts = np.asarray(graph.to_dense_adjacency())
    a = ((counts + counts.T) > 0).astype(np.float64)  # symmetric, duplicates merged
    np.fill_diagonal(a, 0.0)  # no self-loops
    degree = a.sum(axis=1)
    inv_sqrt = np.array([d**-0.5 if d > 0 else 0.0 for d in degree])
    return np.eye(graph.num_nodes) - inv_sqrt[:, None] * a * inv_sqrt[None, :]


def assert_eigen_invariants(pe: np.ndarray, graph: Graph, k: int) -> None:
    """``pe`` (n, k) holds unit, orthonormal eigenvectors of eigenvalues lambda_2..lambda_{c+1}
    (c = min(k, n - 1)) in order, zero columns after them, each signed by the rule."""
    n = graph.num_nodes
    columns = min(k, n - 1)
    assert pe.shape == (n, k) and pe.dtype == np.float64
    np.testing.assert_array_equal(pe[:, columns:], 0.0)  # zero padding, exactly
    vectors = pe[:, :columns]
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(columns), atol=ATOL)
    laplacian = dense_laplacian(graph)
    values = np.einsum("ij,ij->j", vectors, laplacian @ vectors)  # Rayleigh quotients
    np.testing.assert_allclose(laplacian @ vectors, vectors * values, atol=ATOL)
    np.testing.assert_allclose(values, np.linalg.eigvalsh(laplacian)[1 : columns + 1], atol=ATOL)
    assert np.all(np.diff(values) >= -ATOL)  # ascending
    for v in vectors.T:  # sign rule: the first (near-)largest |entry| is positive
        first = np.flatnonzero(np.abs(v) >= np.abs(v).max() - 1e-9)[0]
        assert v[first] > 0


@given(graph=graphs(max_nodes=9, max_edges=20), k=st.integers(1, 6))
@example(graph=Graph([[0, 1], [1, 0]], 3), k=2)  # an isolated node
@example(graph=Graph([], 1), k=1)  # one node: one zero row
def test_single_graph_invariants(graph: Graph, k: int) -> None:
    assert_eigen_invariants(laplacian_pe(graph, k), graph, k)


def _batch(parts: list[Graph]) -> tuple[Graph, np.ndarray]:
    ptr = np.concatenate([[0], np.cumsum([g.num_nodes for g in parts])])
    edges = np.concatenate([g.edge_index + p for g, p in zip(parts, ptr, strict=False)], axis=1)
    return Graph(edges, int(ptr[-1])), ptr


@given(
    parts=st.lists(graphs(max_nodes=7, max_edges=14), min_size=1, max_size=5), k=st.integers(1, 4)
)
def test_blocks_are_encoded_independently(parts: list[Graph], k: int) -> None:
    # Same-size blocks share one stacked eigh: each must still get its own eigenvectors.
    batch, ptr = _batch(parts + parts[:1])
    pe = laplacian_pe(batch, k, ptr)
    for j, part in enumerate(parts + parts[:1]):
        block = pe[ptr[j] : ptr[j + 1]]
        assert_eigen_invariants(block, part, k)
        np.testing.assert_allclose(block, laplacian_pe(part, k), atol=ATOL)


def test_isolated_node_has_eigenvalue_one_and_its_own_column() -> None:
    # 0 - 1 and the isolated node 2: L = [[1, -1, 0], [-1, 1, 0], [0, 0, 1]], eigenvalues 0, 1, 2
    # with eigenvectors (1, 1, 0)/sqrt 2, e_2, (1, -1, 0)/sqrt 2.
    pe = laplacian_pe(Graph([[0, 1], [1, 0]], 3), 3)
    half = np.sqrt(0.5)
    expected = [[0.0, half, 0.0], [0.0, -half, 0.0], [1.0, 0.0, 0.0]]
    np.testing.assert_allclose(pe, expected, atol=1e-15)


def test_small_graphs_are_zero_padded() -> None:
    # One edge (2 nodes, one non-trivial eigenvector) beside a lone node, k = 3.
    graph, ptr = _batch([Graph([[0], [1]], 2), Graph([], 1)])
    pe = laplacian_pe(graph, 3, ptr)
    half = np.sqrt(0.5)  # (1, -1)/sqrt 2: the tie between |+-0.707| goes to node 0, so +
    np.testing.assert_allclose(pe, [[half, 0, 0], [-half, 0, 0], [0, 0, 0]], atol=1e-15)


def test_duplicates_self_loops_and_direction_are_ignored() -> None:
    simple = Graph([[0, 1, 1, 2], [1, 0, 2, 1]], 3)  # path 0 - 1 - 2, both directions
    messy = Graph([[0, 0, 2, 1, 1], [1, 1, 1, 1, 0]], 3)  # one-way, duplicated, a loop at 1
    np.testing.assert_array_equal(laplacian_pe(messy, 2), laplacian_pe(simple, 2))


def test_sign_ties_on_a_mirror_symmetric_path_go_to_the_first_node() -> None:
    # On a path, every eigenvector is symmetric or antisymmetric: |v_i| = |v_{n-1-i}| exactly
    # in exact arithmetic, up to rounding in floating point. The first of each tied pair wins.
    n = 11
    path = Graph.from_networkx(nx.path_graph(n))
    pe = laplacian_pe(path, n - 1)
    for v in pe.T:
        np.testing.assert_allclose(np.abs(v), np.abs(v[::-1]), atol=1e-12)
        largest = np.abs(v).max()
        first = np.flatnonzero(np.abs(v) >= largest - 1e-9)[0]
        assert first < n / 2 and v[first] == pytest.approx(largest, abs=1e-12)
    assert_eigen_invariants(pe, path, n - 1)


def _sign_by_rule(vectors: np.ndarray) -> np.ndarray:
    """Each column times the sign of its first entry within 1e-9 of its largest magnitude."""
    out = vectors.copy()
    for j in range(vectors.shape[1]):
        v = vectors[:, j]
        first = np.flatnonzero(np.abs(v) >= np.abs(v).max() - 1e-9)[0]
        out[:, j] = v if v[first] > 0 else -v
    return out


HYPERCUBE = Graph.from_networkx(nx.convert_node_labels_to_integers(nx.hypercube_graph(3)))


@settings(max_examples=15)
@given(graph=graphs(min_nodes=4, max_nodes=12, max_edges=30), k=st.integers(1, 5))
@example(graph=Graph.from_networkx(nx.star_graph(9)), k=4)  # eigenvalue 1, multiplicity 8
@example(graph=HYPERCUBE, k=5)  # eigenvalues 2/3 and 4/3, multiplicity 3 each
def test_sparse_path_meets_the_same_invariants(graph: Graph, k: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        # every block of >= 4 nodes goes to eigsh (or its dense fallback when k + 1 >= n - 1)
        patch.setattr(positional, "DENSE_LIMIT", 3)
        pe = laplacian_pe(graph, k)
    assert_eigen_invariants(pe, graph, k)


def test_large_graph_uses_eigsh_and_matches_dense_eigh() -> None:
    # A random connected graph of 260 nodes (> DENSE_LIMIT), generic: distinct eigenvalues, so
    # each eigenvector is unique up to sign and the sign rule fixes it.
    graph = Graph.from_networkx(nx.connected_watts_strogatz_graph(260, 4, 0.3, seed=3))
    assert graph.num_nodes > positional.DENSE_LIMIT
    pe = laplacian_pe(graph, 6)
    values, vectors = np.linalg.eigh(dense_laplacian(graph))
    assert np.min(np.diff(values[:8])) > 1e-6  # distinct: the comparison below is meaningful
    np.testing.assert_allclose(pe, _sign_by_rule(vectors[:, 1:7]), atol=1e-8)
    assert_eigen_invariants(pe, graph, 6)


def test_pyg_add_laplacian_eigenvector_pe_agrees_up_to_sign() -> None:
    torch = pytest.importorskip("torch")
    transforms = pytest.importorskip("torch_geometric.transforms")
    from torch_geometric.data import Data

    g = nx.connected_watts_strogatz_graph(30, 4, 0.4, seed=1)  # distinct eigenvalues
    graph = Graph.from_networkx(g)
    data = Data(edge_index=torch.tensor(graph.edge_index), num_nodes=30)
    theirs = transforms.AddLaplacianEigenvectorPE(5, attr_name="pe", is_undirected=True)(data)
    theirs = theirs.pe.numpy().astype(np.float64)
    ours = laplacian_pe(graph, 5)
    signs = np.sign(np.sum(ours * theirs, axis=0))  # per column: +1 or -1
    np.testing.assert_allclose(theirs * signs, ours, atol=1e-5)  # PyG computes in float32


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((Graph([[0], [1]], 2), 0), ValueError, "k must be an int >= 1"),
        ((Graph([[0], [1]], 2), 2.0), ValueError, "k must be an int >= 1"),
        ((np.zeros((2, 1), dtype=int), 2), TypeError, "refimpl.Graph"),
        ((Graph([[0], [2]], 3), 1, np.array([0, 2, 3])), ValueError, r"edge 0 \(0 -> 2\) joins"),
        ((Graph([[0], [1]], 2), 1, np.array([0, 3])), ValueError, "end at the number of nodes"),
        ((Graph([[0], [1]], 2), 1, np.array([0.0, 2.0])), ValueError, "1-D integer array"),
    ],
)
def test_laplacian_pe_rejects_bad_input(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        laplacian_pe(*args)


# -- random sign flip ---------------------------------------------------------------------------


@given(seed=seeds(), k=st.integers(1, 8))
def test_random_sign_flip_is_one_sign_per_column_and_replays(seed: int, k: int) -> None:
    pe = np.random.default_rng(seed).standard_normal((5, k))
    flipped, signs = random_sign_flip(pe, np.random.default_rng(seed))
    assert signs.shape == (k,) and signs.dtype == pe.dtype
    assert set(np.unique(signs).tolist()) <= {-1.0, 1.0}
    np.testing.assert_array_equal(flipped, pe * signs)
    replay, _ = random_sign_flip(pe, np.random.default_rng(seed))
    np.testing.assert_array_equal(replay, flipped)


def test_random_sign_flip_draws_both_signs_evenly_and_keeps_input() -> None:
    pe = np.ones((2, 4000), dtype=np.float32)
    flipped, signs = random_sign_flip(pe, np.random.default_rng(0))
    assert flipped.dtype == np.float32 and np.all(pe == 1)
    assert abs(float(np.mean(signs == 1)) - 0.5) < 0.03  # 4000 fair coins: sd 0.008


def test_random_sign_flip_on_a_device_backend() -> None:
    strict = array_module("strict")
    pe = np.arange(6.0).reshape(2, 3)
    flipped, signs = random_sign_flip(strict.asarray(pe), np.random.default_rng(1))
    host, host_signs = random_sign_flip(pe, np.random.default_rng(1))
    np.testing.assert_array_equal(to_numpy(flipped), host)
    np.testing.assert_array_equal(to_numpy(signs), host_signs)


def test_random_sign_flip_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"pe must be a 2-D float array"):
        random_sign_flip(np.zeros(3), np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        random_sign_flip(np.zeros((3, 2)), 0)


# -- random-walk encodings -----------------------------------------------------------------------


def released_rwpe(graph: Graph, k: int, rows_are_sources: bool) -> np.ndarray:
    """gnn-lspe ``data/molecules.py`` ``init_positional_encoding('rand_walk')`` in dense NumPy:
    ``A = g.adjacency_matrix(scipy_fmt="csr")``, ``Dinv = diag(in_degrees.clip(1) ** -1)``,
    ``RW = A * Dinv`` (a matrix product), the diagonals of ``RW, RW^2, ..., RW^k``. DGL's
    adjacency put sources on the rows in some releases and targets in others: both here."""
    n = graph.num_nodes
    a = np.zeros((n, n))
    in_degree = np.zeros(n)
    for u, v in graph.edge_index.T:  # duplicates add up, as SciPy sums DGL's repeated entries
        a[(u, v) if rows_are_sources else (v, u)] += 1
        in_degree[v] += 1
    rw = a @ np.diag(np.clip(in_degree, 1, None) ** -1.0)
    return np.stack([np.diag(np.linalg.matrix_power(rw, j)) for j in range(1, k + 1)], axis=-1)


@given(graph=graphs(max_nodes=9, max_edges=20), k=st.integers(1, 7))
@example(graph=Graph(np.zeros((2, 0), dtype=np.int64), 3), k=2)  # no edge: all zero
def test_random_walk_pe_is_the_released_computation(graph: Graph, k: int) -> None:
    pe = random_walk_pe(graph, k)
    assert pe.shape == (graph.num_nodes, k) and pe.dtype == np.float64
    for rows_are_sources in (True, False):
        expected = released_rwpe(graph, k, rows_are_sources)
        assert max_relative_error(pe, expected) <= FORWARD_RTOL[np.dtype(np.float64)]
    assert np.all((pe >= 0) & (pe <= 1 + 1e-12))


PATH_3 = Graph([[0, 1, 1, 2], [1, 0, 2, 1]], 3)


def test_random_walk_pe_on_a_path_worked_by_hand() -> None:
    # Path 0 - 1 - 2: from an end the walk must go to 1, from 1 to either end (1/2 each). An
    # odd walk ends on the other colour of the bipartite path: 0. Back at an end after 2
    # steps: 1 * 1/2; after 4: (1/2 at this end) * 1/2 + (1/2 at the other end) * 1/2 = 1/2.
    # From the middle every even walk is back: 1.
    expected = [[0, 0.5, 0, 0.5], [0, 1, 0, 1], [0, 0.5, 0, 0.5]]
    np.testing.assert_allclose(random_walk_pe(PATH_3, 4), expected, rtol=1e-15)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        # Triangle: the walk is at +-1 mod 3 after step 1; it returns when its +-1 steps sum to
        # 0 mod 3. 2 steps: +1-1, -1+1 of 4 -> 1/2; 3 steps: +1+1+1, -1-1-1 of 8 -> 1/4;
        # 4 steps: sums -4..4 in steps of 2, 0 mod 3 only at 0, C(4, 2) = 6 of 16 -> 3/8.
        (3, [0, 1 / 2, 1 / 4, 3 / 8]),
        # Square: odd walks cannot return (bipartite); sum 0 mod 4 from 2 steps: 2 of 4;
        # from 4 steps: sums 0 (C(4,2) = 6) and +-4 (2): 8 of 16.
        (4, [0, 1 / 2, 0, 1 / 2]),
    ],
)
def test_random_walk_pe_on_cycles_worked_by_hand(n: int, expected: list) -> None:
    cycle = Graph.from_networkx(nx.cycle_graph(n))
    np.testing.assert_allclose(random_walk_pe(cycle, 4), np.tile(expected, (n, 1)), rtol=1e-15)


def test_random_walk_pe_counts_duplicates_and_walks_incoming_edges() -> None:
    # Star 1 - 0 - 2 with the edge 1 -> 0 twice: in(0) = 3, so the walk from 0 steps to 1
    # with probability 2/3 and to 2 with 1/3, and from 1 or 2 back to 0 (their one incoming
    # edge). Return after 2 steps: 1 from 0, 2/3 from 1, 1/3 from 2 (1/2 each if merged).
    star = Graph([[1, 1, 2, 0, 0], [0, 0, 0, 1, 2]], 3)
    np.testing.assert_allclose(random_walk_pe(star, 2), [[0, 1], [0, 2 / 3], [0, 1 / 3]])


def test_random_walk_pe_self_loops_isolated_and_source_only_nodes() -> None:
    # 0: a self-loop only, returns every step; 1: isolated, its walk stops at once: 0; 2 -> 3
    # and 3 -> 2, 4 -> 2: 2 has in-edges from 3 and 4 (1/2 each), 3 only from 2, 4 none: the
    # walk 2 -> 3 -> 2 returns with 1/2, the one from 3 with 1/2, and 4's walk stops: 0.
    graph = Graph([[0, 2, 3, 4], [0, 3, 2, 2]], 5)
    expected = [[1, 1, 1], [0, 0, 0], [0, 0.5, 0], [0, 0.5, 0], [0, 0, 0]]
    np.testing.assert_allclose(random_walk_pe(graph, 3), expected, rtol=1e-15)


@given(parts=st.lists(graphs(max_nodes=6, max_edges=12), min_size=1, max_size=4))
def test_random_walk_pe_of_a_batch_is_each_graphs_own(parts: list[Graph]) -> None:
    batch, ptr = _batch(parts)
    graph_of = np.repeat(np.arange(len(parts)), np.diff(ptr))
    pe = random_walk_pe(batch, 5, graph_of)
    np.testing.assert_array_equal(pe, random_walk_pe(batch, 5))  # batch only checks
    for j, part in enumerate(parts):
        block = pe[ptr[j] : ptr[j + 1]]
        assert max_relative_error(block, random_walk_pe(part, 5)) <= FORWARD_RTOL[np.dtype("f8")]


@given(graph=graphs(max_nodes=9, max_edges=20), k=st.integers(1, 6))
def test_random_walk_pe_matches_pyg_on_undirected_graphs_without_duplicates(
    graph: Graph, k: int
) -> None:
    torch = pytest.importorskip("torch")
    transforms = pytest.importorskip("torch_geometric.transforms")
    from torch_geometric.data import Data

    # PyG walks outgoing edges (out-degree) and stores one entry per (u, v) however many edges
    # join them: it agrees with the study where every edge has its reverse, each once.
    src, dst = graph.edge_index
    keys = np.unique(np.concatenate([src * graph.num_nodes + dst, dst * graph.num_nodes + src]))
    undirected = Graph(np.stack([keys // graph.num_nodes, keys % graph.num_nodes]), graph.num_nodes)
    data = Data(edge_index=torch.tensor(undirected.edge_index), num_nodes=graph.num_nodes)
    theirs = transforms.AddRandomWalkPE(k, attr_name="pe")(data).pe.numpy()
    np.testing.assert_allclose(random_walk_pe(undirected, k), theirs, atol=1e-6)  # PyG: float32


def test_random_walk_pe_differs_from_pyg_on_a_directed_graph() -> None:
    torch = pytest.importorskip("torch")
    transforms = pytest.importorskip("torch_geometric.transforms")
    from torch_geometric.data import Data

    # 0 -> 1, 1 -> 0, 2 -> 0. The study walks incoming edges: from 0 to 1 or 2 (1/2 each),
    # and 2 has none, so 0 and 1 return after 2 steps with 1/2. PyG walks outgoing edges:
    # 0 -> 1 -> 0 surely, so 1 and 1.
    graph = Graph([[0, 1, 2], [1, 0, 0]], 3)
    data = Data(edge_index=torch.tensor(graph.edge_index), num_nodes=3)
    theirs = transforms.AddRandomWalkPE(2, attr_name="pe")(data).pe.numpy()
    np.testing.assert_allclose(theirs, [[0, 1], [0, 1], [0, 0]])
    np.testing.assert_allclose(random_walk_pe(graph, 2), [[0, 0.5], [0, 0.5], [0, 0]])


def test_random_walk_pe_on_a_device_backend() -> None:
    strict = Graph(array_module("strict").asarray(PATH_3.edge_index), 3)
    np.testing.assert_array_equal(random_walk_pe(strict, 3), random_walk_pe(PATH_3, 3))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((PATH_3, 0), ValueError, r"k must be an int >= 1 \(walk lengths"),
        ((PATH_3, 2.0), ValueError, "k must be an int >= 1"),
        ((PATH_3, True), ValueError, "k must be an int >= 1"),
        ((PATH_3.edge_index, 2), TypeError, "refimpl.Graph"),
        ((Graph([[0], [1]], 2, num_dst_nodes=3), 2), ValueError, "bipartite"),
        ((PATH_3, 2, np.array([0, 0, 1])), ValueError, r"edge 2 \(1 -> 2\) joins graph 0 to"),
        ((PATH_3, 2, np.array([0, 0])), ValueError, r"one graph id per node \(3,\)"),
        ((PATH_3, 2, np.zeros(3)), ValueError, "1-D integer array"),
    ],
)
def test_random_walk_pe_rejects_bad_input(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        random_walk_pe(*args)
