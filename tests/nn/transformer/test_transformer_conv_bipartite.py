"""TransformerConv on bipartite input (issue 22), as PyG's: ``x = (x_src, x_dst)``, queries and
the root weight from the targets' features, keys and values from the sources'; ``in_channels``
one int or ``(F_src, F_dst)``. Central differences and the literal twin on drawn bipartite
graphs with every option but LipschitzNorm; the pair ``(x, x)`` on one node set equal to ``x``;
the checks. PyG parity: tests/interop/test_pyg_module.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.naive.transformer_conv import transformer_conv_backward, transformer_conv_forward
from refimpl.nn import TransformerConv
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.strategies import bipartite_graphs, seeds
from refimpl.testing.tolerances import GRADCHECK_RTOL, TWIN_RTOL
from tests.bipartite import Bipartite


@st.composite
def setups(draw: st.DrawFn) -> tuple:
    """``(conv, params, x_src, x_dst, graph, edge_attr or None, keep or None)``."""
    graph = draw(bipartite_graphs())
    pair = draw(st.booleans())
    sizes = (draw(st.integers(1, 4)), draw(st.integers(1, 4))) if pair else draw(st.integers(1, 4))
    root_weight = draw(st.booleans())
    dropout = draw(st.sampled_from([0.0, 0.4]))
    conv = TransformerConv(
        in_channels=sizes,
        out_channels=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 3)),
        concat=draw(st.booleans()),
        beta=root_weight and draw(st.booleans()),
        dropout=dropout,
        edge_dim=draw(st.sampled_from([None, 2])),
        bias=draw(st.booleans()),
        root_weight=root_weight,
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {name: rng.standard_normal(shape) for name, shape in conv.param_shapes().items()}
    f_src, f_dst = conv.in_sizes
    x_src = rng.standard_normal((graph.num_nodes, f_src))
    x_dst = rng.standard_normal((graph.num_dst_nodes, f_dst))
    edge_attr = None if conv.edge_dim is None else rng.standard_normal((graph.num_edges, 2))
    keep = rng.random((graph.num_edges, conv.heads)) >= dropout if dropout else None
    return conv, params, x_src, x_dst, graph, edge_attr, keep


def _kwargs(keep: Any) -> dict:
    return {} if keep is None else {"training": True, "attn_dropout_mask": keep}


@given(setup=setups())
def test_backward_matches_central_differences(setup: tuple) -> None:
    conv, params, x_src, x_dst, graph, edge_attr, keep = setup
    inputs = (x_src, x_dst, graph) + (() if edge_attr is None else (edge_attr,))
    report = check_gradients(
        Bipartite(conv), params, inputs, forward_kwargs=_kwargs(keep), max_entries=None
    )
    assert {"input[0]", "input[1]"} <= {e.name for e in report.errors}
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=setups())
def test_matches_the_twin(setup: tuple) -> None:
    conv, params, x_src, x_dst, graph, edge_attr, keep = setup
    out, cache = conv.forward(params, (x_src, x_dst), graph, edge_attr, **_kwargs(keep))
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_inputs, d_params = conv.backward(params, cache, d_out)
    twin_out, twin_alpha, _ = transformer_conv_forward(
        conv, params, (x_src, x_dst), graph.edge_index, edge_attr, keep
    )
    twin_inputs, twin_params = transformer_conv_backward(
        conv, params, (x_src, x_dst), graph.edge_index, d_out, edge_attr, keep
    )
    assert max_relative_error(out, twin_out) <= TWIN_RTOL
    assert max_relative_error(conv.attention_weights(cache)[1], twin_alpha) <= TWIN_RTOL
    ours, theirs = dict(d_params), dict(twin_params)
    for grads, into in ((d_inputs, ours), (twin_inputs, theirs)):
        pair = grads[0] if conv.edge_dim is not None else grads
        into["x_src"], into["x_dst"] = pair
        if conv.edge_dim is not None:
            into["edge_attr"] = grads[1]
    # judged over the largest gradient entry of all: b_k's is zero by cancellation (the
    # softmax ignores q_v . b_k), rounding on both sides
    errors = relative_errors(ours, theirs)
    assert max(errors.values()) <= TWIN_RTOL, errors


@given(seed=seeds())
def test_the_pair_x_x_on_one_node_set_is_x(seed: int) -> None:
    graph = Graph(np.array([[0, 1, 2, 2, 3, 1], [1, 2, 0, 1, 1, 1]]), 4)
    conv = TransformerConv(3, 2, heads=2, edge_dim=2, beta=True)
    rng = np.random.default_rng(seed)
    params = conv.init_params(rng)
    x, edge_attr = rng.standard_normal((4, 3)), rng.standard_normal((6, 2))
    out, cache = conv.forward(params, x, graph, edge_attr)
    pair_out, pair_cache = conv.forward(params, (x, x.copy()), graph, edge_attr)
    assert max_relative_error(pair_out, out) <= 1e-15
    d_out = rng.standard_normal(out.shape)
    (d_x, d_edge_attr), d_params = conv.backward(params, cache, d_out)
    ((d_x_src, d_x_dst), pair_d_edge_attr), pair_d_params = conv.backward(params, pair_cache, d_out)
    assert max_relative_error(d_x_src + d_x_dst, d_x) <= 1e-14
    assert max_relative_error(pair_d_edge_attr, d_edge_attr) <= 1e-14
    assert max(relative_errors(pair_d_params, d_params).values()) <= 1e-14


def test_shapes_and_checks() -> None:
    graph = Graph(np.array([[0, 4, 3], [0, 2, 2]]), 5, num_dst_nodes=3)
    conv = TransformerConv((4, 2), 3, heads=2)
    shapes = conv.param_shapes()
    assert shapes["W_q"] == (6, 2) and shapes["W_k"] == shapes["W_v"] == (6, 4)
    assert shapes["W_skip"] == (6, 2)  # PyG's lin_skip reads the targets' width
    rng = np.random.default_rng(0)
    params = conv.init_params(rng)
    out, _ = conv.forward(params, (rng.random((5, 4)), rng.random((3, 2))), graph)
    assert out.shape == (3, 6)
    with pytest.raises(ValueError, match=r"in_channels=\(4, 2\): pass x as a pair"):
        conv.forward(params, rng.random((5, 4)), graph)
    with pytest.raises(ValueError, match=r"x_dst has shape \(2, 2\)"):
        conv.forward(params, (rng.random((5, 4)), rng.random((2, 2))), graph)
    # a width mismatch names the side that has it
    with pytest.raises(ValueError, match=r"^x_src must have shape \(\*, 4\), got \(5, 3\)$"):
        conv.forward(params, (rng.random((5, 3)), rng.random((3, 2))), graph)
    with pytest.raises(ValueError, match=r"^x_dst must have shape \(\*, 2\), got \(3, 5\)$"):
        conv.forward(params, (rng.random((5, 4)), rng.random((3, 5))), graph)
    with pytest.raises(ValueError, match="LipschitzNorm is defined on one node set"):
        TransformerConv((4, 2), 3, lipschitz_norm="paper")
