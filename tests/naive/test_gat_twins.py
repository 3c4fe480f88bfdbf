"""GATConv v1 and v2 against their literal twins (refimpl.naive.gat_v1, gat_v2): the output, the
attention coefficients and every gradient (x and each parameter) within TWIN_RTOL, with a random
cotangent, over every configuration (heads concat/mean, bias, self-loops, v2 shared weights,
negative slope, attention dropout, each LipschitzNorm mode of each version) on drawn graphs."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import refimpl.naive.gat_v2 as gat_v2_module
from refimpl import Graph
from refimpl.naive.gat import attend_backward, gat_forward
from refimpl.naive.gat_v1 import gat_v1_backward, gat_v1_forward
from refimpl.naive.gat_v2 import gat_v2_backward, gat_v2_forward
from refimpl.nn import GATConv
from refimpl.testing import max_relative_error
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import TWIN_RTOL

TWINS = {"v1": (gat_v1_forward, gat_v1_backward), "v2": (gat_v2_forward, gat_v2_backward)}
# every (version, lipschitz_norm) the layer accepts ("reference-code" is GATv1's only)
MODES = [("v1", None), ("v1", "paper"), ("v1", "reference-code"), ("v2", None), ("v2", "paper")]
# A gradient tensor this far below the layer's largest gradient is mostly cancellation
# (see cancelled()); 1e-3 leaves its rounding, ~1e-16 of the terms, well below TWIN_RTOL of it.
CANCELLATION = 1e-3


class Case(NamedTuple):
    """A configured layer, float64 parameters and features, a keep-mask (or None), a cotangent."""

    conv: GATConv
    params: dict
    x: np.ndarray
    graph: Graph
    keep: np.ndarray | None  # (E, H) attention-dropout keep-mask over the attended edges
    d_out: np.ndarray
    edge_attr: np.ndarray | None = None  # (E_graph, edge_dim) with edge_dim


def make_case(conv: GATConv, graph: Graph, seed: int, dropout: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    # Random (not zero) bias, and attention scaled up so softmaxes are far from uniform.
    params = {
        k: v + rng.standard_normal(v.shape) if k == "bias" else 2.0 * v
        for k, v in conv.init_params(rng).items()
    }
    x = rng.standard_normal((graph.num_nodes, conv.in_channels))
    keep = None
    if dropout:
        conv = replace(conv, dropout=0.4)
        keep = rng.random((conv.prepare_graph(graph).num_edges, conv.heads)) >= 0.4
    width = conv.heads * conv.out_channels if conv.concat else conv.out_channels
    return Case(conv, params, x, graph, keep, rng.standard_normal((graph.num_nodes, width)))


@st.composite
def cases(draw: st.DrawFn, version: str, lipschitz_norm: str | None) -> Case:
    # v2's normalised score is scale-invariant in att, so with one channel per head d_att is
    # zero (rounding noise): drawn with two or more here, one channel has its named test.
    fewest = 2 if version == "v2" and lipschitz_norm is not None else 1
    conv = GATConv(
        in_channels=draw(st.integers(1, 4)),
        out_channels=draw(st.integers(fewest, 3)),
        heads=draw(st.integers(1, 3)),
        concat=draw(st.booleans()),
        version=version,
        share_weights=draw(st.booleans()),
        negative_slope=draw(st.sampled_from([0.2, 0.01, 0.5])),
        add_self_loops=draw(st.booleans()),
        bias=draw(st.booleans()),
        lipschitz_norm=lipschitz_norm,
    )
    return make_case(conv, draw(graphs()), draw(seeds()), dropout=draw(st.booleans()))


def run_both(case: Case) -> tuple[dict, dict]:
    """Production's and the twin's output, coefficients and gradients, keyed alike."""
    conv, params, x, graph, keep, d_out, edge_attr = case
    kwargs = {} if keep is None else {"training": True, "attn_dropout_mask": keep}
    out, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    d_x, d_params = conv.backward(params, cache, d_out)
    twin_forward, twin_backward = TWINS[conv.version]
    twin_out, twin_cache = twin_forward(conv, params, x, graph, keep, edge_attr)
    twin_d_x, twin_d_params = twin_backward(conv, params, twin_cache, d_out)
    assert list(d_params) == list(params) and list(twin_d_params) == list(params)
    edge_index, alpha = conv.attention_weights(cache)
    np.testing.assert_array_equal(edge_index, twin_cache.edges.T)
    actual = {"out": out, "alpha": alpha, **input_gradients(d_x, edge_attr is not None)}
    expected = {
        "out": twin_out,
        "alpha": twin_cache.attended.alpha,
        **input_gradients(twin_d_x, edge_attr is not None),
    }
    actual.update({f"d_{k}": v for k, v in d_params.items()})
    expected.update({f"d_{k}": v for k, v in twin_d_params.items()})
    if conv.version == "v2" and conv.lipschitz_norm is None:
        # d att = sum_e d_e LeakyReLU(x_e): the size of its terms, for twin_errors
        d_scores, *_ = attend_backward(conv, params, twin_cache.attended, twin_cache.f1.h_src,
                                       twin_cache.edges, twin_cache.f1.x_dst, d_out)  # fmt: skip
        expected["|d_att|"] = np.einsum("eh,ehc->hc", np.abs(d_scores), np.abs(twin_cache.hidden))
    return actual, expected


def input_gradients(d_inputs: object, edges: bool) -> dict:
    """A backward's input gradients by name: ``d_x`` (or ``d_x_src``, ``d_x_dst`` for a pair
    x), and ``d_edge_attr`` with edge features."""
    found = {}
    if edges:
        d_inputs, found["d_edge_attr"] = d_inputs
    if isinstance(d_inputs, tuple):
        found["d_x_src"], found["d_x_dst"] = d_inputs
    else:
        found["d_x"] = d_inputs
    return found


def twin_errors(actual: dict, expected: dict) -> dict[str, float]:
    """Each tensor's error relative to its own largest entry, or (where ``expected`` holds
    ``"|name|"``, the size of the terms the tensor sums) to the largest of its terms: a sum
    that cancels to 1e-4 of its terms carries their rounding, ~1e-12 of itself."""
    errors = {}
    for name in (n for n in expected if not n.startswith("|")):
        terms = expected.get(f"|{name}|")
        if terms is None:
            errors[name] = max_relative_error(actual[name], expected[name])
        else:
            difference = np.max(np.abs(actual[name] - expected[name]), initial=0.0)
            errors[name] = float(difference / max(np.max(terms, initial=0.0), 1e-300))
    return errors


def cancelled(actual: dict, expected: dict) -> set[str]:
    """Gradients that are mostly cancellation: not zero on both sides, yet below CANCELLATION
    times the largest gradient entry of the layer (the twin's).

    Where the softmax ignores a change, a gradient is a sum of terms that cancel: the
    Jacobian's rows sum to zero, so a target whose incoming edges all come from one source
    passes no gradient into any score; ``att_dst . W h_v`` (v1) and ``W_t h_v`` (v2, per
    channel where a target's LeakyReLU inputs share a sign) shift a whole neighbourhood alike;
    LipschitzNorm's scores are scale-invariant in the attention vectors. Such a tensor is the
    rounding of its O(1) terms, ~1e-16, and judged against itself that is noise against noise.
    """
    grads = [name for name in expected if name.startswith("d_")]
    scale = max(float(np.max(np.abs(expected[name]), initial=0.0)) for name in grads)
    return {
        name
        for name in grads
        if (np.any(actual[name]) or np.any(expected[name]))
        and np.max(np.abs(expected[name])) < CANCELLATION * scale
    }


# -- against the twins ---------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "lipschitz_norm"), MODES)
@given(data=st.data())
def test_matches_the_twin(version: str, lipschitz_norm: str | None, data: st.DataObject) -> None:
    case = data.draw(cases(version, lipschitz_norm))
    actual, expected = run_both(case)
    # Draws where some gradient is mostly cancellation (cancelled()) are redrawn: rounding, not
    # the derivative, decides their relative error. The named tests below pin such cases.
    assume(not cancelled(actual, expected))
    errors = twin_errors(actual, expected)
    assert max(errors.values()) <= TWIN_RTOL, errors
    # the forward-only loop of refimpl.naive.gat agrees with the twin
    loop_out, _, loop_alpha = gat_forward(
        case.conv, case.params, case.x, case.graph.edge_index, case.keep
    )
    assert max_relative_error(loop_out, expected["out"]) <= TWIN_RTOL
    assert max_relative_error(loop_alpha, expected["alpha"]) <= TWIN_RTOL


@pytest.mark.parametrize("version", ["v1", "v2"])
@given(data=st.data(), seed=seeds())
def test_residual_matches_the_twin(version: str, data: st.DataObject, seed: int) -> None:
    # PyG's residual=True (issue 22): x W_res^T added before the bias; W_res's gradient and
    # x's second path compared with the twin's F8' / B8'.
    case = data.draw(cases(version, None))
    conv = replace(case.conv, residual=True)
    w_res = np.random.default_rng(seed).standard_normal(conv.param_shapes()["W_res"])
    params = {name: case.params.get(name, w_res) for name in conv.param_shapes()}
    actual, expected = run_both(case._replace(conv=conv, params=params))
    assume(not cancelled(actual, expected))
    errors = twin_errors(actual, expected)
    assert "d_W_res" in errors and max(errors.values()) <= TWIN_RTOL, errors


@pytest.mark.parametrize(
    ("version", "name"),
    [("v1", name) for name in ("out", "alpha", "d_x", "d_W", "d_att_src", "d_att_dst", "d_bias")]
    + [("v2", name) for name in ("out", "alpha", "d_x", "d_W_s", "d_W_t", "d_att", "d_bias")],
)
def test_comparison_has_teeth(version: str, name: str) -> None:
    # Every tensor compared: the twin's value off by 1e-9 relative fails TWIN_RTOL.
    conv = GATConv(3, 2, heads=2, version=version, lipschitz_norm="paper", add_self_loops=False)
    graph = Graph(np.array([[0, 1, 2, 2, 3, 1], [1, 2, 0, 1, 1, 1]]), 4)
    actual, expected = run_both(make_case(conv, graph, seed=3, dropout=True))
    assert not cancelled(actual, expected)
    assert twin_errors(actual, expected)[name] <= TWIN_RTOL
    assert max_relative_error(actual[name], expected[name] * (1 + 1e-9)) > TWIN_RTOL


@pytest.mark.parametrize(("factor", "passes"), [(10, False), (2, False), (0.5, True), (0.1, True)])
def test_a_twin_off_around_the_tolerance_fails_above_it_and_passes_below(
    factor: float, passes: bool
) -> None:
    # Guards TWIN_RTOL = 1e-12 itself (mutant: 1e-11 passed every twin test, whose slips are
    # 1e-9): the pair agrees to a few ulps here, so a twin gradient off by factor x TWIN_RTOL
    # is judged by the tolerance alone.
    conv = GATConv(3, 2, heads=2, version="v2", add_self_loops=False)
    graph = Graph(np.array([[0, 1, 2, 2, 3, 1], [1, 2, 0, 1, 1, 1]]), 4)
    actual, expected = run_both(make_case(conv, graph, seed=3, dropout=False))
    assert twin_errors(actual, expected)["d_W_s"] <= 0.01 * TWIN_RTOL  # a few ulps
    slipped = expected["d_W_s"] * (1 + factor * 1e-12)  # the documented TWIN_RTOL, literally
    assert (max_relative_error(actual["d_W_s"], slipped) <= TWIN_RTOL) is passes


@pytest.mark.parametrize("version", ["v1", "v2"])
@given(data=st.data(), seed=seeds(), coarse=st.booleans())
def test_edge_features_and_projection_biases_match_the_twin(
    version: str, data: st.DataObject, seed: int, coarse: bool
) -> None:
    # PyG's edge_dim with every fill_value for the added loops (coarse features: ties in a
    # max or min, zeros in a product), and GATv2's projection biases (issue 22): F1' / B1'.
    case = data.draw(cases(version, None))
    edge_dim = data.draw(st.integers(1, 3))
    fill = data.draw(st.sampled_from(["mean", "add", "max", "min", "mul", 0.5, None, "vector"]))
    conv = replace(
        case.conv,
        edge_dim=edge_dim,
        fill_value=tuple(np.linspace(-1, 1, edge_dim)) if fill == "vector" else fill,
        projection_bias=version == "v2" and data.draw(st.booleans()),
    )
    rng = np.random.default_rng(seed)
    params = {
        name: case.params[name] if name in case.params else rng.standard_normal(shape)
        for name, shape in conv.param_shapes().items()
    }
    shape = (case.graph.num_edges, edge_dim)
    edge_attr = rng.integers(-2, 3, size=shape) / 2.0 if coarse else rng.standard_normal(shape)
    actual, expected = run_both(case._replace(conv=conv, params=params, edge_attr=edge_attr))
    assume(not cancelled(actual, expected))
    errors = twin_errors(actual, expected)
    assert {"d_edge_attr", "d_W_e"} <= set(errors) and max(errors.values()) <= TWIN_RTOL, errors


# -- named edge cases ----------------------------------------------------------------------------

# A graph with every edge case at once (add_self_loops=False keeps it as drawn): node 1 hears
# from 0, twice from 2 (a duplicate edge) and from itself (an existing self-loop); node 2 has no
# incoming edge; node 4 is isolated.
EDGE_CASES = Graph(np.array([[0, 2, 2, 1, 3, 1], [1, 1, 1, 1, 0, 3]]), 5)
# Gradients zero in exact arithmetic are held to this fraction of the largest gradient: the
# rounding of the O(1) terms that cancel (a few ulps of their sum).
ZERO_RTOL = 1e-14


def assert_matches(actual: dict, expected: dict, zeros: frozenset = frozenset()) -> None:
    """Every tensor within TWIN_RTOL of the twin's; ``zeros``, gradients that are zero in exact
    arithmetic (by cancellation), within ZERO_RTOL of the largest gradient on both sides."""
    grads = [name for name in expected if name.startswith("d_")]
    scale = max(float(np.max(np.abs(expected[name]), initial=0.0)) for name in grads)
    errors = {k: v for k, v in twin_errors(actual, expected).items() if k not in zeros}
    assert max(errors.values()) <= TWIN_RTOL, errors
    for name in zeros:
        assert np.max(np.abs(actual[name])) <= ZERO_RTOL * scale, name
        assert np.max(np.abs(expected[name])) <= ZERO_RTOL * scale, name


def attention_names(conv: GATConv) -> frozenset:
    return frozenset({"d_att_src", "d_att_dst"} if conv.version == "v1" else {"d_att"})


@pytest.mark.parametrize(("version", "lipschitz_norm"), MODES)
def test_all_scores_equal_attend_uniformly_and_the_kink_takes_the_slope(
    version: str, lipschitz_norm: str | None
) -> None:
    # Zero attention vectors: every score is 0 (LipschitzNorm: D = 0 divides by 1; with the
    # reference code's eps, D = 1e-12), so alpha = 1 / in-degree. v1's LeakyReLU input is then
    # exactly 0, at the kink, where the derivative is the slope (PyTorch's convention).
    conv = GATConv(
        3, 2, heads=2, version=version, add_self_loops=False, lipschitz_norm=lipschitz_norm
    )
    case = make_case(conv, EDGE_CASES, seed=11)
    params = {k: np.zeros_like(v) if k.startswith("att") else v for k, v in case.params.items()}
    case = case._replace(params=params)
    actual, expected = run_both(case)
    in_degree = np.array([4, 4, 4, 4, 1, 1])  # of each edge's target
    np.testing.assert_array_equal(actual["alpha"], np.repeat(1 / in_degree[:, None], 2, axis=1))
    np.testing.assert_array_equal(expected["alpha"], actual["alpha"])
    # v1: att_dst . W h_v shifts a whole neighbourhood, which the softmax ignores
    assert_matches(actual, expected, zeros=frozenset({"d_att_dst"} if version == "v1" else ()))
    if version == "v1":
        # the same forward with slope 1 (LeakyReLU = identity): d_att_src scales by the slope
        identity, _ = run_both(case._replace(conv=replace(conv, negative_slope=1.0)))
        slope = conv.negative_slope
        assert max_relative_error(actual["d_att_src"], slope * identity["d_att_src"]) <= TWIN_RTOL


@pytest.mark.parametrize(("version", "lipschitz_norm"), MODES)
def test_isolated_node_outputs_the_bias_and_gets_no_gradient(
    version: str, lipschitz_norm: str | None
) -> None:
    conv = GATConv(
        3, 2, heads=2, version=version, add_self_loops=False, lipschitz_norm=lipschitz_norm
    )
    case = make_case(conv, EDGE_CASES, seed=5)
    actual, expected = run_both(case)
    assert not cancelled(actual, expected)
    assert_matches(actual, expected)
    for out in (actual["out"], expected["out"]):
        np.testing.assert_array_equal(out[[2, 4]], np.broadcast_to(case.params["bias"], (2, 4)))
    np.testing.assert_array_equal(actual["d_x"][4], 0.0)
    np.testing.assert_array_equal(expected["d_x"][4], 0.0)


@pytest.mark.parametrize(("version", "lipschitz_norm"), MODES)
def test_one_source_per_target_passes_no_gradient_into_attention(
    version: str, lipschitz_norm: str | None
) -> None:
    # Node 1 hears from 0 three times (alpha = 1/3, not exact in binary), node 3 from 2: the
    # softmax Jacobian's rows sum to zero, so every score gradient is zero but for rounding, and
    # so are the attention gradients (and v2's W_t, reached only through the scores).
    graph = Graph(np.array([[0, 0, 0, 2], [1, 1, 1, 3]]), 4)
    conv = GATConv(
        3, 2, heads=2, version=version, add_self_loops=False, lipschitz_norm=lipschitz_norm
    )
    actual, expected = run_both(make_case(conv, graph, seed=7))
    zeros = attention_names(conv) | ({"d_W_t"} if version == "v2" else set())
    assert cancelled(actual, expected) <= zeros
    assert_matches(actual, expected, zeros=frozenset(zeros))


def test_v2_pre_activation_exactly_at_the_kink_takes_the_slope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A zero feature row: node 0's self-loop has x_00 = W_s 0 + W_t 0 = 0 in every channel.
    conv = GATConv(3, 2, heads=2, version="v2")
    case = make_case(conv, EDGE_CASES, seed=2)
    x = case.x.copy()
    x[0] = 0.0
    actual, expected = run_both(case._replace(x=x))
    assert_matches(actual, expected)
    # A twin that takes the derivative 1 at exactly 0 disagrees: the convention is tested.
    monkeypatch.setattr(
        gat_v2_module, "leaky_relu_derivative", lambda pre, s: np.where(pre >= 0, 1.0, s)
    )
    _, one_at_zero = run_both(case._replace(x=x))
    assert max_relative_error(actual["d_x"], one_at_zero["d_x"]) > TWIN_RTOL


def test_v2_lipschitz_norm_with_one_channel_gives_att_no_gradient() -> None:
    # LipschitzNorm's v2 score att . LeakyReLU(x) / (||att|| r) is unchanged by scaling att,
    # so d_att . att = 0; with one channel per head d_att itself is zero.
    conv = GATConv(3, 1, heads=2, version="v2", lipschitz_norm="paper")
    actual, expected = run_both(make_case(conv, EDGE_CASES, seed=4, dropout=True))
    assert_matches(actual, expected, zeros=frozenset({"d_att"}))


def test_d_att_judged_by_its_terms_still_has_teeth() -> None:
    # GATv2's d att is judged against the size of the terms it sums (twin_errors): a twin
    # value off by 1e-9 relative still fails, the exact one passes.
    conv = GATConv(3, 2, heads=2, version="v2", add_self_loops=False)
    graph = Graph(np.array([[0, 1, 2, 2, 3, 1], [1, 2, 0, 1, 1, 1]]), 4)
    actual, expected = run_both(make_case(conv, graph, seed=3))
    assert "|d_att|" in expected
    assert twin_errors(actual, expected)["d_att"] <= TWIN_RTOL
    slipped = {**expected, "d_att": expected["d_att"] * (1 + 1e-9)}
    assert twin_errors(actual, slipped)["d_att"] > TWIN_RTOL
