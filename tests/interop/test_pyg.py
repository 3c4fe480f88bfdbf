"""``from_pyg`` / ``to_pyg`` without torch: names, round trips, old namings, prefixes, errors.

The reference below is the name table written out by hand from PyG's sources
(``torch_geometric/nn/conv/{gat,gatv2,transformer}_conv.py``, 2.8.1, and the older
layouts the module docstring lists), independent of the conversion code: a swapped
``att_src``/``att_dst`` or a missing transpose survives a round trip but not this.
``test_pyg_parity.py`` checks the same names against the real modules.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.interop.pyg import from_pyg, pyg_shapes, to_pyg
from refimpl.nn import GATConv, TransformerConv
from refimpl.testing.strategies import seeds


@st.composite
def layers(draw: st.DrawFn, kinds: tuple[str, ...] = ("gat", "transformer")) -> object:
    """Every configuration that changes the parameter set (GATConv, TransformerConv)."""
    sizes = {
        "in_channels": draw(st.integers(1, 4)),
        "out_channels": draw(st.integers(1, 3)),
        "heads": draw(st.integers(1, 3)),
        "concat": draw(st.booleans()),
        "bias": draw(st.booleans()),
    }
    if draw(st.sampled_from(kinds)) == "gat":
        version = draw(st.sampled_from(["v1", "v2"]))
        return GATConv(**sizes, version=version, share_weights=draw(st.booleans()))
    root_weight = draw(st.booleans())
    return TransformerConv(
        **sizes,
        root_weight=root_weight,
        beta=root_weight and draw(st.booleans()),
        edge_dim=draw(st.sampled_from([None, 1, 3])),
    )


def random_params(layer: object, seed: int, dtype: object = np.float64) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in layer.param_shapes().items()}


def reference_state_dict(layer: object, p: dict) -> dict:
    """PyG's newest state dict for ``layer`` holding ``p``, by hand from PyG's sources."""
    zeros = np.zeros_like
    if isinstance(layer, GATConv) and layer.version == "v1":
        sd = {"att_src": p["att_src"][None], "att_dst": p["att_dst"][None]}
        sd.update({"bias": p["bias"]} if layer.bias else {})
        sd["lin.weight"] = p["W"]
        return sd
    if isinstance(layer, GATConv):
        w_t = p["W_s"] if layer.share_weights else p["W_t"]
        sd = {"att": p["att"][None]}
        if layer.bias:  # PyG's bias flag also gives lin_l and lin_r biases; ours are zero
            sd.update(
                {"bias": p["bias"], "lin_l.weight": p["W_s"], "lin_l.bias": zeros(p["W_s"][:, 0])}
            )
            sd.update({"lin_r.weight": w_t, "lin_r.bias": zeros(p["W_s"][:, 0])})
        else:
            sd.update({"lin_l.weight": p["W_s"], "lin_r.weight": w_t})
        return sd
    sd = {}
    for lin, name in (("lin_key", "k"), ("lin_query", "q"), ("lin_value", "v")):
        sd[f"{lin}.weight"] = p[f"W_{name}"]
        if layer.bias:
            sd[f"{lin}.bias"] = p[f"b_{name}"]
    if layer.edge_dim is not None:
        sd["lin_edge.weight"] = p["W_e"]
    width = layer.heads * layer.out_channels if layer.concat else layer.out_channels
    # PyG builds lin_skip even without root_weight (unused then; written as zeros)
    sd["lin_skip.weight"] = p["W_skip"] if layer.root_weight else zeros(p["W_q"][:width])
    if layer.bias:
        sd["lin_skip.bias"] = p["b_skip"] if layer.root_weight else zeros(p["b_q"][:width])
    if layer.beta:
        sd["lin_beta.weight"] = p["w_beta"]
    return sd


def assert_same_arrays(actual: dict, expected: dict) -> None:
    """Same keys in the same order, equal values of equal dtype (exact)."""
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert actual[key].dtype == value.dtype, key
        np.testing.assert_array_equal(actual[key], value, err_msg=key)


def older_gat_state_dict(sd: dict, naming: str) -> dict:
    """A newest GATConv (v1) state dict under an older naming (module docstring's table)."""
    if naming == "2.0-2.4":  # lin_dst is lin_src: both keys, equal tensors
        old = {k: v for k, v in sd.items() if k != "lin.weight"}
        return old | {"lin_src.weight": sd["lin.weight"], "lin_dst.weight": sd["lin.weight"]}
    if naming == "1.6-1.7":
        old = {"att_l": sd["att_src"], "att_r": sd["att_dst"]}
        old.update({"bias": sd["bias"]} if "bias" in sd else {})
        return old | {"lin_l.weight": sd["lin.weight"], "lin_r.weight": sd["lin.weight"]}
    # <= 1.5: x @ weight with weight (in, H*C); att (1, H, 2C) = [target part | source part]
    # (the conversion pyg-team/pytorch_geometric#1755 gives: att_l = att[..., C:], att_r =
    # att[..., :C], lin_l.weight = weight.t())
    old = {
        "weight": sd["lin.weight"].T,
        "att": np.concatenate([sd["att_dst"], sd["att_src"]], axis=-1),
    }
    return old | ({"bias": sd["bias"]} if "bias" in sd else {})


# -- names and round trips -----------------------------------------------------------------------


@given(layer=layers(), seed=seeds(), dtype=st.sampled_from([np.float64, np.float32]))
def test_to_pyg_writes_pygs_names_and_from_pyg_reads_them(layer, seed, dtype) -> None:
    params = random_params(layer, seed, dtype)
    expected = reference_state_dict(layer, params)
    exported = to_pyg(layer, params)
    assert_same_arrays(exported, expected)
    assert {k: v.shape for k, v in expected.items()} == pyg_shapes(layer)
    assert_same_arrays(from_pyg(layer, expected), params)


@given(layer=layers(), seed=seeds())
def test_round_trips_are_exact(layer, seed) -> None:
    params = random_params(layer, seed)
    assert_same_arrays(from_pyg(layer, to_pyg(layer, params)), params)
    state_dict = reference_state_dict(layer, random_params(layer, seed + 1))
    assert_same_arrays(to_pyg(layer, from_pyg(layer, state_dict)), state_dict)


@given(layer=layers(), seed=seeds())
def test_results_are_new_arrays_and_inputs_untouched(layer, seed) -> None:
    params = random_params(layer, seed)
    kept = {k: v.copy() for k, v in params.items()}
    exported = to_pyg(layer, params)
    imported = from_pyg(layer, exported)
    for name, value in imported.items():
        assert all(not np.shares_memory(value, other) for other in exported.values()), name
    for key, value in exported.items():
        assert all(not np.shares_memory(value, other) for other in params.values()), key
        value[...] = 7.0  # writing into the export must not reach params or the import
    assert_same_arrays(params, kept)
    assert_same_arrays(imported, kept)


def test_dtype_and_backend_arguments() -> None:
    layer = GATConv(3, 2, heads=2)
    state_dict = to_pyg(layer, random_params(layer, 0, np.float32))
    assert all(v.dtype == np.float32 for v in from_pyg(layer, state_dict).values())
    cast = from_pyg(layer, state_dict, dtype=np.float64, backend="numpy")
    assert all(type(v) is np.ndarray and v.dtype == np.float64 for v in cast.values())
    np.testing.assert_array_equal(cast["W"], state_dict["lin.weight"])


class FakeTensor:
    """What from_pyg may use of a torch tensor: ``.detach().cpu().numpy()``."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return self

    def numpy(self) -> np.ndarray:
        return self.value  # torch's numpy() shares memory: from_pyg must copy


def test_accepts_tensor_like_values_and_lists() -> None:
    layer = GATConv(2, 2, version="v2", share_weights=True, bias=False)
    state_dict = to_pyg(layer, random_params(layer, 1))
    tensors = {k: FakeTensor(v) for k, v in state_dict.items()}
    params = from_pyg(layer, tensors)
    assert all(not np.shares_memory(params["W_s"], v) for v in state_dict.values())
    np.testing.assert_array_equal(params["W_s"], state_dict["lin_l.weight"])
    listed = from_pyg(layer, {k: v.tolist() for k, v in state_dict.items()})
    np.testing.assert_array_equal(listed["att"], params["att"])


# -- older PyG namings ---------------------------------------------------------------------------


@given(layer=layers(kinds=("gat",)), seed=seeds())
def test_every_gatconv_naming_gives_the_same_params(layer, seed) -> None:
    layer = replace(layer, version="v1")
    params = random_params(layer, seed)
    newest = reference_state_dict(layer, params)
    for naming, version in (("2.0-2.4", "2.4.0"), ("1.6-1.7", "1.7.2"), ("<=1.5", "1.5.0")):
        old = older_gat_state_dict(newest, naming)
        assert_same_arrays(from_pyg(layer, old), params)
        assert_same_arrays(to_pyg(layer, params, pyg_version=version), old)
        assert pyg_shapes(layer, version) == {k: v.shape for k, v in old.items()}


@pytest.mark.parametrize(
    ("version", "marker"),
    [
        ("1.4.3", "weight"),
        ("1.6.0", "lin_l.weight"),
        ("1.7.2", "lin_l.weight"),
        ("2.0.0", "lin_src.weight"),
        ("2.4.0+pt21cu121", "lin_src.weight"),
        ("2.5.0", "lin.weight"),
        ("2.8.1", "lin.weight"),
        ("3.0.0.dev20260101", "lin.weight"),
        (None, "lin.weight"),
    ],
)
def test_pyg_version_boundaries_of_gatconv_names(version, marker) -> None:
    # 1.6: the TorchScript rewrite (lin_l/att_l); 2.0.0: lin_src/att_src
    # (pyg-team/pytorch_geometric#3139); 2.5.0: lin for int in_channels (CHANGELOG, #8397)
    assert marker in pyg_shapes(GATConv(3, 2), version)


def test_bipartite_style_names_with_equal_weights_are_accepted() -> None:
    # PyG >= 2.5 writes lin_src/lin_dst for a bipartite layer; equal ones are our single W
    layer = GATConv(3, 2, heads=2)
    params = random_params(layer, 3)
    old = older_gat_state_dict(reference_state_dict(layer, params), "2.0-2.4")
    assert_same_arrays(from_pyg(layer, old), params)


def test_transformer_bias_false_from_pyg_before_2_7() -> None:
    # PyG < 2.7 kept lin_key/query/value biases under bias=False (#10163, fixed by #10177)
    layer = TransformerConv(3, 2, heads=2, bias=False)
    params = random_params(layer, 4)
    old = to_pyg(layer, params, pyg_version="2.6.1")
    assert {"lin_key.bias", "lin_query.bias", "lin_value.bias"} <= set(old)
    assert "lin_skip.bias" not in old
    assert all(not old[f"{lin}.bias"].any() for lin in ("lin_key", "lin_query", "lin_value"))
    assert_same_arrays(from_pyg(layer, old), params)
    assert "lin_key.bias" not in to_pyg(layer, params, pyg_version="2.7.0")


def test_unused_lin_skip_is_ignored_whatever_it_holds() -> None:
    layer = TransformerConv(3, 2, heads=2, root_weight=False)
    params = random_params(layer, 5)
    state_dict = to_pyg(layer, params)
    state_dict["lin_skip.weight"] = np.full((4, 3), 9.0)
    assert_same_arrays(from_pyg(layer, state_dict), params)
    del state_dict["lin_skip.weight"], state_dict["lin_skip.bias"]
    assert_same_arrays(from_pyg(layer, state_dict), params)


# -- prefixes ------------------------------------------------------------------------------------


def test_prefixes_select_one_layer_of_a_model() -> None:
    conv1, conv2 = GATConv(3, 2, heads=2), GATConv(4, 2, version="v2")
    p1, p2 = random_params(conv1, 6), random_params(conv2, 7)
    model = {
        **to_pyg(conv1, p1, prefix="conv1"),
        **to_pyg(conv2, p2, prefix="conv2."),
        "lin.weight": np.ones((2, 2)),  # other modules' keys, ignored under a prefix
        "conv10.lin.weight": np.ones((2, 2)),
        "norm.num_batches_tracked": np.array(3),
    }
    assert "conv1.lin.weight" in model and "conv2.lin_l.weight" in model
    assert_same_arrays(from_pyg(conv1, model, prefix="conv1"), p1)
    assert_same_arrays(from_pyg(conv2, model, prefix="conv2."), p2)
    wrapped = {f"module.{k}": v for k, v in model.items()}  # torch.nn.DataParallel
    assert_same_arrays(from_pyg(conv1, wrapped, prefix="conv1"), p1)
    assert_same_arrays(from_pyg(conv1, wrapped, prefix="module.conv1"), p1)
    single = {f"module.{k}": v for k, v in to_pyg(conv1, p1).items()}
    assert_same_arrays(from_pyg(conv1, single), p1)
    with pytest.raises(ValueError, match=r"no key .* starts with 'conv3\.'.*'conv1', 'conv10'"):
        from_pyg(conv1, model, prefix="conv3")


# -- errors --------------------------------------------------------------------------------------


def error_of(layer: object, state_dict: dict, **kwargs: object) -> str:
    with pytest.raises(ValueError) as info:
        from_pyg(layer, state_dict, **kwargs)
    return str(info.value)


def test_missing_unexpected_and_misshapen_keys_are_all_named() -> None:
    layer = GATConv(3, 2, heads=2)
    state_dict = to_pyg(layer, random_params(layer, 8))
    del state_dict["att_dst"]
    state_dict["bias"] = np.zeros(2)
    state_dict["lin.weight"] = np.zeros((4, 5))
    state_dict["extra.weight"] = np.zeros(1)
    message = error_of(layer, state_dict)
    assert "GATConv(in_channels=3, out_channels=2, heads=2, concat=True" in message
    assert "missing keys: att_dst" in message
    assert "unexpected keys: extra.weight" in message
    assert (
        "bias: expected (4,) = (heads * out_channels,) with concat (heads=2, out_channels=2), "
        "got (2,)" in message
    )
    assert (
        "lin.weight: expected (4, 3) = (heads * out_channels, in_channels) "
        "(heads=2, out_channels=2, in_channels=3), got (4, 5)" in message
    )


def test_errors_name_keys_with_their_prefix() -> None:
    layer = TransformerConv(3, 2, edge_dim=2)
    state_dict = to_pyg(layer, random_params(layer, 9), prefix="convs.0")
    del state_dict["convs.0.lin_edge.weight"]
    message = error_of(layer, state_dict, prefix="convs.0")
    assert "missing keys: convs.0.lin_edge.weight" in message
    assert "edge_dim=None" in message


@pytest.mark.parametrize(
    ("pyg_kwargs", "ours", "expected"),
    [
        ({"bias": True}, {"bias": False}, "the PyG module had bias=True"),
        ({"bias": False}, {"bias": True}, "the PyG module had bias=False"),
        ({"version": "v2"}, {"version": "v1"}, "use GATConv(version='v2')"),
        ({"version": "v1"}, {"version": "v2"}, "use GATConv(version='v1')"),
    ],
)
def test_configuration_mismatches_come_with_a_hint(pyg_kwargs, ours, expected) -> None:
    base = {"in_channels": 3, "out_channels": 2, "heads": 2}
    source = GATConv(**base, **pyg_kwargs)
    state_dict = to_pyg(source, random_params(source, 10))
    assert expected in error_of(GATConv(**base, **ours), state_dict)


def test_nonzero_gatv2_projection_bias_is_refused_with_the_fix() -> None:
    layer = GATConv(3, 2, heads=2, version="v2")
    state_dict = to_pyg(layer, random_params(layer, 11))
    state_dict["lin_r.bias"] = state_dict["lin_r.bias"] + 1e-30  # any non-zero entry
    message = error_of(layer, state_dict)
    assert "lin_r.bias is not zero" in message
    assert "has projection_bias=False: no biases in W_s x and W_t x" in message
    assert "construct it with projection_bias=True" in message
    # and so constructed, the layer reads them as b_s and b_t
    biased = from_pyg(replace(layer, projection_bias=True), state_dict)
    np.testing.assert_array_equal(biased["b_t"], state_dict["lin_r.bias"])


def test_different_shared_weights_are_refused() -> None:
    v2 = GATConv(3, 2, version="v2", share_weights=True, bias=False)
    state_dict = to_pyg(v2, random_params(v2, 12))
    state_dict["lin_r.weight"] = state_dict["lin_r.weight"] * 2
    assert "construct it with share_weights=False" in error_of(v2, state_dict)
    # the unshared layer reads the same dict as W_s and W_t
    unshared = from_pyg(replace(v2, share_weights=False), state_dict)
    np.testing.assert_array_equal(unshared["W_t"], state_dict["lin_r.weight"])

    v1 = GATConv(3, 2)
    old = older_gat_state_dict(reference_state_dict(v1, random_params(v1, 13)), "2.0-2.4")
    old["lin_dst.weight"] = old["lin_dst.weight"] + 1
    assert "bipartite" in error_of(v1, old)


def test_gat_edge_features_ask_for_edge_dim_and_a_residual_for_residual_true() -> None:
    layer = GATConv(3, 2, heads=2)
    state_dict = to_pyg(layer, random_params(layer, 14))
    state_dict |= {
        "att_edge": np.zeros((1, 2, 2)),
        "lin_edge.weight": np.zeros((4, 5)),
        "res.weight": np.zeros((4, 3)),
    }
    message = error_of(layer, state_dict)
    assert "unexpected keys: att_edge, lin_edge.weight, res.weight" in message
    assert "uses edge features; construct with edge_dim=" in message
    assert "residual=True" in message
    with_edges = replace(layer, edge_dim=5)
    assert "no lin_edge: the PyG layer has edge_dim=None" in error_of(
        with_edges, to_pyg(layer, random_params(layer, 14))
    )


def test_nonzero_transformer_biases_under_bias_false_are_refused() -> None:
    layer = TransformerConv(3, 2, heads=2, bias=False)
    state_dict = to_pyg(layer, random_params(layer, 15), pyg_version="2.6.0")
    state_dict["lin_value.bias"] = np.full(4, 0.5)
    message = error_of(layer, state_dict)
    assert "lin_value.bias is not zero" in message
    assert "#10163" in message
    assert "construct the refimpl layer with bias=True and add a zero 'lin_skip.bias'" in message


def test_bad_arguments_are_refused() -> None:
    layer = GATConv(3, 2)
    state_dict = to_pyg(layer, random_params(layer, 16))
    with pytest.raises(TypeError, match=r"GATConv .* or TransformerConv"):
        from_pyg(object(), state_dict)
    with pytest.raises(TypeError, match="mapping"):
        from_pyg(layer, list(state_dict.items()))
    with pytest.raises(TypeError, match="floating-point"):
        from_pyg(layer, state_dict | {"bias": np.zeros(2, dtype=np.int64)})
    with pytest.raises(ValueError, match="pyg_version"):
        to_pyg(layer, random_params(layer, 16), pyg_version="latest")
    with pytest.raises(ValueError, match="do not match"):
        to_pyg(layer, {"W": np.zeros((2, 3))})
