"""GAT model: finite differences through the stack, equivalences, parameters, noise, backends."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import asarray, to_numpy
from refimpl.models import GAT
from refimpl.nn import GATConv
from refimpl.nn.norms.pairnorm import PAIRNORM_MODES, PairNorm
from refimpl.ops.activations import ACTIVATIONS, get_activation
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from tests.backends import DEVICE_BACKENDS
from tests.nn.norms.test_norms import smooth_at_step

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
KINKED = ("relu", "leaky_relu")  # activations whose derivative jumps at 0


@st.composite
def model_setups(draw: st.DrawFn, dropout: bool | None = None) -> tuple:
    """A model, float64 parameters (nonzero bias and res_W), features, a graph, forward kwargs.

    With dropout the kwargs replay one drawn set of masks (``noise``) in training mode, so
    the forward is a deterministic function of the parameters, as finite differences need.
    """
    graph = draw(graphs(max_nodes=6, max_edges=10))
    num_layers = draw(st.integers(1, 4))
    heads = draw(
        st.integers(1, 3) | st.lists(st.integers(1, 3), min_size=num_layers, max_size=num_layers)
    )
    use_dropout = draw(st.booleans()) if dropout is None else dropout
    model = GAT(
        in_channels=draw(st.integers(1, 3)),
        hidden_channels=draw(st.integers(1, 3)),
        out_channels=draw(st.integers(1, 3)),
        num_layers=num_layers,
        heads=heads,
        version=draw(st.sampled_from(["v1", "v2"])),
        share_weights=draw(st.booleans()),
        bias=draw(st.booleans()),
        activation=draw(st.sampled_from(sorted(ACTIVATIONS))),
        dropout=0.3 if use_dropout else 0.0,
        attn_dropout=0.4 if use_dropout else 0.0,
        residual=draw(st.booleans()),
        negative_slope=draw(st.sampled_from([0.2, 0.5])),
        add_self_loops=draw(st.booleans()),
        pairnorm=draw(st.sampled_from([None, *PAIRNORM_MODES])),
    )
    rng = np.random.default_rng(draw(seeds()))
    # Zero bias and res_W (the init's) would hide their bugs; larger attention makes the
    # softmaxes far from uniform.
    params = {
        k: rng.standard_normal(v.shape) if k.endswith(("bias", "res_W")) else 2.0 * v
        for k, v in model.init_params(rng).items()
    }
    x = rng.standard_normal((graph.num_nodes, model.in_channels))
    kwargs: dict = {}
    if use_dropout:
        _, cache = model.forward(params, x, graph, training=True, rng=rng)
        kwargs = {"training": True, "noise": cache.noise}
    return model, params, x, graph, kwargs


def pre_activations(model: GAT, params: dict, cache: object, graph: Graph) -> list:
    """Each hidden layer's activation input, recomputed from the layer inputs in the cache."""
    out = []
    for i, (conv, layer) in enumerate(zip(model.layers[:-1], cache.layers, strict=False)):
        mask = layer.conv.dropout_cache.mask
        z, _ = conv.forward(
            model.layer_params(params, i), layer.conv.x, graph,
            training=mask is not None, attn_dropout_mask=mask,
        )  # fmt: skip
        if model.residual:
            z = z + layer.conv.x @ params[f"layer{i}.res_W"].T
        out.append(PairNorm(model.pairnorm).forward({}, z)[0] if model.pairnorm else z)
    return out


def kink_distance(model: GAT, params: dict, cache: object, graph: Graph) -> float:
    """Smallest |input| of any LeakyReLU in attention and of any ReLU/LeakyReLU activation:
    central differences are meaningless within eps of a kink."""
    values = [layer.conv.score.pre for layer in cache.layers]
    if model.activation in KINKED:
        values += pre_activations(model, params, cache, graph)
    return min((float(np.min(np.abs(v))) for v in values if v.size), default=np.inf)


# -- gradients of the whole network ------------------------------------------------------------


@given(setup=model_setups())
def test_backward_matches_central_differences(setup: tuple) -> None:
    model, params, x, graph, kwargs = setup
    _, cache = model.forward(params, x, graph, **kwargs)
    assume(kink_distance(model, params, cache, graph) > 1e-4)
    # PairNorm curves on the scale of its statistic's root (as in its own gradient test)
    norms = [layer.norm for layer in cache.layers if layer.norm is not None]
    pairnorm = PairNorm(model.pairnorm) if model.pairnorm else None
    assume(all(smooth_at_step(norm.root, pairnorm, 1e-6) for norm in norms))
    # 8 entries per tensor keep ~30 tensors x 2 forwards each affordable; every tensor is hit.
    report = check_gradients(model, params, (x, graph), forward_kwargs=kwargs, max_entries=8)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_gradient_check_catches_a_lost_skip_gradient_only_with_nonzero_res_w() -> None:
    # Why the gradient test uses a nonzero res_W: a backward that forgets the skip's
    # contribution to d_x (d_out @ res_W) is exact at the zero initialisation.
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    model = GAT(3, 2, 2, num_layers=1, heads=2, residual=True)
    rng = np.random.default_rng(1)
    params = model.init_params(rng)
    x = rng.standard_normal((3, 3))

    class Broken:
        forward = staticmethod(model.forward)

        @staticmethod
        def backward(params: dict, cache: object, d_out: np.ndarray) -> tuple:
            d_x, d_params = model.backward(params, cache, d_out)
            return d_x - d_out @ params["layer0.res_W"], d_params

    assert check_gradients(Broken(), params, (x, graph)).max_rel_error <= GRADCHECK_RTOL
    params["layer0.res_W"] = rng.standard_normal(params["layer0.res_W"].shape)
    assert check_gradients(Broken(), params, (x, graph)).by_name()["input[0]"].max_rel_error > 1e-3
    assert check_gradients(model, params, (x, graph)).max_rel_error <= GRADCHECK_RTOL


# -- equivalences ------------------------------------------------------------------------------


@given(setup=model_setups())
def test_one_layer_equals_a_bare_gatconv(setup: tuple) -> None:
    model, _, x, graph, _ = setup
    model = replace(model, num_layers=1, heads=2, residual=False)
    params = model.init_params(np.random.default_rng(0))
    out, cache = model.forward(params, x, graph)
    conv = GATConv(
        model.in_channels, model.out_channels, heads=2, concat=False, version=model.version,
        share_weights=model.share_weights, negative_slope=model.negative_slope,
        add_self_loops=model.add_self_loops, bias=model.bias,
    )  # fmt: skip
    bare = {name: params[f"layer0.{name}"] for name in conv.param_shapes()}
    out_conv, cache_conv = conv.forward(bare, x, graph)
    np.testing.assert_array_equal(out, out_conv)
    d_out = np.random.default_rng(1).standard_normal(out.shape)
    d_x, d_params = model.backward(params, cache, d_out)
    d_x_conv, d_conv = conv.backward(bare, cache_conv, d_out)
    np.testing.assert_array_equal(d_x, d_x_conv)
    for name in bare:
        np.testing.assert_array_equal(d_params[f"layer0.{name}"], d_conv[name])


@given(setup=model_setups(dropout=False))
def test_two_layers_equal_gatconv_activation_gatconv_by_hand(setup: tuple) -> None:
    model, _, x, graph, _ = setup
    model = replace(model, num_layers=2, heads=(3, 2), residual=False, pairnorm=None)
    params = model.init_params(np.random.default_rng(0))
    first = GATConv(
        model.in_channels, model.hidden_channels, heads=3, concat=True, version=model.version,
        share_weights=model.share_weights, negative_slope=model.negative_slope,
        add_self_loops=model.add_self_loops, bias=model.bias,
    )  # fmt: skip
    second = replace(
        first, in_channels=3 * model.hidden_channels, out_channels=model.out_channels, heads=2,
        concat=False,
    )  # fmt: skip
    phi = get_activation(model.activation)
    p0 = {k.removeprefix("layer0."): v for k, v in params.items() if k.startswith("layer0.")}
    p1 = {k.removeprefix("layer1."): v for k, v in params.items() if k.startswith("layer1.")}
    h, c0 = first.forward(p0, x, graph)
    a, ca = phi.forward({}, h)
    logits, c1 = second.forward(p1, a, graph)
    out, cache = model.forward(params, x, graph)
    np.testing.assert_array_equal(out, logits)

    d_out = np.random.default_rng(1).standard_normal(out.shape)
    d_a, d_p1 = second.backward(p1, c1, d_out)
    d_x_hand, d_p0 = first.backward(p0, c0, phi.backward({}, ca, d_a)[0])
    d_x, d_params = model.backward(params, cache, d_out)
    expected = {**{f"layer0.{k}": v for k, v in d_p0.items()}, "x": d_x_hand}
    expected |= {f"layer1.{k}": v for k, v in d_p1.items()}
    assert max(relative_errors({**d_params, "x": d_x}, expected).values()) == 0.0


@given(setup=model_setups())
def test_zero_residual_weight_equals_no_residual(setup: tuple) -> None:
    model, params, x, graph, kwargs = setup
    with_skip = replace(model, residual=True)
    plain = replace(model, residual=False)
    plain_params = {k: v for k, v in params.items() if not k.endswith("res_W")}
    zero_skip = {**plain_params}
    for name, shape in with_skip.param_shapes().items():
        zero_skip.setdefault(name, np.zeros(shape))
    zero_skip = {name: zero_skip[name] for name in with_skip.param_shapes()}
    out, cache = with_skip.forward(zero_skip, x, graph, **kwargs)
    out_plain, cache_plain = plain.forward(plain_params, x, graph, **kwargs)
    assert max_relative_error(out, out_plain) <= RTOL64
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_x, d_params = with_skip.backward(zero_skip, cache, d_out)
    d_x_plain, d_plain = plain.backward(plain_params, cache_plain, d_out)
    shared = {k: v for k, v in d_params.items() if not k.endswith("res_W")}
    errors = relative_errors({**shared, "x": d_x}, {**d_plain, "x": d_x_plain})
    assert max(errors.values()) <= RTOL64, errors


# -- parameters and initialisation -------------------------------------------------------------


def test_parameter_keys_order_and_shapes() -> None:
    model = GAT(5, 4, 3, num_layers=3, heads=[2, 3, 2], residual=True, bias=True)
    assert [c.in_channels for c in model.layers] == [5, 8, 12]
    assert [(c.heads, c.out_channels, c.concat) for c in model.layers] == [
        (2, 4, True), (3, 4, True), (2, 3, False),
    ]  # fmt: skip
    assert list(model.param_shapes().items()) == [
        ("layer0.W_s", (8, 5)), ("layer0.att", (2, 4)), ("layer0.bias", (8,)),
        ("layer0.res_W", (8, 5)),
        ("layer1.W_s", (12, 8)), ("layer1.att", (3, 4)), ("layer1.bias", (12,)),
        ("layer1.res_W", (12, 8)),
        ("layer2.W_s", (6, 12)), ("layer2.att", (2, 3)), ("layer2.bias", (3,)),
        ("layer2.res_W", (3, 12)),
    ]  # fmt: skip
    v1 = GAT(5, 4, 3, num_layers=2, version="v1")
    assert list(v1.param_shapes()) == [
        "layer0.W", "layer0.att_src", "layer0.att_dst", "layer1.W", "layer1.att_src",
        "layer1.att_dst",
    ]  # fmt: skip
    separate = GAT(5, 4, 3, num_layers=1, share_weights=False)
    assert list(separate.param_shapes()) == ["layer0.W_s", "layer0.W_t", "layer0.att"]
    params = model.init_params(np.random.default_rng(0))
    assert [(k, v.shape) for k, v in params.items()] == list(model.param_shapes().items())
    assert list(model.layer_params(params, 1)) == ["W_s", "att", "bias"]
    assert model.layer_params(params, 1)["W_s"] is params["layer1.W_s"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_xavier_is_gatconv_init_layer_by_layer_with_zero_bias_and_res_w(version: str) -> None:
    model = GAT(6, 4, 3, num_layers=3, heads=[2, 1, 3], version=version, bias=True, residual=True)
    params = model.init_params(np.random.default_rng(7))
    rng = np.random.default_rng(7)  # the documented draw order: conv.init_params, layer by layer
    for i, conv in enumerate(model.layers):
        for name, value in conv.init_params(rng).items():
            np.testing.assert_array_equal(params[f"layer{i}.{name}"], value)
        np.testing.assert_array_equal(params[f"layer{i}.res_W"], 0.0)
        np.testing.assert_array_equal(params[f"layer{i}.bias"], 0.0)
    again = model.init_params(np.random.default_rng(7), dtype=np.float32)
    for name, value in params.items():
        assert again[name].dtype == np.float32
        np.testing.assert_array_equal(again[name], value.astype(np.float32))


# -- randomness: draw order, determinism, replay -----------------------------------------------


@given(setup=model_setups(dropout=True), seed=seeds())
def test_masks_follow_the_documented_draw_order_and_replay_exactly(setup: tuple, seed: int) -> None:
    model, params, x, graph, _ = setup
    out, cache = model.forward(params, x, graph, training=True, rng=np.random.default_rng(seed))
    # Layer 0 input, layer 0 attention, layer 1 input, ...: each rng.random(shape) >= p.
    rng, expected, width = np.random.default_rng(seed), {}, model.in_channels
    for i, conv in enumerate(model.layers):
        num_edges = conv.prepare_graph(graph).num_edges
        expected[f"layer{i}.input_mask"] = rng.random((graph.num_nodes, width)) >= model.dropout
        expected[f"layer{i}.attn_mask"] = rng.random((num_edges, conv.heads)) >= model.attn_dropout
        width = conv.heads * conv.out_channels
    assert list(cache.noise) == list(expected)
    for key, mask in expected.items():
        np.testing.assert_array_equal(cache.noise[key], mask)
    again, _ = model.forward(params, x, graph, training=True, rng=np.random.default_rng(seed))
    replayed, cache_replayed = model.forward(params, x, graph, training=True, noise=expected)
    np.testing.assert_array_equal(again, out)
    np.testing.assert_array_equal(replayed, out)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    grads = model.backward(params, cache, d_out)
    grads_replayed = model.backward(params, cache_replayed, d_out)
    np.testing.assert_array_equal(grads[0], grads_replayed[0])
    for name in params:
        np.testing.assert_array_equal(grads[1][name], grads_replayed[1][name])


def test_evaluation_draws_nothing_and_ignores_noise() -> None:
    model = GAT(3, 2, 2, num_layers=2, dropout=0.6, attn_dropout=0.6)
    params = model.init_params(np.random.default_rng(0))
    graph, x = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3), np.ones((3, 3))
    rng = np.random.default_rng(5)
    out, cache = model.forward(params, x, graph, rng=rng, noise={"junk": None})
    assert cache.noise == {}
    assert rng.random() == np.random.default_rng(5).random()  # not advanced
    out_train, _ = model.forward(params, x, graph, training=True, rng=rng)
    assert not np.array_equal(out, out_train)


# -- backends ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@given(setup=model_setups())
def test_backend_matches_numpy(backend: str, setup: tuple) -> None:
    model, params, x, graph, kwargs = setup
    out, cache = model.forward(params, x, graph, **kwargs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_x, d_params = model.backward(params, cache, d_out)

    on = {k: asarray(v, backend=backend) for k, v in params.items()}
    kwargs_on = dict(kwargs)
    if "noise" in kwargs:
        kwargs_on["noise"] = {k: asarray(v, backend=backend) for k, v in kwargs["noise"].items()}
    out_b, cache_b = model.forward(on, asarray(x, backend=backend), graph, **kwargs_on)
    d_x_b, d_params_b = model.backward(on, cache_b, asarray(d_out, backend=backend))
    assert not isinstance(out_b, np.ndarray)
    assert max_relative_error(to_numpy(out_b), out) <= RTOL64
    errors = relative_errors({**d_params_b, "x": d_x_b}, {**d_params, "x": d_x})
    assert max(errors.values()) <= RTOL64, errors


def test_float32_stays_float32() -> None:
    model = GAT(4, 3, 2, num_layers=3, heads=2, residual=True, dropout=0.5)
    params = model.init_params(np.random.default_rng(0), dtype=np.float32)
    graph, x = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3), np.ones((3, 4), dtype=np.float32)
    out, cache = model.forward(params, x, graph, training=True, rng=np.random.default_rng(1))
    d_x, d_params = model.backward(params, cache, np.ones_like(out))
    assert out.dtype == d_x.dtype == np.float32
    assert all(v.dtype == np.float32 for v in d_params.values())
