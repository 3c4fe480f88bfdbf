"""GAT model: bad configuration, inputs, noise and cotangents give clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import Graph
from refimpl.backend import asarray
from refimpl.models import GAT


def _setup(**config: object) -> tuple[GAT, dict, np.ndarray, Graph]:
    model = GAT(3, 2, 2, num_layers=2, heads=2, **config)
    graph = Graph(np.array([[0, 1, 2], [1, 2, 3]]), 4)
    return model, model.init_params(np.random.default_rng(0)), np.ones((4, 3)), graph


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_layers": 0}, "num_layers must be a positive int"),
        ({"num_layers": 2.0}, "num_layers must be a positive int"),
        ({"in_channels": 0}, "in_channels must be a positive int"),
        ({"hidden_channels": -1}, "hidden_channels must be a positive int"),
        ({"heads": [2, 2, 2]}, r"sequence of num_layers=2 ints .*got \[2, 2, 2\]"),
        ({"heads": "22"}, "heads must be an int or a sequence"),
        ({"heads": 0}, "heads must be positive ints"),
        ({"heads": [1, 0]}, "heads must be positive ints"),
        ({"heads": [1, True]}, "heads must be positive ints"),
        ({"activation": "tanh"}, "GAT activation must be one of 'elu', 'identity', 'leaky_relu', "),
        ({"dropout": 1.0}, r"dropout must be a probability in \[0, 1\)"),
        ({"attn_dropout": -0.1}, r"attn_dropout must be a probability in \[0, 1\)"),
        ({"version": "v3"}, "version must be 'v1' or 'v2'"),
        ({"negative_slope": -0.2}, "GAT negative_slope must be a finite number >= 0, got -0.2"),
        ({"negative_slope": float("nan")}, "GAT negative_slope must be a finite number >= 0"),
        ({"negative_slope": float("inf")}, "GAT negative_slope must be a finite number >= 0"),
        ({"attn_dropout": float("nan")}, r"attn_dropout must be a probability in \[0, 1\)"),
    ],
)
def test_bad_configuration(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GAT(
            **{"in_channels": 3, "hidden_channels": 2, "out_channels": 2, "num_layers": 2, **kwargs}
        )


def test_heads_sequence_is_stored_as_a_tuple_and_numpy_ints_are_accepted() -> None:
    model = GAT(3, 2, 2, num_layers=2, heads=[np.int64(3), 1])
    assert model.heads == (3, 1) and [c.heads for c in model.layers] == [3, 1]
    assert GAT(3, 2, 2, num_layers=2, heads=[3, 1]) == model  # hashable, comparable config
    assert hash(model) == hash(GAT(3, 2, 2, num_layers=2, heads=(3, 1)))


def test_unknown_init_lists_the_schemes() -> None:
    model, *_ = _setup()
    with pytest.raises(ValueError, match="unknown init 'balanced'; valid schemes are ") as error:
        model.init_params(np.random.default_rng(0), init="balanced")
    assert "Bal_O" in str(error.value) and "xavier" in str(error.value)


def test_layer_index_out_of_range() -> None:
    model, params, *_ = _setup()
    with pytest.raises(IndexError, match="layer 2 out of range for a GAT with 2 layers"):
        model.layer_params(params, 2)


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda p, x, g: (p, np.ones((4, 5)), g), ValueError, r"x must have shape \(\*, 3\)"),
        (lambda p, x, g: (p, np.ones(3), g), ValueError, "x must have shape"),
        (lambda p, x, g: (p, np.ones((5, 3)), g), ValueError, "x has 5 rows but the graph has 4"),
        (lambda p, x, g: (p, x * np.nan, g), ValueError, "x contains NaN or infinity"),
        (lambda p, x, g: (p, x.astype(np.int64), g), TypeError, "floating-point"),
        (lambda p, x, g: (p, x.astype(np.float32), g), TypeError, "x has dtype float32 but params"),
        (lambda p, x, g: (p, x.tolist(), g), TypeError, "x must be an array"),
        (lambda p, x, g: (p, asarray(x, backend="strict"), g), TypeError, "backend"),
        (lambda p, x, g: (p, x, g.edge_index), TypeError, "graph must be a refimpl.Graph"),
        (
            lambda p, x, g: ({k: v for k, v in p.items() if k != "layer1.att"}, x, g),
            ValueError,
            r"GAT parameters do not match its configuration: missing \['layer1.att'\]",
        ),
        (lambda p, x, g: ({**p, "layer0.res_W": p["layer0.W_s"]}, x, g), ValueError, "unexpected"),
        (
            lambda p, x, g: ({**p, "layer0.W_s": p["layer0.W_s"].T}, x, g),
            ValueError,
            r"params\['layer0.W_s'\] must have shape \(4, 3\)",
        ),
    ],
)
def test_bad_input_gives_a_clear_error(mutate: object, error: type, match: str) -> None:
    model, params, x, graph = _setup()
    params, x, graph = mutate(params, x, graph)
    with pytest.raises(error, match=match):
        model.forward(params, x, graph)


def test_training_with_dropout_needs_rng_or_noise() -> None:
    model, params, x, graph = _setup(dropout=0.5)
    with pytest.raises(ValueError, match=r"needs randomness: pass rng=.* or noise="):
        model.forward(params, x, graph, training=True)
    no_dropout, params, x, graph = _setup()
    no_dropout.forward(params, x, graph, training=True)  # nothing to draw: fine


def test_noise_must_hold_exactly_the_masks_drawn() -> None:
    model, params, x, graph = _setup(dropout=0.5, attn_dropout=0.5)
    _, cache = model.forward(params, x, graph, training=True, rng=np.random.default_rng(0))
    noise = cache.noise
    partial = {k: v for k, v in noise.items() if k != "layer1.attn_mask"}
    with pytest.raises(ValueError, match=r"missing \['layer1.attn_mask'\], unexpected \[\]"):
        model.forward(params, x, graph, training=True, noise=partial)
    with pytest.raises(ValueError, match=r"unexpected \['layer2.input_mask'\]"):
        model.forward(params, x, graph, training=True, noise={**noise, "layer2.input_mask": 1})
    bad_shape = {**noise, "layer0.input_mask": noise["layer0.input_mask"][:2]}
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\) but x has \(4, 3\)"):
        model.forward(params, x, graph, training=True, noise=bad_shape)
    not_bool = {**noise, "layer1.attn_mask": noise["layer1.attn_mask"].astype(float)}
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        model.forward(params, x, graph, training=True, noise=not_bool)


def test_bad_upstream_gradient() -> None:
    model, params, x, graph = _setup()
    out, cache = model.forward(params, x, graph)
    with pytest.raises(ValueError, match=r"d_logits must be an array of the output's shape \(4, 2"):
        model.backward(params, cache, np.ones((4, 4)))
    with pytest.raises(
        TypeError, match="d_logits has dtype float32 but the forward ran in float64"
    ):
        model.backward(params, cache, out.astype(np.float32))
