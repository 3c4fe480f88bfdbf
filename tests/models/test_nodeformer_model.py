"""NodeFormer model (App. C): finite differences of the training objective <c, logits> + lambda L_e
through the whole stack, the wiring against its blocks, noise replay and draw order, deterministic
evaluation, and bad input."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.models import NodeFormer
from refimpl.nn.nodeformer.edge_loss import NodeFormerEdgeLoss
from refimpl.nn.nodeformer.random_features import draw_projection
from refimpl.testing import check_gradients
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import GRADCHECK_RTOL
from tests.nn.norms.test_norms import smooth_at_step


@st.composite
def model_setups(draw: st.DrawFn) -> tuple:
    """A small model, float64 params moved off their init (LayerNorm weights != 1, biases != 0),
    features and a graph (isolated nodes, duplicates, self-loops)."""
    graph = draw(graphs(max_nodes=6, max_edges=10))
    model = NodeFormer(
        in_channels=draw(st.integers(1, 3)),
        hidden_channels=draw(st.integers(1, 3)),
        out_channels=draw(st.integers(1, 3)),
        num_layers=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 2)),
        num_random_features=draw(st.integers(1, 5)),
        num_samples=draw(st.integers(1, 2)),
        use_gumbel=draw(st.booleans()),
        relational_bias=draw(st.sampled_from([None, "sigmoid", "identity"])),
        rb_order=draw(st.integers(1, 2)),
        residual=draw(st.booleans()),
        layer_norm=draw(st.booleans()),
        activation=draw(st.booleans()),
        dropout=draw(st.sampled_from([0.0, 0.4])),
        edge_loss_weight=draw(st.sampled_from([0.0, 0.7])),
        edge_loss_convention=draw(st.sampled_from(["paper", "authors"])),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {
        name: value + 0.3 * rng.standard_normal(value.shape)
        for name, value in model.init_params(rng).items()
    }
    x = rng.standard_normal((graph.num_nodes, model.in_channels))
    return model, params, x, graph, rng


class Objective:
    """``<c, logits> + lambda L_e``, the noise held fixed: what :meth:`NodeFormer.backward`
    differentiates. The terms are returned unsummed, ``(c * logits, lambda L_e)`` flattened,
    for a cotangent of ones (``ones_for``): the checker then sees the size of every term, not of
    their sum, when it bounds the rounding of central differences."""

    def __init__(self, model: NodeFormer, graph: Graph, noise: dict, cotangent: Any) -> None:
        self.model, self.graph, self.noise, self.cotangent = model, graph, noise, cotangent

    def forward(self, params: dict, x: Any) -> tuple[Any, Any]:
        logits, cache = self.model.forward(params, x, self.graph, True, noise=self.noise)
        terms = np.append((self.cotangent * logits).ravel(), self.model.auxiliary_loss(cache))
        return terms, cache

    def ones_for(self) -> np.ndarray:
        return np.ones(self.cotangent.size + 1)

    def backward(self, params: dict, cache: Any, d_out: Any) -> tuple[Any, dict]:
        assert np.all(d_out == 1.0)  # the edge-loss term is weighted by lambda, not by d_out
        return self.model.backward(params, cache, self.cotangent)


# Central-difference step of the whole-model checks: behind a two-channel LayerNorm (which
# saturates to +-1) the gradients are small against the O(1) activations whose rounding the
# differences carry, u / step; 1e-5 keeps that below the tolerance, while the curvature it
# brings in is excluded by layer_norms_smooth. The attention's exponentials curve too (tau =
# 0.25, one random feature: a two-point error of 3.4e-6 that fell as step^2), so the checks
# use the four-point stencil (truncation ~ step^4).
STEP = 1e-5
STENCIL = 4


def layer_norms_smooth(model: NodeFormer, cache: Any) -> bool:
    """Whether every LayerNorm's per-node root is far from 0 on the scale of ``STEP``
    (``smooth_at_step`` of the LayerNorm tests): LayerNorm curves on the scale of that root,
    so closer in, the differences, not the backward, are inaccurate. One channel centres to
    0 whatever the step."""
    if model.hidden_channels == 1:
        return True
    norms = [cache.input_norm] + [layer.norm for layer in cache.layers if layer.norm is not None]
    return all(smooth_at_step(norm.root, model.blocks["input_norm"], STEP) for norm in norms)


@given(setup=model_setups())
def test_training_objective_matches_central_differences(setup: tuple) -> None:
    model, params, x, graph, rng = setup
    logits, cache = model.forward(params, x, graph, training=True, rng=rng)
    assume(layer_norms_smooth(model, cache))
    objective = Objective(model, graph, cache.noise, rng.standard_normal(logits.shape))
    report = check_gradients(
        objective,
        params,
        (x,),
        cotangent=objective.ones_for(),
        max_entries=20,
        rng=rng,
        eps=STEP,
        stencil=STENCIL,
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=model_setups())
def test_evaluation_gradients_match_central_differences(setup: tuple) -> None:
    model, params, x, graph, rng = setup
    assume(layer_norms_smooth(model, model.forward(params, x, graph)[1]))
    report = check_gradients(
        model, params, (x, graph), max_entries=20, rng=rng, eps=STEP, stencil=STENCIL
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_edge_loss_is_the_mean_of_the_layers_edge_losses() -> None:
    """The cache's L_e against NodeFormerEdgeLoss applied to each layer's cache by hand."""
    rng = np.random.default_rng(3)
    graph = Graph(rng.integers(0, 8, (2, 20)), 8)
    model = NodeFormer(4, 6, 3, num_layers=3, heads=2, num_random_features=7, num_samples=3)
    params = model.init_params(rng)
    _, cache = model.forward(params, rng.standard_normal((8, 4)), graph, True, rng)
    by_layer = [
        float(NodeFormerEdgeLoss(conv).forward(model._sub(params, f"layer{i}"), layer.conv)[0])
        for i, (conv, layer) in enumerate(zip(model.convs, cache.layers, strict=True))
    ]
    assert float(cache.edge_loss) == pytest.approx(np.mean(by_layer), rel=1e-14)
    assert model.auxiliary_loss(cache) == pytest.approx(np.mean(by_layer), rel=1e-14)
    assert min(by_layer) > 0  # -log of probabilities below 1


def test_no_edge_loss_in_evaluation_or_with_zero_weight() -> None:
    rng = np.random.default_rng(4)
    graph = Graph(rng.integers(0, 5, (2, 9)), 5)
    model = NodeFormer(2, 4, 2, num_layers=1, heads=1, edge_loss_weight=0.0)
    params = model.init_params(rng)
    x = rng.standard_normal((5, 2))
    _, train_cache = model.forward(params, x, graph, True, rng)
    _, eval_cache = replace(model, edge_loss_weight=1.0).forward(params, x, graph)
    for cache in (train_cache, eval_cache):
        assert cache.edge_loss is None and model.auxiliary_loss(cache) == 0.0
        assert all(layer.edge_loss is None for layer in cache.layers)


@given(seed=seeds(), dropout=st.sampled_from([0.0, 0.5]))
def test_noise_replays_bit_for_bit_and_is_drawn_in_the_documented_order(
    seed: int, dropout: float
) -> None:
    rng = np.random.default_rng(seed)
    graph = Graph(rng.integers(0, 6, (2, 12)), 6)
    model = NodeFormer(3, 4, 2, heads=2, num_random_features=5, num_samples=3, dropout=dropout)
    params = model.init_params(rng)
    x = rng.standard_normal((6, 3))
    logits, cache = model.forward(params, x, graph, True, np.random.default_rng(seed))
    replayed, _ = model.forward(params, x, graph, True, noise=cache.noise)
    assert np.array_equal(logits, replayed)
    # the documented order, drawn by hand from the same seed
    expected, draw = {}, np.random.default_rng(seed)
    if dropout:
        expected["input.dropout"] = draw.random((6, 4)) >= dropout
    for i in range(2):
        expected[f"layer{i}.projection"] = draw_projection(draw, 5, 4, kind="orthogonal")
        expected[f"layer{i}.gumbel"] = -np.log(-np.log(draw.random((6, 2, 3))))
        if dropout:
            expected[f"layer{i}.dropout"] = draw.random((6, 4)) >= dropout
    assert list(cache.noise) == list(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(cache.noise[key], value, err_msg=key)


def test_evaluation_is_deterministic_and_noise_free() -> None:
    """Without rng, each layer's projection comes from eval_seed; Gumbel noise and dropout are
    never used; a given rng draws other projections."""
    rng = np.random.default_rng(5)
    graph = Graph(rng.integers(0, 7, (2, 15)), 7)
    model = NodeFormer(3, 4, 2, num_layers=2, heads=2, num_random_features=6, dropout=0.5)
    params = model.init_params(rng)
    x = rng.standard_normal((7, 3))
    first, cache = model.forward(params, x, graph)
    second, _ = model.forward(params, x, graph)
    assert np.array_equal(first, second)
    assert list(cache.noise) == ["layer0.projection", "layer1.projection"]
    for i in range(2):
        omega = draw_projection(np.random.default_rng([0, i]), 6, 4, kind="orthogonal")
        np.testing.assert_array_equal(cache.noise[f"layer{i}.projection"], omega)
    other, _ = replace(model, eval_seed=1).forward(params, x, graph)
    drawn, _ = model.forward(params, x, graph, rng=np.random.default_rng(0))
    assert not np.allclose(first, other) and not np.allclose(first, drawn)


def test_single_node_and_graph_without_edges() -> None:
    rng = np.random.default_rng(6)
    model = NodeFormer(2, 3, 2, num_layers=2, heads=2, num_random_features=4)
    params = model.init_params(rng)
    for n in (1, 4):
        graph = Graph(np.zeros((2, 0), dtype=np.int64), n)
        x = rng.standard_normal((n, 2))
        logits, cache = model.forward(params, x, graph, True, rng)
        assert logits.shape == (n, 2) and np.isfinite(logits).all()
        assert np.isfinite(float(cache.edge_loss))
        objective = Objective(model, graph, cache.noise, np.ones((n, 2)))
        report = check_gradients(
            objective, params, (x,), cotangent=objective.ones_for(), max_entries=10
        )
        assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_parameter_names_and_shapes() -> None:
    model = NodeFormer(5, 8, 3, num_layers=2, heads=4, rb_order=2)
    shapes = model.param_shapes()
    assert shapes["input.W"] == (8, 5) and shapes["output.W"] == (3, 8)
    assert shapes["layer1.W_q"] == (32, 8) and shapes["layer1.W_o"] == (8, 32)
    assert shapes["layer0.b_rel"] == (2, 4) and shapes["layer0.norm.weight"] == (8,)
    assert "layer0.norm.weight" not in replace(model, layer_norm=False).param_shapes()
    params = model.init_params(np.random.default_rng(0), dtype=np.float32)
    assert list(params) == list(shapes)
    assert all(params[k].shape == s and params[k].dtype == np.float32 for k, s in shapes.items())
    np.testing.assert_array_equal(params["input_norm.weight"], 1.0)
    np.testing.assert_array_equal(params["layer0.b_rel"], np.float32(0.1))
    assert not model.deterministic_training


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dropout": 1.0}, "dropout must be a probability"),
        ({"edge_loss_weight": -1.0}, "edge_loss_weight"),
        ({"edge_loss_convention": "code"}, "edge_loss_convention must be one of"),
        ({"hidden_channels": 0}, "hidden_channels must be a positive int"),
        ({"residual": 1}, "residual must be True or False"),
        ({"heads": 0}, "heads must be a positive int"),
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NodeFormer(3, **kwargs)


def test_bad_calls_say_what_to_do() -> None:
    rng = np.random.default_rng(7)
    graph = Graph(rng.integers(0, 4, (2, 6)), 4)
    model = NodeFormer(2, 3, 2, num_layers=1, heads=1, num_random_features=3)
    params = model.init_params(rng)
    x = rng.standard_normal((4, 2))
    with pytest.raises(ValueError, match=r"needs random draws \['layer0.projection'"):
        model.forward(params, x, graph, training=True)
    with pytest.raises(ValueError, match=r"keys \['layer0.gumbel'\] this forward does not use"):
        model.forward(params, x, graph, noise={"layer0.gumbel": np.zeros((4, 1, 10))})
    with pytest.raises(ValueError, match="init='xavier' only"):
        model.init_params(rng, init="balanced_orthogonal")
    with pytest.raises(ValueError, match=r"x must have shape \(\*, 2\)"):
        model.forward(params, x[:, :1], graph)


def test_backward_without_input_grad_gives_the_same_parameter_gradients() -> None:
    rng = np.random.default_rng(8)
    graph = Graph(rng.integers(0, 5, (2, 8)), 5)
    model = NodeFormer(3, 4, 2, num_layers=2, heads=2, num_random_features=4, num_samples=2)
    params = model.init_params(rng)
    logits, cache = model.forward(params, rng.standard_normal((5, 3)), graph, True, rng)
    d_x, full = model.backward(params, cache, np.ones_like(logits))
    skipped, partial = model.backward(params, cache, np.ones_like(logits), input_grad=False)
    assert d_x.shape == (5, 3) and skipped is None
    for name in full:
        np.testing.assert_array_equal(partial[name], full[name])
