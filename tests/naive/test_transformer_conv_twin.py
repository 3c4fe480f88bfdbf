"""TransformerConv against its literal twin (refimpl.naive.transformer_conv): the output, the
attention coefficients and every gradient (x, edge_attr, each parameter) within TWIN_RTOL, with a
random cotangent, over every configuration (heads concat/mean, beta, bias, root weight, edge
features, LipschitzNorm, attention dropout) on drawn graphs."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
from hypothesis import assume, example, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.naive.transformer_conv import (
    Steps,
    transformer_conv_backward,
    transformer_conv_forward,
    transformer_conv_steps,
)
from refimpl.nn.transformer.transformer_conv import TransformerConv
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import TWIN_RTOL

# A coefficient below this in the one target that carries the queries' and keys' gradients
# amplifies their rounding by about its inverse; so do keys this close (relative) to each
# other (see scores_carry_signal).
MIN_ALPHA = 1e-3
MIN_KEY_SPREAD = 1e-2


class Case(NamedTuple):
    """A configured layer, float64 parameters and inputs, a keep-mask (or None), a cotangent."""

    conv: TransformerConv
    params: dict
    x: np.ndarray
    graph: Graph
    edge_attr: np.ndarray | None
    keep: np.ndarray | None  # (E, H) attention-dropout keep-mask, training only
    d_out: np.ndarray


def make_case(
    conv: TransformerConv, graph: Graph, seed: int, dropout: bool = False, scale: float = 2.0
) -> Case:
    """Values for ``conv`` on ``graph`` from ``seed``; ``dropout``: p = 0.4 with a drawn mask."""
    rng = np.random.default_rng(seed)
    # Scaled up (PyG's init gives |w| <= 1/sqrt(fan_in)) so that softmaxes are far from uniform.
    params = {k: scale * v for k, v in conv.init_params(rng).items()}
    x = rng.standard_normal((graph.num_nodes, conv.in_channels))
    edge_attr = None
    if conv.edge_dim is not None:
        edge_attr = rng.standard_normal((graph.num_edges, conv.edge_dim))
    keep = None
    if dropout:
        conv = replace(conv, dropout=0.4)
        keep = rng.random((graph.num_edges, conv.heads)) >= 0.4
    width = conv.heads * conv.out_channels if conv.concat else conv.out_channels
    return Case(
        conv, params, x, graph, edge_attr, keep, rng.standard_normal((graph.num_nodes, width))
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    root_weight, lipschitz = draw(st.booleans()), draw(st.booleans())
    conv = TransformerConv(
        in_channels=draw(st.integers(1, 4)),
        # one channel with LipschitzNorm zeroes the queries' gradients by cancellation (see
        # test_lipschitz_norm_with_one_channel_ignores_the_query_scale), so two or more there
        out_channels=draw(st.integers(2 if lipschitz else 1, 3)),
        heads=draw(st.integers(1, 3)),
        concat=draw(st.booleans()),
        beta=root_weight and draw(st.booleans()),
        bias=draw(st.booleans()),
        root_weight=root_weight,
        edge_dim=draw(st.sampled_from([None, 1, 2, 3])),
        lipschitz_norm="paper" if lipschitz else None,
    )
    return make_case(conv, draw(graphs()), draw(seeds()), dropout=draw(st.booleans()))


def run_both(case: Case) -> tuple[dict, dict]:
    """Production's and the twin's output, coefficients and gradients, keyed alike."""
    conv, params, x, graph, edge_attr, keep, d_out = case
    kwargs = {} if keep is None else {"training": True, "attn_dropout_mask": keep}
    out, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    d_inputs, d_params = conv.backward(params, cache, d_out)
    twin_out, twin_alpha, _ = transformer_conv_forward(
        conv, params, x, graph.edge_index, edge_attr, keep
    )
    twin_inputs, twin_params = transformer_conv_backward(
        conv, params, x, graph.edge_index, d_out, edge_attr, keep
    )
    actual = {"out": out, "alpha": conv.attention_weights(cache)[1]}
    expected = {"out": twin_out, "alpha": twin_alpha}
    for grads, into in ((d_inputs, actual), (twin_inputs, expected)):
        d_x, d_edge_attr = grads if conv.edge_dim is not None else (grads, None)
        into["d_x"] = d_x
        if d_edge_attr is not None:
            into["d_edge_attr"] = d_edge_attr
    assert list(d_params) == list(params) and list(twin_params) == list(params)
    actual.update({f"d_{k}": v for k, v in d_params.items()})
    expected.update({f"d_{k}": v for k, v in twin_params.items()})
    return actual, expected


def twin_errors(case: Case, actual: dict, expected: dict) -> dict[str, float]:
    """Each tensor's error relative to its own largest entry; ``d_b_k``, where it is zero by
    cancellation, relative to the largest gradient entry of all.

    ``q_v . b_k`` shifts every score into ``v`` alike and the softmax ignores shifts, so the
    raw scores give ``d_b_k = sum_v q_v sum_{e into v} d_s_e = 0``, computed by both as the
    rounding noise of the O(1) terms that cancel. Only LipschitzNorm's ``D_v`` can make it
    nonzero, through ``a`` (the longest key), where ``D_v``'s product holds ``a`` and the
    target's score gradients are not all zero. Elsewhere, judged against itself, noise would
    be compared with noise; it is judged on the scale of the terms, as
    :func:`refimpl.testing.relative_errors` does for tensors zero by cancellation.
    """
    errors = {name: max_relative_error(actual[name], expected[name]) for name in expected}
    if "d_b_k" in expected and not key_bias_reaches_a_divisor(case):
        grads = [name for name in expected if name.startswith("d_")]
        overall = relative_errors({k: actual[k] for k in grads}, {k: expected[k] for k in grads})
        errors["d_b_k"] = overall["d_b_k"]
    return errors


def key_bias_reaches_a_divisor(case: Case) -> bool:
    """Whether some ``D_v`` (LipschitzNorm) holds ``a`` (branch ua or aw) at a target that
    hears from two sources and keeps an edge in that head (else the scores into it, or their
    gradients, are all alike)."""
    steps = twin_steps(case)
    if steps.lipschitz is None:
        return False
    return any(
        choice[3] in (0, 2) and two_sources(case, v) and kept(case, v, h)
        for (v, h), choice in steps.lipschitz.items()
    )


def twin_steps(case: Case) -> Steps:
    """The twin's forward intermediates (F1-F11) for the case."""
    conv, graph = case.conv, case.graph
    _, steps = transformer_conv_steps(
        conv, case.params, case.x, graph.edge_index, case.edge_attr, case.keep
    )
    return steps


def two_sources(case: Case, v: int) -> bool:
    """Whether ``v`` hears from two different sources."""
    src, dst = case.graph.edge_index
    return len(set(src[dst == v].tolist())) > 1


def key_spread(keys: np.ndarray) -> float:
    """``max |k_e - k_e'| / max |k_e|`` over one target's keys ``(k, C)`` in one head."""
    differences = keys[:, None, :] - keys[None, :, :]  # (k, k, C)
    return float(np.abs(differences).max() / max(np.abs(keys).max(), 1e-300))


def kept(case: Case, v: int, h: int) -> bool:
    """Whether some edge into ``v`` is kept by attention dropout in head ``h``."""
    dst = case.graph.edge_index[1]
    return case.keep is None or bool(case.keep[dst == v, h].any())


def scores_carry_signal(case: Case) -> bool:
    """False where the gradients of the queries and keys are rounding noise on both sides, or
    made by a cancellation that amplifies rounding.

    The score gradients into a target sum to zero over its incoming edges (the softmax
    ignores shifts). So ``d_q_v = sum_e d_raw_e k_e`` is zero when all keys into ``v`` are
    equal, and ``d_k_u = sum_v q_v sum_{e: u -> v} d_raw_e`` when ``v`` hears from ``u``
    alone: both are then computed as the noise of the terms that cancel (duplicate edges,
    self-loops; edge features make the keys differ, not the sources). They are exactly zero
    on both sides when no target with two or more edges keeps one (alpha = 1, or nothing
    kept). Between the two, a target whose softmax is saturated (some ``alpha_e`` near 0)
    gives ``d_k`` of the size of that ``alpha_e`` out of O(1) terms, so its rounding grows
    as ``1 / alpha_e``. So ``d_W_q``, ``d_b_q`` and ``d_W_k`` are compared relatively only
    when some target hears from two sources, keeps an edge and has no coefficient below
    ``MIN_ALPHA`` in that head (or when they are exact zeros); the drawn examples keep away
    from the rest.
    """
    dst = case.graph.edge_index[1]
    steps = twin_steps(case)
    into, heads = range(case.graph.num_nodes), range(case.conv.heads)
    signal = any(
        two_sources(case, v)
        and kept(case, v, h)
        and steps.alpha[dst == v, h].min() >= MIN_ALPHA
        and key_spread(steps.k_edges[dst == v, h]) >= MIN_KEY_SPREAD
        for v in into
        for h in heads
    )
    noise = any(np.sum(dst == v) > 1 and kept(case, v, h) for v in into for h in heads)
    return signal or not noise


# -- against the twin -----------------------------------------------------------------------------


@given(case=cases())
@example(  # one node, no edge (E = 0): every per-edge step is empty
    case=make_case(
        TransformerConv(2, 2, heads=2, beta=True, edge_dim=2, lipschitz_norm="paper"),
        Graph(np.zeros((2, 0), dtype=np.int64), 1),
        seed=5,
    )
)
def test_matches_the_twin(case: Case) -> None:
    assume(scores_carry_signal(case))  # else d_W_q, d_b_q, d_W_k are noise on both sides
    actual, expected = run_both(case)
    errors = twin_errors(case, actual, expected)
    assert max(errors.values()) <= TWIN_RTOL, errors


def assert_matches_the_twin(case: Case) -> dict:
    """Production against the twin, every tensor within TWIN_RTOL; the twin's tensors."""
    actual, expected = run_both(case)
    errors = twin_errors(case, actual, expected)
    assert max(errors.values()) <= TWIN_RTOL, errors
    return expected


# -- named edge cases ------------------------------------------------------------------------------

# 0 -> 1, 2 -> 1, 3 -> 1 (the last twice), 1 -> 2, a self-loop on 2; node 0 has no incoming edge
EDGES = np.array([[0, 2, 3, 3, 1, 2], [1, 1, 1, 1, 2, 2]])


def test_an_isolated_target_aggregates_to_zero_and_sends_gradients() -> None:
    # Node 0 has no incoming edge: its messages are 0, so without a root weight its output is
    # 0; it still sends keys and values to node 1, so it gets a gradient.
    for lipschitz in (None, "paper"):
        conv = TransformerConv(3, 2, heads=2, root_weight=False, lipschitz_norm=lipschitz)
        case = make_case(conv, Graph(EDGES, 4), seed=11)
        out, _, _ = transformer_conv_forward(conv, case.params, case.x, EDGES)
        np.testing.assert_array_equal(out[[0, 3]], np.zeros((2, 4)))
        expected = assert_matches_the_twin(case)
        assert np.all(expected["d_x"][0] != 0)


def test_all_scores_equal_give_uniform_attention() -> None:
    # W_q = 0 and no bias: every query is 0, so every score is 0 and each target's softmax is
    # uniform (ties everywhere), with and without LipschitzNorm (D_v = a w there, the query's
    # norm u being 0: the zero subgradient of a norm at 0 for d_q through D).
    for lipschitz in (None, "paper"):
        conv = TransformerConv(3, 2, heads=2, bias=False, edge_dim=2, lipschitz_norm=lipschitz)
        case = make_case(conv, Graph(EDGES, 4), seed=12)
        case.params["W_q"] = np.zeros_like(case.params["W_q"])
        _, alpha, _ = transformer_conv_forward(conv, case.params, case.x, EDGES, case.edge_attr)
        np.testing.assert_allclose(alpha[:4], 0.25, rtol=1e-15)  # four edges into node 1
        np.testing.assert_allclose(alpha[4:], 0.5, rtol=1e-15)  # two into node 2
        assert_matches_the_twin(case)


def test_lipschitz_ties_route_through_the_lowest_edge() -> None:
    # The duplicate edge 3 -> 1 (no edge features) gives two keys and values of exactly equal
    # norms; scaled up, they are the longest into node 1, so a and w are attained twice and
    # the gradient through D goes to the lower edge (2), as production's segment_max.
    conv = TransformerConv(3, 2, heads=1, lipschitz_norm="paper")
    case = make_case(conv, Graph(EDGES, 4), seed=13)
    case.x[3] *= 10.0
    steps = twin_steps(case)
    _, a, w, _, key_edge, value_edge = steps.lipschitz[1, 0]
    assert (key_edge, value_edge) == (2, 2)
    assert np.linalg.norm(steps.k_edges[3, 0]) == a and np.linalg.norm(steps.val_edges[3, 0]) == w
    assert_matches_the_twin(case)


def test_a_vanished_lipschitz_divisor_divides_by_one() -> None:
    # x = 0 and no biases: every query, key and value is 0, so D_v = 0 for every target; the
    # scores are 0 (uniform attention) and no gradient flows through D. d_x still gets the
    # values' and the root weight's gradients.
    conv = TransformerConv(3, 2, heads=2, bias=False, beta=True, lipschitz_norm="paper")
    case = make_case(conv, Graph(EDGES, 4), seed=14)._replace(x=np.zeros((4, 3)))
    steps = twin_steps(case)
    assert steps.lipschitz == {}
    np.testing.assert_array_equal(steps.divisor, np.ones((4, 2)))
    expected = assert_matches_the_twin(case)
    assert np.abs(expected["d_x"]).max() > 0


def test_one_node_with_self_loops_only() -> None:
    # A single node with a duplicated self-loop: each copy gets alpha = 1/2, and every query
    # and key gradient cancels (exact zeros would be judged against noise, so only the
    # values' side is compared here; see scores_carry_signal).
    conv = TransformerConv(2, 3, heads=2, concat=False)
    case = make_case(conv, Graph(np.array([[0, 0], [0, 0]]), 1), seed=15)
    actual, expected = run_both(case)
    np.testing.assert_allclose(expected["alpha"], 0.5, rtol=1e-15)
    for name in ("out", "alpha", "d_x", "d_W_v", "d_b_v", "d_W_skip", "d_b_skip"):
        assert max_relative_error(actual[name], expected[name]) <= TWIN_RTOL, name


def test_lipschitz_norm_with_one_channel_ignores_the_query_scale() -> None:
    # With C = 1 and D_v = u a or u w, s_uv = q_v k_uv / (|q_v| a) = sign(q_v) k_uv / a does
    # not depend on |q_v|: d_q = 0 up to rounding, on both sides (why the drawn examples take
    # C >= 2 with LipschitzNorm). Long queries make u the largest norm, so D holds u; the
    # vanishing gradients are judged on the scale of all gradients.
    conv = TransformerConv(3, 1, heads=2, lipschitz_norm="paper")
    case = make_case(conv, Graph(EDGES, 4), seed=17)
    case.params["W_q"] *= 10.0
    case.params["b_q"] *= 10.0
    assert all(choice[3] in (0, 1) for choice in twin_steps(case).lipschitz.values())
    actual, expected = run_both(case)
    grads = [name for name in expected if name.startswith("d_")]
    scale = max(np.abs(expected[k]).max() for k in grads)
    for name in ("d_W_q", "d_b_q"):
        assert np.abs(expected[name]).max() <= 1e-14 * scale
        assert np.abs(actual[name]).max() <= 1e-14 * scale
    overall = relative_errors({k: actual[k] for k in grads}, {k: expected[k] for k in grads})
    assert max(overall.values()) <= TWIN_RTOL, overall


# -- the comparison has teeth ----------------------------------------------------------------------


def test_a_gradient_off_by_one_part_in_a_billion_fails_the_twin_check() -> None:
    conv = TransformerConv(3, 2, heads=2, beta=True, edge_dim=2, lipschitz_norm="paper")
    case = make_case(conv, Graph(EDGES, 4), seed=17, dropout=True)
    actual, expected = run_both(case)
    assert max(twin_errors(case, actual, expected).values()) <= TWIN_RTOL
    for name in ("d_x", "d_edge_attr", "d_W_k", "d_w_beta"):
        off = dict(expected, **{name: expected[name] * (1 + 1e-9)})
        assert twin_errors(case, actual, off)[name] > TWIN_RTOL, name
