"""NodeFormer's blocks against their literal twins (refimpl.naive): the kernelised
(Gumbel-)softmax (Eq. 5-7, Alg. 1), the positive random features (Eq. 4) and the
relational bias (Eq. 8): the output and every gradient within TWIN_RTOL, with a random
cotangent, on drawn sizes, graphs, flags and noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from refimpl.graph import Graph, with_configured_self_loops
from refimpl.naive.kernel_attention import (
    exponent_spread,
    kernelized_softmax_backward,
    kernelized_softmax_forward,
)
from refimpl.naive.random_features import (
    positive_random_features_backward,
    positive_random_features_forward,
)
from refimpl.naive.relational_bias import relational_bias_backward, relational_bias_forward
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax
from refimpl.nn.nodeformer.random_features import (
    STABILIZERS,
    PositiveRandomFeatures,
    draw_projection,
)
from refimpl.nn.nodeformer.relational_bias import RelationalBias
from refimpl.testing import max_relative_error
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import TWIN_RTOL
from tests.nn.nodeformer.test_kernel_attention import make_setup, row_block

TAUS = [0.25, 0.5, 1.0, 2.0]
BLOCK_SIZES = [1, 2, 1024]  # production's row blocks: one row, a few rows, all rows at once
# Production's floor on exponentials (kernel_attention._exp_floored) cannot bind, nor even round,
# while every group of exponents it shifts as one spreads by less than about 630 (twin module
# docstring); the drawn inputs must stay well inside that, and each example asserts it.
FLOOR_FREE_SPREAD = 300.0


def assert_twins(actual: dict, expected: dict) -> None:
    """Every tensor of production (``actual``) within TWIN_RTOL of the twin's, each judged
    relative to its own largest entry."""
    assert set(actual) == set(expected)
    errors = {name: max_relative_error(actual[name], expected[name]) for name in expected}
    assert max(errors.values()) <= TWIN_RTOL, errors


# -- kernelised (Gumbel-)softmax, Eq. 5-7 ---------------------------------------------------------


def kernel_inputs(
    seed: int, n: int, d: int, d_v: int, m: int, samples: int, kind: str, scale: float
) -> tuple:
    """:func:`make_setup`'s ``q, k, v, omega, gumbel`` and a cotangent ``d_z (N, d_v)``."""
    d_z = np.random.default_rng([seed, 1]).standard_normal((n, d_v))
    return (*make_setup(seed, n, d, d_v, m, samples, kind, scale), d_z)


@st.composite
def kernel_setups(draw: st.DrawFn) -> tuple:
    # N >= 2 and m >= 2: at N = 1 the gradients in q and k are zero by cancellation, at m = 1
    # the one feature of q_u is a factor of numerator and denominator, so d_q is (named tests)
    return kernel_inputs(
        draw(seeds()),
        n=draw(st.integers(2, 6)),
        d=draw(st.integers(1, 4)),
        d_v=draw(st.integers(1, 3)),
        m=draw(st.integers(2, 8)),
        samples=draw(st.integers(0, 3)),
        kind=draw(st.sampled_from(["iid", "orthogonal"])),
        scale=draw(st.sampled_from([0.3, 0.7, 1.2])),
    )


def gradient_terms(inputs: tuple, tau: float) -> float:
    """The size of the terms d_q and d_k are sums of: ``|v| |d_z| (|omega| + |x| / sqrt(tau))
    / sqrt(tau)`` (kernel weights times ``(v_v - z_u)^T d_z_u``, times Eq. 4's ``w_i - x``,
    through the ``1 / sqrt(tau)`` scaling), maxima over the entries."""
    q, k, v, omega, _, d_z = inputs
    x = max(np.max(np.abs(q)), np.max(np.abs(k))) / math.sqrt(tau)
    return float(np.max(np.abs(v)) * np.max(np.abs(d_z)) * (np.max(np.abs(omega)) + x)) / math.sqrt(
        tau
    )


def kernel_production(layer: KernelizedSoftmax, inputs: tuple, rows: int = 1024) -> dict:
    q, k, v, omega, gumbel, d_z = inputs
    with row_block(rows):
        z, cache = layer.forward({}, q, k, v, omega, gumbel)
        (d_q, d_k, d_v), d_params = layer.backward({}, cache, d_z)
    assert d_params == {}
    return {"z": z, "q": d_q, "k": d_k, "v": d_v}


def kernel_twin(layer: KernelizedSoftmax, inputs: tuple) -> tuple[dict, object]:
    q, k, v, omega, gumbel, d_z = inputs
    z, cache = kernelized_softmax_forward(layer, {}, q, k, v, omega, gumbel)
    (d_q, d_k, d_v), d_params = kernelized_softmax_backward(layer, {}, cache, d_z)
    assert d_params == {}
    return {"z": z, "q": d_q, "k": d_k, "v": d_v}, cache


@given(
    inputs=kernel_setups(),
    tau=st.sampled_from(TAUS),
    stabilize=st.booleans(),
    rows=st.sampled_from(BLOCK_SIZES),
)
@example(
    inputs=kernel_inputs(1, n=6, d=4, d_v=3, m=8, samples=3, kind="iid", scale=1.2),
    tau=0.25,
    stabilize=True,
    rows=2,
)
def test_kernelized_softmax_matches_its_twin(
    inputs: tuple, tau: float, stabilize: bool, rows: int
) -> None:
    layer = KernelizedSoftmax(tau, stabilize)
    expected, cache = kernel_twin(layer, inputs)
    assert exponent_spread(cache, tau) < FLOOR_FREE_SPREAD  # production's floor never binds
    # Away from cancellation: d_q and d_k are sums of terms of size gradient_terms that cancel
    # when the attention barely depends on q or k (nearly equal keys or queries at a small
    # scale, one key outweighing the rest); there both twins carry rounding of the terms, which
    # at 1e3 times the result reaches 1e-13 relative (measured over 3000 draws of this space:
    # 1e-16 times the ratio). 3 in 100 uniform draws of this space are set aside (more of
    # Hypothesis's small first examples).
    terms = gradient_terms(inputs, tau)
    assume(min(np.max(np.abs(expected["q"])), np.max(np.abs(expected["k"]))) >= terms / 1e3)
    assert_twins(kernel_production(layer, inputs, rows), expected)


def test_kernelized_softmax_one_node_attends_to_itself() -> None:
    # N = 1: one key, weight 1 in every sample, so z = v and d_v = d_z; d_q and d_k are zero in
    # exact arithmetic and rounding noise in both (num / den with num = den v): judged against
    # the size of the terms that cancel (gradient_terms), not relative to themselves.
    inputs = kernel_inputs(3, n=1, d=3, d_v=2, m=5, samples=2, kind="iid", scale=0.7)
    v, d_z = inputs[2], inputs[5]
    layer = KernelizedSoftmax(0.5)
    actual, (expected, _) = kernel_production(layer, inputs), kernel_twin(layer, inputs)
    for result in (actual, expected):
        assert max_relative_error(result["z"], v) <= TWIN_RTOL
        assert max_relative_error(result["v"], d_z) <= TWIN_RTOL
        terms = gradient_terms(inputs, 0.5)
        assert np.max(np.abs(result["q"])) <= TWIN_RTOL * terms
        assert np.max(np.abs(result["k"])) <= TWIN_RTOL * terms


def test_kernelized_softmax_one_feature_ignores_the_query() -> None:
    # m = 1: phi(q_u) is one number, a factor of numerator and denominator, so z does not
    # depend on q and d_q is zero up to rounding in both (judged as at N = 1); the rest agrees.
    inputs = kernel_inputs(11, n=4, d=3, d_v=2, m=1, samples=2, kind="iid", scale=0.7)
    layer = KernelizedSoftmax(0.5)
    actual, (expected, _) = kernel_production(layer, inputs), kernel_twin(layer, inputs)
    terms = gradient_terms(inputs, 0.5)
    for result in (actual, expected):
        assert np.max(np.abs(result.pop("q"))) <= TWIN_RTOL * terms
    assert_twins(actual, expected)


@pytest.mark.parametrize("samples", [0, 2])
def test_kernelized_softmax_equal_keys_tie(samples: int) -> None:
    # All keys equal: phi(q_u)^T phi(k_v) is the same for every v, so each sample's weights are
    # its Gumbel weights e^{g_vs/tau} normalised (uniform without noise), whatever the query.
    q, k, v, omega, gumbel, d_z = kernel_inputs(4, 5, 3, 2, 6, samples, "iid", 0.7)
    k = np.repeat(k[:1], 5, axis=0)
    inputs, tau = (q, k, v, omega, gumbel, d_z), 0.5
    layer = KernelizedSoftmax(tau)
    actual, (expected, _) = kernel_production(layer, inputs), kernel_twin(layer, inputs)
    g = np.zeros((5, 1)) if gumbel is None else gumbel
    weights = np.exp(g / tau) / np.sum(np.exp(g / tau), axis=0)  # (N, K)
    tied = np.tile(np.mean(weights.T @ v, axis=0), (5, 1))  # (N, d_v), the same for every query
    # the queries do not move the weights: d_q is zero up to rounding of its terms (as at N = 1)
    for result in (actual, expected):
        assert max_relative_error(result["z"], tied) <= TWIN_RTOL
        assert np.max(np.abs(result.pop("q"))) <= TWIN_RTOL * gradient_terms(inputs, tau)
    assert_twins(actual, expected)


def test_kernelized_softmax_floor_binding_is_below_rounding() -> None:
    # The twin does not replicate production's floor. Where it binds (one key's Gumbel weight
    # e^{-700} below the others': its floored features are exact zeros in production, about
    # 1e-304 in the twin), what it drops is below every rounding, so the two still agree.
    q, k, v, omega, _, d_z = kernel_inputs(5, 3, 2, 2, 4, 0, "iid", 0.7)
    gumbel = np.array([[0.0], [0.3], [-700.0]])
    inputs, layer = (q, k, v, omega, gumbel, d_z), KernelizedSoftmax(1.0)
    expected, cache = kernel_twin(layer, inputs)
    assert exponent_spread(cache, 1.0) > 690  # the floor binds here
    assert_twins(kernel_production(layer, inputs), expected)


# -- positive random features, Eq. 4 --------------------------------------------------------------


@given(
    seed=seeds(),
    n=st.integers(1, 6),
    d=st.integers(1, 4),
    m=st.integers(2, 8),  # m = 1 with a shift: phi is the constant 1, d_x zero (a named test)
    scale=st.sampled_from([0.3, 1.0, 2.0]),
    stabilizer=st.sampled_from(STABILIZERS),
    hold_shift=st.booleans(),
)
def test_positive_random_features_match_their_twin(
    seed: int, n: int, d: int, m: int, scale: float, stabilizer: str | None, hold_shift: bool
) -> None:
    rng = np.random.default_rng(seed)
    x, omega = scale * rng.standard_normal((n, d)), draw_projection(rng, m, d)
    d_phi = rng.standard_normal((n, m))
    layer = PositiveRandomFeatures(stabilizer, hold_shift)
    actual, expected = prf_pair(layer, x, omega, d_phi)
    # Away from cancellation: d_x_u = sum_i d_a_ui (w_i - x_u), terms of size |d_phi phi|
    # (|omega| + |x|); with a differentiated shift d_a sums to 0 over the features it shifts, so
    # where all but the largest feature are tiny d_x is far smaller than its terms and carries
    # their rounding (1e-16 times the ratio, measured over 5000 draws). 1 in 1000 set aside.
    terms = np.max(np.abs(d_phi * expected["phi"])) * (np.max(np.abs(omega)) + np.max(np.abs(x)))
    assume(np.max(np.abs(expected["x"])) >= terms / 1e3)
    assert_twins(actual, expected)


def prf_pair(layer: PositiveRandomFeatures, x: np.ndarray, omega: np.ndarray, d_phi: np.ndarray):
    """``(production, twin)``: ``{"phi", "x"}`` each."""
    phi, cache = layer.forward({}, x, omega)
    d_x, d_params = layer.backward({}, cache, d_phi)
    twin_phi, twin_cache = positive_random_features_forward(layer, {}, x, omega)
    twin_d_x, twin_d_params = positive_random_features_backward(layer, {}, twin_cache, d_phi)
    assert d_params == twin_d_params == {}
    return {"phi": phi, "x": d_x}, {"phi": twin_phi, "x": twin_d_x}


def test_positive_random_features_one_feature_row_shift_is_constant() -> None:
    # m = 1 with the row shift: phi = exp(a - a) / sqrt(1) = 1 exactly, whatever x, so d_x is 0:
    # exactly in the twin (d_a = d_phi phi - d_phi phi), up to rounding of its terms in
    # production (d_phi (w - x) - d_phi (w - x) in another grouping).
    rng = np.random.default_rng(12)
    x, omega, d_phi = (
        rng.standard_normal((3, 2)),
        draw_projection(rng, 1, 2),
        rng.standard_normal((3, 1)),
    )
    actual, expected = prf_pair(PositiveRandomFeatures("row"), x, omega, d_phi)
    assert np.all(actual["phi"] == 1.0) and np.all(expected["phi"] == 1.0)
    assert np.all(expected["x"] == 0.0)
    terms = np.max(np.abs(d_phi)) * (np.max(np.abs(omega)) + np.max(np.abs(x)))
    assert np.max(np.abs(actual["x"])) <= TWIN_RTOL * terms


@pytest.mark.parametrize("stabilizer", ["row", "global"])
def test_positive_random_features_tied_shift_takes_the_first_maximiser(stabilizer: str) -> None:
    # x = 0 makes every exponent 0: the shift's argmax is a tie, broken to the first maximiser
    # (feature 0, node 0) by both; the shift's gradient lands there.
    rng = np.random.default_rng(6)
    x, omega = np.zeros((3, 2)), draw_projection(rng, 4, 2)
    x[2] = rng.standard_normal(2)  # one untied row beside the tied ones
    layer = PositiveRandomFeatures(stabilizer)
    assert_twins(*prf_pair(layer, x, omega, rng.standard_normal((3, 4))))


# -- relational bias, Eq. 8 -----------------------------------------------------------------------


def bias_production(layer: RelationalBias, params: dict, v: np.ndarray, graph: Graph, d_out):
    """The relational bias as NodeFormerConv drives it (F4 / B4), from zero ``z`` and ``d_v``."""
    operators = layer.operators(graph, np, v.dtype)
    f = layer.gate(params["b_rel"])
    out = np.zeros_like(v)
    layer.add_terms(operators, f, v, out)
    d_v = np.zeros_like(v)
    d_f = layer.add_terms_backward(operators, f, d_out, v, d_v)
    return {"out": out, "v": d_v, "b_rel": layer.gate_backward(f, d_f)}


def bias_twin(layer: RelationalBias, params: dict, v: np.ndarray, graph: Graph, d_out):
    out, cache = relational_bias_forward(layer, params, v, graph)
    d_v, d_params = relational_bias_backward(layer, params, cache, d_out)
    assert set(d_params) == set(params)
    return {"out": out, "v": d_v, "b_rel": d_params["b_rel"]}


@given(
    graph=graphs(),
    add_self_loops=st.booleans(),
    heads=st.integers(1, 3),
    channels=st.integers(1, 3),
    mode=st.sampled_from(["sigmoid", "identity"]),
    order=st.integers(1, 3),
    powers=st.sampled_from(["paper", "authors"]),
    seed=seeds(),
)
def test_relational_bias_matches_its_twin(
    graph: Graph,
    add_self_loops: bool,
    heads: int,
    channels: int,
    mode: str,
    order: int,
    powers: str,
    seed: int,
) -> None:
    # The graph as NodeFormerConv.prepare_graph hands it over, or as drawn (zero in-degree kept)
    graph = with_configured_self_loops(graph, add_self_loops)
    rng = np.random.default_rng(seed)
    n = graph.num_nodes
    params = {"b_rel": rng.standard_normal((order, heads))}
    v, d_out = rng.standard_normal((n, heads, channels)), rng.standard_normal((n, heads, channels))
    layer = RelationalBias(mode, order, powers)
    assert_twins(
        bias_production(layer, params, v, graph, d_out), bias_twin(layer, params, v, graph, d_out)
    )


@pytest.mark.parametrize("powers", ["paper", "authors"])
def test_relational_bias_isolated_node_gets_nothing(powers: str) -> None:
    # Node 3 has no edge: its bias is exactly 0 and its value gets no gradient through the bias;
    # node 0 has no incoming edge (a zero row of A_hat), node 2 no outgoing one.
    graph = Graph(np.array([[0, 1, 1, 0], [1, 2, 2, 2]]), 4)
    rng = np.random.default_rng(7)
    params = {"b_rel": rng.standard_normal((2, 2))}
    v, d_out = rng.standard_normal((4, 2, 3)), rng.standard_normal((4, 2, 3))
    layer = RelationalBias("sigmoid", 2, powers)
    actual, expected = (
        bias_production(layer, params, v, graph, d_out),
        bias_twin(layer, params, v, graph, d_out),
    )
    for result in (actual, expected):
        assert np.all(result["out"][[0, 3]] == 0.0)
        assert np.all(result["v"][[2, 3]] == 0.0)
    assert_twins(actual, expected)


# -- the comparison has teeth ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_a_gradient_off_by_one_part_in_a_billion_fails(name: str) -> None:
    # TWIN_RTOL must tell a twin from a twin whose gradient is scaled by (1 + 1e-9).
    inputs = kernel_inputs(8, n=4, d=3, d_v=2, m=6, samples=2, kind="iid", scale=0.7)
    layer = KernelizedSoftmax(0.5)
    actual, (expected, _) = kernel_production(layer, inputs), kernel_twin(layer, inputs)
    assert_twins(actual, expected)
    expected[name] = expected[name] * (1.0 + 1e-9)
    with pytest.raises(AssertionError):
        assert_twins(actual, expected)


def test_a_relational_gate_gradient_off_by_one_part_in_a_billion_fails() -> None:
    graph = with_configured_self_loops(Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3), True)
    rng = np.random.default_rng(9)
    params = {"b_rel": rng.standard_normal((2, 2))}
    v, d_out = rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 2, 2))
    layer = RelationalBias("sigmoid", 2, "paper")
    actual, expected = (
        bias_production(layer, params, v, graph, d_out),
        bias_twin(layer, params, v, graph, d_out),
    )
    assert_twins(actual, expected)
    expected["b_rel"] = expected["b_rel"] * (1.0 + 1e-9)
    with pytest.raises(AssertionError):
        assert_twins(actual, expected)
