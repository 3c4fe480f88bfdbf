"""GTAttention (Dwivedi & Bresson's edge attention as released): finite differences on drawn
graphs, the clamp's derivative at its boundary, empty graphs, the uniform attention without edge
features, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.nn.transformer.gt_attention import CLAMP, GTAttention
from refimpl.nn.transformer.gt_layer import GTLayer
from refimpl.testing import check_gradients
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import GRADCHECK_RTOL
from tests.nn.transformer.test_stream import smooth


class Flat:
    """GTAttention as one output ``[h_out, e_out]`` flattened, for check_gradients (which
    takes one output array and a bare input gradient for one input)."""

    def __init__(self, attention: GTAttention) -> None:
        self.attention = attention

    def forward(self, params: dict, h: Any, graph: Graph, e: Any = None) -> tuple[Any, Any]:
        (h_out, e_out), cache = self.attention.forward(params, h, graph, e)
        return np.concatenate([h_out.ravel(), [] if e_out is None else e_out.ravel()]), cache

    def backward(self, params: dict, cache: Any, d_out: Any) -> tuple[Any, dict]:
        width = self.attention.out_channels
        nodes = cache.h.shape[0] * width
        d_h_out = d_out[:nodes].reshape(cache.h.shape[0], width)
        d_e_out = None if cache.e_out is None else d_out[nodes:].reshape(cache.e.shape[0], width)
        (d_h, d_e), d_params = self.attention.backward(params, cache, (d_h_out, d_e_out))
        return (d_h if d_e is None else (d_h, d_e)), d_params


@st.composite
def attention_setups(draw: st.DrawFn, max_nodes: int = 6) -> tuple:
    """A small GTAttention in every configuration, parameters moved off their init, inputs."""
    graph = draw(graphs(max_nodes=max_nodes, max_edges=12))
    heads = draw(st.integers(1, 2))
    attention = GTAttention(
        in_channels=draw(st.integers(1, 3)),
        out_channels=heads * draw(st.integers(1, 3)),
        heads=heads,
        edge_dim=draw(st.sampled_from([None, 1, 2])),
        qkv_bias=draw(st.booleans()),
        explicit_bias=draw(st.booleans()),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {
        name: value + 0.3 * rng.standard_normal(value.shape)
        for name, value in attention.init_params(rng).items()
    }
    h = rng.standard_normal((graph.num_nodes, attention.in_channels))
    e = None
    if attention.edge_dim is not None:
        e = rng.standard_normal((graph.num_edges, attention.edge_dim))
    return attention, params, h, graph, e


def away_from_clamp(cache: Any, step: float) -> bool:
    """No score sum within a step's reach of the clamp's corners at -5 and 5."""
    if cache.e_out is None:
        return True
    t = cache.e_out.sum(-1)  # (E, H)
    return bool(np.all(np.abs(np.abs(t) - CLAMP) > 1e3 * step))


@given(setup=attention_setups())
def test_attention_matches_central_differences(setup: tuple) -> None:
    attention, params, h, graph, e = setup
    _, cache = attention.forward(params, h, graph, e)
    assume(away_from_clamp(cache, 1e-6))
    inputs = (h, graph) if e is None else (h, graph, e)
    report = check_gradients(Flat(attention), params, inputs, max_entries=20)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def boundary_case(value: float) -> tuple:
    """One edge 0 -> 1 whose score sum is exactly ``value``: d_k = 1, every weight 1, h_0 = 1,
    h_1 = value, e = 1, so s = k_0 q_1 / sqrt(1) * P = 1 * value * 1."""
    attention = GTAttention(1, 1, heads=1, edge_dim=1)
    params = {name: np.ones(shape) for name, shape in attention.param_shapes().items()}
    graph = Graph(np.array([[0], [1]]), 2)
    return attention, params, np.array([[1.0], [value]]), graph, np.ones((1, 1))


@pytest.mark.parametrize("value", [CLAMP, -CLAMP, 7.0])
def test_clamp_passes_no_gradient_on_its_boundary_or_outside(value: float) -> None:
    """torch.clamp's derivative at exactly -5 and 5 is 0 (checked against torch in
    test_gt_torch): the weight's gradient stops there, and only the edge output's own
    cotangent reaches the queries and keys."""
    attention, params, h, graph, e = boundary_case(value)
    (h_out, e_out), cache = attention.forward(params, h, graph, e)
    assert e_out[0, 0] == value and not cache.inside[0, 0]
    _, d_params = attention.backward(params, cache, (np.ones_like(h_out), None))
    np.testing.assert_array_equal(d_params["W_q"], 0.0)
    np.testing.assert_array_equal(d_params["W_k"], 0.0)
    np.testing.assert_array_equal(d_params["W_e"], 0.0)
    assert d_params["W_v"][0, 0] != 0.0


def test_clamp_passes_the_gradient_just_inside() -> None:
    t = np.nextafter(CLAMP, 0.0)
    attention, params, h, graph, e = boundary_case(t)
    (h_out, _), cache = attention.forward(params, h, graph, e)
    assert cache.inside[0, 0]
    # one edge into node 1: h_out_1 = w V h_0 / (w + 1e-6) with V h_0 = 1, so d h_out / d t =
    # 1e-6 w / (w + 1e-6)^2 (tiny, not zero), and d t / d W_e = k_0 q_1 e = t
    _, d_params = attention.backward(params, cache, (np.ones_like(h_out), None))
    w = np.exp(t)
    # widened from 1e-12: the gradient is 1 / (w + 1e-6) - w / (w + 1e-6)^2, two terms ~1 / w
    # cancelling to 1e-6 / w^2, which amplifies their rounding by w / 1e-6 ~ 1.5e8
    np.testing.assert_allclose(d_params["W_e"][0, 0], 1e-6 * w / (w + 1e-6) ** 2 * t, rtol=1e-7)


def test_without_edge_features_attention_is_the_released_uniform_mean() -> None:
    """The released edge_feat=False replaces every score by ones: h_out_v is the mean of the
    values into v (up to the 1e-6), whatever Q and K are, and they get no gradient."""
    rng = np.random.default_rng(2)
    attention = GTAttention(3, 4, heads=2)
    params = attention.init_params(rng)
    graph = Graph(np.array([[0, 1, 2, 2], [1, 1, 1, 0]]), 4)
    h = rng.standard_normal((4, 3))
    (h_out, e_out), cache = attention.forward(params, h, graph)
    assert e_out is None
    val = h @ params["W_v"].T
    w = np.exp(min(2, CLAMP))  # d_k = 2
    expected = np.stack([val[2] * w / (w + 1e-6), (val[0] + val[1] + val[2]) * w / (3 * w + 1e-6),
                         np.zeros(4), np.zeros(4)])  # fmt: skip
    np.testing.assert_allclose(h_out, expected, rtol=1e-14, atol=0)
    _, d_params = attention.backward(params, cache, (rng.standard_normal((4, 4)), None))
    np.testing.assert_array_equal(d_params["W_q"], 0.0)
    np.testing.assert_array_equal(d_params["W_k"], 0.0)


def test_empty_edge_set_gives_zero_output() -> None:
    attention = GTAttention(2, 2, heads=1, edge_dim=2, explicit_bias=True)
    rng = np.random.default_rng(0)
    params = attention.init_params(rng)
    graph = Graph(np.zeros((2, 0), dtype=np.int64), 3)
    (h_out, e_out), cache = attention.forward(params, rng.standard_normal((3, 2)), graph,
                                              np.zeros((0, 2)))  # fmt: skip
    np.testing.assert_array_equal(h_out, np.zeros((3, 2)))
    assert e_out.shape == (0, 2)
    (d_h, d_e), d_params = attention.backward(params, cache, (np.ones((3, 2)), np.zeros((0, 2))))
    np.testing.assert_array_equal(d_h, np.zeros((3, 2)))
    assert d_e.shape == (0, 2) and list(d_params) == list(params)


def test_parameter_names_and_explicit_bias_shapes() -> None:
    shapes = GTAttention(5, 8, heads=2, edge_dim=5, explicit_bias=True).param_shapes()
    assert shapes == {
        "W_q": (8, 5), "W_k": (8, 5), "W_v": (8, 5), "W_e": (8, 5),
        "k_bias": (2, 4, 1), "e_bias": (2, 1, 4), "v_bias": (2, 1, 4),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"in_channels": 2, "out_channels": 6, "heads": 4}, "divisible by heads"),
        ({"in_channels": 0, "out_channels": 2}, "positive int"),
        ({"in_channels": 2, "out_channels": 2, "edge_dim": 0}, "positive int"),
        ({"in_channels": 2, "out_channels": 2, "explicit_bias": 1}, "True or False"),
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GTAttention(**kwargs)


def test_bad_inputs_are_rejected_in_one_line() -> None:
    attention = GTAttention(2, 2, heads=1, edge_dim=3)
    params = attention.init_params(np.random.default_rng(0))
    graph = Graph(np.array([[0], [1]]), 2)
    h = np.ones((2, 2))
    with pytest.raises(ValueError, match="needs e of shape"):
        attention.forward(params, h, graph)
    with pytest.raises(ValueError, match="rows but the graph has"):
        attention.forward(params, np.ones((3, 2)), graph, np.ones((1, 3)))
    (h_out, _), cache = attention.forward(params, h, graph, np.ones((1, 3)))
    with pytest.raises(TypeError, match="d_out = "):
        attention.backward(params, cache, h_out)
    no_edges = GTAttention(2, 2, heads=1)
    (h_out, _), cache = no_edges.forward(no_edges.init_params(np.random.default_rng(0)), h, graph)
    with pytest.raises(ValueError, match="no edge output"):
        no_edges.backward(params, cache, (h_out, np.ones((1, 2))))


class FlatLayer:
    """GTLayer as one output ``[h_out, e_out]`` flattened, for check_gradients."""

    def __init__(self, layer: GTLayer) -> None:
        self.layer = layer

    def forward(self, params: dict, h: Any, graph: Graph, e: Any = None, **kwargs: Any) -> Any:
        (h_out, e_out), cache = self.layer.forward(params, h, graph, e, **kwargs)
        return np.concatenate([h_out.ravel(), [] if e_out is None else e_out.ravel()]), cache

    def backward(self, params: dict, cache: Any, d_out: Any) -> tuple[Any, dict]:
        width, rows = self.layer.channels, cache.node.out.shape[0]
        d_h_out = d_out[: rows * width].reshape(rows, width)
        d_e_out = None if cache.edge is None else d_out[rows * width :].reshape(-1, width)
        (d_h, d_e), d_params = self.layer.backward(params, cache, (d_h_out, d_e_out))
        return (d_h if d_e is None else (d_h, d_e)), d_params


@given(data=st.data())
def test_layer_matches_central_differences(data: st.DataObject) -> None:
    """GTLayer in every norm, with or without edge features and explicit bias, in training
    (fixed masks, batch statistics) or evaluation (running statistics)."""
    graph = data.draw(graphs(max_nodes=5, max_edges=8))
    training = data.draw(st.booleans())
    norm = data.draw(st.sampled_from(["batch", "layer", "none", "layer+batch"]))
    if training and "batch" in norm:  # BatchNorm refuses one row in training
        assume(graph.num_nodes >= 2 and graph.num_edges != 1)
    layer = GTLayer(
        channels=2 * data.draw(st.integers(1, 2)),
        heads=2,
        dropout=data.draw(st.sampled_from([0.0, 0.3])),
        norm=norm,
        residual=data.draw(st.booleans()),
        edge_features=data.draw(st.booleans()),
        explicit_bias=data.draw(st.booleans()),
    )
    rng = np.random.default_rng(data.draw(seeds()))
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in layer.init_params(rng).items()}
    state = {k: v + 0.5 * rng.random(v.shape) for k, v in layer.init_state().items()}
    h = rng.standard_normal((graph.num_nodes, layer.channels))
    e = rng.standard_normal((graph.num_edges, layer.channels)) if layer.edge_features else None
    kwargs: dict[str, Any] = {"training": training, "state": state}
    _, cache = layer.forward(params, h, graph, e, rng=rng, **kwargs)
    kwargs["noise"] = cache.noise
    assume(away_from_clamp(cache.attention, 1e-5))
    streams = [("node", cache.node), ("edge", cache.edge)]
    assume(all(smooth(layer.blocks[s], params_of(params, s), c) for s, c in streams if c))
    inputs = (h, graph) if e is None else (h, graph, e)
    report = check_gradients(
        FlatLayer(layer), params, inputs, forward_kwargs=kwargs, max_entries=10, eps=1e-5
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def params_of(params: dict, prefix: str) -> dict:
    return {k.removeprefix(f"{prefix}."): v for k, v in params.items() if k.startswith(prefix)}
