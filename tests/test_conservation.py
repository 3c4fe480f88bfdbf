"""GAT-balance's conservation law (Thm 2.2 / Eq. 3, Thm 6.3, 6.4) on drawn networks and graphs.

Hypothesis draws the structure (graph, depth 2-6, width, heads, variant,
activation slope, labels) and a seed that fills features and parameters;
every hidden neuron's relative residual must be <= 1e-10 in float64.
Independent of the hand-written backward, the residual is also compared with
a central difference of the loss along the rescaling it stands for.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs_check.conservation import RESIDUAL_TOL, gd_drift, gradients, relative_residual
from refimpl.diagnostics import conservation_residuals
from refimpl.graph import Graph
from refimpl.models import GAT
from refimpl.neurons import layer_structure, scale_incoming, scale_outgoing
from refimpl.ops.losses import SoftmaxCrossEntropy
from tests.strategies import graphs, seeds


def _case(graph, seed, **options):
    rng = np.random.default_rng(seed)
    features, classes = int(rng.integers(1, 5)), int(rng.integers(2, 4))
    model = GAT(features, out_channels=classes, **options)
    params = model.init_params(rng)
    # Every entry moved off the initialisation: attention, biases, residuals non-zero.
    params = {k: v + 0.5 * rng.standard_normal(v.shape) for k, v in params.items()}
    n = graph.num_nodes
    x = rng.standard_normal((n, features))
    y = rng.integers(0, classes, n)
    mask = rng.random(n) < 0.7
    mask[0] = True
    return model, params, x, y, mask


def _loss(model, params, x, graph, y, mask):
    logits, _ = model.forward(params, x, graph)
    return float(SoftmaxCrossEntropy().forward({}, logits, y, mask)[0])


@settings(deadline=None)
@given(
    graph=graphs(max_nodes=6, max_edges=12),
    seed=seeds(),
    num_layers=st.integers(2, 6),
    hidden=st.integers(1, 5),
    heads=st.integers(1, 3),
    version=st.sampled_from(["v1", "v2"]),
    share_weights=st.booleans(),
    concat=st.booleans(),
    bias=st.booleans(),
    residual=st.booleans(),
    activation=st.sampled_from(["relu", "leaky_relu", "identity"]),
    slope=st.floats(0.0, 3.0),
)
def test_law_holds_for_every_hidden_neuron(
    graph,
    seed,
    num_layers,
    hidden,
    heads,
    version,
    share_weights,
    concat,
    bias,
    residual,
    activation,
    slope,
):
    model, params, x, y, mask = _case(
        graph,
        seed,
        num_layers=num_layers,
        hidden_channels=hidden,
        heads=heads,
        version=version,
        share_weights=share_weights,
        concat=concat,
        bias=bias,
        residual=residual,
        activation=activation,
        activation_slope=slope,
    )
    residual_per_neuron = relative_residual(params, gradients(model, params, x, graph, y, mask))
    assert residual_per_neuron.size == sum(layer.width for layer in layer_structure(params)[:-1])
    assert residual_per_neuron.max() <= RESIDUAL_TOL


BREAKERS = [{"activation": "elu"}, {"lipschitz_norm": "paper"}, {"pairnorm": "PN"}]


@settings(deadline=None, max_examples=20)
@given(
    graph=graphs(min_nodes=2, max_nodes=6),
    seed=seeds(),
    num_layers=st.integers(2, 4),
    breaker=st.sampled_from(BREAKERS),
)
def test_broken_law_residual_is_the_rescaling_derivative(graph, seed, num_layers, breaker):
    # delta_i = d/dlambda L(lambda in_i, a_i / lambda, out_i / lambda) at lambda = 1
    # (GAT-balance Lemma 6.2). Compare with a central difference of the loss: this
    # ties the three inner products to their meaning, independent of the backward,
    # where the law does not hold (ELU; LipschitzNorm's rescaled denominator).
    model, params, x, y, mask = _case(
        graph, seed, num_layers=num_layers, hidden_channels=3, **breaker
    )
    residuals = conservation_residuals(params, gradients(model, params, x, graph, y, mask))
    layers = layer_structure(params)
    step = 1e-5
    for index, residual in enumerate(residuals):
        for neuron in range(layers[index].width):

            def rescaled(scale, index=index, neuron=neuron):
                factor = np.ones(layers[index].width)
                factor[neuron] = scale
                moved = scale_incoming(params, layers, index, factor, attention=False)
                for key in layers[index].attention:  # a_i / lambda
                    moved[key] = moved[key] / factor.reshape(moved[key].shape)
                moved = scale_outgoing(moved, layers, index, 1 / factor)
                return _loss(model, moved, x, graph, y, mask)

            # d/dlambda at 1 of lambda -> (lambda, 1/lambda): use lambda = e^t, d/dt at 0.
            derivative = (rescaled(np.exp(step)) - rescaled(np.exp(-step))) / (2 * step)
            scale = max(residual.scale[neuron], 1e-12)
            assert abs(derivative - residual.delta[neuron]) <= 1e-6 * scale + 1e-9


@pytest.mark.parametrize("breaker", BREAKERS)
def test_broken_law_residual_is_clearly_nonzero(breaker):
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    model, params, x, y, mask = _case(graph, 3, num_layers=3, hidden_channels=4, **breaker)
    assert relative_residual(params, gradients(model, params, x, graph, y, mask)).max() > 1e-3


def test_gradient_descent_drift_is_second_order_in_the_step():
    # c(t+1) - c(t) = lr^2 (...) exactly, so over a fixed horizon the drift is
    # lr * integral + O(lr^2): the ratio drift(lr) / drift(lr/2) tends to 2, and
    # its distance from 2 shrinks with lr (a first-order term would pin it near 1).
    graph = Graph(np.array([[0, 1, 2, 3, 1], [1, 2, 3, 0, 3]]), 4)
    model, params, x, y, mask = _case(graph, 5, num_layers=3, hidden_channels=3)
    deviations = []
    for lr in (0.02, 0.01):
        coarse, error = gd_drift(model, params, x, graph, y, mask, lr, round(0.2 / lr))
        fine, _ = gd_drift(model, params, x, graph, y, mask, lr / 2, round(0.4 / lr))
        assert error <= 1.0  # the per-step identity, in units of the rounding allowance
        assert np.linalg.norm(fine) > 1e-6  # something drifts: the ratio means something
        deviations.append(abs(np.linalg.norm(coarse) / np.linalg.norm(fine) - 2.0))
    assert deviations[1] < deviations[0] <= 0.2, deviations
