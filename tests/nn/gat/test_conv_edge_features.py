"""GATConv's PyG options beyond the papers (issue 22): edge features (``edge_dim``, with every
``fill_value`` for the added self-loops) and GATv2's projection biases. Central differences on
drawn graphs (isolated nodes, duplicate edges, existing self-loops), the parameter layout, and
the configuration and input checks. The literal twins are in tests/naive/test_gat_twins.py,
torch autograd with PyG's own self-loop code in test_conv_torch.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.nn import GATConv
from refimpl.testing import check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from tests.nn.gat.test_conv import kink_distance, setups
from tests.nn.transformer.test_transformer_conv import assert_catches_a_wrong_edge_gradient

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
FILLS = ["mean", "add", "sum", "max", "min", "mul", 0.5, None, "vector"]


@st.composite
def edge_setups(draw: st.DrawFn, coarse: bool = False) -> tuple:
    """``setups()`` with edge features: ``(conv, params, x, graph, edge_attr, kwargs)``, the
    layer with ``edge_dim``, a drawn ``fill_value`` and (v2) drawn projection biases; the
    features standard normal, or (``coarse``) on a grid of halves (ties and zeros)."""
    conv, params, x, graph, kwargs = draw(setups(lipschitz_norms=[None]))
    edge_dim = draw(st.integers(1, 3))
    fill = draw(st.sampled_from(FILLS))
    conv = replace(
        conv,
        edge_dim=edge_dim,
        fill_value=tuple(np.linspace(-1, 1, edge_dim)) if fill == "vector" else fill,
        projection_bias=conv.version == "v2" and draw(st.booleans()),
    )
    rng = np.random.default_rng(draw(seeds()))
    drawn = {name: rng.standard_normal(shape) for name, shape in conv.param_shapes().items()}
    params = {name: params.get(name, drawn[name]) for name in conv.param_shapes()}
    shape = (graph.num_edges, edge_dim)
    edge_attr = rng.integers(-2, 3, size=shape) / 2.0 if coarse else rng.standard_normal(shape)
    return conv, params, x, graph, edge_attr, kwargs


@given(setup=edge_setups())
def test_backward_matches_central_differences(setup: tuple) -> None:
    conv, params, x, graph, edge_attr, kwargs = setup
    _, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    assume(kink_distance(cache) > 1e-4)
    report = check_gradients(
        conv, params, (x, graph, edge_attr), forward_kwargs=kwargs, max_entries=None
    )
    checked = {e.name for e in report.errors}
    assert {"input[0]", "input[2]", "param:W_e"} <= checked
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_gradient_check_catches_a_wrong_edge_backward(version: str) -> None:
    graph = Graph(np.array([[0, 1, 2, 2, 3], [1, 2, 0, 1, 1]]), 4)
    conv = GATConv(3, 2, heads=2, version=version, edge_dim=2)
    rng = np.random.default_rng(1)
    params = {k: 2.0 * v for k, v in conv.init_params(rng).items()}
    x, edge_attr = rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
    assert_catches_a_wrong_edge_gradient(conv, params, x, graph, edge_attr)


@pytest.mark.parametrize("shared", [False, True])
def test_projection_biases_shift_both_sides_and_the_message(shared: bool) -> None:
    # GATv2Conv(bias=True): lin_l and lin_r carry biases, so W_s h_u + b_s is both the
    # score's source term and the message; with a zero b_s, b_t the layer is the papers'.
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    paper = GATConv(3, 2, heads=2, version="v2", share_weights=shared)
    biased = replace(paper, projection_bias=True)
    assert list(biased.param_shapes()) == (
        ["W_s", "b_s", "att", "bias"] if shared else ["W_s", "b_s", "W_t", "b_t", "att", "bias"]
    )
    rng = np.random.default_rng(3)
    params = biased.init_params(rng)
    x = rng.standard_normal((3, 3))
    zeroed = {k: (0 * v if k in ("b_s", "b_t") else v) for k, v in params.items()}
    without = {k: v for k, v in params.items() if k not in ("b_s", "b_t")}
    np.testing.assert_array_equal(
        biased.forward(zeroed, x, graph)[0], paper.forward(without, x, graph)[0]
    )
    assert max_relative_error(biased.forward(params, x, graph)[0],
                              paper.forward(without, x, graph)[0]) > 1e-3  # fmt: skip


@given(setup=edge_setups(), seed=seeds())
def test_an_existing_self_loop_is_replaced_with_its_features(setup: tuple, seed: int) -> None:
    # With add_self_loops, a self-loop's own features are dropped with it: changing them
    # changes nothing, and they get no gradient.
    conv, params, x, graph, edge_attr, kwargs = setup
    assume(conv.add_self_loops and np.any(graph.is_self_loop()))
    out, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    changed = edge_attr.copy()
    changed[graph.is_self_loop()] += np.random.default_rng(seed).standard_normal(
        changed[graph.is_self_loop()].shape
    )
    np.testing.assert_array_equal(conv.forward(params, x, graph, changed, **kwargs)[0], out)
    (_, d_edge_attr), _ = conv.backward(params, cache, np.ones_like(out))
    assert not np.any(d_edge_attr[graph.is_self_loop()])


def test_one_edge_feature_may_be_a_vector() -> None:
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    conv = GATConv(2, 2, edge_dim=1)
    rng = np.random.default_rng(0)
    params, x, edge_attr = conv.init_params(rng), rng.standard_normal((3, 2)), rng.random(3)
    out, cache = conv.forward(params, x, graph, edge_attr)
    column, column_cache = conv.forward(params, x, graph, edge_attr[:, None])
    np.testing.assert_array_equal(out, column)
    d_out = rng.standard_normal(out.shape)
    (_, d_edge_attr), d_params = conv.backward(params, cache, d_out)
    (_, d_column), d_column_params = conv.backward(params, column_cache, d_out)
    # the gradient is shaped as the input it is of: it was (E, 1) for an (E,) edge_attr, and
    # check_pyg_module failed PyG's own test input (torch's gradient of a view is (E,))
    assert d_edge_attr.shape == (3,) and d_column.shape == (3, 1)
    np.testing.assert_array_equal(d_edge_attr, d_column[:, 0])
    for name in params:
        np.testing.assert_array_equal(d_params[name], d_column_params[name])
    assert check_gradients(conv, params, (x, graph, edge_attr), rng=rng).passed


def _edge_layer() -> tuple[GATConv, dict, np.ndarray, Graph, np.ndarray]:
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    conv = GATConv(2, 2, edge_dim=2)
    rng = np.random.default_rng(0)
    return conv, conv.init_params(rng), rng.standard_normal((3, 2)), graph, np.ones((3, 2))


@pytest.mark.parametrize(
    ("edge_dim", "edge_attr", "match"),
    [
        (2, None, r"has edge_dim=2 and needs edge_attr of shape \(3, 2\)"),
        (None, np.ones((3, 2)), "edge_attr was given but this GATConv has no edge_dim"),
        (2, np.ones((4, 2)), r"edge_attr must have shape \(3, 2\)"),
        (2, np.full((3, 2), np.nan), "edge_attr"),
    ],
)
def test_bad_edge_attr_gives_a_clear_error(edge_dim: Any, edge_attr: Any, match: str) -> None:
    conv, params, x, graph, _ = _edge_layer()
    conv = replace(conv, edge_dim=edge_dim)
    params = conv.init_params(np.random.default_rng(0))
    with pytest.raises(ValueError, match=match):
        conv.forward(params, x, graph, edge_attr)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"edge_dim": 0}, "edge_dim must be None or a positive int"),
        ({"edge_dim": True}, "edge_dim must be None or a positive int"),
        ({"edge_dim": 2, "fill_value": "median"}, "fill_value must be"),
        ({"edge_dim": 2, "fill_value": (1.0, 2.0, 3.0)}, "has 3 numbers but edge_dim is 2"),
        ({"projection_bias": True}, "projection_bias is GATv2's"),
        ({"edge_dim": 2, "lipschitz_norm": "paper"}, "LipschitzNorm is defined for scores"),
    ],
)
def test_bad_configuration(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GATConv(2, 2, **kwargs)


def test_a_positional_training_flag_is_refused_as_edge_attr() -> None:
    # forward(params, x, graph, edge_attr, ...), as TransformerConv: a caller of the order
    # before edge features (training fourth) hears so in one line
    conv, params, x, graph, _ = _edge_layer()
    conv = replace(conv, edge_dim=None)
    params = conv.init_params(np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"edge_attr must be an array or None, got bool.*keyword"):
        conv.forward(params, x, graph, True)
