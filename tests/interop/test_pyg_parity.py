"""``from_pyg`` / ``to_pyg`` against real PyG modules, and our layers against them (float64).

GATConv / GATv2Conv: a PyG module with randomised parameters (biases included; GATv2's
``lin_l``/``lin_r`` biases zeroed, as our GATv2 has none) is read with ``from_pyg``;
outputs and attention coefficients must equal PyG's to 1e-12 and our gradients (input and
every parameter) torch autograd's to 1e-10, judged over the largest entry of all gradients
(``relative_errors``: some vanish by cancellation and are rounding on both sides). PyG's
gradients are mapped to our names with ``from_pyg`` itself. TransformerConv: the setups
of ``tests/nn/transformer/test_transformer_conv.py`` go to PyG through ``to_pyg`` (``strict=True``
loading), gradients come back through ``from_pyg``. Attention dropout: PyG draws its own
mask, so its module's ``F.dropout`` is replaced for one call by one applying ours (as in
``tests/nn/transformer/test_transformer_conv_torch.py``).

The last section holds forward checks at 1e-12 of our LipschitzNorm GAT (both variants)
and NodeFormerConv against the torch formulations of ``tests/nn/gat/test_conv_torch.py`` and
``tests/nn/nodeformer/test_conv_torch.py``, whose own tests judge the forward at 1e-10 only.
"""

from __future__ import annotations

import types
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.interop.pyg import from_pyg, pyg_shapes, to_pyg
from refimpl.nn import GATConv, TransformerConv
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.strategies import graphs, seeds
from tests.interop.test_pyg import layers
from tests.nn.transformer.test_transformer_conv import Setup
from tests.nn.transformer.test_transformer_conv import setups as transformer_setups

torch = pytest.importorskip("torch")
torch_geometric = pytest.importorskip("torch_geometric")
import torch_geometric.nn.conv.gat_conv as pyg_gat  # noqa: E402
import torch_geometric.nn.conv.gatv2_conv as pyg_gatv2  # noqa: E402
import torch_geometric.nn.conv.transformer_conv as pyg_transformer  # noqa: E402

from tests.nn.nodeformer.test_conv import setups as nodeformer_setups  # noqa: E402
from tests.nn.nodeformer.test_conv_torch import torch_gradients, torch_layer  # noqa: E402

FORWARD_RTOL = 1e-12  # outputs and coefficients: rounding in another summation order
GRADIENT_RTOL = 1e-10  # autograd's chain reorders longer sums (over the largest gradient)


# -- running a PyG module --------------------------------------------------------------------------


def pyg_module(layer: GATConv | TransformerConv) -> object:
    """PyG's counterpart of ``layer`` (float64, PyG's own initialisation)."""
    sizes = (layer.in_channels, layer.out_channels)
    common = {"heads": layer.heads, "concat": layer.concat, "bias": layer.bias}
    common["dropout"] = layer.dropout
    if isinstance(layer, TransformerConv):
        module = pyg_transformer.TransformerConv(
            *sizes,
            **common,
            beta=layer.beta,
            edge_dim=layer.edge_dim,
            root_weight=layer.root_weight,
        )
    else:
        fill = layer.fill_value
        gat = {
            "negative_slope": layer.negative_slope,
            "add_self_loops": layer.add_self_loops,
            "edge_dim": layer.edge_dim,
            "fill_value": torch.tensor(fill) if isinstance(fill, tuple) else fill,
            "residual": layer.residual,
        }
        if layer.version == "v1":
            module = pyg_gat.GATConv(*sizes, **common, **gat)
        else:
            module = pyg_gatv2.GATv2Conv(*sizes, **common, **gat, share_weights=layer.share_weights)
    return module.double()


def randomise(module: object, seed: int, projection_bias: bool = False) -> None:
    """Every parameter ~ N(0, 1) (shared ones once); GATv2's projection biases zero unless
    the layer they are for has ``projection_bias``."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, value in module.named_parameters():
            if name in ("lin_l.bias", "lin_r.bias") and not projection_bias:
                value.zero_()  # lin_l.bias, lin_r.bias: the papers' GATv2 has none
            else:
                value.copy_(torch.from_numpy(rng.standard_normal(tuple(value.shape))))


def run_pyg(module: object, x: np.ndarray, graph: Graph, d_out: np.ndarray, **inputs: object):
    """PyG forward (with our dropout mask if given), autograd backward.

    Returns ``(out, (edge_index, alpha), grads)``; ``grads`` holds ``x`` (and
    ``edge_attr``) and every state-dict key (a shared module under each of its names).
    """
    keep, edge_attr = inputs.get("attn_dropout_mask"), inputs.get("edge_attr")
    module.train(keep is not None)
    t_x = torch.tensor(x, requires_grad=True)
    args = [t_x, torch.tensor(graph.edge_index)]
    t_edge_attr = None
    if edge_attr is not None:
        t_edge_attr = torch.tensor(edge_attr, requires_grad=True)
        args.append(t_edge_attr)
    owner = {
        pyg_gat.GATConv: pyg_gat,
        pyg_gatv2.GATv2Conv: pyg_gatv2,
        pyg_transformer.TransformerConv: pyg_transformer,
    }[type(module)]

    def our_mask(alpha: object, p: float = 0.5, training: bool = True) -> object:
        return alpha * torch.from_numpy(keep) / (1 - p) if training else alpha

    functional = types.SimpleNamespace(dropout=our_mask, leaky_relu=torch.nn.functional.leaky_relu)
    with pytest.MonkeyPatch.context() as patch:
        if keep is not None:
            patch.setattr(owner, "F", functional)
        t_out, (t_edges, t_alpha) = module(*args, return_attention_weights=True)
    t_out.backward(torch.from_numpy(d_out))
    grads = {"x": t_x.grad.numpy()}
    if t_edge_attr is not None:  # no grad where no edge read it (GATv1 skips E = 0)
        grad = t_edge_attr.grad
        grads["edge_attr"] = np.zeros(edge_attr.shape) if grad is None else grad.numpy()
    for key, value in module.state_dict(keep_vars=True).items():
        # unused parameters (lin_skip without root_weight) get no gradient
        grads[key] = np.zeros(tuple(value.shape)) if value.grad is None else value.grad.numpy()
    edges = t_edges.numpy()
    return t_out.detach().numpy(), (edges, t_alpha.detach().numpy()), grads


def theirs_under_our_names(layer: object, grads: dict) -> dict:
    """PyG's gradients keyed like our parameters, through ``from_pyg``."""
    state = {k: v for k, v in grads.items() if k not in ("x", "edge_attr")}
    if isinstance(layer, GATConv) and layer.version == "v2" and layer.bias:
        if not layer.projection_bias:
            # PyG's lin_l/lin_r biases held at zero for the papers' GATv2: nothing to compare
            state["lin_l.bias"] = np.zeros_like(state["lin_l.bias"])
            state["lin_r.bias"] = np.zeros_like(state["lin_r.bias"])
    theirs = from_pyg(layer, state)
    theirs["x"] = grads["x"]
    if "edge_attr" in grads:
        theirs["edge_attr"] = grads["edge_attr"]
    return theirs


def compare(layer: object, params: dict, x: np.ndarray, graph: Graph, module: object, **inputs):
    """Errors of ours against PyG: output, coefficients (edges equal), gradients."""
    edge_attr = inputs.pop("edge_attr", None)
    extra = () if edge_attr is None else (edge_attr,)
    training = inputs.get("attn_dropout_mask") is not None
    out, cache = layer.forward(params, x, graph, *extra, training=training, **inputs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_inputs, d_params = layer.backward(params, cache, d_out)
    ours = {**d_params, "x": d_inputs if edge_attr is None else d_inputs[0]}
    if edge_attr is not None:
        ours["edge_attr"] = d_inputs[1]
    t_out, (t_edges, t_alpha), t_grads = run_pyg(
        module, x, graph, d_out, edge_attr=edge_attr, **inputs
    )
    edges, _ = layer.attention_weights(cache)
    np.testing.assert_array_equal(edges, t_edges)
    # PyG 2.8.1 returns GAT's coefficients after dropout, TransformerConv's before
    alpha = cache.alpha if isinstance(layer, TransformerConv) else cache.alpha_dropped
    gradients = relative_errors(ours, theirs_under_our_names(layer, t_grads))
    return {
        "forward": max_relative_error(out, t_out),
        "alpha": max_relative_error(alpha, t_alpha),
        "gradients": max(gradients.values()),
    }


def assert_close(errors: dict) -> None:
    assert errors["forward"] <= FORWARD_RTOL, errors
    assert errors["alpha"] <= FORWARD_RTOL, errors
    assert errors["gradients"] <= GRADIENT_RTOL, errors


# -- GATConv and GATv2Conv -------------------------------------------------------------------------


@st.composite
def gat_cases(draw: st.DrawFn) -> tuple:
    """Our layer, PyG's module with random parameters, features, a graph, forward kwargs."""
    graph = draw(graphs())
    layer = GATConv(
        in_channels=draw(st.integers(1, 4)),
        out_channels=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 3)),
        concat=draw(st.booleans()),
        version=draw(st.sampled_from(["v1", "v2"])),
        share_weights=draw(st.booleans()),
        negative_slope=draw(st.sampled_from([0.2, 0.01, 0.5])),
        add_self_loops=draw(st.booleans()),
        bias=draw(st.booleans()),
        dropout=draw(st.sampled_from([0.0, 0.4])),
        residual=draw(st.booleans()),
    )
    edge_dim = draw(st.sampled_from([None, 1, 2]))
    if edge_dim is not None:  # PyG's edge features, with every fill of the added loops
        fill = draw(st.sampled_from(["mean", "add", "sum", "max", "min", "mul", -0.5, "vector"]))
        fill = tuple(np.linspace(-1, 1, edge_dim)) if fill == "vector" else fill
        layer = replace(layer, edge_dim=edge_dim, fill_value=fill)
    if layer.version == "v2" and layer.bias:  # PyG's lin_l, lin_r biases: as trained, or zero
        layer = replace(layer, projection_bias=draw(st.booleans()))
    seed = draw(seeds())
    module = pyg_module(layer)
    randomise(module, seed, layer.projection_bias)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((graph.num_nodes, layer.in_channels))
    kwargs = {}
    if edge_dim is not None:  # continuous: no ties in a max or min (tests/ops/test_loop_fill.py)
        kwargs["edge_attr"] = rng.standard_normal((graph.num_edges, edge_dim))
    if layer.dropout:
        num_edges = layer.prepare_graph(graph).num_edges
        kwargs["attn_dropout_mask"] = rng.random((num_edges, layer.heads)) >= layer.dropout
    return layer, module, x, graph, kwargs


@given(case=gat_cases())
def test_gat_from_pyg_matches_pyg_forward_coefficients_and_autograd(case: tuple) -> None:
    layer, module, x, graph, kwargs = case
    params = from_pyg(layer, module.state_dict())
    assert_close(compare(layer, params, x, graph, module, **kwargs))


# -- TransformerConv -------------------------------------------------------------------------------


@given(setup=transformer_setups(lipschitz=False))
def test_transformer_conv_through_to_pyg_matches_pyg_and_autograd(setup: Setup) -> None:
    conv, params, x, graph, edge_attr, kwargs = setup
    module = pyg_module(conv)
    state = {k: torch.from_numpy(v) for k, v in to_pyg(conv, params).items()}
    module.load_state_dict(state, strict=True)
    kwargs = {k: v for k, v in kwargs.items() if k != "training"}
    assert_close(compare(conv, params, x, graph, module, edge_attr=edge_attr, **kwargs))


@given(setup=transformer_setups(lipschitz=False, dropout=False), seed=seeds())
def test_transformer_conv_from_a_randomised_pyg_module(setup: Setup, seed: int) -> None:
    conv, _, x, graph, edge_attr, _ = setup
    module = pyg_module(conv)
    randomise(module, seed)
    params = from_pyg(conv, module.state_dict())
    assert_close(compare(conv, params, x, graph, module, edge_attr=edge_attr))


# -- the names against the real modules ------------------------------------------------------------


@given(layer=layers(), seed=seeds())
def test_state_dict_keys_shapes_and_order_are_pygs(layer: object, seed: int) -> None:
    module = pyg_module(layer)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    for version in (None, torch_geometric.__version__):
        assert list(pyg_shapes(layer, version).items()) == list(expected.items())
    params = layer.init_params(np.random.default_rng(seed))
    exported = to_pyg(layer, params, pyg_version=torch_geometric.__version__)
    module.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
    back = from_pyg(layer, module.state_dict())
    assert all(np.array_equal(back[k], params[k]) for k in params)


def assert_state_dict_round_trip(layer: object, module: object) -> None:
    """``pyg_shapes`` lists the module's keys and shapes in its order; ``to_pyg`` loads into it
    strictly and ``from_pyg`` reads the same parameters back."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    assert list(pyg_shapes(layer).items()) == list(expected.items())
    params = layer.init_params(np.random.default_rng(0))
    exported = {k: torch.from_numpy(v) for k, v in to_pyg(layer, params).items()}
    module.load_state_dict(exported, strict=True)
    back = from_pyg(layer, module.state_dict())
    assert all(np.array_equal(back[k], params[k]) for k in params)


@given(case=gat_cases())
def test_gat_options_state_dict_keys_shapes_and_order_are_pygs(case: tuple) -> None:
    # edge_dim (lin_edge, att_edge), residual (res), projection biases: PyG's own tensors
    # first (att*, bias), then its submodules' (lin*, lin_edge, res)
    layer, module, *_ = case
    assert_state_dict_round_trip(layer, module)


@pytest.mark.parametrize(
    "layer",
    [
        GATConv((3, 4), 2, heads=2),
        GATConv((3, 4), 2, heads=2, edge_dim=2, residual=True, concat=False),
        GATConv((3, 4), 2, heads=2, version="v2", projection_bias=True, residual=True),
        GATConv((3, 4), 2, version="v2", bias=False, edge_dim=1),
        TransformerConv((3, 4), 2, heads=2, edge_dim=2, beta=True),
        TransformerConv((3, 4), 2, heads=2, concat=False, root_weight=False, bias=False),
    ],
    ids=[
        "v1",
        "v1-edges-residual-mean",
        "v2-biases-residual",
        "v2-no-bias-edges",
        "transformer-edges-beta",
        "transformer-mean-no-root-no-bias",
    ],
)
def test_bipartite_state_dict_keys_shapes_and_order_are_pygs(layer: object) -> None:
    # in_channels = (F_src, F_dst): lin_src/lin_dst (v1), lin_l/lin_r (v2) of two widths,
    # res reading the targets' width
    assert_state_dict_round_trip(layer, pyg_module(layer))


def test_float32_modules_stay_float32_and_tensors_are_copied() -> None:
    module = pyg_gatv2.GATv2Conv(3, 2, heads=2, bias=False)  # float32, PyG's default
    params = from_pyg(GATConv(3, 2, heads=2, version="v2", bias=False), module.state_dict())
    assert all(v.dtype == np.float32 for v in params.values())
    with torch.no_grad():
        module.lin_l.weight.add_(1.0)  # the module's storage must not be shared
    assert not np.array_equal(params["W_s"], module.lin_l.weight.detach().numpy())


def test_gatv2_bias_refusal_on_a_real_module() -> None:
    module = pyg_gatv2.GATv2Conv(3, 2, heads=2)  # bias=True: random lin_l/lin_r biases
    with pytest.raises(ValueError, match=r"lin_l\.bias is not zero"):
        from_pyg(GATConv(3, 2, heads=2, version="v2"), module.state_dict())
    biased = GATConv(3, 2, heads=2, version="v2", projection_bias=True)
    params = from_pyg(biased, module.state_dict())
    np.testing.assert_array_equal(params["b_s"], module.lin_l.bias.detach().numpy())


def test_prefixed_model_state_dict() -> None:
    model = torch.nn.ModuleDict(
        {"conv1": pyg_gat.GATConv(3, 2, heads=2), "conv2": pyg_gatv2.GATv2Conv(4, 3, bias=False)}
    )
    conv1 = from_pyg(GATConv(3, 2, heads=2), model.state_dict(), prefix="conv1")
    np.testing.assert_array_equal(conv1["W"], model["conv1"].lin.weight.detach().numpy())
    wrapped = torch.nn.DataParallel(model)  # keys "module.conv1...."
    conv2 = from_pyg(GATConv(4, 3, version="v2", bias=False), wrapped.state_dict(), prefix="conv2")
    np.testing.assert_array_equal(conv2["att"], model["conv2"].att.detach().numpy()[0])


# -- forward at 1e-12 for a formulation the layer tests judge at 1e-10 ---------------------------


@given(setup=nodeformer_setups(), seed=seeds())
def test_nodeformer_forward_at_1e12_against_torch(setup: tuple, seed: int) -> None:
    conv, params, x, graph, kwargs = setup
    out, cache = conv.forward(params, x, graph, **kwargs)
    d_out = np.random.default_rng(seed).standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out)
    theirs = torch_gradients(
        lambda p, t_x: torch_layer(conv, p, t_x, graph, kwargs["noise"], kwargs["training"]),
        params,
        x,
        d_out,
    )
    assert max_relative_error(out, theirs.pop("out")) <= FORWARD_RTOL
    errors = relative_errors({"x": d_x, **d_params}, theirs)
    assert max(errors.values()) <= GRADIENT_RTOL, errors
