"""``refimpl.init``: the initialisation schemes and GAT-balance's balancing (Procedure 2.6).

Shapes and zeros for every scheme on every model variant; the Glorot variances
against their sampling distribution; the block structure of the looks-linear
and identity schemes; and ``balance`` on drawn networks: every hidden neuron
balanced, the first (forward) or last (reverse) layer at ``beta``, directions
kept, the input untouched.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.diagnostics import balancedness
from refimpl.init import INITIALISERS, balance, orthogonal
from refimpl.models import GAT
from refimpl.neurons import incoming_sums, layer_structure
from refimpl.testing.strategies import seeds

ATTENTION_DRAWN = {"xavier", "xavier_normal", "Xav"}  # every other scheme zeroes attention
IDENTITY_FAMILY = {"identity", "ll_identity", "Bal_identity", "Bal_LLidentity"}
WEIGHTS = ("W", "W_s", "W_t")
ORTHO_TOL = 1e-12  # Householder QR in float64: orthonormality to a few ulps per entry
BALANCE_RTOL = 1e-12  # squared norms are sums of a few dozen terms: a few ulps each

MODELS = {
    "plain": GAT(5, 4, 3, num_layers=3),
    "heads3": GAT(5, 4, 3, num_layers=3, heads=3),
    "heads-per-layer": GAT(5, 4, 3, num_layers=3, heads=[2, 1, 3]),
    "unshared": GAT(5, 4, 3, num_layers=3, heads=2, share_weights=False),
    "bias": GAT(5, 4, 3, num_layers=3, heads=2, bias=True),
    "residual": GAT(5, 4, 3, num_layers=3, heads=2, residual=True),
    "v1": GAT(5, 4, 3, num_layers=3, heads=2, version="v1", bias=True),
    "averaged": GAT(5, 4, 3, num_layers=3, heads=3, concat=False, bias=True, residual=True),
    "one-layer": GAT(5, 4, 3, num_layers=1),
}


def _local(name: str) -> str:
    return name.split(".", 1)[1]


def _is_attention(name: str) -> bool:
    return _local(name).startswith("att")


LOOKS_LINEAR = ("ll_orthogonal", "ll_identity", "Bal_O", "Bal_LLidentity")


@pytest.mark.parametrize("scheme", LOOKS_LINEAR)
def test_looks_linear_refuses_averaged_hidden_heads(scheme: str) -> None:
    # [U; -U] puts a neuron's mirror image in another head; averaging the heads of an
    # even head count then cancels every output to exactly zero.
    model = GAT(5, 4, 3, num_layers=3, heads=2, concat=False)
    with pytest.raises(ValueError, match="concat=True"):
        INITIALISERS[scheme](model, np.random.default_rng(0))
    one_head = GAT(5, 4, 3, num_layers=3, heads=1, concat=False)  # nothing to cancel
    assert INITIALISERS[scheme](one_head, np.random.default_rng(0))
    # Every hidden layer counts, not only the first; the output layer's heads do not.
    later = GAT(5, 4, 3, num_layers=3, heads=[1, 2, 1], concat=False)
    with pytest.raises(ValueError, match="concat=True"):
        INITIALISERS[scheme](later, np.random.default_rng(0))
    output_only = GAT(5, 4, 3, num_layers=3, heads=[1, 1, 2], concat=False)
    assert INITIALISERS[scheme](output_only, np.random.default_rng(0))


# -- every scheme: keys, shapes, zeros ---------------------------------------------------------


@pytest.mark.parametrize("model_id", sorted(MODELS))
@pytest.mark.parametrize("scheme", sorted(INITIALISERS))
def test_scheme_returns_the_models_parameters(scheme: str, model_id: str) -> None:
    model = MODELS[model_id]
    if model_id == "heads-per-layer" and scheme in ("Bal_identity", "Bal_LLidentity"):
        pytest.skip("unequal hidden widths: see test_balanced_identity_needs_equal_hidden_widths")
    if model_id == "averaged" and scheme in LOOKS_LINEAR:
        pytest.skip(
            "looks-linear needs concat=True: see test_looks_linear_refuses_averaged_hidden_heads"
        )
    params = INITIALISERS[scheme](model, np.random.default_rng(0))
    shapes = model.param_shapes()
    assert list(params) == list(shapes)  # same keys, same order
    for name, shape in shapes.items():
        value = params[name]
        assert isinstance(value, np.ndarray) and value.dtype == np.float64, name
        assert value.shape == shape, name
        assert np.all(np.isfinite(value)), name
        if _local(name) in ("bias", "res_W"):
            assert not np.any(value), f"{name} must start at zero"
        elif _is_attention(name):
            assert np.any(value) == (scheme in ATTENTION_DRAWN), name
        else:
            assert np.any(value), f"{name} all zero"


@pytest.mark.parametrize("scheme", sorted(INITIALISERS))
def test_init_params_is_deterministic_under_a_seed(scheme: str) -> None:
    model = GAT(5, 4, 3, num_layers=4, heads=2, share_weights=False)
    first = model.init_params(np.random.default_rng(11), init=scheme)
    again = model.init_params(np.random.default_rng(11), init=scheme)
    other = model.init_params(np.random.default_rng(12), init=scheme)
    assert list(first) == list(model.param_shapes())
    for name in first:
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    assert any(not np.array_equal(first[n], other[n]) for n in first)  # the seed matters


def test_named_schemes_alias_their_base_schemes() -> None:
    model = GAT(5, 4, 3, num_layers=3, heads=2)
    for alias, base in (("Xav", "xavier_normal"), ("Xav_Z", "xavier_zero_att")):
        a = model.init_params(np.random.default_rng(3), init=alias)
        b = model.init_params(np.random.default_rng(3), init=base)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{alias} {name}")


# -- Glorot variances --------------------------------------------------------------------------

# (scheme, kurtosis of the draw): normal 3, uniform 9/5. The sample variance of n draws has
# standard deviation sigma^2 sqrt((kurtosis - 1) / n) (normal: sigma^2 sqrt(2 / n)).
GLOROT = [("xavier_normal", 3.0), ("Xav", 3.0), ("xavier", 9.0 / 5.0)]


def _assert_variance(sample: np.ndarray, fan_sum: int, kurtosis: float) -> None:
    n, var = sample.size, 2.0 / fan_sum
    sd_of_variance = var * math.sqrt((kurtosis - 1.0) / (n - 1))
    assert abs(sample.var(ddof=1) - var) <= 5 * sd_of_variance, (sample.var(ddof=1), var)
    assert abs(sample.mean()) <= 5 * math.sqrt(var / n)


@pytest.mark.parametrize(("scheme", "kurtosis"), GLOROT)
def test_glorot_weight_variance_is_two_over_fan_sum(scheme: str, kurtosis: float) -> None:
    model = GAT(600, 400, 2, num_layers=2)
    weight = model.init_params(np.random.default_rng(2024), init=scheme)["layer0.W_s"]
    assert weight.shape == (400, 600)
    _assert_variance(weight, 400 + 600, kurtosis)  # 5 sd: 1.4% (normal), 0.9% (uniform)
    if scheme == "xavier":  # U(-b, b), b = sqrt(6 / (fan_in + fan_out))
        assert np.abs(weight).max() <= math.sqrt(6.0 / 1000)


@pytest.mark.parametrize(("scheme", "kurtosis"), GLOROT)
def test_glorot_attention_variance_uses_heads_plus_channels(scheme: str, kurtosis: float) -> None:
    # PyG's glorot on the (1, H, C) tensor: fan_in + fan_out = H + C, not H*C + C.
    model = GAT(2, 400, 3, num_layers=2, heads=100)
    att = model.init_params(np.random.default_rng(2025), init=scheme)["layer0.att"]
    assert att.shape == (100, 400)
    _assert_variance(att, 100 + 400, kurtosis)  # 5 sd: 3.5%; fans C alone would be 25% off


# -- orthogonal and looks-linear structure -----------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 7), (7, 3), (5, 5), (1, 4), (4, 1)])
def test_orthogonal_has_orthonormal_rows_or_columns(shape: tuple[int, int]) -> None:
    rows, cols = shape
    q = orthogonal(np.random.default_rng(5), shape)
    assert q.shape == shape
    if rows <= cols:  # wide: Q Q^T = I
        np.testing.assert_allclose(q @ q.T, np.eye(rows), rtol=0, atol=ORTHO_TOL)
    if rows >= cols:  # tall: Q^T Q = I
        np.testing.assert_allclose(q.T @ q, np.eye(cols), rtol=0, atol=ORTHO_TOL)


def test_orthogonal_draws_differ_and_repeat_with_the_seed() -> None:
    a = orthogonal(np.random.default_rng(1), (4, 6))
    np.testing.assert_array_equal(a, orthogonal(np.random.default_rng(1), (4, 6)))
    assert not np.allclose(a, orthogonal(np.random.default_rng(2), (4, 6)))


def _weights(model: GAT, params: dict, layer: int) -> list[np.ndarray]:
    return [params[f"layer{layer}.{n}"] for n in WEIGHTS if f"layer{layer}.{n}" in params]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"share_weights": False},
        {"version": "v1"},
        {"heads": 2, "hidden_channels": 3},  # width 6: pairs across heads
    ],
    ids=["shared", "unshared", "v1", "heads2"],
)
def test_ll_orthogonal_mirrors_blocks(options: dict) -> None:
    model = GAT(**{"in_channels": 5, "hidden_channels": 4, "out_channels": 3,
                   "num_layers": 4, **options})  # fmt: skip
    params = model.init_params(np.random.default_rng(8), init="ll_orthogonal")
    n = model.layers[0].heads * model.layers[0].out_channels
    half = n // 2
    for w in _weights(model, params, 0):  # [U; -U], U (n/2, n0) orthonormal rows
        np.testing.assert_array_equal(w[:half], -w[half:])
        u = w[:half]
        np.testing.assert_allclose(u @ u.T, np.eye(half), atol=ORTHO_TOL)
    for layer in (1, 2):  # [[U, -U], [-U, U]], U (n/2, n/2) orthogonal
        for w in _weights(model, params, layer):
            u = w[:half, :half]
            np.testing.assert_array_equal(w, np.block([[u, -u], [-u, u]]))
            np.testing.assert_allclose(u @ u.T, np.eye(half), atol=ORTHO_TOL)
    for w in _weights(model, params, 3):  # [V, -V], V (3, n/2) orthonormal columns
        v = w[:, :half]
        np.testing.assert_array_equal(w, np.hstack([v, -v]))
        np.testing.assert_allclose(v.T @ v, np.eye(half), atol=ORTHO_TOL)
    if not model.share_weights:  # W_s and W_t drawn independently
        assert not np.allclose(params["layer1.W_s"], params["layer1.W_t"])


@pytest.mark.parametrize(
    ("scheme", "layer"),
    # ll_identity draws its first layer Glorot normal: layer1 is the first it mirrors.
    [("ll_orthogonal", 0), ("Bal_O", 0), ("ll_identity", 1), ("Bal_LLidentity", 1)],
)
def test_looks_linear_rejects_an_odd_width(scheme: str, layer: int) -> None:
    model = GAT(5, 3, 2, num_layers=3, heads=1)
    message = f"widths must be even; layer{layer} has 3 output neurons"
    with pytest.raises(ValueError, match=message):
        model.init_params(np.random.default_rng(0), init=scheme)


def _looks_linear_eye(n: int) -> np.ndarray:
    eye = np.eye(n // 2)
    return np.block([[eye, -eye], [-eye, eye]])


@pytest.mark.parametrize(
    ("scheme", "block"), [("identity", np.eye), ("ll_identity", _looks_linear_eye)]
)
@pytest.mark.parametrize(
    "options", [{}, {"heads": 2, "hidden_channels": 2}, {"share_weights": False}]
)
def test_identity_hidden_layers(scheme: str, block, options: dict) -> None:
    model = GAT(**{"in_channels": 5, "hidden_channels": 4, "out_channels": 3,
                   "num_layers": 4, **options})  # fmt: skip
    params = model.init_params(np.random.default_rng(4), init=scheme)
    for layer in (1, 2):
        for w in _weights(model, params, layer):
            np.testing.assert_array_equal(w, block(4))
    for layer in (0, 3):  # Glorot normal: not structured
        for w in _weights(model, params, layer):
            assert np.count_nonzero(w) == w.size


@pytest.mark.parametrize(
    ("scheme", "base"), [("Bal_identity", "identity"), ("Bal_LLidentity", "ll_identity")]
)
def test_balanced_identity_needs_equal_hidden_widths(scheme: str, base: str) -> None:
    # Hidden widths 8 -> 4: the rectangular eye(4, 8) (or its looks-linear blocks) has zero
    # columns, so some layer0 neurons have no outgoing weight and cannot be balanced.
    model = GAT(5, 4, 3, num_layers=3, heads=[2, 1, 3])
    params = model.init_params(np.random.default_rng(0), init=base)
    assert not np.all(np.any(params["layer1.W_s"], axis=0))  # some dead columns
    with pytest.raises(ValueError, match="of layer0 has all-zero outgoing weights"):
        model.init_params(np.random.default_rng(0), init=scheme)


# -- balance: properties on drawn networks -----------------------------------------------------


@st.composite
def balance_cases(draw: st.DrawFn) -> tuple[GAT, dict[str, np.ndarray]]:
    num_layers = draw(st.integers(1, 5))
    heads = draw(st.integers(1, 3))
    bias, residual = draw(st.booleans()), draw(st.booleans())
    model = GAT(
        in_channels=draw(st.integers(1, 4)),
        hidden_channels=draw(st.integers(1, 4)),
        out_channels=draw(st.integers(1, 3)),
        num_layers=num_layers,
        heads=heads,
        version=draw(st.sampled_from(["v1", "v2"])),
        share_weights=draw(st.booleans()),
        bias=bias,
        residual=residual,
        concat=draw(st.booleans()),
    )
    rng = np.random.default_rng(draw(seeds()))
    # Every entry non-zero, attention, bias and res_W included: balance must zero them.
    params = {k: rng.standard_normal(shape) for k, shape in model.param_shapes().items()}
    return model, params


def _row_norms(model: GAT, params: dict, layer: int) -> np.ndarray:
    """Squared norm of each neuron's incoming rows, over W/W_s/W_t (and heads if averaged,
    as the last layer always is)."""
    conv = model.layers[layer]
    rows = sum((w * w).sum(axis=1) for w in _weights(model, params, layer))  # (H*C,)
    if conv.concat:
        return rows
    return rows.reshape(conv.heads, conv.out_channels).sum(axis=0)


def _column_norms(model: GAT, params: dict, layer: int) -> np.ndarray:
    return sum((w * w).sum(axis=0) for w in _weights(model, params, layer))


@given(
    case=balance_cases(), beta=st.floats(0.1, 5.0), order=st.sampled_from(["forward", "reverse"])
)
def test_balance_properties(case: tuple, beta: float, order: str) -> None:
    model, params = case
    snapshot = {k: v.copy() for k, v in params.items()}
    out = balance(params, beta=beta, order=order)
    last = model.num_layers - 1

    # The input dict and its arrays are untouched; the result has the same keys and shapes.
    assert list(params) == list(snapshot)
    for name in params:
        np.testing.assert_array_equal(params[name], snapshot[name], err_msg=name)
    assert list(out) == list(params)
    assert all(out[n].shape == params[n].shape for n in params)

    # Step 1: attention, biases and residual weights zero.
    for name in out:
        if _is_attention(name) or _local(name) in ("bias", "res_W"):
            assert not np.any(out[name]), name

    # Every hidden neuron balanced: c = ||in||^2 - ||a||^2 - ||out||^2 = 0.
    layers = layer_structure(out)
    squares = {k: v * v for k, v in out.items()}
    for layer, c in enumerate(balancedness(out)):
        scale = incoming_sums(squares, layers, layer)
        assert np.all(np.abs(c) <= BALANCE_RTOL * scale), (layer, c, scale)

    # The anchored end sits at beta: first-layer rows (forward; and any one-layer network),
    # last-layer columns (reverse).
    if order == "forward" or last == 0:
        np.testing.assert_allclose(_row_norms(model, out, 0), beta, rtol=BALANCE_RTOL)
    else:
        np.testing.assert_allclose(_column_norms(model, out, last), beta, rtol=BALANCE_RTOL)

    # Directions kept: each layer's weights are diag(a) W diag(b) with a, b > 0, one a per
    # neuron (shared by W_s and W_t, and by all heads of an averaged neuron) and one b per
    # input; inputs to the network and outputs of the last layer are not rescaled.
    for layer in range(model.num_layers):
        conv = model.layers[layer]
        ratios = [o / p for o, p in zip(_weights(model, out, layer), _weights(model, params, layer),
                                        strict=True)]  # fmt: skip
        assert all(np.all(r > 0) for r in ratios), layer
        a, b = ratios[0][:, 0], ratios[0][0, :] / ratios[0][0, 0]
        for r in ratios:
            np.testing.assert_allclose(r, np.outer(a, b), rtol=BALANCE_RTOL)
        if layer == 0:
            np.testing.assert_allclose(b, 1.0, rtol=BALANCE_RTOL)
        if layer == last and last > 0:
            np.testing.assert_allclose(a, a[0], rtol=BALANCE_RTOL)
        if not conv.concat and layer < last:
            per_head = a.reshape(conv.heads, conv.out_channels)
            np.testing.assert_allclose(per_head, per_head[[0] * conv.heads], rtol=BALANCE_RTOL)


def test_forward_and_reverse_balance_differ_but_both_balance() -> None:
    # Remark 2.7: anchoring the other end gives another balanced network, not the same one.
    model = GAT(4, 3, 2, num_layers=4, heads=2)
    params = model.init_params(np.random.default_rng(9), init="xavier_normal")
    forward, reverse = balance(params, 1.5, "forward"), balance(params, 1.5, "reverse")
    np.testing.assert_allclose(_row_norms(model, forward, 0), 1.5, rtol=BALANCE_RTOL)
    np.testing.assert_allclose(_column_norms(model, reverse, 3), 1.5, rtol=BALANCE_RTOL)
    assert not np.allclose(_row_norms(model, reverse, 0), 1.5)
    assert not np.allclose(_column_norms(model, forward, 3), 1.5)
    for balanced in (forward, reverse):
        for c in balancedness(balanced):
            assert np.abs(c).max() <= 1e-11, c


@pytest.mark.parametrize(
    ("balanced", "base", "options"),
    [
        ("Bal_O", "ll_orthogonal", {}),
        ("Bal_O", "ll_orthogonal", {"version": "v1"}),
        ("Bal_O", "ll_orthogonal", {"heads": 2, "hidden_channels": 2}),
        ("Bal_LLidentity", "ll_identity", {}),
        ("Bal_identity", "identity", {}),
    ],
)
def test_looks_linear_hidden_layers_are_already_balanced(
    balanced: str, base: str, options: dict
) -> None:
    # GAT-balance Sec. 2: the rows and columns of [[U, -U], [-U, U]] (U orthogonal) have
    # squared norm 2, so with beta = 2 balancing rescales only the first and last layers
    # (identity rows have norm 1: Bal_identity uses beta = 1). Shared W_s = W_t, as the paper.
    model = GAT(**{"in_channels": 6, "hidden_channels": 4, "out_channels": 2,
                   "num_layers": 5, **options})  # fmt: skip
    after = model.init_params(np.random.default_rng(21), init=balanced)
    before = model.init_params(np.random.default_rng(21), init=base)
    for layer in range(1, model.num_layers - 1):
        for w_after, w_before in zip(_weights(model, after, layer), _weights(model, before, layer),
                                     strict=True):  # fmt: skip
            np.testing.assert_allclose(w_after, w_before, rtol=1e-12, atol=0)
    for layer in (0, model.num_layers - 1):
        for w_after, w_before in zip(_weights(model, after, layer), _weights(model, before, layer),
                                     strict=True):  # fmt: skip
            assert not np.allclose(w_after, w_before), layer


# -- balance: errors ---------------------------------------------------------------------------


def _xavier(num_layers: int = 3) -> dict[str, np.ndarray]:
    return GAT(4, 2, 2, num_layers=num_layers, heads=2).init_params(np.random.default_rng(0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"order": "sideways"}, "order must be 'forward' or 'reverse', got 'sideways'"),
        ({"beta": 0}, r"^balance beta \(a squared norm\) must be a finite number > 0, got 0$"),
        ({"beta": -1.0}, "beta .* must be a finite number > 0, got -1.0"),
        ({"beta": float("nan")}, "beta .* must be a finite number > 0, got nan"),
        ({"beta": float("inf")}, "beta .* must be a finite number > 0, got inf"),
        ({"beta": "2"}, "beta .* must be a finite number > 0, got '2'"),
        # True balanced to 1 (a bool is an int), and 10**400 escaped as an OverflowError
        ({"beta": True}, "beta .* must be a finite number > 0, got True"),
        ({"beta": 10**400}, "beta .* must be a finite number > 0, got 1000"),
    ],
)
def test_balance_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        balance(_xavier(), **kwargs)


def test_balance_rejects_a_stray_key() -> None:
    params = {**_xavier(), "layer1.gamma": np.ones(4)}
    with pytest.raises(ValueError, match=r"'layer1\.gamma' is not a GAT parameter name"):
        balance(params)


@pytest.mark.parametrize(
    ("order", "zeroed", "message"),
    [
        # forward anchors layer0's rows: neuron 1 has nothing to scale to beta
        ("forward", ("layer0.W_s", np.s_[1, :]), "neuron 1 of layer0 has all-zero incoming"),
        # forward matches layer1's columns to layer0's rows: neuron 2 has no outgoing weight
        ("forward", ("layer1.W_s", np.s_[:, 2]), "neuron 2 of layer0 has all-zero outgoing"),
        # reverse anchors the last layer's columns
        ("reverse", ("layer2.W_s", np.s_[:, 3]), "neuron 3 of layer1 has all-zero outgoing"),
        # reverse matches layer1's rows to its (now beta) columns
        ("reverse", ("layer1.W_s", np.s_[0, :]), "neuron 0 of layer1 has all-zero incoming"),
    ],
)
def test_balance_rejects_a_neuron_with_all_zero_weights(
    order: str, zeroed: tuple, message: str
) -> None:
    params = _xavier()
    key, where = zeroed
    params[key] = params[key].copy()
    params[key][where] = 0.0
    with pytest.raises(ValueError, match=message):
        balance(params, order=order)


@pytest.mark.parametrize("option", ["bias", "residual"])
def test_balance_single_layer_with_averaged_heads_and_bias_or_residual(option: str) -> None:
    # Regression: layer_structure took the last layer for concatenated (width H*C), but
    # a GAT's last layer averages its heads, so its bias and res_W have C rows and the
    # incoming sums failed to broadcast. The Hypothesis cases had excluded this combination.
    model = GAT(4, 2, 3, num_layers=1, heads=2, **{option: True})
    params = model.init_params(np.random.default_rng(0), init="xavier_normal")
    out = balance(params, beta=2.0)
    np.testing.assert_allclose(_row_norms(model, out, 0), 2.0, rtol=BALANCE_RTOL)
