"""The study's layers against their literal twins (refimpl.naive.stream, refimpl.naive.
study_layers): TransformerStream, GTLayer, GraphiTLayer and SANLayer, outputs and running
statistics within TWIN_RTOL and every gradient (inputs and parameters, random cotangents) within
GRADIENT_RTOL, in every norm, in training (fixed dropout masks, batch statistics, running
statistics updated) and evaluation (running statistics read), on drawn graphs and batches
(isolated nodes, one-node graphs, duplicate edges, self-loops, empty edge sets, empty streams);
and the comparison shown not blind: a twin with one step broken fails it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl.graph import Graph
from refimpl.naive import stream as naive_stream
from refimpl.naive.stream import stream_backward, stream_forward
from refimpl.naive.study_layers import (
    graphit_layer_backward,
    graphit_layer_forward,
    gt_layer_backward,
    gt_layer_forward,
    san_layer_backward,
    san_layer_forward,
)
from refimpl.nn.transformer.gt_layer import GTLayer
from refimpl.nn.transformer.san_layer import SANLayer
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import GRADIENT_RTOL, TWIN_RTOL
from tests.nn.transformer.test_graphit import configs_and_batches
from tests.nn.transformer.test_graphit_layer import layer_case
from tests.nn.transformer.test_san import attention_setups as san_attention_setups
from tests.nn.transformer.test_stream import stream_setups

NORMS = ["batch", "layer", "none", "layer+batch"]
GRAD_RTOL = GRADIENT_RTOL[np.dtype(np.float64)]


def twin_errors(
    out: Any, twin_out: Any, state: dict, twin_state: dict, grads: dict, twin_grads: dict
) -> dict[str, float]:
    """The largest relative errors of the outputs (a tuple: each judged on its own scale),
    the running statistics and the gradients (on the scale of all gradients: one zero by
    cancellation would compare noise with noise), the layer's against the twin's."""
    outs = out if isinstance(out, tuple) else (out,)
    twin_outs = twin_out if isinstance(twin_out, tuple) else (twin_out,)
    assert [o is None for o in outs] == [o is None for o in twin_outs]
    assert list(state) == list(twin_state) and list(grads) == list(twin_grads)
    pairs = [(a, b) for a, b in zip(outs, twin_outs, strict=True) if a is not None]
    return {
        "out": max(max_relative_error(a, b) for a, b in pairs),
        "state": max((max_relative_error(state[k], v) for k, v in twin_state.items()), default=0),
        "gradients": max(relative_errors(grads, twin_grads).values()),
    }


def assert_twins(errors: dict[str, float]) -> None:
    assert errors["out"] <= TWIN_RTOL, errors
    assert errors["state"] <= TWIN_RTOL, errors
    assert errors["gradients"] <= GRAD_RTOL, errors


def drifted_state(layer: Any, rng: np.random.Generator) -> dict:
    """Running statistics off their initial values (variances stay positive)."""
    return {k: v + 0.5 * rng.random(v.shape) for k, v in layer.init_state().items()}


# -- TransformerStream ------------------------------------------------------------------------


@given(setup=stream_setups())
def test_stream_equals_its_literal_twin(setup: tuple) -> None:
    stream, params, attn_out, residual_in, kwargs = setup
    training, state, noise = kwargs["training"], kwargs["state"], kwargs.get("noise", {})
    out, cache = stream.forward(params, attn_out, residual_in, **kwargs)
    twin_out, twin_state = stream_forward(
        stream, params, attn_out, residual_in, training, state, noise
    )
    d_out = np.random.default_rng(1).standard_normal(out.shape)
    (d_a, d_x), d_params = stream.backward(params, cache, d_out)
    (t_a, t_x), t_params = stream_backward(
        stream, params, attn_out, residual_in, d_out, training, state, noise
    )
    ours = {"attn_out": d_a, "residual_in": d_x, **d_params}
    theirs = {"attn_out": t_a, "residual_in": t_x, **t_params}
    assert_twins(twin_errors(out, twin_out, cache.state, twin_state, ours, theirs))


# -- GTLayer ----------------------------------------------------------------------------------


@st.composite
def gt_cases(draw: st.DrawFn) -> tuple:
    """A GTLayer in any configuration and norm, drifted parameters and statistics, inputs,
    training or evaluation, and whether the edge output has a cotangent."""
    graph = draw(graphs(max_nodes=5, max_edges=8))
    training, norm = draw(st.booleans()), draw(st.sampled_from(NORMS))
    heads = draw(st.integers(1, 2))
    layer = GTLayer(
        channels=heads * draw(st.integers(1, 2)),
        heads=heads,
        dropout=draw(st.sampled_from([0.0, 0.3])),
        norm=norm,
        residual=draw(st.booleans()),
        edge_features=draw(st.booleans()),
        qkv_bias=draw(st.booleans()),
        explicit_bias=draw(st.booleans()),
    )
    if training and "batch" in norm:  # BatchNorm refuses one row in training; 0 is passed
        assume(graph.num_nodes >= 2 and (graph.num_edges != 1 or not layer.edge_features))
    rng = np.random.default_rng(draw(seeds()))
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in layer.init_params(rng).items()}
    h = rng.standard_normal((graph.num_nodes, layer.channels))
    e = rng.standard_normal((graph.num_edges, layer.channels)) if layer.edge_features else None
    edge_cotangent = layer.edge_features and draw(st.booleans())
    return layer, params, h, graph, e, training, drifted_state(layer, rng), edge_cotangent, rng


def gt_errors(case: tuple) -> dict[str, float]:
    layer, params, h, graph, e, training, state, edge_cotangent, rng = case
    (h_out, e_out), cache = layer.forward(
        params, h, graph, e, training=training, rng=rng, state=state
    )
    twin_out, twin_state = gt_layer_forward(
        layer, params, h, graph, e, training, state, cache.noise
    )
    g = np.random.default_rng(1)
    d_out = (g.standard_normal(h_out.shape), g.standard_normal(e_out.shape) if edge_cotangent
             else None)  # fmt: skip
    (d_h, d_e), d_params = layer.backward(params, cache, d_out)
    (t_h, t_e), t_params = gt_layer_backward(
        layer, params, h, graph, e, d_out, training, state, cache.noise
    )
    ours, theirs = {"h": d_h, **d_params}, {"h": t_h, **t_params}
    assert (d_e is None) == (t_e is None) == (e is None)
    if e is not None:
        ours["e"], theirs["e"] = d_e, t_e
    return twin_errors((h_out, e_out), twin_out, cache.state, twin_state, ours, theirs)


@given(case=gt_cases())
def test_gt_layer_equals_its_literal_twin(case: tuple) -> None:
    assert_twins(gt_errors(case))


# -- GraphiTLayer -----------------------------------------------------------------------------


@given(drawn=configs_and_batches(), norm=st.sampled_from(NORMS), training=st.booleans())
def test_graphit_layer_equals_its_literal_twin(drawn: tuple, norm: str, training: bool) -> None:
    layer, params, state, inputs, rng = layer_case(drawn, norm)
    if training and "batch" in norm:  # BatchNorm refuses one row in training
        assume(inputs[0].shape[0] >= 2)
    out, cache = layer.forward(params, *inputs, training=training, rng=rng, state=state)
    twin_out, twin_state = graphit_layer_forward(
        layer, params, *inputs, training, state, cache.noise
    )
    d_out = np.random.default_rng(1).standard_normal(out.shape)
    (d_h, d_e), d_params = layer.backward(params, cache, d_out)
    (t_h, t_e), t_params = graphit_layer_backward(
        layer, params, *inputs, d_out, training, state, cache.noise
    )
    ours, theirs = {"h": d_h, "e": d_e, **d_params}, {"h": t_h, "e": t_e, **t_params}
    assert_twins(twin_errors(out, twin_out, cache.state, twin_state, ours, theirs))


# -- SANLayer ---------------------------------------------------------------------------------


@given(setup=san_attention_setups(), norm=st.sampled_from(NORMS), training=st.booleans())
def test_san_layer_equals_its_literal_twin(setup: tuple, norm: str, training: bool) -> None:
    attention, attention_params, h, graph, e, real = setup
    if training and "batch" in norm:  # BatchNorm refuses one row in training
        assume(h.shape[0] >= 2)
    layer = SANLayer(
        attention.channels, heads=attention.heads, full_graph=attention.full_graph,
        gamma=attention.gamma, learn_gamma=attention.learn_gamma, bias=attention.bias,
        dropout=0.2, norm=norm,
    )  # fmt: skip
    rng = np.random.default_rng(1)
    params = layer.init_params(rng)
    params.update({f"attention.{k}": v for k, v in attention_params.items()})
    state = drifted_state(layer, rng)
    out, cache = layer.forward(params, h, graph, e, real, training=training, rng=rng, state=state)
    twin_out, twin_state = san_layer_forward(
        layer, params, h, graph, e, real, training, state, cache.noise
    )
    d_out = rng.standard_normal(out.shape)
    (d_h, d_e), d_params = layer.backward(params, cache, d_out)
    (t_h, t_e), t_params = san_layer_backward(
        layer, params, h, graph, e, real, d_out, training, state, cache.noise
    )
    ours, theirs = {"h": d_h, "e": d_e, **d_params}, {"h": t_h, "e": t_e, **t_params}
    assert_twins(twin_errors(out, twin_out, cache.state, twin_state, ours, theirs))


# -- the comparison is not blind --------------------------------------------------------------


def broken_case() -> tuple:
    """A GTLayer with both norms in training: LayerNorm and BatchNorm on both streams, a
    self-loop, a duplicate edge and an isolated node."""
    rng = np.random.default_rng(5)
    layer = GTLayer(4, heads=2, dropout=0.2, norm="layer+batch", explicit_bias=True)
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in layer.init_params(rng).items()}
    graph = Graph(np.array([[0, 1, 1, 2, 2, 3], [1, 2, 2, 0, 2, 1]]), 5)
    h, e = rng.standard_normal((5, 4)), rng.standard_normal((6, 4))
    return layer, params, h, graph, e, True, drifted_state(layer, rng), True, rng


@pytest.mark.parametrize(
    ("target", "broken", "caught"),
    [
        # the norms' eps at Keras's default (1e-3) instead of torch's 1e-5: a port's slip
        ("EPS", 1e-3, "out"),
        # BatchNorm's momentum in Keras's convention (0.9 kept) instead of torch's (0.1 taken)
        ("MOMENTUM", 0.9, "state"),
        # the backward reading the running statistics in training (the batch statistics
        # treated as constants): the forward is untouched, the gradients are wrong
        ("batchnorm_backward", "backward_in_evaluation", "gradients"),
    ],
    ids=["layernorm-eps", "batchnorm-momentum", "batchnorm-backward-in-evaluation"],
)
def test_a_broken_twin_step_is_caught(
    monkeypatch: pytest.MonkeyPatch, target: str, broken: Any, caught: str
) -> None:
    assert_twins(gt_errors(broken_case()))
    if broken == "backward_in_evaluation":
        right = naive_stream.batchnorm_backward
        broken = lambda x, w, mean, var, training, eps, d_y: right(x, w, mean, var, False, eps, d_y)  # noqa: E731
    monkeypatch.setattr(naive_stream, target, broken)
    errors = gt_errors(broken_case())
    assert errors[caught] > 1e-6, errors  # far beyond every tolerance, not rounding
