"""GraphTransformerLayer (supplement Eq. 3-13): finite differences through the whole layer, its
wiring against its blocks applied by hand, mask replay, the attention mask, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.nn.transformer.graph_transformer_layer import GraphTransformerLayer
from refimpl.ops.linear import Linear
from refimpl.testing import check_gradients, max_relative_error
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from tests.nn.norms.test_norms import smooth_at_step

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
# step of the whole-layer differences, as in the model tests: LayerNorm and ReLU curvature
# is excluded by `smooth` below instead of by a smaller step
STEP = 1e-5


@st.composite
def layer_setups(draw: st.DrawFn, lipschitz: bool = True) -> tuple:
    """A small layer, float64 parameters moved off their init, features, edge features, a graph
    (isolated nodes, duplicates, self-loops) and forward kwargs with fixed dropout masks."""
    graph = draw(graphs(max_nodes=6, max_edges=12))
    heads = draw(st.integers(1, 2))
    layer = GraphTransformerLayer(
        channels=heads * draw(st.integers(1, 2)),
        heads=heads,
        ffn_channels=draw(st.integers(1, 4)),
        edge_dim=draw(st.sampled_from([None, 1, 2])),
        dropout=draw(st.sampled_from([0.0, 0.3])),
        attn_dropout=draw(st.sampled_from([0.0, 0.3])),
        layer_norm=draw(st.booleans()),
        qkv_bias=draw(st.booleans()),
        lipschitz_norm=draw(st.sampled_from([None, "paper"] if lipschitz else [None])),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {
        name: value + 0.3 * rng.standard_normal(value.shape)
        for name, value in layer.init_params(rng).items()
    }
    h = rng.standard_normal((graph.num_nodes, layer.channels))
    edge_attr = None
    if layer.edge_dim is not None:
        edge_attr = rng.standard_normal((graph.num_edges, layer.edge_dim))
    training = draw(st.booleans())
    kwargs: dict[str, Any] = {"training": training}
    if training:
        _, cache = layer.forward(params, h, graph, edge_attr, training=True, rng=rng)
        kwargs["noise"] = cache.noise
    return layer, params, h, graph, edge_attr, kwargs


def smooth(layer: GraphTransformerLayer, params: dict, cache: Any) -> bool:
    """Central differences are accurate: every LayerNorm root (``smooth_at_step`` of the
    LayerNorm tests; one channel centres to 0 whatever the step) and every FFN pre-activation
    (F5's ReLU input, recomputed from the cache) is far from its non-smooth point on the scale
    of the step."""
    roots = [c.root for c in (cache.norm1, cache.norm2) if c is not None]
    norm = layer.blocks.get("norm1")
    norms_ok = layer.channels == 1 or all(smooth_at_step(r, norm, STEP) for r in roots)
    pre_activation = cache.ffn1.x @ params["ffn1.W"].T + params["ffn1.b"]  # (N, d_ff)
    return norms_ok and bool(np.abs(pre_activation).min(initial=np.inf) > 1e3 * STEP)


@given(setup=layer_setups(lipschitz=False))
def test_layer_matches_central_differences(setup: tuple) -> None:
    layer, params, h, graph, edge_attr, kwargs = setup
    _, cache = layer.forward(params, h, graph, edge_attr, **kwargs)
    assume(smooth(layer, params, cache))
    inputs = (h, graph) if edge_attr is None else (h, graph, edge_attr)
    rng = np.random.default_rng(0)
    report = check_gradients(
        layer, params, inputs, forward_kwargs=kwargs, max_entries=20, rng=rng, eps=STEP
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=layer_setups())
def test_layer_is_its_blocks_applied_in_order(setup: tuple) -> None:
    """F1-F8 by hand from the blocks (the conv, the linears, LayerNorms, ReLU) with the same
    masks: the wiring, not the blocks, is under test."""
    layer, params, h, graph, edge_attr, kwargs = setup
    out, cache = layer.forward(params, h, graph, edge_attr, **kwargs)
    noise = kwargs.get("noise", {})
    blocks = layer.blocks

    def sub(prefix: str) -> dict:
        return {
            k.removeprefix(f"{prefix}."): v for k, v in params.items() if k.startswith(prefix + ".")
        }

    def drop(key: str, x: np.ndarray) -> np.ndarray:
        return x * noise[key] / (1 - layer.dropout) if key in noise else x

    a, _ = blocks["attention"].forward(
        sub("attention"),
        h,
        graph,
        edge_attr,
        training=kwargs["training"],
        attn_dropout_mask=noise.get("attn_dropout"),
    )
    a = drop("dropout1", a @ params["output.W"].T + params["output.b"])
    z = h + a
    if layer.layer_norm:
        z, _ = blocks["norm1"].forward(sub("norm1"), z)
    f = np.maximum(z @ params["ffn1.W"].T + params["ffn1.b"], 0)
    f = drop("dropout2", f @ params["ffn2.W"].T + params["ffn2.b"])
    expected = z + f
    if layer.layer_norm:
        expected, _ = blocks["norm2"].forward(sub("norm2"), expected)
    assert max_relative_error(out, expected) <= RTOL64
    np.testing.assert_array_equal(cache.out, out)


def test_mask_replay_is_exact() -> None:
    """forward(noise=cache.noise) repeats a training step bit for bit; the masks are drawn
    attn_dropout, dropout1, dropout2 in that order."""
    rng = np.random.default_rng(5)
    graph = Graph(rng.integers(0, 7, (2, 20)), 7)
    layer = GraphTransformerLayer(4, heads=2, edge_dim=3, dropout=0.2, attn_dropout=0.1)
    params = layer.init_params(rng)
    h, e = rng.standard_normal((7, 4)), rng.standard_normal((20, 3))
    out, cache = layer.forward(params, h, graph, e, training=True, rng=np.random.default_rng(9))
    assert list(cache.noise) == ["attn_dropout", "dropout1", "dropout2"]
    replay, _ = layer.forward(params, h, graph, e, training=True, noise=cache.noise)
    np.testing.assert_array_equal(out, replay)
    draws = np.random.default_rng(9)
    np.testing.assert_array_equal(cache.noise["attn_dropout"], draws.random((20, 2)) >= 0.1)
    np.testing.assert_array_equal(cache.noise["dropout1"], draws.random((7, 4)) >= 0.2)
    np.testing.assert_array_equal(cache.noise["dropout2"], draws.random((7, 4)) >= 0.2)


def test_attention_is_masked_to_the_edges() -> None:
    """Eq. 7: a node's output depends only on its in-neighbours. Changing the features of a
    node with no edge to v leaves v's output unchanged; changing an in-neighbour changes it."""
    rng = np.random.default_rng(1)
    # 0 -> 1, 1 -> 1 (self), 2 -> 1; node 3 sends nothing to 1
    graph = Graph(np.array([[0, 1, 2, 3], [1, 1, 1, 3]]), 4)
    layer = GraphTransformerLayer(4, heads=2)
    params = layer.init_params(rng)
    h = rng.standard_normal((4, 4))
    out, _ = layer.forward(params, h, graph)
    moved = h.copy()
    moved[3] += 5.0
    np.testing.assert_array_equal(layer.forward(params, moved, graph)[0][1], out[1])
    moved[0] += 5.0
    assert np.abs(layer.forward(params, moved, graph)[0][1] - out[1]).max() > 1e-3


def test_default_ffn_width_and_parameter_names() -> None:
    layer = GraphTransformerLayer(8, heads=2, edge_dim=3)
    shapes = layer.param_shapes()
    assert shapes["ffn1.W"] == (16, 8) and shapes["ffn2.W"] == (8, 16)
    assert shapes["attention.W_q"] == (8, 8) and shapes["attention.W_e"] == (8, 3)
    assert "attention.b_q" not in shapes  # Eq. 3-5 have no biases
    assert list(shapes)[-2:] == ["norm2.weight", "norm2.bias"]
    assert isinstance(layer.blocks["output"], Linear)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"channels": 6, "heads": 4}, "divisible by heads"),
        ({"channels": 0}, "positive int"),
        ({"channels": 4, "dropout": 1.0}, "probability"),
        ({"channels": 4, "attn_dropout": -0.1}, "probability"),
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GraphTransformerLayer(**kwargs)


def test_unknown_noise_key_is_rejected() -> None:
    layer = GraphTransformerLayer(2, heads=1)
    params = layer.init_params(np.random.default_rng(0))
    graph = Graph(np.array([[0], [1]]), 2)
    with pytest.raises(ValueError, match="unknown keys"):
        layer.forward(params, np.ones((2, 2)), graph, noise={"dropout3": None})
