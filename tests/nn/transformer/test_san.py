"""SAN (Kreuzer et al. 2021) as released: SANAttention, LearnedLaplacianPE, SANLayer and the
padded eigenpairs, against central differences on drawn batches (one-node graphs, isolated
nodes, duplicate edges, graphs with fewer nodes than eigenpairs), named cases and bad input."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.data.full_graph import full_graph
from refimpl.nn.transformer.san_attention import SANAttention
from refimpl.nn.transformer.san_layer import SANLayer
from refimpl.nn.transformer.san_lpe import LearnedLaplacianPE, eigenpairs_padded
from refimpl.testing import check_gradients
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import GRADCHECK_RTOL
from tests.nn.transformer.test_stream import smooth

# step of the layer's differences, as the stream's tests: norm and ReLU curvature is excluded
# by an assume() instead of by a smaller step
STEP = 1e-5


class Batch(NamedTuple):
    """Input edges of a batch, its pairs graph (refimpl.data.full_graph) and node_ptr."""

    edge_index: np.ndarray  # (2, E)
    node_ptr: np.ndarray  # (G+1,)
    pairs: Graph  # P pairs
    real: np.ndarray  # (P,) bool


@st.composite
def batches(draw: st.DrawFn, max_graphs: int = 3, max_nodes: int = 4) -> Batch:
    """1-3 graphs of 1-4 nodes, directed edges within each (duplicates, isolated nodes; no
    self-loop: the released full graph has no (v, v) pair)."""
    sizes = draw(st.lists(st.integers(1, max_nodes), min_size=1, max_size=max_graphs))
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    edges = []
    for g, size in enumerate(sizes):
        node = st.integers(int(ptr[g]), int(ptr[g]) + size - 1)
        drawn = draw(st.lists(st.tuples(node, node), max_size=2 * size))
        edges += [(u, v) for u, v in drawn if u != v]
    if edges and draw(st.booleans()):  # a duplicate edge
        edges.append(edges[draw(st.integers(0, len(edges) - 1))])
    edge_index = np.array(edges, dtype=np.int64).reshape(-1, 2).T
    batch = np.repeat(np.arange(len(sizes)), sizes)
    pairs = full_graph(edge_index, int(ptr[-1]), batch)
    return Batch(edge_index, ptr, pairs.graph, np.asarray(pairs.real))


@st.composite
def attention_setups(draw: st.DrawFn) -> tuple:
    """A SANAttention (full graph or not, fixed or learned gamma, biases), parameters moved off
    their init, node and pair features."""
    batch = draw(batches())
    full = draw(st.booleans())
    heads = draw(st.integers(1, 2))
    attention = SANAttention(
        heads * draw(st.integers(1, 2)),
        heads=heads,
        full_graph=full,
        gamma=draw(st.sampled_from([0.0, 0.3, 1.0])),
        learn_gamma=full and draw(st.booleans()),
        bias=draw(st.booleans()),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = attention.init_params(rng)
    for name, value in params.items():
        if name == "gamma":  # inside (0, 1): the clamp is differentiable there
            params[name] = np.array([rng.uniform(0.2, 0.8)])
        else:  # larger: scores reach the clamp
            params[name] = 2.0 * value + 0.5 * rng.standard_normal(value.shape)
    graph, real = batch.pairs, batch.real
    if not full:  # over the input edges, all real
        graph, real = Graph(batch.edge_index, int(batch.node_ptr[-1])), None
    h = rng.standard_normal((graph.num_nodes, attention.channels))
    e = rng.standard_normal((graph.num_edges, attention.channels))
    return attention, params, h, graph, e, real


def away_from_clamp(cache: Any) -> bool:
    """No score within the step's reach of +-5, where the clamp's derivative jumps."""
    return bool(np.all(np.abs(np.abs(cache.core.raw) - 5.0) > 1e-4))


@given(setup=attention_setups())
def test_attention_matches_central_differences(setup: tuple) -> None:
    attention, params, h, graph, e, real = setup
    _, cache = attention.forward(params, h, graph, e, real)
    assume(away_from_clamp(cache))
    report = check_gradients(
        attention, params, (h, graph, e, real), wrt_inputs=[0, 2], rng=np.random.default_rng(0)
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def clique(n: int) -> tuple[Graph, np.ndarray]:
    """The pairs graph of one graph of ``n`` nodes whose only input edge is 0 -> 1."""
    pairs = full_graph(np.array([[0], [1]]), n)
    return pairs.graph, np.asarray(pairs.real)


def test_gamma_zero_attends_to_real_pairs_only() -> None:
    # gamma = 0 gives non-edges weight 0 (exp_fake), so node 1, whose only in-edge is 0 -> 1,
    # gets V_0 * z / (z + 1e-6) and changes neither with node 2's features through a key nor
    # through a value.
    graph, real = clique(3)
    attention = SANAttention(2, heads=1, gamma=0.0)
    rng = np.random.default_rng(3)
    params = attention.init_params(rng)
    h, e = rng.standard_normal((3, 2)), rng.standard_normal((graph.num_edges, 2))
    out, cache = attention.forward(params, h, graph, e, real)
    z = cache.core.z[1, 0]
    np.testing.assert_allclose(out[1], (h[0] @ params["W_V"].T) * z / (z + 1e-6), rtol=1e-14)
    moved = h.copy()
    moved[2] += 3.0
    np.testing.assert_array_equal(attention.forward(params, moved, graph, e, real)[0][1], out[1])


def test_a_one_node_graph_and_an_isolated_node_output_zero() -> None:
    # A one-node graph has no pair, and a node without incoming pairs has z = 0: wV / 1e-6 = 0.
    graph = Graph(np.array([[0], [1]]), 3)  # node 2 alone, node 0 hears nothing
    attention = SANAttention(2, heads=2, full_graph=False)
    rng = np.random.default_rng(4)
    params = attention.init_params(rng)
    out, _ = attention.forward(params, rng.standard_normal((3, 2)), graph, np.ones((1, 2)))
    np.testing.assert_array_equal(out[[0, 2]], np.zeros((2, 2)))


def test_clamped_scores_pass_no_gradient() -> None:
    # Scores beyond +-5 are clamped (exp(clamp(s, -5, 5))): the queries, keys and edge features
    # of such a pair get no gradient through its score, so with every score clamped, W_Q,
    # W_K and W_E get exactly zero.
    graph, _ = clique(2)
    attention = SANAttention(1, heads=1, full_graph=False)
    params = {name: np.full(shape, 10.0) for name, shape in attention.param_shapes().items()}
    h, e = np.ones((2, 1)), np.ones((graph.num_edges, 1))
    out, cache = attention.forward(params, h, graph, e)
    assert np.all(cache.core.raw > 5)
    _, grads = attention.backward(params, cache, np.ones_like(out))
    for name in ("W_Q", "W_K", "W_E"):
        np.testing.assert_array_equal(grads[name], 0.0)


def test_learned_gamma_outside_its_range_is_clamped_and_gets_no_gradient() -> None:
    # gnn-lspe clamps its learned gamma to [0, 1] (torch.clamp): 1.7 acts as 1, gradient 0.
    graph, real = clique(3)
    attention = SANAttention(2, heads=1, learn_gamma=True)
    rng = np.random.default_rng(5)
    params = attention.init_params(rng)
    h, e = rng.standard_normal((3, 2)), rng.standard_normal((graph.num_edges, 2))
    params["gamma"] = np.array([1.7])
    out, cache = attention.forward(params, h, graph, e, real)
    fixed = SANAttention(2, heads=1, gamma=1.0)
    as_one = {k: v for k, v in params.items() if k != "gamma"}
    np.testing.assert_array_equal(out, fixed.forward(as_one, h, graph, e, real)[0])
    _, grads = attention.backward(params, cache, np.ones_like(out))
    assert grads["gamma"][0] == 0.0


# -- the learned Laplacian encoding -----------------------------------------------------------


@st.composite
def lpe_setups(draw: st.DrawFn) -> tuple:
    """An LPE with a small FFN, its eigenpairs for a drawn batch with m up to 5 (so graphs with
    fewer nodes than eigenpairs), training with fixed masks or evaluation."""
    batch = draw(batches())
    m = draw(st.integers(1, 5))
    heads = draw(st.integers(1, 2))
    lpe = LearnedLaplacianPE(
        heads * draw(st.integers(1, 2)),
        heads=heads,
        layers=draw(st.integers(1, 2)),
        ffn_channels=draw(st.integers(1, 4)),
        dropout=draw(st.sampled_from([0.0, 0.3])),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in lpe.init_params(rng).items()}
    graph = Graph(batch.edge_index, int(batch.node_ptr[-1]))
    vecs, vals, valid = eigenpairs_padded(graph, m, batch.node_ptr)
    kwargs: dict[str, Any] = {"training": draw(st.booleans())}
    if kwargs["training"]:
        kwargs["noise"] = lpe.forward(params, vecs, vals, valid, training=True, rng=rng)[1].noise
    return lpe, params, vecs, vals, valid, kwargs


def lpe_smooth(lpe: LearnedLaplacianPE, params: dict, cache: Any) -> bool:
    """Every LayerNorm root and every FFN pre-activation far from its kink on the step's scale
    (one channel: LayerNorm centres to 0 whatever the step)."""
    for i, layer in enumerate(cache.layers):
        pre = f"layers.{i}."
        hidden = layer["linear1"].x @ params[pre + "linear1.W"].T + params[pre + "linear1.b"]
        if np.abs(hidden).min() <= 1e3 * STEP:
            return False
        roots = [layer[name].root for name in ("norm1", "norm2")]
        if lpe.channels > 1 and not all(np.all(r > 1e4 * STEP) for r in roots):
            return False
    return True


@given(setup=lpe_setups())
def test_lpe_matches_central_differences(setup: tuple) -> None:
    lpe, params, vecs, vals, valid, kwargs = setup
    _, cache = lpe.forward(params, vecs, vals, valid, **kwargs)
    assume(lpe_smooth(lpe, params, cache))
    report = check_gradients(
        lpe,
        params,
        (vecs, vals, valid),
        forward_kwargs=kwargs,
        max_entries=20,
        rng=np.random.default_rng(0),
        eps=STEP,
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_padded_eigenpairs_change_nothing() -> None:
    # A padded token (the released NaN) is masked as a key and left out of the sum, so
    # whatever sits in eigvecs/eigvals there, pe is the same, and its gradient there is 0.
    graph = Graph(np.array([[0, 1], [1, 0]]), 3)  # a 2-node graph, then a 1-node graph
    vecs, vals, valid = eigenpairs_padded(graph, 3, np.array([0, 2, 3]))
    assert valid.sum(axis=1).tolist() == [2, 2, 1]
    lpe = LearnedLaplacianPE(4, heads=2, ffn_channels=6, dropout=0.0)
    params = lpe.init_params(np.random.default_rng(6))
    out, cache = lpe.forward(params, vecs, vals, valid)
    noisy = np.where(valid, vecs, 7.0), np.where(valid, vals, -3.0)
    np.testing.assert_array_equal(lpe.forward(params, *noisy, valid)[0], out)
    (d_vecs, d_vals), _ = lpe.backward(params, cache, np.ones_like(out))
    assert np.all(d_vecs[~valid] == 0) and np.all(d_vals[~valid] == 0)


def test_eigenpairs_of_a_path_are_the_laplacians() -> None:
    # The path 0 - 1 - 2: L = I - D^-1/2 A D^-1/2 has eigenvalues 0, 1, 2 (known in closed
    # form), eigenvector of 0 proportional to sqrt(degree) = (1, sqrt 2, 1); with m = n every
    # node's row of the orthogonal eigenvector matrix already has unit length.
    graph = Graph(np.array([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)
    vecs, vals, valid = eigenpairs_padded(graph, 4)
    np.testing.assert_allclose(vals[:, :3], np.tile([0.0, 1.0, 2.0], (3, 1)), atol=1e-14)
    first = np.array([1.0, np.sqrt(2.0), 1.0]) / 2.0
    np.testing.assert_allclose(np.abs(vecs[:, 0]), first, rtol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-14)
    assert valid[:, :3].all() and not valid[:, 3].any() and np.all(vecs[:, 3] == 0)


def test_eigenpairs_rows_are_normalised_when_truncated() -> None:
    # m < n: the released F.normalize(EigVecs, dim=1) rescales each node's row of the m kept
    # eigenvectors to unit length (a released quirk kept on purpose: docs/guide/san.md).
    graph = Graph(np.array([[0, 1, 2, 3], [1, 2, 3, 0]]), 4)  # a 4-cycle, one direction
    vecs, _, valid = eigenpairs_padded(graph, 2)
    assert valid.all()
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-14)


# -- the layer --------------------------------------------------------------------------------


@given(setup=attention_setups(), norm=st.sampled_from(["batch", "layer", "none"]))
def test_layer_matches_central_differences(setup: tuple, norm: str) -> None:
    attention, attention_params, h, graph, e, real = setup
    assume(h.shape[0] > 1 or norm != "batch")  # BatchNorm over one row: zero variance
    layer = SANLayer(
        attention.channels,
        heads=attention.heads,
        full_graph=attention.full_graph,
        gamma=attention.gamma,
        learn_gamma=attention.learn_gamma,
        bias=attention.bias,
        dropout=0.2,
        norm=norm,
    )
    rng = np.random.default_rng(1)
    params = layer.init_params(rng)
    params.update({f"attention.{k}": v for k, v in attention_params.items()})
    _, cache = layer.forward(params, h, graph, e, real, training=True, rng=rng)
    kwargs = {"training": True, "noise": cache.noise}
    assume(away_from_clamp(cache.attention) and stream_smooth(layer, params, cache.stream))
    report = check_gradients(
        layer,
        params,
        (h, graph, e, real),
        wrt_inputs=[0, 2],
        forward_kwargs=kwargs,
        max_entries=20,
        rng=np.random.default_rng(0),
        eps=STEP,
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def stream_smooth(layer: SANLayer, params: dict, cache: Any) -> bool:
    """The stream's norms and ReLU far from their kinks (the stream tests' rule)."""
    sub = {k.removeprefix("stream."): v for k, v in params.items() if k.startswith("stream.")}
    return smooth(layer.blocks["stream"], sub, cache)  # test_stream's


def test_layer_is_attention_then_stream() -> None:
    graph, real = clique(4)
    layer = SANLayer(4, heads=2, norm="layer")
    rng = np.random.default_rng(8)
    params = layer.init_params(rng)
    h, e = rng.standard_normal((4, 4)), rng.standard_normal((graph.num_edges, 4))
    out, cache = layer.forward(params, h, graph, e, real)
    attention, stream = layer.blocks["attention"], layer.blocks["stream"]
    sub = lambda p: {k.removeprefix(p): v for k, v in params.items() if k.startswith(p)}  # noqa: E731
    a, _ = attention.forward(sub("attention."), h, graph, e, real)
    expected, _ = stream.forward(sub("stream."), a, h, state=None)
    np.testing.assert_array_equal(out, expected)
    assert list(cache.state) == [f"stream.{k}" for k in stream.state_shapes()]


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"channels": 6, "heads": 4}, "divisible by heads"),
        ({"channels": 4, "heads": 2, "gamma": -0.1}, "gamma must be a finite number >= 0"),
        (
            {"channels": 4, "heads": 2, "full_graph": False, "learn_gamma": True},
            "needs full_graph=True",
        ),
        ({"channels": 4, "heads": 2, "bias": "no"}, "bias"),
    ],
)
def test_bad_attention_configuration_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        SANAttention(**kwargs)


def test_bad_attention_inputs_are_refused_in_one_line() -> None:
    graph, real = clique(3)
    attention = SANAttention(2, heads=1)
    params = attention.init_params(np.random.default_rng(0))
    h, e = np.ones((3, 2)), np.ones((graph.num_edges, 2))
    with pytest.raises(TypeError, match="real must be a bool array"):
        attention.forward(params, h, graph, e, real.astype(np.int64))
    with pytest.raises(ValueError, match="4 rows but the pairs graph has 3 nodes"):
        attention.forward(params, np.ones((4, 2)), graph, e, real)
    with pytest.raises(ValueError, match="e must have shape"):
        attention.forward(params, h, graph, e[:2], real)
    sparse = SANAttention(2, heads=1, full_graph=False)
    with pytest.raises(ValueError, match="real marks non-edges"):
        sparse.forward(sparse.init_params(np.random.default_rng(0)), h, graph, e, real)


def test_bad_lpe_inputs_are_refused_in_one_line() -> None:
    lpe = LearnedLaplacianPE(2, heads=1, ffn_channels=2)
    params = lpe.init_params(np.random.default_rng(0))
    vecs = np.ones((2, 3))
    with pytest.raises(ValueError, match="at least one True per node"):
        lpe.forward(params, vecs, vecs, np.array([[True, False, False], [False] * 3]))
    with pytest.raises(ValueError, match="eigvals must have shape"):
        lpe.forward(params, vecs, np.ones((2, 2)), np.ones((2, 3), dtype=bool))
    with pytest.raises(ValueError, match="node_ptr"):
        eigenpairs_padded(Graph(np.zeros((2, 0), dtype=np.int64), 3), 2, np.array([0, 2]))
    with pytest.raises(ValueError, match="joins two graphs"):
        eigenpairs_padded(Graph(np.array([[0], [2]]), 3), 2, np.array([0, 2, 3]))


@pytest.mark.parametrize("value", [5.0, -5.0])
def test_clamp_boundary_passes_no_gradient_as_torch(value: float) -> None:
    # What broke: SANAttention passed the score's gradient at s = +-5 and gamma's at gamma in
    # {0, 1} (a closed interval), but torch.clamp's derivative is 0 on the boundary
    # (test_gt_torch checks GT's at +-5 against torch); drawn scores and gammas never land
    # exactly on the boundary, so the torch parity test could not see it.
    attention = SANAttention(1, heads=1, full_graph=False)
    params = {name: np.ones(shape) for name, shape in attention.param_shapes().items()}
    graph = Graph(np.array([[0], [1]]), 2)  # s = K h_0 * Q h_1 / sqrt(1) * E e = 1 * value * 1
    out, cache = attention.forward(params, np.array([[1.0], [value]]), graph, np.ones((1, 1)))
    assert cache.core.raw[0, 0] == value
    _, grads = attention.backward(params, cache, np.ones_like(out))
    for name in ("W_Q", "W_K", "W_E"):
        np.testing.assert_array_equal(grads[name], 0.0)
    graph, real = clique(3)
    learned = SANAttention(2, heads=1, learn_gamma=True)
    params = learned.init_params(np.random.default_rng(5))
    params["gamma"] = np.array([1.0])
    h, e = np.ones((3, 2)), np.ones((graph.num_edges, 2))
    out, cache = learned.forward(params, h, graph, e, real)
    assert learned.backward(params, cache, np.ones_like(out))[1]["gamma"][0] == 0.0
