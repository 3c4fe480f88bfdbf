"""GATConv on bipartite input (issue 22): ``x = (x_src, x_dst)`` on a graph whose targets are a
second node set, with ``in_channels`` one int (one map for both sides, PyG's ``lin``) or a pair
``(F_src, F_dst)`` (PyG's ``lin_src``/``lin_dst``, ``lin_l``/``lin_r``). Central differences
and the literal twins on drawn bipartite graphs (isolated nodes on either side, duplicate edges,
edges ``i -> i``), with every other option; the pair ``(x, x)`` on one node set equal to ``x``;
the checks. PyG parity: tests/interop/test_pyg_module.py and test_pyg_parity.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.nn import GATConv
from refimpl.testing import check_gradients, max_relative_error
from refimpl.testing.strategies import bipartite_graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL, TWIN_RTOL
from tests.bipartite import Bipartite
from tests.naive.test_gat_twins import Case, cancelled, run_both, twin_errors
from tests.nn.gat.test_conv import kink_distance

F64 = FORWARD_RTOL[np.dtype(np.float64)]


@st.composite
def setups(draw: st.DrawFn) -> tuple:
    """``(conv, params, x_src, x_dst, graph, edge_attr or None, kwargs)``."""
    graph = draw(bipartite_graphs())
    version = draw(st.sampled_from(["v1", "v2"]))
    pair = draw(st.booleans())
    sizes = (draw(st.integers(1, 4)), draw(st.integers(1, 4))) if pair else draw(st.integers(1, 4))
    conv = GATConv(
        in_channels=sizes,
        out_channels=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 3)),
        concat=draw(st.booleans()),
        version=version,
        share_weights=version == "v2" and not pair and draw(st.booleans()),
        negative_slope=draw(st.sampled_from([0.2, 0.01, 0.5])),
        add_self_loops=draw(st.booleans()),
        bias=draw(st.booleans()),
        residual=draw(st.booleans()),
        projection_bias=version == "v2" and draw(st.booleans()),
        edge_dim=draw(st.sampled_from([None, 2])),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {name: rng.standard_normal(shape) for name, shape in conv.param_shapes().items()}
    f_src, f_dst = sizes if pair else (sizes, sizes)
    x_src = rng.standard_normal((graph.num_nodes, f_src))
    x_dst = rng.standard_normal((graph.num_dst_nodes, f_dst))
    edge_attr = None if conv.edge_dim is None else rng.standard_normal((graph.num_edges, 2))
    kwargs: dict = {}
    if draw(st.booleans()):
        attended = conv.prepare_graph(graph).num_edges
        keep = rng.random((attended, conv.heads)) >= 0.4
        conv = conv.__class__(**{**conv.__dict__, "dropout": 0.4})
        kwargs = {"training": True, "attn_dropout_mask": keep}
    return conv, params, x_src, x_dst, graph, edge_attr, kwargs


@given(setup=setups())
def test_backward_matches_central_differences(setup: tuple) -> None:
    conv, params, x_src, x_dst, graph, edge_attr, kwargs = setup
    _, cache = conv.forward(params, (x_src, x_dst), graph, edge_attr, **kwargs)
    assume(kink_distance(cache) > 1e-4)
    inputs = (x_src, x_dst, graph) + (() if edge_attr is None else (edge_attr,))
    report = check_gradients(
        Bipartite(conv), params, inputs, forward_kwargs=kwargs, max_entries=None
    )
    assert {"input[0]", "input[1]"} <= {e.name for e in report.errors}
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=setups())
def test_matches_the_twin(setup: tuple) -> None:
    conv, params, x_src, x_dst, graph, edge_attr, kwargs = setup
    keep = kwargs.get("attn_dropout_mask")
    width = conv.heads * conv.out_channels if conv.concat else conv.out_channels
    d_out = np.random.default_rng(0).standard_normal((graph.num_dst_nodes, width))
    case = Case(conv, params, (x_src, x_dst), graph, keep, d_out, edge_attr)
    actual, expected = run_both(case)
    assume(not cancelled(actual, expected))
    errors = twin_errors(actual, expected)
    assert {"d_x_src", "d_x_dst"} <= set(errors) and max(errors.values()) <= TWIN_RTOL, errors


@pytest.mark.parametrize("version", ["v1", "v2"])
@given(seed=seeds())
def test_the_pair_x_x_on_one_node_set_is_x(version: str, seed: int) -> None:
    # PyG's (x, x): the same output, and the two sides' gradients sum to x's
    graph = Graph(np.array([[0, 1, 2, 2, 3, 1], [1, 2, 0, 1, 1, 1]]), 4)
    conv = GATConv(3, 2, heads=2, version=version, residual=True)
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(v.shape) for k, v in conv.init_params(rng).items()}
    x = rng.standard_normal((4, 3))
    out, cache = conv.forward(params, x, graph)
    pair_out, pair_cache = conv.forward(params, (x, x.copy()), graph)
    assert max_relative_error(pair_out, out) <= 1e-15
    d_out = rng.standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out)
    (d_x_src, d_x_dst), pair_d_params = conv.backward(params, pair_cache, d_out)
    assert max_relative_error(d_x_src + d_x_dst, d_x) <= 1e-14
    for name, grad in d_params.items():
        assert max_relative_error(pair_d_params[name], grad) <= 1e-14, name


def test_output_rows_are_the_targets_and_loops_the_common_nodes() -> None:
    # 5 sources, 3 targets: 3 output rows; add_self_loops adds i -> i for i < min(5, 3)
    graph = Graph(np.array([[0, 4, 3, 1], [0, 2, 2, 1]]), 5, num_dst_nodes=3)
    conv = GATConv((4, 2), 3, heads=2)
    assert list(conv.param_shapes()) == ["W_s", "W_t", "att_src", "att_dst", "bias"]
    rng = np.random.default_rng(1)
    params = conv.init_params(rng)
    out, cache = conv.forward(params, (rng.random((5, 4)), rng.random((3, 2))), graph)
    assert out.shape == (3, 6)
    edge_index, _ = conv.attention_weights(cache)
    np.testing.assert_array_equal(edge_index, [[4, 3, 0, 1, 2], [2, 2, 0, 1, 2]])


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda x, g: ((x[0], x[1][:2]), g), ValueError, r"x_dst has shape \(2, 2\)"),
        (lambda x, g: (x[0], g), ValueError, r"in_channels=\(4, 2\): pass x as a pair"),
        (lambda x, g: ((x[0], x[1].astype(np.float32)), g), TypeError, "x_dst"),
        (lambda x, g: ((x[0],), g), TypeError, "a pair of arrays"),
    ],
)
def test_bad_bipartite_input_gives_a_clear_error(make: Any, error: type, match: str) -> None:
    graph = Graph(np.array([[0, 4], [0, 2]]), 5, num_dst_nodes=3)
    conv = GATConv((4, 2), 3)
    rng = np.random.default_rng(0)
    x, g = make((rng.random((5, 4)), rng.random((3, 2))), graph)
    with pytest.raises(error, match=match):
        conv.forward(conv.init_params(rng), x, g)


def test_a_bipartite_graph_needs_the_pair_and_configurations_are_checked() -> None:
    graph = Graph(np.array([[0, 4], [0, 2]]), 5, num_dst_nodes=3)
    conv = GATConv(4, 3)
    with pytest.raises(ValueError, match=r"bipartite \(5 sources, 3 targets\): pass x as a pair"):
        conv.forward(conv.init_params(np.random.default_rng(0)), np.ones((5, 4)), graph)
    with pytest.raises(ValueError, match="share_weights needs one width"):
        GATConv((4, 2), 3, version="v2", share_weights=True)
    with pytest.raises(ValueError, match="LipschitzNorm is defined on one node set"):
        GATConv((4, 2), 3, lipschitz_norm="paper")
    with pytest.raises(ValueError, match="in_channels must be a positive int, or a pair"):
        GATConv((4, 0), 3)


def test_v2_projection_biases_are_drawn_within_each_sides_fan_in() -> None:
    # PyG's lin_l and lin_r are Linear(F_src, .) and Linear(F_dst, .): each bias from
    # U(-1/sqrt(F), 1/sqrt(F)) of its own side. Widths 100 and 4 give bounds 0.1 and 0.5, and
    # 64 draws each come within 0.8 of their bound (all below it: 0.8**64, about 1e-6).
    conv = GATConv((100, 4), 8, heads=8, version="v2", projection_bias=True)
    params = conv.init_params(np.random.default_rng(0))
    for name, fan_in in (("b_s", 100), ("b_t", 4)):
        largest, bound = np.abs(params[name]).max(), 1 / np.sqrt(fan_in)
        assert 0.8 * bound < largest <= bound, (name, largest, bound)


@pytest.mark.parametrize("sides", ["x_dst", "both"])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_sparse_x_dst_gives_the_dense_results(sides: str, version: str) -> None:
    # sparse input features on the targets' side: its map, the residual's x_dst W_res^T and
    # both their weight gradients run over the stored values; d_x_dst is dense
    rng = np.random.default_rng(0)
    graph = Graph(np.stack([rng.integers(0, 6, 14), rng.integers(0, 5, 14)]), 6, num_dst_nodes=5)
    conv = GATConv((4, 3), 2, heads=2, version=version, residual=True,
                   projection_bias=version == "v2")  # fmt: skip
    params = conv.init_params(rng)
    x_src = rng.standard_normal((6, 4))
    x_dst = np.where(rng.random((5, 3)) < 0.5, rng.standard_normal((5, 3)), 0.0)
    sparse_src = sp.csr_matrix(x_src) if sides == "both" else x_src
    d_out = rng.standard_normal((5, 4))
    results = []
    for x in ((x_src, x_dst), (sparse_src, sp.csr_matrix(x_dst))):
        out, cache = conv.forward(params, x, graph)
        (d_x_src, d_x_dst), d_params = conv.backward(params, cache, d_out)
        results.append({"out": out, "d_x_src": d_x_src, "d_x_dst": d_x_dst, **d_params})
    for name, dense in results[0].items():
        assert isinstance(results[1][name], np.ndarray), name
        assert max_relative_error(results[1][name], dense) <= F64, name  # sums reordered
