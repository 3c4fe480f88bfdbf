"""``refimpl.neurons``: each hidden neuron's incoming, attention and outgoing parameter sets.

The sets are rebuilt here from the model's configuration with explicit Python
loops (``naive_sets``), independent of how ``refimpl.neurons`` reads them off
the parameter dict; the sums must agree, and rescaling a neuron's incoming set
by ``lambda`` and its attention and outgoing sets by ``1 / lambda`` must leave a
ReLU or LeakyReLU network's logits unchanged (the proof of GAT-balance Thm 2.2).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.models import GAT
from refimpl.neurons import (
    attention_sums,
    incoming_sums,
    layer_structure,
    neuron_sums,
    outgoing_sums,
    scale_incoming,
    scale_outgoing,
)
from refimpl.testing import max_relative_error
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
LAMBDA = 2.7
HOMOGENEOUS = {"relu": {}, "leaky_relu": {"activation_slope": 0.3}}  # phi(l z) = l phi(z), l > 0


def naive_sets(model: GAT, layer: int) -> list[dict[str, list[tuple[str, tuple[int, ...]]]]]:
    """Per neuron of hidden ``layer``: its incoming, attention and outgoing entries,
    as ``(key, index)`` pairs, enumerated from the model's configuration."""
    conv, shapes = model.layers[layer], model.param_shapes()
    heads, channels = conv.heads, conv.out_channels
    width = heads * channels if conv.concat else channels
    sets = []
    for i in range(width):
        # Concatenated heads: neuron i is channel i % C of head i // C; averaged: channel i of
        # every head.
        owners = [(i // channels, i % channels)] if conv.concat else [(h, i) for h in range(heads)]
        incoming, attention, outgoing = [], [], []
        for name in ("W", "W_s", "W_t"):
            key = f"layer{layer}.{name}"
            if key in shapes:
                for head, channel in owners:
                    row = head * channels + channel
                    incoming += [(key, (row, j)) for j in range(shapes[key][1])]
        if model.bias:
            incoming.append((f"layer{layer}.bias", (i,)))
        if model.residual:
            key = f"layer{layer}.res_W"
            incoming += [(key, (i, j)) for j in range(shapes[key][1])]
        for name in ("att", "att_src", "att_dst"):
            key = f"layer{layer}.{name}"
            if key in shapes:
                attention += [(key, owner) for owner in owners]
        for name in ("W", "W_s", "W_t", "res_W"):
            key = f"layer{layer + 1}.{name}"
            if key in shapes:
                outgoing += [(key, (r, i)) for r in range(shapes[key][0])]
        sets.append({"incoming": incoming, "attention": attention, "outgoing": outgoing})
    return sets


@st.composite
def models(draw: st.DrawFn, min_layers: int = 2, activations: tuple[str, ...] = ("relu",)) -> GAT:
    """A GAT with at least one hidden layer and every structural option drawn."""
    num_layers = draw(st.integers(min_layers, 4))
    activation = draw(st.sampled_from(activations))
    return GAT(
        in_channels=draw(st.integers(1, 3)),
        hidden_channels=draw(st.integers(1, 3)),
        out_channels=draw(st.integers(1, 3)),
        num_layers=num_layers,
        heads=draw(
            st.integers(1, 3)
            | st.lists(st.integers(1, 3), min_size=num_layers, max_size=num_layers)
        ),
        version=draw(st.sampled_from(["v1", "v2"])),
        share_weights=draw(st.booleans()),
        bias=draw(st.booleans()),
        residual=draw(st.booleans()),
        concat=draw(st.booleans()),
        activation=activation,
        **HOMOGENEOUS.get(activation, {}),
    )


def random_params(model: GAT, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every entry random and non-zero (attention, bias and res_W too, which init leaves 0)."""
    return {k: rng.standard_normal(shape) for k, shape in model.param_shapes().items()}


# -- the sums against explicit index sets ------------------------------------------------------


@given(model=models(), seed=seeds())
def test_neuron_sums_match_explicit_index_sets(model: GAT, seed: int) -> None:
    values = random_params(model, np.random.default_rng(seed))
    layers = layer_structure(values)
    assert len(layers) == model.num_layers
    for layer in range(model.num_layers - 1):
        sets = naive_sets(model, layer)
        got = neuron_sums(values, layers, layer)
        for which, sums in zip(("incoming", "attention", "outgoing"), got, strict=True):
            expected = np.array([sum(values[k][idx] for k, idx in s[which]) for s in sets])
            assert sums.shape == expected.shape, which
            np.testing.assert_allclose(sums, expected, rtol=RTOL64, atol=RTOL64, err_msg=which)
        np.testing.assert_array_equal(got[0], incoming_sums(values, layers, layer))
        np.testing.assert_array_equal(got[1], attention_sums(values, layers, layer))
        np.testing.assert_array_equal(got[2], outgoing_sums(values, layers, layer))
        assert layers[layer].width == len(sets)


def test_averaged_heads_pool_every_head_into_one_neuron() -> None:
    # A named case of the property above: 2 heads x 2 channels averaged, unshared W_t, bias
    # and residual; all-ones values make each sum a count of the set's entries.
    model = GAT(3, 2, 1, num_layers=2, heads=2, share_weights=False, bias=True, residual=True,
                concat=False)  # fmt: skip
    ones = {k: np.ones(shape) for k, shape in model.param_shapes().items()}
    incoming, attention, outgoing = neuron_sums(ones, layer_structure(ones), 0)
    # 2 heads x (W_s, W_t) rows of 3 inputs + 1 bias + a res_W row of 3 inputs
    np.testing.assert_array_equal(incoming, [16, 16])
    np.testing.assert_array_equal(attention, [2, 2])  # att[h, i] for both heads
    # layer1 W_s, W_t (2 heads x 1 channel rows each) and res_W (1 row)
    np.testing.assert_array_equal(outgoing, [5, 5])


# -- rescale invariance (GAT-balance Thm 2.2) --------------------------------------------------


def rescaled(model: GAT, params: dict, layer: int, neuron: int, attention: bool = True) -> dict:
    """``in_i * lambda``, ``a_i / lambda`` (unless ``attention=False``), ``out_i / lambda``."""
    layers = layer_structure(params)
    factor = np.ones(layers[layer].width)
    factor[neuron] = LAMBDA
    moved = scale_incoming(params, layers, layer, factor, attention=False)
    moved = scale_outgoing(moved, layers, layer, 1.0 / factor)
    if attention:
        for key, index in naive_sets(model, layer)[neuron]["attention"]:
            moved[key] = moved[key].copy()
            moved[key][index] /= LAMBDA
    return moved


@given(
    model=models(activations=tuple(HOMOGENEOUS)),
    graph=graphs(max_nodes=6, max_edges=12),
    seed=seeds(),
)
def test_rescaling_a_hidden_neuron_leaves_logits_unchanged(
    model: GAT, graph: Graph, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    params = random_params(model, rng)
    x = rng.standard_normal((graph.num_nodes, model.in_channels))
    logits, _ = model.forward(params, x, graph)
    for layer in range(model.num_layers - 1):
        for neuron in range(len(naive_sets(model, layer))):
            moved, _ = model.forward(rescaled(model, params, layer, neuron), x, graph)
            assert max_relative_error(moved, logits) <= RTOL64, (layer, neuron)


def _fixed_case(activation: str, **options: object) -> tuple[GAT, dict, np.ndarray, Graph]:
    graph = Graph(np.array([[0, 1, 2, 3, 4, 0, 2, 4], [1, 2, 3, 4, 0, 2, 4, 1]]), 5)
    model = GAT(3, 3, 2, num_layers=3, heads=2, bias=True, residual=True,
                activation=activation, **options)  # fmt: skip
    rng = np.random.default_rng(7)
    return model, random_params(model, rng), rng.standard_normal((5, 3)), graph


@pytest.mark.parametrize("activation", sorted(HOMOGENEOUS))
def test_rescaling_without_the_attention_factor_changes_logits(activation: str) -> None:
    # The invariance needs a_i / lambda: with the attention left alone the scores change
    # (the test above would pass vacuously if the attention sets were empty or ignored).
    model, params, x, graph = _fixed_case(activation, **HOMOGENEOUS[activation])
    logits, _ = model.forward(params, x, graph)
    for layer in range(model.num_layers - 1):
        for neuron in range(len(naive_sets(model, layer))):
            kept, _ = model.forward(rescaled(model, params, layer, neuron), x, graph)
            assert max_relative_error(kept, logits) <= RTOL64
            broken, _ = model.forward(rescaled(model, params, layer, neuron, False), x, graph)
            assert max_relative_error(broken, logits) > 1e-6, (layer, neuron)


def test_elu_is_not_rescale_invariant() -> None:
    # ELU is not positively homogeneous (elu(l z) != l elu(z) for z < 0), so the rescaling
    # moves the logits, exactly for the neurons with a negative pre-activation somewhere;
    # a neuron positive on every node sits on ELU's linear part and stays invariant.
    model, params, x, graph = _fixed_case("elu")
    logits, cache = model.forward(params, x, graph)
    negative = 0
    for layer in range(model.num_layers - 1):
        h_in = cache.layers[layer].conv.x
        z, _ = model.layers[layer].forward(model.layer_params(params, layer), h_in, graph)
        z = z + h_in @ params[f"layer{layer}.res_W"].T  # (N, n_l): phi's input
        for neuron in range(len(naive_sets(model, layer))):
            moved, _ = model.forward(rescaled(model, params, layer, neuron), x, graph)
            change = max_relative_error(moved, logits)
            if z[:, neuron].min() < 0:
                negative += 1
                assert change > 1e-6, (layer, neuron)
            else:
                assert change <= RTOL64, (layer, neuron)
    assert negative >= 8  # of 12 hidden neurons: the case tests what it claims


@given(model=models(), seed=seeds())
def test_scale_functions_touch_exactly_the_named_sets(model: GAT, seed: int) -> None:
    rng = np.random.default_rng(seed)
    params = random_params(model, rng)
    snapshot = {k: v.copy() for k, v in params.items()}
    layers = layer_structure(params)
    for layer in range(model.num_layers - 1):
        sets = naive_sets(model, layer)
        factor = rng.uniform(0.5, 2.0, len(sets))
        for side, moved in (
            ("incoming", scale_incoming(params, layers, layer, factor)),
            ("outgoing", scale_outgoing(params, layers, layer, factor)),
        ):
            expected = {k: v.copy() for k, v in params.items()}
            kinds = ("incoming", "attention") if side == "incoming" else ("outgoing",)
            for neuron, entries in enumerate(sets):
                for key, index in (e for kind in kinds for e in entries[kind]):
                    expected[key][index] *= factor[neuron]
            assert list(moved) == list(params)
            for key in params:
                np.testing.assert_allclose(moved[key], expected[key], rtol=RTOL64, err_msg=key)
        without = scale_incoming(params, layers, layer, factor, attention=False)
        for key in layers[layer].attention:
            np.testing.assert_array_equal(without[key], params[key])
    for key in params:  # copies: the input is never written
        np.testing.assert_array_equal(params[key], snapshot[key])


# -- layer_structure errors --------------------------------------------------------------------


def _two_layer_params() -> dict[str, np.ndarray]:
    model = GAT(3, 2, 2, num_layers=2, heads=2)
    return {k: np.ones(shape) for k, shape in model.param_shapes().items()}


def test_layer_structure_reads_heads_channels_and_concat() -> None:
    layers = layer_structure(_two_layer_params())
    assert [(lp.heads, lp.channels, lp.concat, lp.width) for lp in layers] == [
        (2, 2, True, 4),
        (2, 2, False, 2),  # the last layer of a GAT averages its heads
    ]
    assert layers[0].weights == ("layer0.W_s",) and layers[0].attention == ("layer0.att",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update({"layer0.weight": p["layer0.W_s"]}), "'layer0.weight' is not a GAT"),
        (lambda p: p.update({"bias": np.ones(2)}), "'bias' is not a GAT parameter"),
        (
            lambda p: p.update(
                {"layer2.W_s": p.pop("layer1.W_s"), "layer2.att": p.pop("layer1.att")}
            ),
            r"numbered 0, 1, \.\.\.; got \[0, 2\]",
        ),
        (lambda p: p.pop("layer1.att"), "layer1 has no feature weights or no attention"),
        (lambda p: p.update({"layer1.W_s": np.ones((4, 3))}), "widths do not chain"),
        (lambda p: p.clear(), r"numbered 0, 1, \.\.\.; got \[\]"),
    ],
    ids=["bad-name", "no-layer-prefix", "gap", "no-attention", "widths", "empty"],
)
def test_layer_structure_rejects_dicts_that_are_not_a_gats(change, message: str) -> None:
    params = _two_layer_params()
    change(params)
    with pytest.raises(ValueError, match=message):
        layer_structure(params)
