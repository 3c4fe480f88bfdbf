"""refimpl.ops.loop_fill, the added self-loops' edge features: against its literal twin
(refimpl.naive.loop_fill) on drawn graphs with ties and zeros, against central differences,
against PyG's own add_self_loops under torch autograd, and its configuration checks."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import asarray, to_numpy
from refimpl.naive.loop_fill import loop_fill_backward, loop_fill_forward
from refimpl.ops.loop_fill import (
    _segment_product,
    check_fill_value,
    fill_self_loops,
    fill_self_loops_backward,
)
from refimpl.testing import GRADCHECK_RTOL, check_gradients, max_relative_error
from refimpl.testing.strategies import bipartite_graphs, graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, TWIN_RTOL

FILLS = ["mean", "add", "sum", "max", "min", "mul", 0.5, -2, None, "vector"]
F64 = FORWARD_RTOL[np.dtype(np.float64)]


class Fill(NamedTuple):
    """``fill_self_loops`` as a block ``check_gradients`` can drive: ``edge_attr`` the input."""

    graph: Graph
    fill_value: Any

    def forward(self, params: dict, edge_attr: np.ndarray) -> tuple:
        return fill_self_loops(edge_attr, self.graph, self.fill_value)

    def backward(self, params: dict, cache: Any, d_out: np.ndarray) -> tuple:
        return fill_self_loops_backward(cache, d_out), {}


def features(
    rng: np.random.Generator, shape: tuple, coarse: bool, zeros: bool = True
) -> np.ndarray:
    """Standard normal, or (``coarse``) on a grid of halves in [-1, 1]: ties and zeros (or,
    without ``zeros``, the grid shifted by a quarter: ties only)."""
    if coarse:
        grid = rng.integers(-2, 3, size=shape) / 2.0
        return grid if zeros else grid + 0.25
    return rng.standard_normal(shape)


def fill_of(name: Any, width: int) -> Any:
    """The configured fill (a vector of ``width`` numbers for ``"vector"``)."""
    return check_fill_value(tuple(np.linspace(-1, 1, width)) if name == "vector" else name, width)


@given(graph=graphs(), width=st.integers(1, 3), name=st.sampled_from(FILLS), seed=seeds(),
       coarse=st.booleans())  # fmt: skip
def test_matches_the_literal_twin(graph: Graph, width: int, name: Any, seed: int, coarse: bool):
    rng = np.random.default_rng(seed)
    fill_value = fill_of(name, width)
    edge_attr = features(rng, (graph.num_edges, width), coarse)
    out, cache = fill_self_loops(edge_attr, graph, fill_value)
    twin = loop_fill_forward(edge_attr, graph.edge_index, graph.num_nodes, fill_value)
    assert out.shape == twin.shape == (graph.remove_self_loops().num_edges + graph.num_nodes, width)
    assert max_relative_error(out, twin) <= TWIN_RTOL
    d_out = rng.standard_normal(out.shape)
    d_edge_attr = fill_self_loops_backward(cache, d_out)
    twin_d = loop_fill_backward(d_out, edge_attr, graph.edge_index, graph.num_nodes, fill_value)
    assert max_relative_error(d_edge_attr, twin_d) <= TWIN_RTOL


@given(graph=graphs(), width=st.integers(1, 3), name=st.sampled_from(FILLS), seed=seeds())
def test_backward_matches_central_differences(graph: Graph, width: int, name: Any, seed: int):
    # continuous features: a max or min has no ties (where it has no derivative)
    rng = np.random.default_rng(seed)
    edge_attr = features(rng, (graph.num_edges, width), coarse=False)
    report = check_gradients(Fill(graph, fill_of(name, width)), {}, (edge_attr,), rng=rng)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("name", ["mean", "add", "max", "min", "mul"])
def test_gradient_check_sees_a_wrong_reduction_backward(name: str) -> None:
    graph = Graph(np.array([[0, 2, 2, 1, 3], [1, 1, 1, 1, 0]]), 4)
    edge_attr = np.random.default_rng(2).standard_normal((5, 2))

    class Broken(Fill):
        def backward(self, params: dict, cache: Any, d_out: np.ndarray) -> tuple:
            d_out = d_out.copy()
            d_out[cache.features.shape[0] :] *= 1.01  # the loops' rows: the reduction's share
            return fill_self_loops_backward(cache, d_out), {}

    report = check_gradients(Broken(graph, name), {}, (edge_attr,))
    assert report.max_rel_error > 1e-3


def test_ties_share_the_gradient_and_zeros_take_the_rest_of_the_product() -> None:
    # node 1 hears from 0, 2 and 3 (and has a self-loop, dropped): feature 0 ties at 2.0,
    # feature 1 has one zero factor
    graph = Graph(np.array([[0, 2, 3, 1], [1, 1, 1, 1]]), 4)
    edge_attr = np.array([[2.0, 3.0], [2.0, 0.0], [-1.0, 5.0], [9.0, 9.0]])
    d_loops = np.zeros((4, 2))
    d_loops[1] = [1.0, 1.0]  # the gradient of the loop (1, 1) alone
    d_out = np.concatenate([np.zeros((3, 2)), d_loops])
    out, cache = fill_self_loops(edge_attr, graph, "max")
    np.testing.assert_array_equal(out[3 + 1], [2.0, 5.0])
    np.testing.assert_array_equal(
        fill_self_loops_backward(cache, d_out), [[0.5, 0.0], [0.5, 0.0], [0.0, 1.0], [0.0, 0.0]]
    )
    out, cache = fill_self_loops(edge_attr, graph, "mul")
    np.testing.assert_array_equal(out[3 + 1], [-4.0, 0.0])
    np.testing.assert_allclose(
        fill_self_loops_backward(cache, d_out),
        [[-2.0, 0.0], [-2.0, 15.0], [4.0, 0.0], [0.0, 0.0]],
        rtol=F64,
        atol=0,
    )
    # a node without incoming edges: 0, except the product's 1
    assert fill_self_loops(edge_attr, graph, "mul")[0][3 + 2].tolist() == [1.0, 1.0]
    assert fill_self_loops(edge_attr, graph, "mean")[0][3 + 2].tolist() == [0.0, 0.0]


# Graphs whose targets reach the reductions' hard cases, run on every derandomised run: the
# drawn graphs above rarely give a "mean" or "mul" target two kept in-edges or zeros.
HARD_CASES = {
    # node 2 hears from 0 and 1; its self-loop is dropped; nodes 0 and 1 hear from nobody
    "two kept in-edges": (Graph(np.array([[0, 1, 2], [2, 2, 2]]), 3),
                          [[1.5, -2.0], [0.5, 4.0], [9.0, 9.0]]),
    # node 2's first feature has one zero factor, its second two
    "one zero, two zeros": (Graph(np.array([[0, 1, 3], [2, 2, 2]]), 4),
                            [[0.0, 0.0], [3.0, 0.0], [-1.5, 5.0]]),
    # 5 sources, 3 targets: loops for targets 0..2; an edge 1 -> 1 dropped as a self-loop
    "bipartite, more sources": (Graph(np.array([[4, 3, 1, 0, 2], [2, 2, 1, 1, 1]]), 5,
                                      num_dst_nodes=3), [[2.0], [-0.5], [7.0], [0.0], [3.0]]),
    # 2 sources, 4 targets: loops for targets 0 and 1 only, target 3 hears from both
    "bipartite, more targets": (Graph(np.array([[0, 1, 1, 0], [3, 3, 0, 1]]), 2,
                                      num_dst_nodes=4), [[2.0], [-0.5], [7.0], [0.25]]),
}  # fmt: skip


@pytest.mark.parametrize("name", FILLS)
@pytest.mark.parametrize("case", list(HARD_CASES))
def test_hard_cases_match_the_literal_twin(case: str, name: Any) -> None:
    graph, edge_attr = HARD_CASES[case]
    edge_attr = np.array(edge_attr)
    fill_value = fill_of(name, edge_attr.shape[1])
    loops = min(graph.num_nodes, graph.num_dst_nodes)
    out, cache = fill_self_loops(edge_attr, graph, fill_value)
    twin = loop_fill_forward(edge_attr, graph.edge_index, loops, fill_value)
    assert out.shape == twin.shape
    assert max_relative_error(out, twin) <= TWIN_RTOL
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_edge_attr = fill_self_loops_backward(cache, d_out)
    twin_d = loop_fill_backward(d_out, edge_attr, graph.edge_index, loops, fill_value)
    assert max_relative_error(d_edge_attr, twin_d) <= TWIN_RTOL


def test_mul_fill_is_the_direct_product_not_exp_of_a_log_sum() -> None:
    # Regression: the "mul" fill was sign * exp(sum log |a|), up to 2.9e-15 off for one
    # factor and 1.2e-13 for 20 (torch multiplies directly, exactly for one factor), so
    # check_pyg_module failed a correct PyG layer in 86 of 100 seeds on 1e5-scale edge
    # features; the twin comparison, at TWIN_RTOL = 1e-12, could not see a few ulps.
    rng = np.random.default_rng(0)
    one_each = Graph(np.array([np.arange(1, 51), np.arange(50)]), 51)  # one factor per node
    edge_attr = 1e5 * rng.standard_normal((50, 3))
    out, _ = fill_self_loops(edge_attr, one_each, "mul")
    np.testing.assert_array_equal(out[50:100], edge_attr)
    # factors whose every partial product is an exact binary fraction: the product is exact
    factors = np.array([0.5, -1.25, 3.0, 0.375, 2.0**-20, -7.0, 1e5 / 2**10, 96.0])
    graph = Graph(np.array([np.arange(1, 9), np.zeros(8, int)]), 9)
    out, _ = fill_self_loops(factors[:, None], graph, "mul")
    exact = math.prod(Fraction(float(a)) for a in factors)
    assert out[8, 0] == float(exact) and Fraction(float(out[8, 0])) == exact


@given(graph=st.one_of(graphs(max_edges=30), bipartite_graphs()), width=st.integers(1, 3),
       seed=seeds(), single=st.booleans())  # fmt: skip
def test_both_product_routes_multiply_in_edge_order_bit_for_bit(graph, width, seed, single):
    # multiply.reduceat (NumPy, strict) and the route by rank (CuPy) against the product
    # written out left to right, edge by edge: the same rounded numbers, empty targets 1
    dtype = np.float32 if single else np.float64
    values = np.random.default_rng(seed).uniform(0.5, 2.0, (graph.num_edges, width))
    values = values.astype(dtype)
    segments = graph.dst_segments(np)
    expected = np.ones((graph.num_dst_nodes, width), dtype=dtype)
    for e, v in enumerate(np.asarray(graph.edge_index[1])):
        expected[v] = expected[v] * values[e]
    for by_rank in (False, True):
        product = _segment_product(values, segments, by_rank=by_rank)
        assert product.dtype == dtype
        np.testing.assert_array_equal(product, expected)


@pytest.mark.parametrize("name", ["mul", "mean", "max"])
def test_the_strict_backend_gives_the_same_bits(name: str) -> None:
    graph, edge_attr = HARD_CASES["one zero, two zeros"]
    edge_attr = np.array(edge_attr)
    out, cache = fill_self_loops(edge_attr, graph, name)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    strict_graph, strict_attr = graph.to_backend("strict"), asarray(edge_attr, backend="strict")
    strict_out, strict_cache = fill_self_loops(strict_attr, strict_graph, name)
    np.testing.assert_array_equal(to_numpy(strict_out), out)
    d_strict = fill_self_loops_backward(strict_cache, asarray(d_out, backend="strict"))
    np.testing.assert_array_equal(to_numpy(d_strict), fill_self_loops_backward(cache, d_out))


@pytest.mark.parametrize(
    ("fill_value", "match"),
    [
        ("median", "fill_value must be"),
        (True, "not a bool"),
        ((1.0, 2.0), "has 2 numbers but edge_dim is 3"),
        (float("nan"), "finite"),
        ([[1.0]], "finite numbers"),
        (object(), "finite numbers"),
        (10**400, r"finite numbers in float64's range .*, got 1000000000"),  # not OverflowError
        (np.array([1.0, np.inf, 2.0]), "finite numbers"),
        (np.array([1.0, 2.0]), "has 2 numbers but edge_dim is 3"),  # not "truth value"
    ],
)
def test_bad_fill_value_is_refused(fill_value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        check_fill_value(fill_value, 3)
    assert "\n" not in str(info.value)


def test_an_array_fill_value_is_taken_as_pyg_takes_a_tensor() -> None:
    assert check_fill_value(np.array([0.5, -2.0, 1.0]), 3) == (0.5, -2.0, 1.0)
    assert check_fill_value(np.float32(0.25), 3) == 0.25


# -- against PyG's own add_self_loops ----------------------------------------------------------


@given(graph=graphs(), width=st.integers(1, 3), name=st.sampled_from(FILLS), seed=seeds(),
       coarse=st.booleans())  # fmt: skip
def test_matches_pyg_add_self_loops_under_autograd(
    graph: Graph, width: int, name: Any, seed: int, coarse: bool
) -> None:
    torch = pytest.importorskip("torch")
    utils = pytest.importorskip("torch_geometric.utils")
    rng = np.random.default_rng(seed)
    fill_value = fill_of(name, width)
    # torch splits a max or min of exactly 0 with its zero-initialised output: no zeros there
    # (test_torch_shares_an_extreme_of_zero_with_its_initial_value)
    edge_attr = features(rng, (graph.num_edges, width), coarse, zeros=name not in ("max", "min"))
    out, cache = fill_self_loops(edge_attr, graph, fill_value)
    d_out = rng.standard_normal(out.shape)
    d_edge_attr = fill_self_loops_backward(cache, d_out)

    t_attr = torch.tensor(edge_attr, requires_grad=True)
    t_index = torch.tensor(np.asarray(graph.edge_index))
    pyg_fill = torch.tensor(fill_value) if isinstance(fill_value, tuple) else fill_value
    t_index, t_kept = utils.remove_self_loops(t_index, t_attr)
    _, t_out = utils.add_self_loops(t_index, t_kept, fill_value=pyg_fill, num_nodes=graph.num_nodes)
    t_out.backward(torch.tensor(d_out))
    assert max_relative_error(out, t_out.detach().numpy()) <= F64
    assert max_relative_error(d_edge_attr, t_attr.grad.numpy()) <= F64


@pytest.mark.parametrize("factors", [1, 2, 20])
def test_mul_fill_is_torchs_product_at_1e5_scale(factors: int) -> None:
    # torch multiplies each target's features in edge order (PyG: scatter_reduce "prod" onto
    # ones): the same rounded products, bit for bit, however large; the gradients to rounding
    torch = pytest.importorskip("torch")
    utils = pytest.importorskip("torch_geometric.utils")
    rng = np.random.default_rng(factors)
    num_nodes = 30
    targets = np.repeat(np.arange(num_nodes), factors)
    edge_index = np.stack([(targets + rng.integers(1, num_nodes, targets.size)) % num_nodes,
                           targets])  # fmt: skip
    order = rng.permutation(targets.size)  # the edges of a target interleaved with others'
    graph = Graph(edge_index[:, order], num_nodes)
    edge_attr = 1e5 * rng.standard_normal((targets.size, 3))
    out, cache = fill_self_loops(edge_attr, graph, "mul")
    d_out = rng.standard_normal(out.shape)
    t_attr = torch.tensor(edge_attr, requires_grad=True)
    _, t_out = utils.add_self_loops(torch.tensor(graph.edge_index), t_attr, fill_value="mul",
                                    num_nodes=num_nodes)  # fmt: skip
    np.testing.assert_array_equal(out, t_out.detach().numpy())
    t_out.backward(torch.tensor(d_out))
    assert max_relative_error(fill_self_loops_backward(cache, d_out), t_attr.grad.numpy()) <= F64


@pytest.mark.parametrize("name", ["max", "min"])
def test_torch_shares_an_extreme_of_zero_with_its_initial_value(name: str) -> None:
    # Where a node's incoming features peak at exactly 0, torch 2.x's scatter_reduce backward
    # (include_self=False) counts the zero it initialised the output with as one more tie:
    # k tied edges get 1/(k + 1) each, and 1/(k + 1) of the gradient is lost, which is no
    # subgradient of the max. We give each 1/k (refimpl.ops.loop_fill). This pins torch's
    # behaviour, so a torch that changes it is noticed.
    torch = pytest.importorskip("torch")
    utils = pytest.importorskip("torch_geometric.utils")
    sign = 1.0 if name == "max" else -1.0
    edge_attr = sign * np.array([[0.0], [0.0], [-0.5]])  # node 0's edges tie at 0
    graph = Graph(np.array([[1, 1, 1], [0, 0, 0]]), 2)
    d_out = np.zeros((5, 1))
    d_out[3] = 1.0  # the gradient of node 0's loop alone
    out, cache = fill_self_loops(edge_attr, graph, name)
    ours = fill_self_loops_backward(cache, d_out)
    t_attr = torch.tensor(edge_attr, requires_grad=True)
    _, t_out = utils.add_self_loops(torch.tensor(graph.edge_index), t_attr, fill_value=name,
                                    num_nodes=2)  # fmt: skip
    t_out.backward(torch.tensor(d_out))
    assert out[3, 0] == t_out[3, 0].item() == 0.0
    np.testing.assert_array_equal(ours[:, 0], [0.5, 0.5, 0.0])
    np.testing.assert_array_equal(t_attr.grad.numpy()[:, 0], [1 / 3, 1 / 3, 0.0])
