"""NodeFormerConv and its edge loss (NodeFormer Eq. 4-12, Alg. 1): finite differences, a dense
reference, convergence to the exact softmax layer as m grows, the relational bias as dense matrix
powers, noise replay and draw order, evaluation mode, the strict backend, bad input."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.nn.attention_common import project, project_backward
from refimpl.nn.nodeformer import kernel_attention, random_features
from refimpl.nn.nodeformer.all_pair_softmax import AllPairSoftmax
from refimpl.nn.nodeformer.conv import NodeFormerConv
from refimpl.nn.nodeformer.edge_loss import NodeFormerEdgeLoss
from refimpl.nn.nodeformer.random_features import (
    PositiveRandomFeatures,
    draw_gumbel,
    draw_projection,
)
from refimpl.nn.nodeformer.relational_bias import Operator, apply_operator, power_graphs
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from tests.backends import DEVICE_BACKENDS

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
# the dense references multiply unshifted features, ours shifts exponents first (as in
# test_kernel_attention): rounding of exponents of size ~|q|^2 / tau
KERNEL_RTOL = 1e2 * RTOL64


def make_params(conv: NodeFormerConv, rng: np.random.Generator) -> dict[str, Any]:
    """Glorot weights, and random (not the initial constant) biases and b_rel."""
    params = conv.init_params(rng)
    return {
        name: value if name.startswith("W_") else value + rng.standard_normal(value.shape)
        for name, value in params.items()
    }


@st.composite
def setups(draw: st.DrawFn, min_nodes: int = 1) -> tuple:
    """A configured layer, float64 params, features, a graph and forward kwargs with the noise
    fixed (drawn once from a seeded generator, then passed as ``noise=``)."""
    graph = draw(graphs(min_nodes=min_nodes, max_nodes=6, max_edges=10))
    relational_bias = draw(st.sampled_from([None, "sigmoid", "identity"]))
    conv = NodeFormerConv(
        in_channels=draw(st.integers(1, 3)),
        out_channels=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 3)),
        num_random_features=draw(st.integers(1, 6)),
        tau=draw(st.sampled_from([0.25, 1.0])),
        num_samples=draw(st.integers(1, 3)),
        use_gumbel=draw(st.booleans()),
        relational_bias=relational_bias,
        rb_order=draw(st.integers(1, 2)),
        rb_powers=draw(st.sampled_from(["paper", "authors"])),
        qk_scale=draw(st.sampled_from(["paper", "sqrt_d"])),
        projection=draw(st.sampled_from(["orthogonal", "iid"])),
        bias=draw(st.booleans()),
        add_self_loops=draw(st.booleans()),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = make_params(conv, rng)
    x = 0.8 * rng.standard_normal((graph.num_nodes, conv.in_channels))
    training = draw(st.booleans())
    _, cache = conv.forward(params, x, graph, training=training, rng=rng)
    return conv, params, x, graph, {"training": training, "noise": cache.noise}


ONE_NODE = (
    NodeFormerConv(2, 2, heads=2, num_random_features=3, num_samples=2, relational_bias="sigmoid"),
    {
        "W_q": np.array([[0.3, -1.2], [0.7, 0.1], [-0.4, 0.9], [1.1, 0.5]]),
        "b_q": np.array([0.1, -0.2, 0.3, 0.4]),
        "W_k": np.array([[0.2, 0.4], [-0.8, 0.6], [0.3, -0.3], [0.9, -1.0]]),
        "b_k": np.array([-0.3, 0.2, 0.1, 0.0]),
        "W_v": np.array([[0.5, 0.4], [-0.1, 0.6], [0.8, -0.3], [0.2, 0.7]]),
        "b_v": np.array([0.2, 0.1, -0.4, 0.3]),
        "W_o": np.array([[0.6, -0.2, 0.3, 0.9], [-0.5, 0.4, 0.7, 0.1]]),
        "b_o": np.array([0.05, -0.1]),
        "b_rel": np.array([[0.3, -0.6]]),
    },
    np.array([[0.5, -1.5]]),
    Graph(np.zeros((2, 0), dtype=np.int64), 1),
    {
        "training": True,
        "noise": {
            "projection": np.array([[0.4, -1.1], [1.3, 0.2], [-0.7, 0.8]]),
            "gumbel": np.array([[[0.3, -0.5], [1.2, 0.1]]]),
        },
    },
)


class LayerThenEdgeLoss:
    """The layer's forward followed by the edge loss, as one block for ``check_gradients``."""

    def __init__(self, conv: NodeFormerConv, convention: str) -> None:
        self.conv, self.loss = conv, NodeFormerEdgeLoss(conv, convention)

    def forward(self, params: dict, x: np.ndarray, graph: Graph, **kwargs: Any) -> tuple:
        _, cache = self.conv.forward(params, x, graph, **kwargs)
        return self.loss.forward(params, cache)

    def backward(self, params: dict, cache: Any, d_loss: Any) -> tuple:
        return self.loss.backward(params, cache, d_loss)


# -- gradients ------------------------------------------------------------------------------------


@given(setup=setups())
@example(setup=ONE_NODE)
def test_backward_matches_central_differences(setup: tuple) -> None:
    conv, params, x, graph, kwargs = setup
    report = check_gradients(conv, params, (x, graph), forward_kwargs=kwargs, max_entries=30)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=setups(), rows=st.integers(1, 3))
def test_backward_in_small_row_blocks_matches_central_differences(setup: tuple, rows: int) -> None:
    # The attention's host default is 1024 rows per block: the graphs drawn here are one block
    # unless the blocks are made smaller.
    conv, params, x, graph, kwargs = setup
    saved, kernel_attention.ROW_BLOCK = kernel_attention.ROW_BLOCK, rows
    try:
        report = check_gradients(conv, params, (x, graph), forward_kwargs=kwargs, max_entries=30)
    finally:
        kernel_attention.ROW_BLOCK = saved
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=setups(min_nodes=2), convention=st.sampled_from(["paper", "authors"]))
def test_edge_loss_backward_matches_central_differences(setup: tuple, convention: str) -> None:
    # N >= 2: with one node L_e is 0 identically (test_edge_loss_of_one_node_is_zero), and the
    # checker's resolution floor, ~ |L_e| / eps, would judge its ~1e-19 rounding as relative.
    conv, params, x, graph, kwargs = setup
    block = LayerThenEdgeLoss(conv, convention)
    report = check_gradients(block, params, (x, graph), forward_kwargs=kwargs, max_entries=30)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("loops", [1, 3])
@pytest.mark.parametrize("convention", ["paper", "authors"])
def test_edge_loss_of_one_node_is_zero(loops: int, convention: str) -> None:
    # One node is its own only key: pi = 1 on each of its self-loops, so L_e = 0 exactly (the
    # log-sum-exp of one key is that key, bit for bit) and its gradient is 0 up to rounding.
    conv, params, x, _, kwargs = ONE_NODE
    conv = replace(conv, add_self_loops=False)
    graph = Graph(np.zeros((2, loops), dtype=np.int64), 1)
    _, cache = conv.forward(params, x, graph, **kwargs)
    block = NodeFormerEdgeLoss(conv, convention)
    loss, loss_cache = block.forward(params, cache)
    assert float(loss) == 0.0 and np.all(loss_cache.log_pi == 0.0)
    d_x, d_params = block.backward(params, loss_cache)
    assert max(np.max(np.abs(d)) for d in (d_x, *d_params.values())) <= 1e-15


def test_gradient_checks_catch_wrong_backwards() -> None:
    # The checks must be able to fail: a relational-bias gate without its sigmoid derivative,
    # and an edge loss whose denominator term is dropped.
    graph = Graph(np.array([[0, 1, 2, 2, 3], [1, 2, 0, 1, 3]]), 4)
    conv = NodeFormerConv(3, 2, heads=2, num_random_features=4, relational_bias="sigmoid")
    rng = np.random.default_rng(1)
    params, x = make_params(conv, rng), rng.standard_normal((4, 3))
    kwargs = {"noise": conv.forward(params, x, graph, rng=rng)[1].noise}

    class BrokenGate:
        forward = staticmethod(conv.forward)

        @staticmethod
        def backward(params: dict, cache: Any, d_out: np.ndarray) -> tuple:
            broken = replace(conv, relational_bias="identity")
            d_x, d_params = broken.backward({**params}, cache, d_out)
            return d_x, d_params

    report = check_gradients(BrokenGate(), params, (x, graph), forward_kwargs=kwargs)
    assert report.by_name()["param:b_rel"].max_rel_error > 1e-2

    class BrokenLoss(LayerThenEdgeLoss):
        def backward(self, params: dict, cache: Any, d_loss: Any) -> tuple:
            zero = np.full_like(cache.log_denominators, np.inf)  # node weights exp(-inf) = 0
            return self.loss.backward(params, cache._replace(log_denominators=zero), d_loss)

    report = check_gradients(BrokenLoss(conv, "paper"), params, (x, graph), forward_kwargs=kwargs)
    assert report.max_rel_error > 1e-2


# -- a dense reference, written from the equations ------------------------------------------------


def dense_operators(conv: NodeFormerConv, graph: Graph) -> list[np.ndarray]:
    """``A_j`` (N, N) for j = 1..r with ``A[v, u]`` the weight of u -> v: Eq. 8 as the code
    normalises it, ``D_in^(-1/2) A D_out^(-1/2)``; ``A_hat^j`` or the code's ``A, A^2, A^4``."""

    def normalise(counts: np.ndarray) -> np.ndarray:  # counts[v, u] = #edges u -> v
        d_in, d_out = counts.sum(axis=1), counts.sum(axis=0)
        inv_in = np.where(d_in > 0, 1 / np.sqrt(np.maximum(d_in, 1)), 0.0)
        inv_out = np.where(d_out > 0, 1 / np.sqrt(np.maximum(d_out, 1)), 0.0)
        return inv_in[:, None] * counts * inv_out[None, :]

    counts = conv.prepare_graph(graph).to_dense_adjacency().T.astype(float)
    a_hat = normalise(counts)
    if conv.rb_powers == "paper":
        return [np.linalg.matrix_power(a_hat, j) for j in range(1, conv.rb_order + 1)]
    pattern = (counts > 0).astype(float)
    return [a_hat] + [
        normalise((np.linalg.matrix_power(pattern, 2 ** (j - 1)) > 0).astype(float))
        for j in range(2, conv.rb_order + 1)
    ]


def dense_phi(y: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """Eq. 4 as printed, no shift: (N, d) -> (N, m)."""
    return np.exp(y @ omega.T - 0.5 * np.sum(y * y, axis=1, keepdims=True)) / math.sqrt(len(omega))


def dense_layer(
    conv: NodeFormerConv,
    params: dict,
    x: np.ndarray,
    graph: Graph,
    noise: dict,
    training: bool,
    exact: bool = False,
) -> np.ndarray:
    """The layer with N x N matrices: per head Eq. 17 with ``phi`` written out (or, ``exact``,
    :class:`AllPairSoftmax`, Eq. 15), the relational bias with dense ``A_j``, concat, ``W_o``."""
    n, heads, c, tau = x.shape[0], conv.heads, conv.out_channels, conv.tau
    s = 1.0 if conv.qk_scale == "paper" else c**-0.25

    def project(name: str) -> np.ndarray:
        b = params[f"b_{name}"] if conv.bias else 0.0
        return (x @ params[f"W_{name}"].T + b).reshape(n, heads, c)

    q, k, v = s * project("q"), s * project("k"), project("v")
    use_gumbel = training and conv.use_gumbel
    z = np.zeros((n, heads, c))
    for h in range(heads):
        g = noise["gumbel"][:, h, :] if use_gumbel else np.zeros((n, 1))  # (N, K)
        if exact:
            z[:, h] = AllPairSoftmax(tau).forward({}, q[:, h], k[:, h], v[:, h], g)[0]
            continue
        omega = noise["projection"]
        kernel = (
            dense_phi(q[:, h] / math.sqrt(tau), omega)
            @ dense_phi(k[:, h] / math.sqrt(tau), omega).T
        )  # (N, N): [v, u] estimates exp(q_v.k_u / tau)
        for sample in range(g.shape[1]):
            weights = kernel * np.exp(g[:, sample] / tau)[None, :]
            z[:, h] += (weights / weights.sum(axis=1, keepdims=True)) @ v[:, h] / g.shape[1]
    if conv.relational_bias is not None:
        b_rel = params["b_rel"]
        gate = 1 / (1 + np.exp(-b_rel)) if conv.relational_bias == "sigmoid" else b_rel
        for j, a in enumerate(dense_operators(conv, graph)):
            z += gate[j][None, :, None] * np.einsum("vu,uhc->vhc", a, v)
    out = z.reshape(n, heads * c) @ params["W_o"].T
    return out + params["b_o"] if conv.bias else out


def dense_edge_loss(
    conv: NodeFormerConv,
    params: dict,
    x: np.ndarray,
    graph: Graph,
    omega: np.ndarray | None,
    convention: str,
) -> float:
    """Eq. 10 edge by edge with ``pi`` from Eq. 12 as a dense matrix (``phi`` written out), or,
    ``omega=None``, the exact softmax that Eq. 12 estimates."""
    n, heads, c = x.shape[0], conv.heads, conv.out_channels
    t = conv.qk_factor * (1.0 if convention == "paper" else 1 / math.sqrt(conv.tau))

    def project(name: str) -> np.ndarray:
        b = params[f"b_{name}"] if conv.bias else 0.0
        return t * (x @ params[f"W_{name}"].T + b).reshape(n, heads, c)

    q, k = project("q"), project("k")
    used = conv.prepare_graph(graph)
    src, dst = used.edge_index
    in_degree = np.bincount(dst, minlength=n)
    scale = n if convention == "paper" else max(used.num_edges, 1)
    total = 0.0
    for h in range(heads):
        if omega is None:
            scores = q[:, h] @ k[:, h].T
            kernel = np.exp(scores - scores.max(axis=1, keepdims=True))
        else:
            kernel = dense_phi(q[:, h], omega) @ dense_phi(k[:, h], omega).T  # [v, u]
        pi = kernel / kernel.sum(axis=1, keepdims=True)
        for u, v in zip(src, dst, strict=True):
            total -= math.log(pi[v, u]) / in_degree[v]
    return total / (scale * heads)


@given(setup=setups())
def test_forward_matches_the_dense_reference(setup: tuple) -> None:
    conv, params, x, graph, kwargs = setup
    out, _ = conv.forward(params, x, graph, **kwargs)
    expected = dense_layer(conv, params, x, graph, kwargs["noise"], kwargs["training"])
    assert max_relative_error(out, expected) <= KERNEL_RTOL


@given(setup=setups(), convention=st.sampled_from(["paper", "authors"]))
def test_edge_loss_matches_eq10_edge_by_edge(setup: tuple, convention: str) -> None:
    conv, params, x, graph, kwargs = setup
    _, cache = conv.forward(params, x, graph, **kwargs)
    loss, _ = NodeFormerEdgeLoss(conv, convention).forward(params, cache)
    expected = dense_edge_loss(conv, params, x, graph, kwargs["noise"]["projection"], convention)
    assert abs(float(loss) - expected) <= KERNEL_RTOL * max(abs(expected), 1.0)


def test_edge_probabilities_equal_the_ratio_of_stabilised_features() -> None:
    # Independent route to Eq. 12: PositiveRandomFeatures with per-query ("row") and global key
    # shifts, which cancel in the ratio. Moderate inputs, so nothing underflows there.
    conv = NodeFormerConv(3, 2, heads=2, num_random_features=8)
    graph = Graph(np.array([[0, 1, 2, 3, 3, 0], [1, 2, 0, 1, 3, 0]]), 4)
    rng = np.random.default_rng(3)
    params, x = make_params(conv, rng), rng.standard_normal((4, 3))
    _, cache = conv.forward(params, x, graph, rng=rng)
    _, loss_cache = NodeFormerEdgeLoss(conv).forward(params, cache)
    omega = cache.noise["projection"]
    src, dst = cache.graph.edge_index
    for h in range(2):
        phi_q, _ = PositiveRandomFeatures("row").forward({}, cache.q[:, h], omega)
        phi_k, _ = PositiveRandomFeatures("global").forward({}, cache.k[:, h], omega)
        pi = np.sum(phi_q[dst] * phi_k[src], axis=1) / (phi_q @ phi_k.sum(axis=0))[dst]
        assert max_relative_error(np.exp(loss_cache.log_pi[:, h]), pi) <= RTOL64


def test_edge_probabilities_stay_normalised_where_feature_ratios_underflow() -> None:
    # Large |q|, |k|: the stabilised feature ratio gives pi = 0 (log pi = -inf) for keys far
    # below the largest; the log-domain form stays finite, and on the complete graph (every key
    # of every query, self included) pi sums to 1 over each query's keys.
    n = 5
    conv = NodeFormerConv(2, 2, num_random_features=6, add_self_loops=False)
    complete = Graph(np.stack(np.meshgrid(np.arange(n), np.arange(n))).reshape(2, -1), n)
    rng = np.random.default_rng(4)
    params, x = make_params(conv, rng), 30.0 * rng.standard_normal((n, 2))
    _, cache = conv.forward(params, x, complete, rng=rng)
    omega = cache.noise["projection"]
    with np.errstate(under="ignore"):
        phi_k, _ = PositiveRandomFeatures("global").forward({}, cache.k[:, 0], omega)
    assert np.min(phi_k.sum(axis=1)) == 0.0  # some key's features underflowed
    loss, loss_cache = NodeFormerEdgeLoss(conv).forward(params, cache)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(loss_cache.log_pi))
    dst = complete.edge_index[1]
    sums = np.bincount(dst, weights=np.exp(loss_cache.log_pi[:, 0]), minlength=n)
    np.testing.assert_allclose(sums, 1.0, rtol=0, atol=1e-12)


# -- kernelised against exact as m grows ----------------------------------------------------------


def test_layer_and_edge_loss_converge_to_the_exact_softmax_at_rate_one_over_sqrt_m() -> None:
    # The layer with KernelizedSoftmax against the same layer with AllPairSoftmax (and the edge
    # loss against Eq. 12's exact softmax). As in test_kernel_attention: delta method,
    # error = xi / sqrt(m) + O(1/m), so RMS(64) / RMS(4096) -> 8 over R independent projections;
    # the log of the ratio has standard error <= 1 / sqrt(R), and we accept 4 of them.
    # (No convergence gives a ratio of 1, a 1/m rate 64.)
    graph = Graph(np.array([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 3]]), 5)
    conv = NodeFormerConv(
        3, 2, heads=2, tau=1.0, num_samples=2, relational_bias="sigmoid", projection="iid"
    )
    rng = np.random.default_rng(50)
    params, x = make_params(conv, rng), 0.5 * rng.standard_normal((5, 3))
    # small |q|, |k|: the estimator's variance grows like exp(||q + k||^2) (Prop. 1) and its
    # heavy tail delays the 1/sqrt(m) regime past m = 64 when ||q + k|| ~ 2
    small_qk = ("W_q", "b_q", "W_k", "b_k")
    params = {k: 0.3 * v if k in small_qk else v for k, v in params.items()}
    gumbel = rng.gumbel(size=(5, 2, 2))
    exact = dense_layer(conv, params, x, graph, {"gumbel": gumbel}, training=True, exact=True)
    exact_loss = dense_edge_loss(conv, params, x, graph, None, "paper")
    repeats, small, large = 40, 64, 4096
    mse, mse_loss = {}, {}
    for m in (small, large):
        sized = replace(conv, num_random_features=m)
        errors, loss_errors = [], []
        for _ in range(repeats):
            noise = {"projection": draw_projection(rng, m, 2, "iid"), "gumbel": gumbel}
            out, cache = sized.forward(params, x, graph, training=True, noise=noise)
            loss, _ = NodeFormerEdgeLoss(sized).forward(params, cache)
            errors.append(out - exact)
            loss_errors.append(float(loss) - exact_loss)
        mse[m], mse_loss[m] = np.mean(np.square(errors)), np.mean(np.square(loss_errors))
    for found in (mse, mse_loss):
        ratio = math.sqrt(found[small] / found[large])
        assert abs(math.log(ratio / math.sqrt(large / small))) <= 4 / math.sqrt(repeats), ratio


# -- the relational bias ----------------------------------------------------------------------


@pytest.mark.parametrize("powers", ["paper", "authors"])
@pytest.mark.parametrize("gate", ["sigmoid", "identity"])
def test_relational_bias_is_the_dense_matrix_sum(powers: str, gate: str) -> None:
    # out(with bias) - out(without) = concat_h(sum_j f(b_jh) A_j V_h) W_o^T, A_j built densely.
    # A directed graph with a duplicate edge, a self-loop and a node without in-edges.
    graph = Graph(np.array([[0, 1, 2, 2, 3, 0, 1], [1, 2, 0, 1, 3, 1, 1]]), 5)
    for add_self_loops in (True, False):
        conv = NodeFormerConv(
            3,
            2,
            heads=2,
            relational_bias=gate,
            rb_order=3,
            rb_powers=powers,
            add_self_loops=add_self_loops,
        )
        rng = np.random.default_rng(5)
        params, x = make_params(conv, rng), rng.standard_normal((5, 3))
        with_bias, cache = conv.forward(params, x, graph, rng=rng)
        plain = replace(conv, relational_bias=None)
        no_bias_params = {k: v for k, v in params.items() if k != "b_rel"}
        without, _ = plain.forward(no_bias_params, x, graph, noise=cache.noise)
        b = params["b_rel"]
        f = 1 / (1 + np.exp(-b)) if gate == "sigmoid" else b
        bias = sum(
            f[j][None, :, None] * np.einsum("vu,uhc->vhc", a, cache.v)
            for j, a in enumerate(dense_operators(conv, graph))
        )
        expected = bias.reshape(5, 4) @ params["W_o"].T
        assert max_relative_error(with_bias - without, expected) <= RTOL64


def test_authors_powers_are_the_patterns_of_a_a2_a4() -> None:
    # A directed path 0 -> 1 -> ... -> 7 with self-loops: A^(2^(j-1)) joins i to i..i+2^(j-1).
    n = 8
    path = Graph(np.array([np.arange(n - 1), np.arange(1, n)]), n)
    loops = NodeFormerConv(1, 1).prepare_graph(path)
    graphs_ = power_graphs(loops, 3)
    assert graphs_[0] is loops
    for j, power in enumerate(graphs_[1:], start=2):
        reach = 2 ** (j - 1)
        expected = {(i, w) for i in range(n) for w in range(i, min(i + reach, n - 1) + 1)}
        assert {tuple(e) for e in power.edge_index.T.tolist()} == expected
        assert power.num_edges == len(expected)  # each pair once


def test_power_graphs_of_a_lower_order_reuse_the_cached_powers() -> None:
    # The powers are cached per graph; a later call with a lower order must return its
    # order's graphs only, the first ones of those a higher order built.
    path = Graph(np.array([[0, 1, 2], [1, 2, 3]]), 4)
    highest = power_graphs(path, 4)
    for order in (1, 2, 3):
        assert power_graphs(path, order) == highest[:order]


@pytest.mark.parametrize(("relational_bias", "constant"), [("sigmoid", 0.1), ("identity", 1.0)])
def test_init_params_as_the_codes_reset_parameters(relational_bias: str, constant: float) -> None:
    # Glorot-uniform W, U(-a, a) with a = sqrt(6 / (out + in)): all inside, some within 5 %
    # of a (P(none of n >= 1800 draws) = 0.95^n < 1e-40); zero biases; b_rel the constant.
    conv = NodeFormerConv(40, 30, heads=2, relational_bias=relational_bias, rb_order=2)
    params = conv.init_params(np.random.default_rng(0))
    for name, value in params.items():
        if name.startswith("W_"):
            bound = np.sqrt(6.0 / sum(value.shape))
            assert 0.95 * bound <= np.abs(value).max() <= bound, name
        elif name == "b_rel":
            np.testing.assert_array_equal(value, np.full((2, 2), constant))
        else:
            assert not np.any(value), name


@pytest.mark.parametrize("factor", [0.1, 2.0])
def test_projection_factors_scale_the_maps_and_their_gradients(factor: float) -> None:
    # The layer folds s into W_q, b_q, W_k, b_k, and the authors' edge loss s / sqrt(tau),
    # which is 0.1 at tau = 100: every factor is applied, however it compares with 1.
    rng = np.random.default_rng(3)
    params = {"W_q": rng.standard_normal((4, 3)), "b_q": rng.standard_normal(4)}
    x, d_y = rng.standard_normal((5, 3)), rng.standard_normal((5, 4))
    (y,) = project(params, "q", x, True, (factor,))
    assert max_relative_error(y, factor * (x @ params["W_q"].T + params["b_q"])) <= RTOL64
    d_params: dict[str, np.ndarray] = {}
    d_x = project_backward(params, "q", x, [d_y], d_params, True, factors=(factor,))
    assert max_relative_error(d_params["W_q"], factor * d_y.T @ x) <= RTOL64
    assert max_relative_error(d_params["b_q"], factor * d_y.sum(axis=0)) <= RTOL64
    assert max_relative_error(d_x, factor * d_y @ params["W_q"]) <= RTOL64


def test_rb_powers_agree_at_order_one() -> None:
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    conv = NodeFormerConv(2, 2, heads=2, relational_bias="sigmoid", rb_order=1)
    rng = np.random.default_rng(6)
    params, x = make_params(conv, rng), rng.standard_normal((3, 2))
    out, cache = conv.forward(params, x, graph, rng=rng)
    out_authors, _ = replace(conv, rb_powers="authors").forward(params, x, graph, noise=cache.noise)
    np.testing.assert_array_equal(out_authors, out)


@given(seed=seeds(), heads=st.integers(1, 3), transpose=st.booleans())
def test_host_matrices_give_the_propagated_sums(seed: int, heads: int, transpose: bool) -> None:
    # The relational bias builds its host CSR matrices once per graph; a device (and an Operator
    # without them) propagates along the edges: both are A h (or A^T h), bit for bit.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    graph = Graph(rng.integers(0, n, (2, int(rng.integers(0, 20)))), n)
    conv = NodeFormerConv(2, 3, heads=heads, relational_bias="sigmoid")
    (operator,) = conv._relational.operators(conv.prepare_graph(graph), np, np.float64)
    assert len(operator.host) == 2
    h = rng.standard_normal((n, heads, 3))
    without = Operator(operator.graph, operator.weights, ())
    np.testing.assert_array_equal(
        apply_operator(operator, h, transpose), apply_operator(without, h, transpose)
    )


# -- noise ----------------------------------------------------------------------------------------


@given(setup=setups(), seed=seeds())
def test_noise_replay_is_bit_identical(setup: tuple, seed: int) -> None:
    conv, params, x, graph, kwargs = setup
    out, cache = conv.forward(
        params, x, graph, training=kwargs["training"], rng=np.random.default_rng(seed)
    )
    replayed, _ = conv.forward(params, x, graph, training=kwargs["training"], noise=cache.noise)
    np.testing.assert_array_equal(replayed, out)


@pytest.mark.parametrize("kind", ["orthogonal", "iid"])
def test_draw_order_is_projection_then_gumbel(kind: str) -> None:
    conv = NodeFormerConv(2, 3, heads=2, num_random_features=7, num_samples=4, projection=kind)
    graph = Graph(np.array([[0, 1], [1, 2]]), 3)
    params, x = make_params(conv, np.random.default_rng(7)), np.ones((3, 2))
    _, cache = conv.forward(params, x, graph, training=True, rng=np.random.default_rng(8))
    replay = np.random.default_rng(8)
    omega = draw_projection(replay, 7, 3, kind)
    gumbel = -np.log(-np.log(replay.random((3, 2, 4))))
    np.testing.assert_array_equal(cache.noise["projection"], omega)
    np.testing.assert_array_equal(cache.noise["gumbel"], gumbel)
    # given noise is used as is, and the generator is not advanced for it
    rng = np.random.default_rng(9)
    _, partial = conv.forward(params, x, graph, training=True, rng=rng, noise={"projection": omega})
    np.testing.assert_array_equal(partial.noise["projection"], omega)
    np.testing.assert_array_equal(
        partial.noise["gumbel"], -np.log(-np.log(np.random.default_rng(9).random((3, 2, 4))))
    )


@pytest.mark.parametrize("chunk", [1, 5, 24, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gumbel_draws_in_chunks_equal_one_draw(
    chunk: int, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    # chunks of the flat draw (the last one short at 5) give the one-call values, rounded
    # to dtype once; and the generator ends where one call leaves it
    monkeypatch.setattr(random_features, "_GUMBEL_CHUNK", chunk)
    rng, replay = np.random.default_rng(3), np.random.default_rng(3)
    drawn = draw_gumbel(rng, (3, 2, 4), dtype)
    expected = -np.log(-np.log(replay.random((3, 2, 4))))
    assert drawn.dtype == dtype
    np.testing.assert_array_equal(drawn, expected.astype(dtype))
    assert rng.random() == replay.random()


def test_evaluation_draws_no_gumbel_noise() -> None:
    # Evaluation (and training without use_gumbel) is Eq. 5: only omega is drawn, a given
    # Gumbel draw is ignored, and the output is that of zero noise with one sample.
    conv = NodeFormerConv(2, 2, heads=2, num_random_features=5, num_samples=3)
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    params = make_params(conv, np.random.default_rng(10))
    x = np.random.default_rng(11).random((3, 2))
    rng = np.random.default_rng(12)
    out, cache = conv.forward(params, x, graph, rng=rng)
    after_projection = np.random.default_rng(12)
    draw_projection(after_projection, 5, 2, "orthogonal")
    assert rng.random() == after_projection.random()  # nothing else was drawn
    assert set(cache.noise) == {"projection"}
    noisy = {**cache.noise, "gumbel": np.ones((3, 2, 3))}
    ignored, _ = conv.forward(params, x, graph, noise=noisy)
    np.testing.assert_array_equal(ignored, out)
    no_gumbel = replace(conv, use_gumbel=False)
    trained, train_cache = no_gumbel.forward(params, x, graph, training=True, noise=noisy)
    np.testing.assert_array_equal(trained, out)
    assert set(train_cache.noise) == {"projection"}
    single = replace(conv, num_samples=1)
    zeros = {**cache.noise, "gumbel": np.zeros((3, 2, 1))}
    np.testing.assert_array_equal(single.forward(params, x, graph, True, noise=zeros)[0], out)


# -- properties, edge cases, dtypes, backends -----------------------------------------------------


@given(setup=setups(), seed=seeds())
def test_permuting_nodes_permutes_outputs(setup: tuple, seed: int) -> None:
    conv, params, x, graph, kwargs = setup
    perm = np.random.default_rng(seed).permutation(graph.num_nodes)  # new node i = old perm[i]
    permuted = Graph(np.argsort(perm)[graph.edge_index], graph.num_nodes)
    noise = dict(kwargs["noise"])
    if "gumbel" in noise:
        noise["gumbel"] = noise["gumbel"][perm]  # one value per key node: moves with it
    out, cache = conv.forward(params, x, graph, **kwargs)
    out_p, cache_p = conv.forward(params, x[perm], permuted, kwargs["training"], noise=noise)
    assert max_relative_error(out_p, out[perm]) <= RTOL64
    loss, _ = NodeFormerEdgeLoss(conv).forward(params, cache)
    loss_p, _ = NodeFormerEdgeLoss(conv).forward(params, cache_p)
    assert abs(float(loss_p) - float(loss)) <= RTOL64 * max(abs(float(loss)), 1.0)


def test_edge_loss_without_edges_is_zero() -> None:
    conv = NodeFormerConv(2, 2, add_self_loops=False)
    graph = Graph(np.zeros((2, 0), dtype=np.int64), 3)
    params = make_params(conv, np.random.default_rng(13))
    _, cache = conv.forward(params, np.ones((3, 2)), graph, rng=np.random.default_rng(14))
    for convention in ("paper", "authors"):
        block = NodeFormerEdgeLoss(conv, convention)
        loss, loss_cache = block.forward(params, cache)
        assert float(loss) == 0.0
        d_x, d_params = block.backward(params, loss_cache)
        assert np.all(d_x == 0) and all(np.all(d == 0) for d in d_params.values())


def test_edge_loss_gradients_touch_only_queries_and_keys() -> None:
    conv = NodeFormerConv(2, 2, heads=2, relational_bias="identity")
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    rng = np.random.default_rng(15)
    params, x = make_params(conv, rng), rng.standard_normal((3, 2))
    _, cache = conv.forward(params, x, graph, rng=rng)
    block = NodeFormerEdgeLoss(conv)
    _, loss_cache = block.forward(params, cache)
    _, d_params = block.backward(params, loss_cache, 0.5)
    assert list(d_params) == list(params)
    for name in ("W_v", "b_v", "W_o", "b_o", "b_rel"):
        assert np.all(d_params[name] == 0)
    assert all(np.any(d_params[name] != 0) for name in ("W_q", "b_q", "W_k", "b_k"))


def test_input_grad_false_skips_only_d_x() -> None:
    conv = NodeFormerConv(2, 2, heads=2, relational_bias="sigmoid")
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    rng = np.random.default_rng(20)
    params, x = make_params(conv, rng), rng.standard_normal((3, 2))
    out, cache = conv.forward(params, x, graph, rng=rng)
    d_out = rng.standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out, input_grad=False)
    assert d_x is None
    _, expected = conv.backward(params, cache, d_out)
    for name in params:
        np.testing.assert_array_equal(d_params[name], expected[name])


def test_float32_stays_float32() -> None:
    conv = NodeFormerConv(3, 2, heads=2, relational_bias="sigmoid", rb_order=2)
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    params = conv.init_params(np.random.default_rng(16), dtype=np.float32)
    x = np.random.default_rng(17).standard_normal((3, 3)).astype(np.float32)
    out, cache = conv.forward(params, x, graph, training=True, rng=np.random.default_rng(18))
    assert out.dtype == np.float32 and cache.noise["projection"].dtype == np.float32
    d_x, d_params = conv.backward(params, cache, np.ones_like(out))
    loss, loss_cache = NodeFormerEdgeLoss(conv).forward(params, cache)
    d_x_e, d_params_e = NodeFormerEdgeLoss(conv).backward(params, loss_cache)
    arrays = [d_x, d_x_e, loss, *d_params.values(), *d_params_e.values()]
    assert all(a.dtype == np.float32 for a in arrays)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("powers", ["paper", "authors"])
def test_device_backend_matches_numpy(backend: str, powers: str) -> None:
    # the strict stand-in refuses silent host conversion: no stray NumPy in the math
    conv = NodeFormerConv(
        3, 2, heads=2, num_samples=2, relational_bias="sigmoid", rb_order=2, rb_powers=powers
    )
    graph = Graph(np.array([[0, 1, 2, 2, 3], [1, 2, 0, 1, 3]]), 4)
    rng = np.random.default_rng(19)
    params, x = make_params(conv, rng), rng.standard_normal((4, 3))
    out, cache = conv.forward(params, x, graph, training=True, rng=rng)
    d_out = rng.standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out)
    block = NodeFormerEdgeLoss(conv)
    loss, loss_cache = block.forward(params, cache)
    d_x_e, d_params_e = block.backward(params, loss_cache)

    def move(a: np.ndarray) -> Any:
        return asarray(a, backend=backend)

    d_params_d = {k: move(v) for k, v in params.items()}
    noise = {k: move(v) for k, v in cache.noise.items()}
    out_d, cache_d = conv.forward(d_params_d, move(x), graph, training=True, noise=noise)
    assert backend_name(get_array_module(out_d)) == backend
    d_x_d, d_params_dd = conv.backward(d_params_d, cache_d, move(d_out))
    loss_d, loss_cache_d = block.forward(d_params_d, cache_d)
    d_x_ed, d_params_ed = block.backward(d_params_d, loss_cache_d)
    assert max_relative_error(to_numpy(out_d), out) <= RTOL64
    assert abs(float(loss_d) - float(loss)) <= RTOL64 * abs(float(loss))
    for found, expected in (
        ({**d_params_dd, "x": d_x_d}, {**d_params, "x": d_x}),
        ({**d_params_ed, "x": d_x_ed}, {**d_params_e, "x": d_x_e}),
    ):
        errors = relative_errors(found, expected)
        assert max(errors.values()) <= RTOL64, errors


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"heads": 0}, "heads must be a positive int"),
        ({"num_random_features": 2.0}, "num_random_features must be a positive int"),
        ({"num_samples": True}, "num_samples must be a positive int"),
        ({"rb_order": 0}, "rb_order must be a positive int"),
        ({"tau": 0.0}, "tau must be a finite number > 0"),
        ({"relational_bias": "tanh"}, "relational_bias must be one of"),
        ({"rb_powers": "squares"}, "rb_powers must be one of"),
        ({"qk_scale": "sqrt"}, "qk_scale must be one of"),
        ({"projection": "gaussian"}, "projection must be one of"),
        ({"use_gumbel": 1}, "use_gumbel must be True or False"),
        ({"bias": None}, "bias must be True or False"),
    ],
)
def test_bad_configuration(changes: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(NodeFormerConv(2, 2), **changes)


NOISE_CONV = NodeFormerConv(2, 3, heads=2, num_random_features=4, num_samples=5)
NOISE_GRAPH = Graph(np.array([[0, 1], [1, 2]]), 3)
GOOD_NOISE = {"projection": np.ones((4, 3)), "gumbel": np.zeros((3, 2, 5))}


@pytest.mark.parametrize(
    ("noise", "error", "match"),
    [
        ({**GOOD_NOISE, "projection": np.ones((3, 4))}, ValueError, r"must be \(4, 3\): \(m, C\)"),
        ({**GOOD_NOISE, "gumbel": np.ones((3, 5, 2))}, ValueError, r"must be \(3, 2, 5\)"),
        ({**GOOD_NOISE, "gumbel": np.ones((3, 2))}, ValueError, "one value per key node, head"),
        ({**GOOD_NOISE, "gumbel": np.full((3, 2, 5), np.inf)}, ValueError, "NaN or infinity"),
        (
            {**GOOD_NOISE, "projection": np.ones((4, 3), np.float32)},
            TypeError,
            r"noise\['projection'\] has dtype float32 but x has float64",
        ),
        ({**GOOD_NOISE, "gumbel": [[0.0]]}, TypeError, "must be an array"),
        ({**GOOD_NOISE, "omega": np.ones((4, 3))}, ValueError, r"unknown keys \['omega'\]"),
        ([np.ones((4, 3))], TypeError, "noise must be a dict"),
        ({"projection": np.ones((4, 3))}, ValueError, r"random draws \(gumbel \(3, 2, 5\)\)"),
    ],
)
def test_bad_noise_gives_a_clear_error(noise: Any, error: type, match: str) -> None:
    params = NOISE_CONV.init_params(np.random.default_rng(0))
    with pytest.raises(error, match=match):
        NOISE_CONV.forward(params, np.ones((3, 2)), NOISE_GRAPH, training=True, noise=noise)


def test_missing_randomness_and_bad_inputs() -> None:
    conv, graph = NOISE_CONV, NOISE_GRAPH
    params, x = conv.init_params(np.random.default_rng(0)), np.ones((3, 2))
    with pytest.raises(ValueError, match=r"pass rng=numpy.random.default_rng\(seed\)"):
        conv.forward(params, x, graph)  # evaluation still needs omega
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        conv.forward(params, x, graph, rng=np.random.RandomState(0))
    with pytest.raises(ValueError, match="x has 2 rows but the graph has 3 nodes"):
        conv.forward(params, np.ones((2, 2)), graph, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"graph must be a refimpl\.Graph"):
        conv.forward(params, x, graph.edge_index, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"unexpected \['b_rel'\]"):
        conv.forward({**params, "b_rel": np.ones((1, 2))}, x, graph, rng=np.random.default_rng(0))
    _, cache = conv.forward(params, x, graph, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"d_out must be an array of the output's shape \(3, 3\)"):
        conv.backward(params, cache, np.ones((3, 6)))
    with pytest.raises(ValueError, match="convention must be one of"):
        NodeFormerEdgeLoss(conv, "mean")
    with pytest.raises(TypeError, match="conv must be a NodeFormerConv"):
        NodeFormerEdgeLoss("conv")
    block = NodeFormerEdgeLoss(conv)
    with pytest.raises(TypeError, match="layer_cache must be the NodeFormerCache"):
        block.forward(params, cache._asdict())
    with pytest.raises(ValueError, match=r"this layer has \(heads, out_channels\) = \(1, 3\)"):
        NodeFormerEdgeLoss(replace(conv, heads=1)).forward(
            replace(conv, heads=1).init_params(np.random.default_rng(0)), cache
        )
    _, loss_cache = block.forward(params, cache)
    with pytest.raises(TypeError, match="d_loss must be a number or a 0-d array"):
        block.backward(params, loss_cache, "1")
    with pytest.raises(TypeError, match="d_loss has dtype float32"):
        block.backward(params, loss_cache, np.ones((), np.float32))
