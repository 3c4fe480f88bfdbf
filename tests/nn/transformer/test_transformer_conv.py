"""TransformerConv: naive loops, finite differences, properties, edge cases, bad input."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import asarray, to_numpy
from refimpl.kernels.segment import segment_sum
from refimpl.naive.transformer_conv import transformer_conv_forward
from refimpl.nn.transformer.transformer_conv import TransformerConv
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from tests.backends import DEVICE_BACKENDS

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
# Finite differences step 1e-6: a max (of three products, over a neighbourhood) whose two
# largest arguments are closer than this (relative) may switch within the step.
MAX_GAP = 1e-4


class Setup(NamedTuple):
    """A configured layer, float64 parameters and inputs, and forward keyword arguments."""

    conv: TransformerConv
    params: dict
    x: np.ndarray
    graph: Graph
    edge_attr: np.ndarray | None
    kwargs: dict

    @property
    def inputs(self) -> tuple:
        """Positional inputs after ``params``: ``(x, graph)`` or ``(x, graph, edge_attr)``."""
        if self.edge_attr is None:
            return (self.x, self.graph)
        return (self.x, self.graph, self.edge_attr)


@st.composite
def setups(draw: st.DrawFn, dropout: bool | None = None, lipschitz: bool | None = None) -> Setup:
    graph = draw(graphs())
    root_weight = draw(st.booleans())
    if lipschitz is None:
        lipschitz = draw(st.booleans())
    conv = TransformerConv(
        in_channels=draw(st.integers(1, 4)),
        out_channels=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 3)),
        concat=draw(st.booleans()),
        beta=root_weight and draw(st.booleans()),
        bias=draw(st.booleans()),
        root_weight=root_weight,
        edge_dim=draw(st.sampled_from([None, 1, 2, 3])),
        lipschitz_norm="paper" if lipschitz else None,
    )
    rng = np.random.default_rng(draw(seeds()))
    # Scaled up (PyG's init gives |w| <= 1/sqrt(fan_in)) so that softmaxes are far from uniform.
    params = {k: 2.0 * v for k, v in conv.init_params(rng).items()}
    x = rng.standard_normal((graph.num_nodes, conv.in_channels))
    edge_attr = None
    if conv.edge_dim is not None:
        edge_attr = rng.standard_normal((graph.num_edges, conv.edge_dim))
    kwargs: dict = {}
    if dropout if dropout is not None else draw(st.booleans()):
        conv = replace(conv, dropout=0.4)
        kwargs = {"training": True, "attn_dropout_mask": rng.random((graph.num_edges, conv.heads))}
        kwargs["attn_dropout_mask"] = kwargs["attn_dropout_mask"] >= 0.4
    return Setup(conv, params, x, graph, edge_attr, kwargs)


def max_gap(cache: Any) -> float:
    """Smallest relative gap, over targets and heads, between the largest and the next
    argument of each LipschitzNorm max (inf without it). Exactly equal arguments (duplicate
    edges without edge features) stay equal under any perturbation, so they are skipped."""
    lip = cache.lipschitz
    if lip is None:
        return np.inf
    dst = np.asarray(cache.graph.edge_index[1])
    u, a, w = lip.norms
    products = np.stack([u * a, u * w, a * w], axis=-1)  # (N, H, 3)
    gaps = [np.inf]
    for v in np.unique(dst):
        for h in range(u.shape[1]):
            for values in (
                products[v, h],
                lip.key_norms[dst == v, h],
                lip.value_norms[dst == v, h],
            ):
                top = values.max()
                below = values[values < top]
                if top > 0 and below.size:
                    gaps.append((top - below.max()) / top)
    return float(min(gaps))


# -- against the naive loop version ----------------------------------------------------------


@given(setup=setups())
def test_forward_matches_naive_loops(setup: Setup) -> None:
    conv, params, x, graph, edge_attr, kwargs = setup
    out, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    keep = kwargs.get("attn_dropout_mask")
    expected, alpha, terms = transformer_conv_forward(
        conv, params, x, graph.edge_index, edge_attr, attn_keep=keep
    )
    assert max_relative_error(out, expected) <= RTOL64
    edge_index, attention = conv.attention_weights(cache)
    np.testing.assert_array_equal(edge_index, graph.edge_index)
    assert max_relative_error(attention, alpha) <= RTOL64
    assert max_relative_error(conv.score_vectors(cache), terms) <= RTOL64


@pytest.mark.parametrize("heads", [1, 3])
def test_equals_the_dense_masked_softmax_of_the_supplement(heads: int) -> None:
    # Supplement Eq. 6-8: softmax(Q K^T / sqrt(d_k) + M) V per head, M = 0 on edges and the
    # diagonal (Eq. 7), -inf elsewhere: a dense route independent of the segment softmax.
    rng = np.random.default_rng(3)
    n, channels = 5, 2
    edges = np.array([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 3, 1]])  # simple, no self-loops
    graph = Graph(edges, n).add_self_loops()  # Eq. 7 unmasks i = j
    conv = TransformerConv(3, channels, heads=heads, bias=False, root_weight=False)
    params = {k: 2.0 * v for k, v in conv.init_params(rng).items()}
    x = rng.standard_normal((n, 3))
    out, _ = conv.forward(params, x, graph)

    mask = np.full((n, n), -np.inf)
    mask[edges[1], edges[0]] = 0.0  # row = target v, column = source u
    mask[np.arange(n), np.arange(n)] = 0.0
    q, k, v = ((x @ params[f"W_{p}"].T).reshape(n, heads, channels) for p in "qkv")
    expected = []
    for h in range(heads):
        logits = q[:, h] @ k[:, h].T / math.sqrt(channels) + mask  # (N, N)
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        expected.append(probabilities @ v[:, h])
    assert max_relative_error(out, np.concatenate(expected, axis=1)) <= RTOL64


# -- gradients ---------------------------------------------------------------------------------


@given(setup=setups())
@example(  # a single node and no edge (E = 0): every segment op on empty inputs
    setup=Setup(
        TransformerConv(2, 2, heads=2, beta=True, edge_dim=2, lipschitz_norm="paper"),
        TransformerConv(2, 2, heads=2, beta=True, edge_dim=2).init_params(np.random.default_rng(5)),
        np.array([[0.5, -1.5]]),
        Graph(np.zeros((2, 0), dtype=np.int64), 1),
        np.zeros((0, 2)),
        {},
    )
)
def test_backward_matches_central_differences(setup: Setup) -> None:
    conv, params, x, graph, edge_attr, kwargs = setup
    _, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    assume(max_gap(cache) > MAX_GAP)
    report = check_gradients(
        conv,
        params,
        setup.inputs,
        forward_kwargs=kwargs,
        max_entries=None,
        rng=np.random.default_rng(1),
    )
    checked = {e.name for e in report.errors}
    assert ("input[2]" in checked) == (edge_attr is not None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_gradient_check_catches_a_wrong_backward() -> None:
    # The check must be able to fail: break the edge-feature gradient and watch it.
    graph = Graph(np.array([[0, 1, 2, 2, 3], [1, 2, 0, 1, 1]]), 4)
    conv = TransformerConv(3, 2, heads=2, edge_dim=2, lipschitz_norm="paper")
    rng = np.random.default_rng(1)
    params = conv.init_params(rng)
    x, edge_attr = rng.standard_normal((4, 3)), rng.standard_normal((5, 2))
    assert_catches_a_wrong_edge_gradient(conv, params, x, graph, edge_attr)


def assert_catches_a_wrong_edge_gradient(
    conv: Any, params: dict, x: np.ndarray, graph: Graph, edge_attr: np.ndarray
) -> None:
    """The gradient check flags ``conv``'s edge-feature gradient scaled by 1.01, and only it."""

    class Broken:
        forward = staticmethod(conv.forward)

        @staticmethod
        def backward(params: dict, cache: object, d_out: np.ndarray) -> tuple:
            (d_x, d_edge_attr), d_params = conv.backward(params, cache, d_out)
            return (d_x, d_edge_attr * 1.01), d_params

    report = check_gradients(Broken(), params, (x, graph, edge_attr))
    assert report.by_name()["input[2]"].max_rel_error > 1e-3
    assert report.by_name()["input[0]"].max_rel_error <= GRADCHECK_RTOL


@given(setup=setups(dropout=False))
def test_input_grad_false_skips_only_d_x(setup: Setup) -> None:
    conv, params, x, graph, edge_attr, _ = setup
    out, cache = conv.forward(params, x, graph, edge_attr)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_inputs, d_params = conv.backward(params, cache, d_out)
    d_inputs_skipped, d_params_skipped = conv.backward(params, cache, d_out, input_grad=False)
    if edge_attr is None:
        assert d_inputs_skipped is None
    else:
        assert d_inputs_skipped[0] is None
        np.testing.assert_array_equal(d_inputs_skipped[1], d_inputs[1])
    for name in params:
        np.testing.assert_array_equal(d_params_skipped[name], d_params[name])


# -- properties ------------------------------------------------------------------------------


@given(setup=setups(dropout=False))
def test_attention_over_incoming_edges_sums_to_one(setup: Setup) -> None:
    conv, params, x, graph, edge_attr, _ = setup
    _, cache = conv.forward(params, x, graph, edge_attr)
    sums = segment_sum(cache.alpha, graph.dst_segments(np))  # (N, H)
    has_incoming = graph.in_degree() > 0
    np.testing.assert_allclose(sums[has_incoming], 1.0, rtol=0, atol=1e-14)
    assert np.all(sums[~has_incoming] == 0)


@given(setup=setups(dropout=False), seed=seeds())
def test_reordering_edges_permutes_edge_quantities_only(setup: Setup, seed: int) -> None:
    conv, params, x, graph, edge_attr, _ = setup
    order = np.random.default_rng(seed).permutation(graph.num_edges)
    reordered = Graph(graph.edge_index[:, order], graph.num_nodes)
    edge_attr_reordered = None if edge_attr is None else edge_attr[order]
    out, cache = conv.forward(params, x, graph, edge_attr)
    out_r, cache_r = conv.forward(params, x, reordered, edge_attr_reordered)
    assert max_relative_error(out_r, out) <= RTOL64
    assert max_relative_error(cache_r.alpha, cache.alpha[order]) <= RTOL64
    d_out = np.random.default_rng(seed).standard_normal(out.shape)
    d_inputs, d_params = conv.backward(params, cache, d_out)
    d_inputs_r, d_params_r = conv.backward(params, cache_r, d_out)
    if edge_attr is None:
        d_inputs, d_inputs_r = (d_inputs,), (d_inputs_r,)
    else:
        d_inputs_r = (d_inputs_r[0], d_inputs_r[1][np.argsort(order)])
    errors = relative_errors(
        {**d_params_r, **{f"input{i}": d for i, d in enumerate(d_inputs_r)}},
        {**d_params, **{f"input{i}": d for i, d in enumerate(d_inputs)}},
    )
    assert max(errors.values()) <= RTOL64, errors


@given(setup=setups(lipschitz=False))
def test_key_bias_gets_no_gradient_without_lipschitz_norm(setup: Setup) -> None:
    # q_v . b_k shifts every score of target v by the same amount: the softmax ignores it.
    conv, params, x, graph, edge_attr, kwargs = setup
    assume(conv.bias)
    out, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    _, d_params = conv.backward(params, cache, np.random.default_rng(0).standard_normal(out.shape))
    scale = max(float(np.max(np.abs(d), initial=0.0)) for d in d_params.values())
    assert np.max(np.abs(d_params["b_k"])) <= 1e-13 * max(scale, 1.0)


@given(setup=setups(lipschitz=True), scale=st.sampled_from([1e-3, 0.5, 7.0, 1e4]))
def test_lipschitz_scores_are_bounded_and_scale_free(setup: Setup, scale: float) -> None:
    # LipschitzNorm Eq. 19: |g| <= 1, and g is homogeneous of degree 0 in (Q, K, V).
    conv, params, x, graph, edge_attr, _ = setup
    _, cache = conv.forward(params, x, graph, edge_attr)
    assert np.all(np.abs(cache.lipschitz.scores) <= 1.0)
    projections = {"W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_e"}
    scaled = {k: v * scale if k in projections else v for k, v in params.items()}
    _, cache_scaled = conv.forward(scaled, x, graph, edge_attr)
    assert max_relative_error(cache_scaled.alpha, cache.alpha) <= RTOL64


@given(setup=setups(dropout=False))
def test_one_head_concat_equals_mean(setup: Setup) -> None:
    conv, _, x, graph, edge_attr, _ = setup
    conv = replace(conv, heads=1, concat=True)
    params = conv.init_params(np.random.default_rng(0))
    out_concat, _ = conv.forward(params, x, graph, edge_attr)
    out_mean, _ = replace(conv, concat=False).forward(params, x, graph, edge_attr)
    np.testing.assert_array_equal(out_concat, out_mean)


# -- named edge cases ------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [False, True])
def test_node_without_incoming_edges_outputs_its_root_weight_only(beta: bool) -> None:
    graph = Graph(np.array([[0, 1, 2], [1, 0, 1]]), 4)  # nodes 2 and 3 have no incoming edge
    conv = TransformerConv(3, 2, heads=2, beta=beta, edge_dim=1, lipschitz_norm="paper")
    rng = np.random.default_rng(0)
    params = conv.init_params(rng)
    x = rng.standard_normal((4, 3))
    out, _ = conv.forward(params, x, graph, rng.standard_normal((3, 1)))
    skip = x[2:] @ params["W_skip"].T + params["b_skip"]  # (2, F)
    if beta:  # the aggregate is 0: b = sigmoid(w_beta . [0, x_r, -x_r])
        z = np.concatenate([0 * skip, skip, -skip], axis=1) @ params["w_beta"].T
        skip = skip / (1 + np.exp(-z))
    np.testing.assert_allclose(out[2:], skip, rtol=1e-15, atol=0)
    no_root = replace(conv, beta=False, root_weight=False)
    out, _ = no_root.forward(no_root.init_params(rng), x, graph, rng.standard_normal((3, 1)))
    assert np.all(out[2:] == 0)


def test_one_node() -> None:
    conv = TransformerConv(2, 3, heads=2)
    params = conv.init_params(np.random.default_rng(0))
    x = np.array([[0.7, -1.1]])
    skip = x @ params["W_skip"].T + params["b_skip"]
    # no edge: the root weight alone; one self-loop: alpha = 1, the node's own value
    out, cache = conv.forward(params, x, Graph(np.zeros((2, 0), dtype=np.int64), 1))
    np.testing.assert_array_equal(out, skip)
    out, cache = conv.forward(params, x, Graph(np.array([[0], [0]]), 1))
    np.testing.assert_array_equal(cache.alpha, np.ones((1, 2)))
    value = x @ params["W_v"].T + params["b_v"]
    np.testing.assert_allclose(out, value + skip, rtol=1e-15, atol=1e-15)


def test_one_head_one_channel_matches_the_formula() -> None:
    # H = C = 1: scalars, s_uv = q_v k_uv / sqrt(1), out_v = sum alpha val + x_r.
    graph = Graph(np.array([[0, 2, 1, 1], [1, 1, 2, 2]]), 3)  # duplicate 1 -> 2
    conv = TransformerConv(1, 1, edge_dim=1)
    params = {k: np.array(v) for k, v in conv.init_params(np.random.default_rng(0)).items()}
    x = np.array([[0.3], [-1.2], [2.0]])
    edge_attr = np.array([[0.5], [-0.25], [1.0], [-2.0]])
    out, _ = conv.forward(params, x, graph, edge_attr)

    def lin(name: str, value: float) -> float:
        return float(params[f"W_{name}"][0, 0] * value + params[f"b_{name}"][0])

    q = [lin("q", xi) for xi in x[:, 0]]
    ef = [float(params["W_e"][0, 0] * e) for e in edge_attr[:, 0]]
    expected = np.array([lin("skip", xi) for xi in x[:, 0]])
    for v in range(3):
        incoming = [e for e in range(4) if graph.edge_index[1, e] == v]
        scores = [q[v] * (lin("k", x[graph.edge_index[0, e], 0]) + ef[e]) for e in incoming]
        weights = np.exp(np.array(scores) - max(scores, default=0))
        for e, weight in zip(incoming, weights, strict=True):
            expected[v] += weight / weights.sum() * (lin("v", x[graph.edge_index[0, e], 0]) + ef[e])
    np.testing.assert_allclose(out[:, 0], expected, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("lipschitz_norm", [None, "paper"])
def test_equal_scores_give_uniform_attention_exactly(lipschitz_norm: str | None) -> None:
    # A zero query makes every score 0 (with LipschitzNorm D = a w > 0 still).
    graph = Graph(np.array([[0, 1, 2, 2, 3, 3], [1, 1, 1, 0, 0, 0]]), 4)  # duplicate 3 -> 0
    conv = TransformerConv(3, 2, heads=2, edge_dim=2, lipschitz_norm=lipschitz_norm)
    rng = np.random.default_rng(0)
    params = conv.init_params(rng)
    params["W_q"][:], params["b_q"][:] = 0.0, 0.0
    _, cache = conv.forward(params, rng.standard_normal((4, 3)), graph, rng.standard_normal((6, 2)))
    degree = graph.in_degree()[graph.edge_index[1]]  # (E,)
    np.testing.assert_array_equal(cache.alpha, np.repeat(1.0 / degree[:, None], 2, axis=1))
    if lipschitz_norm:
        assert np.all(cache.lipschitz.nonzero[[0, 1]])


@pytest.mark.parametrize("lipschitz_norm", [None, "paper"])
@pytest.mark.parametrize("scale", [1e3, -1e3])
def test_extreme_scores_stay_finite(lipschitz_norm: str | None, scale: float) -> None:
    graph = Graph(np.array([[0, 1, 2, 3, 0], [1, 2, 3, 1, 1]]), 4)
    conv = TransformerConv(2, 2, heads=2, lipschitz_norm=lipschitz_norm)
    rng = np.random.default_rng(0)
    params = conv.init_params(rng)
    params = {k: v * abs(scale) if k in ("W_q", "W_k") else v for k, v in params.items()}
    x = rng.standard_normal((4, 2)) * np.sign(scale)
    with np.errstate(divide="raise", over="raise", invalid="raise"):
        out, cache = conv.forward(params, x, graph)
        d_x, d_params = conv.backward(params, cache, np.ones_like(out))
    assert np.isfinite(out).all() and np.isfinite(d_x).all()
    assert all(np.isfinite(v).all() for v in d_params.values())
    if lipschitz_norm is None:
        assert np.max(cache.alpha) > 1 - 1e-12  # saturated: the test reached the extreme
    sums = segment_sum(cache.alpha, graph.dst_segments(np))
    np.testing.assert_allclose(sums[graph.in_degree() > 0], 1.0, atol=1e-15)


@pytest.mark.parametrize("zeros", [("q", "k"), ("q", "v"), ("k", "v")])
def test_zero_denominator_gives_zero_scores_and_no_gradient_through_it(zeros: tuple) -> None:
    # D = max{ua, uw, aw} = 0 when two of u = ||q_v||, a = max ||k_uv||, w = max ||val_uv||
    # vanish. The score is 0 (uniform attention), nothing divides by zero, and the gradient
    # through the score vanishes; so finite differences agree even there (module docstring).
    graph = Graph(np.array([[0, 1, 2, 2, 3], [1, 1, 1, 0, 0]]), 4)
    conv = TransformerConv(3, 2, heads=2, lipschitz_norm="paper")
    rng = np.random.default_rng(2)
    params = conv.init_params(rng)
    for name in zeros:
        params[f"W_{name}"][:], params[f"b_{name}"][:] = 0.0, 0.0
    x = rng.standard_normal((4, 3))
    with np.errstate(divide="raise", over="raise", invalid="raise"):
        out, cache = conv.forward(params, x, graph)
        d_out = rng.standard_normal(out.shape)
        _, d_params = conv.backward(params, cache, d_out)
    targets = [0, 1]
    assert not cache.lipschitz.nonzero[targets].any()
    assert np.all(cache.lipschitz.scores == 0) and np.all(conv.score_vectors(cache) == 0)
    degree = graph.in_degree()[graph.edge_index[1]]
    np.testing.assert_array_equal(cache.alpha, np.repeat(1.0 / degree[:, None], 2, axis=1))
    assert np.all(d_params["W_q"] == 0) and np.all(d_params["W_k"] == 0)
    report = check_gradients(conv, params, (x, graph), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def _gradients(conv: TransformerConv, params: dict, inputs: tuple, seed: int = 0) -> dict:
    out, cache = conv.forward(params, *inputs)
    d_inputs, d_params = conv.backward(
        params, cache, np.random.default_rng(seed).standard_normal(out.shape)
    )
    d_inputs = d_inputs if isinstance(d_inputs, tuple) else (d_inputs,)
    return {**d_params, **{f"input{i}": d for i, d in enumerate(d_inputs)}}


def test_tie_in_the_three_products_uses_the_first() -> None:
    # Keys = values (W_v = W_k) ties a = w, so ua = uw; a long query makes them the maximum.
    # The gradient goes to u and a (product 0): it is the limit from the side where ua wins
    # strictly, and not the one from the side where uw does.
    graph = Graph(np.array([[0, 1, 2, 3, 3], [1, 2, 1, 1, 0]]), 4)
    conv = TransformerConv(3, 2, heads=2, lipschitz_norm="paper")
    rng = np.random.default_rng(4)
    params = conv.init_params(rng)
    params["W_q"] *= 50.0
    params["W_v"], params["b_v"] = params["W_k"].copy(), params["b_k"].copy()
    x = rng.standard_normal((4, 3))
    _, cache = conv.forward(params, x, graph)
    has_incoming = graph.in_degree() > 0
    assert np.all(cache.lipschitz.branch[has_incoming] == 0)
    u, a, w = cache.lipschitz.norms
    assert np.array_equal(a, w) and np.all((u > a)[has_incoming])

    at_tie = _gradients(conv, params, (x, graph))
    sides = {}
    for side, factor in (("ua wins", 1 - 1e-9), ("uw wins", 1 + 1e-9)):
        moved = {**params, "W_v": params["W_v"] * factor, "b_v": params["b_v"] * factor}
        sides[side] = _gradients(conv, moved, (x, graph))
    assert max(relative_errors(at_tie, sides["ua wins"]).values()) <= 1e-6
    assert max(relative_errors(at_tie, sides["uw wins"]).values()) > 1e-3


def test_tie_in_a_neighbourhood_maximum_uses_the_lowest_edge() -> None:
    # Two copies of the edge 0 -> 1 with equal features have equal keys k_0 + W_e e: a tie
    # in a = max ||k_uv||. Long queries and keys make D = u a; its gradient reaches the lower
    # edge only: the limit from the side where that edge's key is strictly the longest (one
    # head, so that one direction lengthens the key of every head).
    graph = Graph(np.array([[2, 0, 3, 0], [1, 1, 1, 1]]), 4)  # edges 1 and 3 duplicate
    conv = TransformerConv(3, 2, heads=1, edge_dim=2, lipschitz_norm="paper")
    rng = np.random.default_rng(6)
    params = conv.init_params(rng)
    params["W_q"] *= 50.0
    params["W_k"] *= 10.0
    params["W_v"] *= 0.01
    params["b_v"] *= 0.01
    x = rng.standard_normal((4, 3))
    x[[2, 3]] *= 0.1  # the other sources: shorter keys
    edge_attr = rng.standard_normal((4, 2))
    edge_attr[3] = edge_attr[1]
    _, cache = conv.forward(params, x, graph, edge_attr)
    assert cache.lipschitz.branch[1, 0] == 0 and cache.lipschitz.key_argmax[1, 0] == 1
    key_norms = cache.lipschitz.key_norms[:, 0]
    assert key_norms[1] == key_norms[3] > max(key_norms[0], key_norms[2])

    at_tie = _gradients(conv, params, (x, graph, edge_attr))
    key = x[0] @ params["W_k"].T + params["b_k"] + params["W_e"] @ edge_attr[1]  # (C,)
    longer = params["W_e"].T @ key  # d||k|| / de, up to a positive factor
    sides = {}
    for winner in (1, 3):
        moved = edge_attr.copy()
        moved[winner] += 1e-9 * longer / np.linalg.norm(longer)
        sides[winner] = _gradients(conv, params, (x, graph, moved))
    assert max(relative_errors(at_tie, sides[1]).values()) <= 1e-6
    # the two sides differ in which duplicate's features receive the gradient through D
    assert max_relative_error(at_tie["input1"], sides[3]["input1"]) > 1e-3  # measured 1.7e-2


def test_drawn_dropout_mask_is_reproducible_and_returned() -> None:
    graph = Graph(np.array([[0, 1, 2, 0], [1, 2, 0, 2]]), 3)
    conv = TransformerConv(2, 2, heads=3, dropout=0.5)
    params = conv.init_params(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((3, 2))
    out_a, cache_a = conv.forward(params, x, graph, training=True, rng=np.random.default_rng(7))
    out_b, _ = conv.forward(params, x, graph, training=True, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(out_a, out_b)
    keep = cache_a.dropout_cache.mask
    out_c, _ = conv.forward(params, x, graph, training=True, attn_dropout_mask=keep)
    np.testing.assert_array_equal(out_a, out_c)
    out_eval, cache_eval = conv.forward(params, x, graph)
    assert not np.array_equal(out_a, out_eval)
    np.testing.assert_array_equal(cache_a.alpha, cache_eval.alpha)  # alpha is before dropout


def test_init_params_follow_pyg_linear_reset() -> None:
    conv = TransformerConv(16, 8, heads=4, beta=True, edge_dim=9)
    params = conv.init_params(np.random.default_rng(0))
    fan_in = {"W_e": 9, "w_beta": 3 * 32}
    for name, value in params.items():
        bound = 1 / math.sqrt(fan_in.get(name, 16))
        assert np.all(np.abs(value) <= bound), name
        assert np.abs(value).max() > 0.8 * bound, name  # uniform over the whole interval
    assert list(params) == list(conv.param_shapes())


# -- device backends: the strict stand-in (no stray NumPy in the math), CuPy if installed ----


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@given(setup=setups())
def test_device_backend_matches_numpy(backend: str, setup: Setup) -> None:
    conv, params, x, graph, edge_attr, kwargs = setup
    out, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_inputs, d_params = conv.backward(params, cache, d_out)
    d_inputs = d_inputs if isinstance(d_inputs, tuple) else (d_inputs,)

    def move(value: Any) -> Any:
        return asarray(value, backend=backend) if isinstance(value, np.ndarray) else value

    out_d, cache_d = conv.forward(
        {k: move(v) for k, v in params.items()},
        move(x),
        graph,
        move(edge_attr),
        **{k: move(v) for k, v in kwargs.items()},
    )
    assert not isinstance(out_d, np.ndarray)
    assert not isinstance(conv.score_vectors(cache_d), np.ndarray)
    d_inputs_d, d_params_d = conv.backward(
        {k: move(v) for k, v in params.items()}, cache_d, move(d_out)
    )
    d_inputs_d = d_inputs_d if isinstance(d_inputs_d, tuple) else (d_inputs_d,)
    assert max_relative_error(to_numpy(out_d), out) <= RTOL64
    errors = relative_errors(
        {**d_params_d, **{f"input{i}": d for i, d in enumerate(d_inputs_d)}},
        {**d_params, **{f"input{i}": d for i, d in enumerate(d_inputs)}},
    )
    assert max(errors.values()) <= RTOL64, errors


def test_float32_stays_float32() -> None:
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    for lipschitz_norm in (None, "paper"):
        conv = TransformerConv(4, 2, heads=2, beta=True, edge_dim=3, lipschitz_norm=lipschitz_norm)
        params = conv.init_params(np.random.default_rng(0), dtype=np.float32)
        x, edge_attr = np.ones((3, 4), dtype=np.float32), np.ones((3, 3), dtype=np.float32)
        out, cache = conv.forward(params, x, graph, edge_attr)
        (d_x, d_edge_attr), d_params = conv.backward(params, cache, np.ones_like(out))
        assert out.dtype == d_x.dtype == d_edge_attr.dtype == np.float32
        assert conv.score_vectors(cache).dtype == np.float32
        assert all(v.dtype == np.float32 for v in d_params.values())


# -- bad input -----------------------------------------------------------------------------


def _layer(edge_dim: int | None = 2) -> tuple[TransformerConv, dict, np.ndarray, Graph, Any]:
    conv = TransformerConv(3, 2, heads=2, edge_dim=edge_dim)
    edge_attr = None if edge_dim is None else np.ones((3, edge_dim))
    return (
        conv,
        conv.init_params(np.random.default_rng(0)),
        np.ones((4, 3)),
        Graph(np.array([[0, 1, 2], [1, 2, 3]]), 4),
        edge_attr,
    )


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda p, x, g, e: (p, np.ones((4, 5)), g, e), ValueError, r"x must have shape \(\*, 3\)"),
        (lambda p, x, g, e: (p, np.ones((5, 3)), g, e), ValueError, "x has 5 rows but the graph"),
        (lambda p, x, g, e: (p, x * np.nan, g, e), ValueError, "NaN or infinity"),
        (lambda p, x, g, e: (p, x.astype(np.float32), g, e), TypeError, "x has dtype float32"),
        (lambda p, x, g, e: (p, x.tolist(), g, e), TypeError, "x must be an array"),
        (lambda p, x, g, e: (p, x, g.edge_index, e), TypeError, "graph must be a refimpl.Graph"),
        (
            lambda p, x, g, e: ({k: v for k, v in p.items() if k != "W_e"}, x, g, e),
            ValueError,
            r"missing \['W_e'\]",
        ),
        (lambda p, x, g, e: ({**p, "att": p["W_q"]}, x, g, e), ValueError, r"unexpected \['att'\]"),
        (
            lambda p, x, g, e: ({**p, "W_q": p["W_q"].T}, x, g, e),
            ValueError,
            r"params\['W_q'\] must have shape",
        ),
        (
            lambda p, x, g, e: (p, x, g, None),
            ValueError,
            r"edge_dim=2 and needs edge_attr.*\(3, 2\)",
        ),
        (
            lambda p, x, g, e: (p, x, g, np.ones((4, 2))),
            ValueError,
            r"edge_attr must have shape \(3, 2\)",
        ),
        (lambda p, x, g, e: (p, x, g, np.ones((3, 1))), ValueError, r"edge_attr must have shape"),
        (lambda p, x, g, e: (p, x, g, e * np.inf), ValueError, "edge_attr contains NaN"),
        (lambda p, x, g, e: (p, x, g, e.astype(np.float32)), TypeError, "cast edge_attr"),
        (lambda p, x, g, e: (p, x, g, e.astype(int)), TypeError, "floating-point"),
    ],
)
def test_bad_input_gives_a_clear_error(mutate: Any, error: type, match: str) -> None:
    conv, params, x, graph, edge_attr = _layer()
    params, x, graph, edge_attr = mutate(params, x, graph, edge_attr)
    with pytest.raises(error, match=match):
        conv.forward(params, x, graph, edge_attr)


def test_edge_attr_without_edge_dim_is_refused() -> None:
    conv, params, x, graph, _ = _layer(edge_dim=None)
    with pytest.raises(ValueError, match=r"edge_dim=None; construct it with edge_dim="):
        conv.forward(params, x, graph, np.ones((3, 2)))


def test_bad_upstream_gradient_and_dropout_mask() -> None:
    conv, params, x, graph, edge_attr = _layer()
    _, cache = conv.forward(params, x, graph, edge_attr)
    with pytest.raises(ValueError, match=r"d_out must be an array of the output's shape \(4, 4\)"):
        conv.backward(params, cache, np.ones((4, 2)))
    with pytest.raises(TypeError, match="d_out has dtype float32"):
        conv.backward(params, cache, np.ones((4, 4), dtype=np.float32))
    dropping = replace(conv, dropout=0.5)
    with pytest.raises(ValueError, match="rng"):
        dropping.forward(params, x, graph, edge_attr, training=True)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 2\)"):
        dropping.forward(
            params, x, graph, edge_attr, training=True, attn_dropout_mask=np.ones((2, 2), bool)
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heads": 0}, "heads must be a positive int"),
        ({"out_channels": 2.5}, "out_channels must be a positive int"),
        ({"edge_dim": 0}, "edge_dim must be a positive int"),
        ({"dropout": 1.0}, r"dropout must be a probability in \[0, 1\)"),
        ({"lipschitz_norm": "reference-code"}, "lipschitz_norm must be None or 'paper'"),
        ({"beta": True, "root_weight": False}, "beta=True .* needs root_weight=True"),
    ],
)
def test_bad_configuration(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TransformerConv(**{"in_channels": 3, "out_channels": 2, **kwargs})
