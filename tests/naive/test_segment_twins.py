"""The segment primitives and ``propagate`` against their literal twins (refimpl.naive): every
output and every gradient within TWIN_RTOL, with a random cotangent, on drawn graphs (isolated
nodes, duplicate edges, self-loops, one node, no edge) and feature shapes."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.kernels import segment as ops
from refimpl.naive import propagate as naive_propagate
from refimpl.naive import segment as naive
from refimpl.ops.propagate import propagate, propagate_backward
from refimpl.testing import max_relative_error
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import TWIN_RTOL

FEATURE_SHAPES = st.sampled_from([(), (3,), (2, 3)])
HEAD_SHAPES = st.sampled_from([(1,), (2,), (3, 4)])  # (H, *F') for weighted sums
# (H, C) for propagate: one head, narrow heads and wide ones, all through production's
# head-block matrix (one head: the pattern itself)
PROPAGATE_SHAPES = st.sampled_from([(1, 3), (3, 2), (2, 32)])
EMPTY_GRAPH = Graph(np.zeros((2, 0), dtype=np.int64), 3)  # E = 0, every segment empty
ONE_NODE = Graph(np.array([[0, 0], [0, 0]]), 1)  # a duplicated self-loop on the only node


def assert_twins(actual: dict, expected: dict) -> None:
    """Every tensor of production (``actual``) within TWIN_RTOL of the twin's (``expected``),
    each judged relative to its own largest entry."""
    assert set(actual) == set(expected)
    errors = {name: max_relative_error(actual[name], expected[name]) for name in expected}
    assert max(errors.values(), default=0.0) <= TWIN_RTOL, errors


def index_of(graph: Graph, by: str) -> tuple[ops.Segments, np.ndarray]:
    """Production's segments of the graph and the plain index the twin takes."""
    if by == "dst":
        return graph.dst_segments(np), graph.edge_index[1]
    return graph.src_segments(np), graph.edge_index[0]


# -- segment_sum, unweighted and weighted ---------------------------------------------------------


@given(graph=graphs(), seed=seeds(), shape=FEATURE_SHAPES, by=st.sampled_from(["dst", "src"]))
@example(graph=EMPTY_GRAPH, seed=0, shape=(3,), by="dst")
def test_segment_sum_matches_its_twin(graph: Graph, seed: int, shape: tuple, by: str) -> None:
    segments, index = index_of(graph, by)
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((graph.num_edges, *shape))
    d_out = rng.standard_normal((graph.num_nodes, *shape))
    assert_twins(
        {"out": ops.segment_sum(values, segments), "d": ops.segment_sum_backward(d_out, segments)},
        {
            "out": naive.segment_sum(values, index, graph.num_nodes),
            "d": naive.segment_sum_backward(d_out, index),
        },
    )


@given(graph=graphs(), seed=seeds(), shape=HEAD_SHAPES, mask=st.booleans())
@example(graph=EMPTY_GRAPH, seed=0, shape=(3, 4), mask=False)
def test_weighted_segment_sum_matches_its_twin(
    graph: Graph, seed: int, shape: tuple, mask: bool
) -> None:
    # Production has no weighted backward of its own: its callers scale the repeat-per-item
    # adjoint by the weights and take the weights' gradient as a per-item dot product.
    segments, index = index_of(graph, "dst")
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((graph.num_edges, *shape))
    values = values > 0 if mask else values  # a mask is read as 0/1
    weights = rng.standard_normal((graph.num_edges, shape[0]))
    d_out = rng.standard_normal((graph.num_nodes, *shape))
    repeated = ops.segment_sum_backward(d_out, segments)  # (E, H, *F')
    scale = weights.reshape(weights.shape + (1,) * (len(shape) - 1))  # (E, H, 1...)
    products = values * repeated  # (E, H, *F')
    assert_twins(
        {
            "out": ops.segment_sum(values, segments, weights=weights),
            "d_values": repeated * scale,
            "d_weights": products.sum(axis=tuple(range(2, products.ndim))),  # (E, H)
        },
        {
            "out": naive.segment_sum(values, index, graph.num_nodes, weights),
            "d_values": naive.segment_sum_backward(d_out, index, weights),
            "d_weights": naive.segment_sum_weights_backward(values, d_out, index),
        },
    )


@given(graph=graphs(), seed=seeds(), shape=HEAD_SHAPES)
def test_weighted_segment_sum_twin_backward_is_its_adjoint(
    graph: Graph, seed: int, shape: tuple
) -> None:
    # The twin's backward against the twin's forward, by the dot-product test: the sum is
    # linear in the values and in the weights, so <out, d_out> = <values, d_values> =
    # <weights, d_weights>.
    index = graph.edge_index[1]
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((graph.num_edges, *shape))
    weights = rng.standard_normal((graph.num_edges, shape[0]))
    d_out = rng.standard_normal((graph.num_nodes, *shape))
    pairing = np.sum(naive.segment_sum(values, index, graph.num_nodes, weights) * d_out)
    by_values = np.sum(values * naive.segment_sum_backward(d_out, index, weights))
    by_weights = np.sum(weights * naive.segment_sum_weights_backward(values, d_out, index))
    terms = np.sum(np.abs(values) * np.abs(naive.segment_sum_backward(d_out, index, weights)))
    assert abs(by_values - pairing) <= TWIN_RTOL * max(terms, 1.0)
    assert abs(by_weights - pairing) <= TWIN_RTOL * max(terms, 1.0)


@given(graph=graphs(), seed=seeds(), shape=HEAD_SHAPES, weighted=st.booleans())
@example(graph=EMPTY_GRAPH, seed=0, shape=(2,), weighted=True)
@example(graph=ONE_NODE, seed=0, shape=(3, 4), weighted=False)
def test_segment_sum_pair_matches_its_twin(
    graph: Graph, seed: int, shape: tuple, weighted: bool
) -> None:
    # A self-loop's item lands twice in its node; its gradient is that node's, twice.
    src, dst = graph.src_segments(np), graph.dst_segments(np)
    first, second = graph.edge_index
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((graph.num_edges, *shape))
    weights = rng.standard_normal((graph.num_edges, shape[0])) if weighted else None
    d_out = rng.standard_normal((graph.num_nodes, *shape))
    adjoint = ops.gather(d_out, src) + ops.gather(d_out, dst)  # read at both ends
    if weighted:
        adjoint = adjoint * weights.reshape(weights.shape + (1,) * (len(shape) - 1))
    assert_twins(
        {"out": ops.segment_sum_pair(values, src, dst, weights), "d": adjoint},
        {
            "out": naive.segment_sum_pair(values, first, second, graph.num_nodes, weights),
            "d": naive.segment_sum_pair_backward(d_out, first, second, weights),
        },
    )


# -- segment_max -----------------------------------------------------------------------------------


@given(graph=graphs(), seed=seeds(), shape=FEATURE_SHAPES, tied=st.booleans())
@example(graph=EMPTY_GRAPH, seed=0, shape=(2, 3), tied=False)
def test_segment_max_matches_its_twin_exactly(
    graph: Graph, seed: int, shape: tuple, tied: bool
) -> None:
    # ``tied`` draws from three values only, so most segments have ties: the twin's strict
    # ">" scan (lowest item index wins) must pick production's argmax, item for item. A max
    # and its routing are exact, so exact equality.
    segments, index = index_of(graph, "dst")
    rng = np.random.default_rng(seed)
    size = (graph.num_edges, *shape)
    values = rng.integers(-1, 2, size).astype(float) if tied else rng.standard_normal(size)
    d_out = rng.standard_normal((graph.num_nodes, *shape))
    maxima, argmax = ops.segment_max(values, segments)
    expected_max, expected_argmax = naive.segment_max(values, index, graph.num_nodes)
    np.testing.assert_array_equal(maxima, expected_max)
    np.testing.assert_array_equal(argmax, expected_argmax)
    np.testing.assert_array_equal(
        ops.segment_max_backward(d_out, argmax, segments),
        naive.segment_max_backward(d_out, expected_argmax, index),
    )


def test_segment_max_ties_route_to_the_lowest_item() -> None:
    # Node 1 gets items 0, 2, 3 with equal values, node 0 items 1, 4 (ties too), node 2 none.
    graph = Graph(np.array([[0, 1, 2, 0, 2], [1, 0, 1, 1, 0]]), 3)
    values = np.array([[5.0, -1.0], [2.0, 2.0], [5.0, -1.0], [5.0, 7.0], [2.0, 2.0]])
    d_out = np.array([[1.5, -2.0], [3.0, 4.0], [8.0, 9.0]])
    maxima, argmax = naive.segment_max(values, graph.edge_index[1], 3)
    np.testing.assert_array_equal(argmax, [[1, 1], [0, 3], [-1, -1]])
    np.testing.assert_array_equal(maxima, [[2.0, 2.0], [5.0, 7.0], [0.0, 0.0]])
    expected = np.zeros_like(values)
    expected[1] = [1.5, -2.0]  # node 0, both features: item 1 before item 4
    expected[0, 0], expected[3, 1] = 3.0, 4.0  # node 1: item 0 (a three-way tie), item 3
    d_values = naive.segment_max_backward(d_out, argmax, graph.edge_index[1])
    np.testing.assert_array_equal(d_values, expected)  # node 2 (empty) sends nothing
    production = ops.segment_max(values, graph.dst_segments(np))
    np.testing.assert_array_equal(production[1], argmax)
    np.testing.assert_array_equal(
        ops.segment_max_backward(d_out, production[1], graph.dst_segments(np)), expected
    )


# -- segment_softmax -------------------------------------------------------------------------------


@given(graph=graphs(), seed=seeds(), shape=FEATURE_SHAPES)
@example(graph=EMPTY_GRAPH, seed=0, shape=(3,))
@example(graph=ONE_NODE, seed=0, shape=())
def test_segment_softmax_matches_its_twin(graph: Graph, seed: int, shape: tuple) -> None:
    segments, index = index_of(graph, "dst")
    rng = np.random.default_rng(seed)
    scores = 3 * rng.standard_normal((graph.num_edges, *shape))
    d_alpha = rng.standard_normal(scores.shape)
    alpha = ops.segment_softmax(scores, segments)
    twin_alpha = naive.segment_softmax(scores, index, graph.num_nodes)
    assert_twins(
        {"alpha": alpha, "d_scores": ops.segment_softmax_backward(alpha, d_alpha, segments)},
        {
            "alpha": twin_alpha,
            "d_scores": naive.segment_softmax_backward(twin_alpha, d_alpha, index, graph.num_nodes),
        },
    )


def test_segment_softmax_with_all_scores_equal_is_uniform() -> None:
    # Node 1: three equal scores (one a duplicate edge); node 0: a single edge; node 2: none.
    graph = Graph(np.array([[0, 2, 2, 1], [1, 1, 1, 0]]), 3)
    segments, index = graph.dst_segments(np), graph.edge_index[1]
    scores = np.full((4, 2), 0.7)
    d_alpha = np.array([[1.0, -2.0], [0.5, 3.0], [-4.0, 1.0], [2.0, 6.0]])
    alpha = naive.segment_softmax(scores, index, 3)
    np.testing.assert_array_equal(alpha, [[1 / 3, 1 / 3]] * 3 + [[1.0, 1.0]])
    d_scores = naive.segment_softmax_backward(alpha, d_alpha, index, 3)
    mean = d_alpha[:3].mean(axis=0)  # alpha_e (g_e - mean g) with alpha_e = 1/3
    np.testing.assert_allclose(d_scores[:3], (d_alpha[:3] - mean) / 3, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(d_scores[3], [0.0, 0.0])  # alone in its segment
    assert_twins(
        {"alpha": ops.segment_softmax(scores, segments)},
        {"alpha": alpha},
    )
    assert_twins(
        {"d_scores": ops.segment_softmax_backward(alpha, d_alpha, segments)},
        {"d_scores": d_scores},
    )


# -- propagate -------------------------------------------------------------------------------------


@given(graph=graphs(), seed=seeds(), shape=PROPAGATE_SHAPES)
@example(graph=EMPTY_GRAPH, seed=0, shape=(3, 2))
@example(graph=ONE_NODE, seed=0, shape=(1, 3))
def test_propagate_matches_its_twin(graph: Graph, seed: int, shape: tuple) -> None:
    src, dst = graph.src_segments(np), graph.dst_segments(np)
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((graph.num_nodes, *shape))
    weights = rng.standard_normal((graph.num_edges, shape[0]))
    d_out = rng.standard_normal((graph.num_nodes, *shape))
    d_h, d_weights = propagate_backward(h, weights, d_out, src, dst)
    out, messages = naive_propagate.propagate_forward(h, weights, graph.edge_index)
    twin_d_h, twin_d_weights = naive_propagate.propagate_backward(
        h, weights, d_out, graph.edge_index
    )
    assert_twins(
        {"out": propagate(h, weights, src, dst), "d_h": d_h, "d_weights": d_weights},
        {"out": out, "d_h": twin_d_h, "d_weights": twin_d_weights},
    )
    assert messages.shape == (graph.num_edges, *shape)


def test_propagate_twin_leaves_an_isolated_target_at_zero() -> None:
    # Node 2 has no incoming edge: zero output; it sends along 2 -> 0, so it gets a gradient.
    edge_index = np.array([[0, 1, 2, 1], [1, 0, 0, 0]])
    rng = np.random.default_rng(0)
    h, weights = rng.standard_normal((3, 2, 3)), rng.standard_normal((4, 2))
    d_out = rng.standard_normal((3, 2, 3))
    out, _ = naive_propagate.propagate_forward(h, weights, edge_index)
    d_h, d_weights = naive_propagate.propagate_backward(h, weights, d_out, edge_index)
    np.testing.assert_array_equal(out[2], np.zeros((2, 3)))
    np.testing.assert_allclose(d_h[2], weights[2][:, None] * d_out[0], rtol=1e-15)
    src, dst = Graph(edge_index, 3).src_segments(np), Graph(edge_index, 3).dst_segments(np)
    production = propagate_backward(h, weights, d_out, src, dst)
    assert_twins({"d_h": production[0], "d_w": production[1]}, {"d_h": d_h, "d_w": d_weights})


# -- the comparison has teeth ----------------------------------------------------------------------


def test_a_gradient_off_by_one_part_in_a_billion_fails_the_twin_check() -> None:
    graph = Graph(np.array([[0, 1, 2, 2, 3], [1, 2, 0, 1, 1]]), 4)
    rng = np.random.default_rng(7)
    h, weights = rng.standard_normal((4, 2, 3)), rng.standard_normal((5, 2))
    d_out = rng.standard_normal((4, 2, 3))
    d_h, _ = propagate_backward(h, weights, d_out, graph.src_segments(np), graph.dst_segments(np))
    twin_d_h, _ = naive_propagate.propagate_backward(h, weights, d_out, graph.edge_index)
    assert max_relative_error(d_h, twin_d_h) <= TWIN_RTOL
    assert max_relative_error(d_h, twin_d_h * (1 + 1e-9)) > TWIN_RTOL
    alpha = ops.segment_softmax(rng.standard_normal((5, 2)), graph.dst_segments(np))
    d_alpha = rng.standard_normal((5, 2))
    d_scores = naive.segment_softmax_backward(alpha, d_alpha, graph.edge_index[1], 4)
    production = ops.segment_softmax_backward(alpha, d_alpha, graph.dst_segments(np))
    assert max_relative_error(production, d_scores) <= TWIN_RTOL
    assert max_relative_error(production, d_scores * (1 + 1e-9)) > TWIN_RTOL
