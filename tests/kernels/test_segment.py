"""Segment primitives: against naive loops, gradients against finite differences,
properties, named edge cases, and the generic (strict) path against the NumPy one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, target
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import array_module, to_numpy
from refimpl.kernels import segment as ops
from refimpl.kernels.segment import Segments
from refimpl.naive import segment as naive
from refimpl.testing import FORWARD_RTOL, GRADCHECK_RTOL, check_gradients, max_relative_error
from refimpl.testing.strategies import graphs, seeds

FEATURE_SHAPES = st.sampled_from([(), (3,), (2, 3)])
DTYPES = st.sampled_from([np.float64, np.float32])
EMPTY_GRAPH = Graph(np.zeros((2, 0), dtype=np.int64), 3)  # E = 0, every segment empty


def _values(seed: int, shape: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _distinct_values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    # Values 0.1 apart: no two items of a segment are within the finite-difference
    # step of each other, so the max does not switch items inside a central difference.
    size = int(np.prod(shape))
    return np.random.default_rng(seed).permutation(size).reshape(shape) * 0.1


def _segments(graph: Graph, by: str = "dst") -> tuple[Segments, np.ndarray]:
    """Segments of the NumPy graph and the plain index the naive code takes."""
    if by == "dst":
        return graph.dst_segments(np), graph.edge_index[1]
    return graph.src_segments(np), graph.edge_index[0]


# -- against the naive loops ---------------------------------------------------------------


@given(
    graph=graphs(),
    seed=seeds(),
    feature_shape=FEATURE_SHAPES,
    dtype=DTYPES,
    by=st.sampled_from(["dst", "src"]),
)
@example(graph=EMPTY_GRAPH, seed=0, feature_shape=(2, 3), dtype=np.float64, by="dst")
def test_segment_sum_matches_naive(graph, seed, feature_shape, dtype, by):
    segments, index = _segments(graph, by)
    values = _values(seed, (graph.num_edges, *feature_shape), dtype)
    out = ops.segment_sum(values, segments)
    expected = naive.segment_sum(values, index, graph.num_nodes)
    assert out.dtype == dtype  # the scipy CSR product keeps float32
    assert out.shape == (graph.num_nodes, *feature_shape)
    error = max_relative_error(out, expected)
    target(error)
    assert error <= FORWARD_RTOL[np.dtype(dtype)]


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES, dtype=DTYPES)
@example(graph=EMPTY_GRAPH, seed=0, feature_shape=(2, 3), dtype=np.float64)
def test_segment_sum_pair_matches_naive_on_both_backends(graph, seed, feature_shape, dtype):
    values = _values(seed, (graph.num_edges, *feature_shape), dtype)
    expected = naive.segment_sum(values, graph.edge_index[0], graph.num_nodes) + (
        naive.segment_sum(values, graph.edge_index[1], graph.num_nodes)
    )
    out = ops.segment_sum_pair(values, graph.src_segments(np), graph.dst_segments(np))
    assert out.dtype == dtype and out.shape == (graph.num_nodes, *feature_shape)
    assert max_relative_error(out, expected) <= FORWARD_RTOL[np.dtype(dtype)]
    strict, on_strict = array_module("strict"), graph.to_backend("strict")
    generic = ops.segment_sum_pair(
        strict.asarray(values), on_strict.src_segments(strict), on_strict.dst_segments(strict)
    )
    assert max_relative_error(to_numpy(generic), expected) <= FORWARD_RTOL[np.dtype(dtype)]


@given(
    graph=graphs(),
    seed=seeds(),
    heads=st.integers(1, 3),
    channels=st.sampled_from([(), (4,)]),
    mask=st.booleans(),
    dtype=DTYPES,
)
@example(graph=EMPTY_GRAPH, seed=0, heads=2, channels=(4,), mask=True, dtype=np.float64)
def test_weighted_segment_sums_match_naive_on_both_backends(
    graph, seed, heads, channels, mask, dtype
):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((graph.num_edges, heads, *channels))
    values = values > 0 if mask else values.astype(dtype)  # a mask is read as 0/1
    weights = rng.standard_normal((graph.num_edges, heads)).astype(dtype)
    products = values * weights.reshape(weights.shape + (1,) * len(channels))
    by_source = naive.segment_sum(products, graph.edge_index[0], graph.num_nodes)
    by_target = naive.segment_sum(products, graph.edge_index[1], graph.num_nodes)
    strict, on_strict = array_module("strict"), graph.to_backend("strict")
    for xp, g in ((np, graph), (strict, on_strict)):
        src, dst = g.src_segments(xp), g.dst_segments(xp)
        v, w = xp.asarray(values), xp.asarray(weights)
        for out, expected in (
            (ops.segment_sum(v, src, weights=w), by_source),
            (ops.segment_sum_pair(v, src, dst, weights=w), by_source + by_target),
        ):
            assert out.dtype == dtype and out.shape == (graph.num_nodes, heads, *channels)
            assert max_relative_error(to_numpy(out), expected) <= FORWARD_RTOL[np.dtype(dtype)]


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES, dtype=DTYPES)
@example(graph=EMPTY_GRAPH, seed=0, feature_shape=(3,), dtype=np.float32)
def test_segment_max_matches_naive(graph, seed, feature_shape, dtype):
    segments, index = _segments(graph)
    values = _values(seed, (graph.num_edges, *feature_shape), dtype)
    maxima, argmax = ops.segment_max(values, segments)
    expected_max, expected_argmax = naive.segment_max(values, index, graph.num_nodes)
    assert maxima.dtype == dtype
    np.testing.assert_array_equal(maxima, expected_max)  # a max is exact
    np.testing.assert_array_equal(argmax, expected_argmax)


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES, dtype=DTYPES)
@example(graph=EMPTY_GRAPH, seed=0, feature_shape=(), dtype=np.float64)
def test_segment_softmax_matches_naive(graph, seed, feature_shape, dtype):
    segments, index = _segments(graph)
    scores = _values(seed, (graph.num_edges, *feature_shape), dtype) * 3
    alpha = ops.segment_softmax(scores, segments)
    expected = naive.segment_softmax(scores, index, graph.num_nodes)
    assert alpha.dtype == dtype
    error = max_relative_error(alpha, expected)
    target(error)
    assert error <= FORWARD_RTOL[np.dtype(dtype)]


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES)
def test_segment_softmax_matches_dense_masked_softmax(graph, seed, feature_shape):
    # Independent method: scores on a dense (N, N) grid, softmax over the sources
    # of each column weighted by edge counts. Parallel edges share their score, so
    # the per-edge weights of a pair add up to the dense entry.
    src, dst = graph.edge_index
    dense_scores = _values(seed, (graph.num_nodes, graph.num_nodes, *feature_shape)) * 3
    alpha = ops.segment_softmax(dense_scores[src, dst], graph.dst_segments(np))  # (E, *F)
    per_pair = np.zeros_like(dense_scores)
    np.add.at(per_pair, (src, dst), alpha)
    expected = naive.dense_masked_softmax(dense_scores, graph.to_dense_adjacency())
    assert max_relative_error(per_pair, expected) <= FORWARD_RTOL[np.dtype(np.float64)]


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES)
def test_gather_is_row_indexing(graph, seed, feature_shape):
    segments, index = _segments(graph)
    x = _values(seed, (graph.num_nodes, *feature_shape), np.float32)
    out = ops.gather(x, segments)
    assert out.dtype == np.float32
    rows = [x[int(n)] for n in index]  # one copy of its segment's row per item
    expected = np.array(rows, dtype=np.float32).reshape(graph.num_edges, *feature_shape)
    np.testing.assert_array_equal(out, expected)


@given(graph=graphs())
def test_counts_are_in_degrees(graph):
    segments, index = _segments(graph)
    naive_counts = [sum(1 for n in index if n == v) for v in range(graph.num_nodes)]
    np.testing.assert_array_equal(segments.counts(), naive_counts)
    assert segments.num_items == graph.num_edges
    assert segments.num_segments == graph.num_nodes


# -- gradients against central finite differences -------------------------------------------


class _GatherBlock:
    def forward(self, params, x, segments):
        return ops.gather(x, segments), segments

    def backward(self, params, segments, d_out):
        return ops.gather_backward(d_out, segments), {}


class _SegmentSumBlock:
    def forward(self, params, values, segments):
        return ops.segment_sum(values, segments), segments

    def backward(self, params, segments, d_out):
        return ops.segment_sum_backward(d_out, segments), {}


class _SegmentMaxBlock:
    def forward(self, params, values, segments):
        maxima, argmax = ops.segment_max(values, segments)
        return maxima, (argmax, segments)

    def backward(self, params, cache, d_out):
        argmax, segments = cache
        return ops.segment_max_backward(d_out, argmax, segments), {}


class _SegmentSoftmaxBlock:
    def forward(self, params, scores, segments):
        alpha = ops.segment_softmax(scores, segments)
        return alpha, (alpha, segments)

    def backward(self, params, cache, d_alpha):
        alpha, segments = cache
        return ops.segment_softmax_backward(alpha, d_alpha, segments), {}


BLOCKS = {
    "gather": (_GatherBlock(), "nodes"),
    "segment_sum": (_SegmentSumBlock(), "edges"),
    "segment_max": (_SegmentMaxBlock(), "edges"),
    "segment_softmax": (_SegmentSoftmaxBlock(), "edges"),
}


@pytest.mark.parametrize("name", list(BLOCKS))
@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES)
@example(graph=EMPTY_GRAPH, seed=0, feature_shape=(2,))
def test_backward_matches_finite_differences(name, graph, seed, feature_shape):
    block, rows = BLOCKS[name]
    num_rows = graph.num_nodes if rows == "nodes" else graph.num_edges
    shape = (num_rows, *feature_shape)
    x = _distinct_values(seed, shape) if name == "segment_max" else _values(seed, shape)
    report = check_gradients(
        block, {}, (x, graph.dst_segments(np)), rng=np.random.default_rng(seed)
    )
    target(report.max_rel_error)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES)
def test_gather_and_segment_sum_are_adjoint(graph, seed, feature_shape):
    segments, _ = _segments(graph)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((graph.num_nodes, *feature_shape))
    y = rng.standard_normal((graph.num_edges, *feature_shape))
    lhs = float(np.sum(ops.gather(x, segments) * y))
    rhs = float(np.sum(x * ops.segment_sum(y, segments)))
    # Rounding of two dot products of length <= E * F: a few ulps of sum |terms|.
    bound = FORWARD_RTOL[np.dtype(np.float64)] * float(np.sum(np.abs(ops.gather(x, segments) * y)))
    assert abs(lhs - rhs) <= bound


# -- softmax properties -----------------------------------------------------------------------


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES)
def test_softmax_sums_to_one_per_nonempty_segment(graph, seed, feature_shape):
    segments, _ = _segments(graph)
    alpha = ops.segment_softmax(_values(seed, (graph.num_edges, *feature_shape)) * 5, segments)
    totals = ops.segment_sum(alpha, segments)  # (N, *F)
    nonempty = graph.in_degree() > 0
    expected = np.zeros_like(totals)
    expected[nonempty] = 1.0
    np.testing.assert_allclose(totals, expected, rtol=0, atol=FORWARD_RTOL[np.dtype(np.float64)])
    assert np.all(alpha >= 0)


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES)
def test_softmax_invariant_to_per_segment_shift(graph, seed, feature_shape):
    segments, _ = _segments(graph)
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((graph.num_edges, *feature_shape))
    shift = rng.uniform(-50, 50, size=(graph.num_nodes, *feature_shape))  # one constant per node
    alpha = ops.segment_softmax(scores, segments)
    shifted = ops.segment_softmax(scores + ops.gather(shift, segments), segments)
    # Adding c changes s - max(s) by the rounding of s + c: ~|c| ulps in the exponent.
    assert max_relative_error(shifted, alpha) <= FORWARD_RTOL[np.dtype(np.float64)]


# -- named edge cases ---------------------------------------------------------------------------


def test_zero_in_degree():
    # Nodes 0 and 2 receive nothing; 1 receives from 0 and 2; 3 from 1.
    graph = Graph([[0, 2, 1], [1, 1, 3]], 4)
    segments = graph.dst_segments(np)
    values = np.array([[1.0, -2.0], [3.0, -4.0], [5.0, 6.0]])
    np.testing.assert_array_equal(
        ops.segment_sum(values, segments), [[0, 0], [4, -6], [0, 0], [5, 6]]
    )
    maxima, argmax = ops.segment_max(values, segments)
    np.testing.assert_array_equal(maxima, [[0, 0], [3, -2], [0, 0], [5, 6]])
    np.testing.assert_array_equal(argmax, [[-1, -1], [1, 0], [-1, -1], [2, 2]])
    d_out = np.arange(1.0, 9.0).reshape(4, 2)
    # Empty segments route their gradient nowhere.
    np.testing.assert_array_equal(
        ops.segment_max_backward(d_out, argmax, segments), [[0, 4], [3, 0], [7, 8]]
    )
    alpha = ops.segment_softmax(values, segments)
    assert alpha.shape == values.shape  # one entry per edge, none for empty nodes
    np.testing.assert_allclose(
        ops.segment_sum(alpha, segments),
        [[0, 0], [1, 1], [0, 0], [1, 1]],
        rtol=0,
        atol=FORWARD_RTOL[np.dtype(np.float64)],
    )


def test_single_node():
    alone = Graph([], 1)
    values = np.zeros((0, 2))
    np.testing.assert_array_equal(ops.segment_sum(values, alone.dst_segments(np)), [[0, 0]])
    maxima, argmax = ops.segment_max(values, alone.dst_segments(np))
    np.testing.assert_array_equal(maxima, [[0, 0]])
    np.testing.assert_array_equal(argmax, [[-1, -1]])
    looped = alone.add_self_loops()
    alpha = ops.segment_softmax(np.array([[-7.0, 3.0]]), looped.dst_segments(np))
    np.testing.assert_array_equal(alpha, [[1.0, 1.0]])  # one neighbour: weight exactly 1


def test_self_loop_is_an_ordinary_item():
    graph = Graph([[1, 0], [1, 1]], 2)  # 1 -> 1 and 0 -> 1
    segments = graph.dst_segments(np)
    values = np.array([2.0, 5.0])
    np.testing.assert_array_equal(ops.segment_sum(values, segments), [0.0, 7.0])
    maxima, argmax = ops.segment_max(values, segments)
    np.testing.assert_array_equal(maxima, [0.0, 5.0])
    np.testing.assert_array_equal(argmax, [-1, 1])
    alpha = ops.segment_softmax(np.log(np.array([1.0, 3.0])), segments)
    np.testing.assert_allclose(alpha, [0.25, 0.75], rtol=FORWARD_RTOL[np.dtype(np.float64)])


def test_duplicate_edges_each_counted():
    graph = Graph([[0, 0, 2], [1, 1, 1]], 3)  # 0 -> 1 twice, 2 -> 1 once
    segments = graph.dst_segments(np)
    np.testing.assert_array_equal(
        ops.segment_sum(np.array([1.0, 10.0, 100.0]), segments), [0.0, 111.0, 0.0]
    )
    assert segments.counts().tolist() == [0, 3, 0]
    alpha = ops.segment_softmax(np.array([0.0, 0.0, np.log(2.0)]), segments)
    np.testing.assert_allclose(alpha, [0.25, 0.25, 0.5], rtol=FORWARD_RTOL[np.dtype(np.float64)])


@given(graph=graphs(), score=st.floats(-1e3, 1e3), feature_shape=FEATURE_SHAPES)
def test_all_scores_equal_gives_exactly_uniform_weights(graph, score, feature_shape):
    segments, index = _segments(graph)
    scores = np.full((graph.num_edges, *feature_shape), score)
    alpha = ops.segment_softmax(scores, segments)
    # exp(s - s) = 1 exactly, the denominator is the in-degree exactly: 1 / deg.
    uniform = 1.0 / graph.in_degree()[index].astype(np.float64)
    np.testing.assert_array_equal(
        alpha, np.broadcast_to(uniform.reshape(-1, *(1,) * len(feature_shape)), alpha.shape)
    )


def test_extreme_scores_stay_finite():
    graph = Graph([[0, 1, 2, 0, 1, 2], [3, 3, 3, 4, 4, 4]], 5)
    segments = graph.dst_segments(np)
    scores = np.array([1e3, 1e3 - 1, -1e3, -1e3, -1e3 + 1, -1e3])  # exp(+-1e3) overflows alone
    alpha = ops.segment_softmax(scores, segments)
    assert np.all(np.isfinite(alpha))
    np.testing.assert_allclose(
        ops.segment_sum(alpha, segments),
        [0, 0, 0, 1, 1],
        rtol=0,
        atol=FORWARD_RTOL[np.dtype(np.float64)],
    )
    e = np.exp(-1.0)
    np.testing.assert_allclose(
        alpha,
        [1 / (1 + e), e / (1 + e), 0.0, e / (1 + 2 * e), 1 / (1 + 2 * e), e / (1 + 2 * e)],
        rtol=FORWARD_RTOL[np.dtype(np.float64)],
        atol=1e-300,
    )
    np.testing.assert_allclose(
        alpha,
        naive.segment_softmax(scores, graph.edge_index[1], 5),
        rtol=FORWARD_RTOL[np.dtype(np.float64)],
    )
    d_scores = ops.segment_softmax_backward(alpha, np.arange(6.0), segments)
    assert np.all(np.isfinite(d_scores))


def test_segment_max_ties_pick_lowest_index_and_route_one_gradient():
    # Node 0 receives items 1, 2, 4 (values tie at 3 in feature 0, at 5 in feature 1);
    # node 1 receives items 0 and 3, tied everywhere.
    graph = Graph([[0, 0, 0, 0, 0], [1, 0, 0, 1, 0]], 2)
    segments = graph.dst_segments(np)
    values = np.array([[7.0, 7.0], [3.0, 1.0], [3.0, 5.0], [7.0, 7.0], [2.0, 5.0]])
    maxima, argmax = ops.segment_max(values, segments)
    np.testing.assert_array_equal(maxima, [[3.0, 5.0], [7.0, 7.0]])
    np.testing.assert_array_equal(argmax, [[1, 2], [0, 0]])
    d_values = ops.segment_max_backward(np.array([[10.0, 20.0], [30.0, 40.0]]), argmax, segments)
    np.testing.assert_array_equal(
        d_values, [[30.0, 40.0], [10.0, 0.0], [0.0, 20.0], [0.0, 0.0], [0.0, 0.0]]
    )


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES)
def test_segment_max_ties_match_naive(graph, seed, feature_shape):
    # Three possible values: ties in nearly every segment with two or more items.
    segments, index = _segments(graph)
    values = np.random.default_rng(seed).integers(0, 3, (graph.num_edges, *feature_shape))
    values = values.astype(np.float64)
    maxima, argmax = ops.segment_max(values, segments)
    expected_max, expected_argmax = naive.segment_max(values, index, graph.num_nodes)
    np.testing.assert_array_equal(maxima, expected_max)
    np.testing.assert_array_equal(argmax, expected_argmax)
    d_out = _values(seed, maxima.shape)
    d_values = ops.segment_max_backward(d_out, argmax, segments)
    # Exactly one item per non-empty (segment, feature) receives d_out, unchanged.
    routed = np.zeros_like(d_values)
    for n, *f in np.ndindex(*argmax.shape):
        if expected_argmax[(n, *f)] >= 0:
            routed[(int(expected_argmax[(n, *f)]), *f)] = d_out[(n, *f)]
    np.testing.assert_array_equal(d_values, routed)


def test_regression_empty_edge_set_reshape():
    # Every primitive raised "cannot reshape array of size 0 into shape (0,newaxis)"
    # on E = 0: reshape(E, -1) cannot infer -1 for an empty array. The drawn graphs
    # rarely had no edges at all and no test pinned one.
    for feature_shape in [(), (2,), (2, 3)]:
        for xp_name in ["numpy", "strict"]:
            xp = array_module(xp_name)
            segments = EMPTY_GRAPH.to_backend(xp_name).dst_segments(xp)
            values = xp.zeros((0, *feature_shape))
            zeros = np.zeros((3, *feature_shape))
            np.testing.assert_array_equal(to_numpy(ops.segment_sum(values, segments)), zeros)
            maxima, argmax = ops.segment_max(values, segments)
            np.testing.assert_array_equal(to_numpy(maxima), zeros)
            np.testing.assert_array_equal(to_numpy(argmax), zeros - 1)
            d_values = ops.segment_max_backward(xp.ones((3, *feature_shape)), argmax, segments)
            assert d_values.shape == (0, *feature_shape)
            alpha = ops.segment_softmax(values, segments)
            assert alpha.shape == (0, *feature_shape)
            assert ops.segment_softmax_backward(alpha, values, segments).shape == alpha.shape
            assert ops.gather(xp.ones((3, *feature_shape)), segments).shape == values.shape


# -- the generic path (strict stand-in, as CuPy) against the NumPy/scipy path ----------------


@given(graph=graphs(), seed=seeds(), feature_shape=FEATURE_SHAPES, dtype=DTYPES)
@example(graph=EMPTY_GRAPH, seed=0, feature_shape=(2, 3), dtype=np.float32)
def test_strict_path_matches_numpy_path(graph, seed, feature_shape, dtype):
    strict = array_module("strict")
    host, device = graph.dst_segments(np), graph.to_backend("strict").dst_segments(strict)
    assert device.backend == "strict"  # takes the xp.add.at / xp.maximum.at branch
    rtol = FORWARD_RTOL[np.dtype(dtype)]
    rng = np.random.default_rng(seed)
    edge_values = rng.standard_normal((graph.num_edges, *feature_shape)).astype(dtype)
    node_values = rng.standard_normal((graph.num_nodes, *feature_shape)).astype(dtype)
    edge_strict, node_strict = strict.asarray(edge_values), strict.asarray(node_values)

    def same(a, b, exact: bool) -> None:
        b = to_numpy(b)
        assert b.dtype == a.dtype and b.shape == a.shape
        if exact:
            np.testing.assert_array_equal(b, a)
        else:
            assert max_relative_error(b, a) <= rtol

    same(ops.gather(node_values, host), ops.gather(node_strict, device), exact=True)
    same(
        ops.gather_backward(edge_values, host),
        ops.gather_backward(edge_strict, device),
        exact=False,
    )
    same(ops.segment_sum(edge_values, host), ops.segment_sum(edge_strict, device), exact=False)
    same(
        ops.segment_sum_backward(node_values, host),
        ops.segment_sum_backward(node_strict, device),
        exact=True,
    )
    maxima, argmax = ops.segment_max(edge_values, host)
    maxima_s, argmax_s = ops.segment_max(edge_strict, device)
    same(maxima, maxima_s, exact=True)
    same(argmax, argmax_s, exact=True)
    same(
        ops.segment_max_backward(node_values, argmax, host),
        ops.segment_max_backward(node_strict, argmax_s, device),
        exact=True,
    )
    alpha = ops.segment_softmax(edge_values, host)
    alpha_s = ops.segment_softmax(edge_strict, device)
    same(alpha, alpha_s, exact=False)
    d_alpha = rng.standard_normal(alpha.shape).astype(dtype)
    same(
        ops.segment_softmax_backward(alpha, d_alpha, host),
        ops.segment_softmax_backward(alpha_s, strict.asarray(d_alpha), device),
        exact=False,
    )


def test_the_backend_below_does_not_re_export_the_primitives():
    # Issue 23: backend.py re-exported these upward (the floor below re-exporting the one
    # above); they are imported from refimpl.kernels.segment, where they live.
    import refimpl.backend as backend

    for name in ["Segments", "gather", "scatter_add", "segment_max", "segment_softmax"]:
        assert not hasattr(backend, name)
    assert ops.scatter_add is ops.segment_sum


@pytest.mark.parametrize("cap", [0, ops.CACHED_POSITIONS])
def test_flat_positions_are_kept_only_up_to_the_cap(
    cap: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The positions every softmax reads are index * F + f, kept per F on small graphs and
    made afresh (the same values) beyond the cap."""
    monkeypatch.setattr(ops, "CACHED_POSITIONS", cap)
    segments = Segments(np.array([2, 0, 2, 1]), 3)
    first, again = segments.flat_positions(3), segments.flat_positions(3)
    np.testing.assert_array_equal(first, [[6, 7, 8], [0, 1, 2], [6, 7, 8], [3, 4, 5]])
    np.testing.assert_array_equal(again, first)
    assert (again is first) == (cap > 0)


def test_one_head_structures_are_the_pattern_itself_and_build_no_float64_matrix() -> None:
    """Memory on large graphs: one head's block structure is the pair structure (not a second
    copy), and neither builds a float64 sum matrix (a float32 model never reads one)."""
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 2]]), 3)
    src, dst = graph.src_segments(np), graph.dst_segments(np)
    assert dst.head_pair_structure(src, 1) is dst.pair_structure(src)
    dst.head_sum_structure(4)
    assert not dst._sum_matrices  # the structure came from csr_structure
