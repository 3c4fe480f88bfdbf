"""propagate: against an explicit edge loop, central differences, and the strict backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import to_numpy
from refimpl.ops.propagate import propagate, propagate_backward
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing import strict as strict_xp
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
# (H, C): one head (sparse backward), narrow heads (literal backward), wide heads (sparse again)
SHAPES = st.sampled_from([(1, 3), (3, 2), (2, 32)])


class Propagate:
    """propagate as a block of the layer protocol, for check_gradients."""

    def __init__(self, graph: object) -> None:
        self.src, self.dst = graph.src_segments(np), graph.dst_segments(np)

    def forward(self, params: dict, h: np.ndarray, weights: np.ndarray) -> tuple:
        return propagate(h, weights, self.src, self.dst), (h, weights)

    def backward(self, params: dict, cache: tuple, d_out: np.ndarray) -> tuple:
        h, weights = cache
        return propagate_backward(h, weights, d_out, self.src, self.dst), {}


def edge_loop(h: np.ndarray, weights: np.ndarray, edge_index: np.ndarray) -> np.ndarray:
    out = np.zeros_like(h)
    for e, (u, v) in enumerate(edge_index.T):
        out[v] += weights[e][:, None] * h[u]
    return out


@given(graph=graphs(), shape=SHAPES, seed=seeds())
def test_matches_an_edge_loop_and_finite_differences(
    graph: object, shape: tuple, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((graph.num_nodes, *shape))
    weights = rng.standard_normal((graph.num_edges, shape[0]))
    block = Propagate(graph)
    out, _ = block.forward({}, h, weights)
    assert max_relative_error(out, edge_loop(h, weights, graph.edge_index)) <= RTOL64
    report = check_gradients(block, {}, (h, weights), rng=rng, max_entries=60)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(graph=graphs(), shape=SHAPES, seed=seeds())
def test_strict_backend_matches_numpy(graph: object, shape: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((graph.num_nodes, *shape))
    weights = rng.standard_normal((graph.num_edges, shape[0]))
    d_out = rng.standard_normal(h.shape)
    src, dst = graph.src_segments(np), graph.dst_segments(np)
    s_src, s_dst = graph.src_segments(strict_xp), graph.dst_segments(strict_xp)
    h_s, w_s, d_s = (strict_xp.asarray(a) for a in (h, weights, d_out))
    assert (
        max_relative_error(
            to_numpy(propagate(h_s, w_s, s_src, s_dst)), propagate(h, weights, src, dst)
        )
        <= RTOL64
    )
    d_h, d_w = propagate_backward(h, weights, d_out, src, dst)
    d_h_s, d_w_s = propagate_backward(h_s, w_s, d_s, s_src, s_dst)
    errors = relative_errors({"h": d_h_s, "w": d_w_s}, {"h": d_h, "w": d_w})
    assert max(errors.values()) <= RTOL64, errors


@pytest.mark.parametrize("shape", [(1, 3), (3, 2), (2, 32)])
def test_reusing_the_gathered_sources_changes_nothing(shape: tuple) -> None:
    from refimpl import Graph
    from refimpl.kernels.segment import gather

    graph = Graph(np.array([[0, 1, 2, 2, 3], [1, 2, 0, 1, 1]]), 4)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((4, *shape))
    weights, d_out = rng.standard_normal((5, shape[0])), rng.standard_normal(h.shape)
    src, dst = graph.src_segments(np), graph.dst_segments(np)
    plain = propagate_backward(h, weights, d_out, src, dst)
    reused = propagate_backward(h, weights, d_out, src, dst, gather(h, src))
    for a, b in zip(plain, reused, strict=True):
        np.testing.assert_array_equal(a, b)
