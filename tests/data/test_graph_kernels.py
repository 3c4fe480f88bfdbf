"""GraphiT's kernels: the released ``k_RW`` computation, closed forms, symmetry, definiteness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.data.full_graph import full_graph
from refimpl.data.graph_kernels import diffusion_kernel, laplacian, random_walk_kernel
from refimpl.testing.strategies import graphs
from refimpl.testing.tolerances import FORWARD_RTOL
from tests.data.test_full_graph import batches

RTOL = FORWARD_RTOL[np.dtype(np.float64)]


def released_k_rw(edges: np.ndarray, n: int, p: int, gamma: float, sym: bool) -> np.ndarray:
    """``make_full_graph`` of gnn-lspe/data/molecules.py, densely: A counts edges u -> v, N
    from in-degrees clipped at 1, then p - 1 products (the released loop)."""
    adjacency = np.zeros((n, n))
    for u, v in edges.T:
        adjacency[u, v] += 1
    degree = adjacency.sum(axis=0)
    if sym:
        scale = np.diag(np.maximum(degree, 1) ** -0.5)
        lap = np.eye(n) - scale @ adjacency @ scale
    else:
        lap = np.diag(degree) - adjacency
    step = np.eye(n) - gamma * lap
    power = step
    for _ in range(p - 1):
        power = power @ step
    return power


def dense(kernel: np.ndarray, n: int) -> np.ndarray:
    """Values on ``full_graph(..., self_pairs=True)`` of one graph, (u, v)-sorted, as (n, n)."""
    return kernel.reshape(n, n)


def undirected(graph: object) -> np.ndarray:
    edges = graph.edge_index
    return np.concatenate([edges, edges[::-1]], axis=1)


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=RTOL * scale)


@settings(deadline=None)
@given(graphs(), st.integers(1, 20), st.sampled_from([0.1, 0.25, 0.5, 0.9]), st.booleans())
def test_random_walk_kernel_is_the_released_k_rw(graph, p, gamma, sym) -> None:
    n, edges = graph.num_nodes, graph.edge_index
    pairs = full_graph(graph.remove_self_loops().edge_index, n, self_pairs=True).graph
    norm = "sym" if sym else "none"
    kernel = random_walk_kernel(pairs, edges, n, p=p, gamma=gamma, normalization=norm)
    assert_close(dense(kernel, n), released_k_rw(edges, n, p, gamma, sym))


@settings(deadline=None)
@given(graphs(), st.sampled_from([0.1, 1.0, 3.0]))
def test_diffusion_kernel_is_the_eigen_exponential_on_undirected_graphs(graph, beta) -> None:
    # exp(-beta L) = V diag(exp(-beta lambda)) V^T for symmetric L: a second route to expm.
    n, edges = graph.num_nodes, undirected(graph)
    lap = laplacian(edges, n)
    values, vectors = np.linalg.eigh(lap)
    expected = (vectors * np.exp(-beta * values)) @ vectors.T
    pairs = full_graph(np.zeros((2, 0), dtype=np.int64), n, self_pairs=True).graph
    assert_close(dense(diffusion_kernel(pairs, edges, n, beta=beta), n), expected)


@settings(deadline=None)
@given(graphs(), st.integers(1, 16), st.sampled_from([0.1, 0.25, 0.45]), st.floats(0.1, 3.0))
def test_kernels_of_undirected_graphs_are_symmetric_positive_definite(graph, p, gamma, beta):
    # L (sym) has eigenvalues in [0, 2]: exp(-beta L) > 0, and (I - gamma L)^p > 0 for
    # gamma < 1/2, whose smallest eigenvalue is at least (1 - 2 gamma)^p.
    n, edges = graph.num_nodes, undirected(graph)
    pairs = full_graph(np.zeros((2, 0), dtype=np.int64), n, self_pairs=True).graph
    walk = dense(random_walk_kernel(pairs, edges, n, p=p, gamma=gamma), n)
    diffusion = dense(diffusion_kernel(pairs, edges, n, beta=beta), n)
    for kernel, floor in ((walk, (1 - 2 * gamma) ** p), (diffusion, np.exp(-2 * beta))):
        assert_close(kernel, kernel.T)  # to rounding: s_u a s_v is not s_v a s_u bit for bit
        assert np.linalg.eigvalsh(kernel).min() >= floor * (1 - 1e-9)


@settings(deadline=None)
@given(batches(), st.booleans())
def test_a_batch_reads_each_graph_alone(drawn, walk) -> None:
    edges, n, batch = drawn
    fg = full_graph(edges, n, batch)

    def kernel(pairs, edge_index, num_nodes, graph_of=None):
        if walk:
            return random_walk_kernel(pairs, edge_index, num_nodes, graph_of, p=3, gamma=0.3)
        return diffusion_kernel(pairs, edge_index, num_nodes, graph_of, beta=0.7)

    together = kernel(fg.graph, edges, n, batch)
    src, dst = fg.graph.edge_index
    for j in np.unique(batch):
        nodes = np.flatnonzero(batch == j)
        local = np.full(n, -1)
        local[nodes] = np.arange(nodes.size)
        inside = batch[edges[0]] == j
        alone = dense(
            kernel(
                full_graph(np.zeros((2, 0), dtype=np.int64), nodes.size, self_pairs=True).graph,
                local[edges[:, inside]],
                nodes.size,
            ),
            nodes.size,
        )
        mine = batch[src] == j
        np.testing.assert_array_equal(together[mine], alone[local[src[mine]], local[dst[mine]]])


def test_hand_checked_path_of_three() -> None:
    # Path 0 - 1 - 2: d = (1, 2, 1), L off-diagonal -1/sqrt(2); I - L/4 has diagonal 3/4 and
    # off-diagonal sqrt(2)/8, so (I - L/4)^2 = [[19/32, 3 sqrt(2)/16, 1/32], [., 5/8, .], ...].
    edges = np.array([[0, 1, 1, 2], [1, 0, 2, 1]])
    pairs = full_graph(edges, 3, self_pairs=True).graph
    a, b = 19 / 32, 3 * np.sqrt(2) / 16
    expected = np.array([[a, b, 1 / 32], [b, 5 / 8, b], [1 / 32, b, a]])
    assert_close(dense(random_walk_kernel(pairs, edges, 3, p=2, gamma=0.25), 3), expected)


def test_hand_checked_diffusion_on_one_edge_and_an_isolated_node() -> None:
    # One undirected edge: L = [[1, -1], [-1, 1]], eigenvalues 0 and 2, so exp(-beta L) =
    # (1/2) [[1 + t, 1 - t], [1 - t, 1 + t]], t = exp(-2 beta). The isolated node 2 keeps
    # L = 1 (degree clipped at 1): exp(-beta), and (1 - gamma)^p for the random walk.
    edges = np.array([[0, 1], [1, 0]])
    fg = full_graph(edges, 3, np.array([0, 0, 1]), self_pairs=True)
    beta, t = 0.8, np.exp(-1.6)
    kernel = diffusion_kernel(fg.graph, edges, 3, np.array([0, 0, 1]), beta=beta)
    expected = [(1 + t) / 2, (1 - t) / 2, (1 - t) / 2, (1 + t) / 2, np.exp(-beta)]
    assert_close(kernel, np.array(expected))
    walk = random_walk_kernel(fg.graph, edges, 3, np.array([0, 0, 1]), p=5, gamma=0.3)
    assert_close(walk[-1:], np.array([0.7**5]))


def test_directed_pairs_read_row_source_column_target() -> None:
    # One edge 0 -> 1: A[0, 1] = 1, in-degrees (0, 1) clipped to (1, 1), L = [[1, -1], [0, 1]],
    # (I - gamma L) = [[1 - g, g], [0, 1 - g]]: the pair 0 -> 1 reads g, the pair 1 -> 0 reads 0.
    kernel = random_walk_kernel(full_graph([[0], [1]], 2).graph, [[0], [1]], 2, p=1, gamma=0.25)
    np.testing.assert_array_equal(kernel, [0.25, 0.0])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"normalization": "rw"}, ValueError, "normalization"),
        ({"p": 0}, ValueError, "p"),
        ({"p": 2.0}, ValueError, "p must be a positive int"),
        ({"gamma": -0.1}, ValueError, "gamma"),
        ({"gamma": float("nan")}, ValueError, "gamma"),
    ],
)
def test_bad_options_are_one_clear_line(kwargs, error, message) -> None:
    pairs = full_graph([[0], [1]], 2).graph
    with pytest.raises(error, match=message):
        random_walk_kernel(pairs, [[0], [1]], 2, **kwargs)


def test_pairs_across_graphs_and_other_node_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="joins graph 0 to graph 1"):
        diffusion_kernel([[0], [1]], [[0], [1]], 2, np.array([0, 0]) * 0 + np.array([0, 1]))
    with pytest.raises(ValueError, match="pairs are on 3 nodes"):
        diffusion_kernel(full_graph([[0], [1]], 3).graph, [[0], [1]], 2)
    with pytest.raises(ValueError, match="beta"):
        diffusion_kernel([[0], [1]], [[0], [1]], 2, beta=-1.0)
