"""GraphTransformer model: finite differences through the whole stack (graph and node level,
global node, positional and edge features), batches as independent graphs, invariance to node
order, the attention graph of Eq. 7 / 14, the massive-activation tensors, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import asarray, to_numpy
from refimpl.models import GraphTransformer
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from refimpl.validation import NonFiniteError
from tests.backends import DEVICE_BACKENDS
from tests.nn.norms.test_norms import smooth_at_step

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
STEP = 1e-5  # as in the NodeFormer model tests; curvature excluded by `smooth` instead


def block_diagonal(parts: list[Graph]) -> tuple[Graph, np.ndarray]:
    """The disjoint union of ``parts`` (node ids offset) and the graph id of every node,
    written here independently of refimpl.data.collate."""
    offsets = np.cumsum([0] + [g.num_nodes for g in parts])
    edges = np.concatenate([g.edge_index + offsets[i] for i, g in enumerate(parts)], axis=1)
    batch = np.repeat(np.arange(len(parts)), [g.num_nodes for g in parts])
    return Graph(edges, int(offsets[-1])), batch


@st.composite
def model_setups(draw: st.DrawFn) -> tuple:
    """A small model, float64 parameters moved off their init, a batch of 1-3 graphs and its
    inputs, and forward kwargs (fixed masks in training)."""
    parts = draw(st.lists(graphs(max_nodes=4, max_edges=6), min_size=1, max_size=3))
    graph, batch = block_diagonal(parts)
    heads = draw(st.integers(1, 2))
    model = GraphTransformer(
        in_channels=draw(st.integers(1, 3)),
        out_channels=draw(st.integers(1, 2)),
        hidden_channels=heads * draw(st.integers(1, 2)),
        num_layers=draw(st.integers(1, 2)),
        heads=heads,
        ffn_channels=draw(st.integers(1, 3)),
        edge_dim=draw(st.sampled_from([None, 2])),
        pe_dim=draw(st.sampled_from([0, 2])),
        global_node=draw(st.booleans()),
        pool=draw(st.sampled_from(["mean", "sum", "max", None])),
        dropout=draw(st.sampled_from([0.0, 0.3])),
        layer_norm=draw(st.booleans()),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {
        name: value + 0.3 * rng.standard_normal(value.shape)
        for name, value in model.init_params(rng).items()
    }
    inputs = {
        "x": rng.standard_normal((graph.num_nodes, model.in_channels)),
        "graph": graph,
        "edge_attr": None if model.edge_dim is None else rng.standard_normal((graph.num_edges, 2)),
        "pe": None if not model.pe_dim else rng.standard_normal((graph.num_nodes, 2)),
        "batch": batch,
        "num_graphs": len(parts),
    }
    kwargs: dict[str, Any] = {"training": draw(st.booleans())}
    if kwargs["training"]:
        _, cache = model.forward(params, **inputs, training=True, rng=rng)
        kwargs["noise"] = cache.noise
    return model, params, inputs, kwargs


def smooth(model: GraphTransformer, params: dict, cache: Any) -> bool:
    """LayerNorm roots and ReLU inputs (the layers' FFNs, the head) far from their non-smooth
    points on the scale of the step (see tests/nn/transformer/test_graph_transformer_layer.py)."""
    norm = model.blocks["layer0"].blocks.get("norm1")
    for i, layer in enumerate(cache.layers):
        roots = [c.root for c in (layer.norm1, layer.norm2) if c is not None]
        if model.hidden_channels > 1 and not all(smooth_at_step(r, norm, STEP) for r in roots):
            return False
        pre = layer.ffn1.x @ params[f"layer{i}.ffn1.W"].T + params[f"layer{i}.ffn1.b"]
        if np.abs(pre).min() <= 1e3 * STEP:
            return False
    if cache.head1 is not None:
        pre = cache.head1.x @ params["head1.W"].T + params["head1.b"]
        return bool(np.abs(pre).min() > 1e3 * STEP)
    return True


class Positional:
    """The model with its inputs passed positionally, as ``check_gradients`` perturbs them."""

    def __init__(self, model: GraphTransformer, inputs: dict, kwargs: dict) -> None:
        self.model, self.kwargs = model, kwargs
        self.names = [k for k in ("x", "edge_attr", "pe") if inputs[k] is not None]
        self.fixed = {k: v for k, v in inputs.items() if k not in self.names}

    def forward(self, params: dict, *arrays: Any) -> tuple:
        given = dict(zip(self.names, arrays, strict=True))
        return self.model.forward(params, **given, **self.fixed, **self.kwargs)

    def backward(self, params: dict, cache: Any, d_out: Any) -> tuple:
        return self.model.backward(params, cache, d_out)


@settings(max_examples=15)
@given(setup=model_setups())
def test_model_matches_central_differences(setup: tuple) -> None:
    model, params, inputs, kwargs = setup
    _, cache = model.forward(params, **inputs, **kwargs)
    assume(smooth(model, params, cache))
    block = Positional(model, inputs, kwargs)
    arrays = tuple(inputs[name] for name in block.names)
    report = check_gradients(
        block, params, arrays, max_entries=12, rng=np.random.default_rng(0), eps=STEP
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@settings(max_examples=15)
@given(setup=model_setups())
def test_a_batch_is_its_graphs_run_one_by_one(setup: tuple) -> None:
    """Block-diagonal batching: every graph's outputs equal those of the graph alone (the
    attention never crosses graphs, each global node serves one graph)."""
    model, params, inputs, _ = setup
    out, _ = model.forward(params, **inputs)
    graph, batch = inputs["graph"], inputs["batch"]
    edge_graph = batch[graph.edge_index[1]]
    for g in range(inputs["num_graphs"]):
        nodes = np.flatnonzero(batch == g)
        alone = {
            "x": inputs["x"][nodes],
            "graph": graph.subgraph(nodes),
            "edge_attr": None
            if inputs["edge_attr"] is None
            else inputs["edge_attr"][edge_graph == g],
            "pe": None if inputs["pe"] is None else inputs["pe"][nodes],
        }
        single, _ = model.forward(params, **alone)
        expected = out[g : g + 1] if model.pool is not None else out[nodes]
        assert max_relative_error(single, expected) <= 1e2 * RTOL64  # summation order only


def test_graph_outputs_do_not_depend_on_node_order() -> None:
    """Relabelling the nodes (edges and features with them) permutes nothing at graph level."""
    rng = np.random.default_rng(2)
    graph = Graph(rng.integers(0, 9, (2, 25)), 9)
    model = GraphTransformer(
        3, 2, hidden_channels=4, num_layers=2, heads=2, edge_dim=2, global_node=True
    )
    params = model.init_params(rng)
    x, e = rng.standard_normal((9, 3)), rng.standard_normal((25, 2))
    out, _ = model.forward(params, x, graph, e)
    perm = rng.permutation(9)  # new node i is old node perm[i]
    new_id = np.argsort(perm)
    relabelled = Graph(new_id[graph.edge_index], 9)
    moved, _ = model.forward(params, x[perm], relabelled, e)
    assert max_relative_error(moved, out) <= 1e2 * RTOL64


def test_attention_graph_has_loops_and_global_edges() -> None:
    """Eq. 7's diagonal and Eq. 14's global node: input self-loops replaced by one per node,
    then node -> global, global -> node and the global loops, with their type columns."""
    graph = Graph(np.array([[0, 1, 1, 2], [1, 0, 1, 3]]), 4)  # 1 -> 1 is a self-loop
    batch = np.array([0, 0, 1, 1])
    model = GraphTransformer(
        1, 1, hidden_channels=2, num_layers=1, heads=1, edge_dim=1, global_node=True
    )
    params = model.init_params(np.random.default_rng(0))
    e = np.array([[1.0], [2.0], [3.0], [4.0]])
    _, cache = model.forward(params, np.ones((4, 1)), graph, e, batch=batch)
    structure = cache.attention_graph
    expected = [
        [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 4, 5, 5, 4, 5],
        [1, 0, 3, 0, 1, 2, 3, 4, 4, 5, 5, 0, 1, 2, 3, 4, 5],
    ]
    np.testing.assert_array_equal(structure.graph.edge_index, expected)
    types = structure.edge_types
    np.testing.assert_array_equal(types[:3], 0)
    np.testing.assert_array_equal(types[3:7], [[1, 0, 0]] * 4)
    np.testing.assert_array_equal(types[7:11], [[0, 1, 0]] * 4)
    np.testing.assert_array_equal(types[11:15], [[0, 0, 1]] * 4)
    np.testing.assert_array_equal(types[15:], [[1, 0, 0]] * 2)
    # the edge embedding's input: the kept edges' features (the self-loop's 3.0 dropped), zeros
    np.testing.assert_array_equal(cache.edge.x[:3, 0], [1.0, 2.0, 4.0])
    np.testing.assert_array_equal(cache.edge.x[3:, 0], 0.0)


def test_activations_cover_every_layer_with_graph_ids() -> None:
    rng = np.random.default_rng(4)
    graph, batch = block_diagonal(
        [Graph(rng.integers(0, 3, (2, 4)), 3), Graph(np.array([[0], [1]]), 2)]
    )
    model = GraphTransformer(2, 1, hidden_channels=4, num_layers=3, heads=2, global_node=True)
    params = model.init_params(rng)
    _, cache = model.forward(params, rng.standard_normal((5, 2)), graph, batch=batch)
    found = model.activations(cache)
    assert list(found) == [f"layer{i}.{kind}" for i in range(3) for kind in ("scores", "output")]
    num_edges = cache.attention_graph.graph.num_edges
    scores, edge_graph = found["layer1.scores"]
    assert scores.shape == (num_edges, 4) and edge_graph.shape == (num_edges,)
    dst = cache.attention_graph.graph.edge_index[1]
    np.testing.assert_array_equal(edge_graph, np.r_[batch, 0, 1][dst])
    output, node_graph = found["layer2.output"]
    np.testing.assert_array_equal(output, cache.layers[2].out)
    np.testing.assert_array_equal(node_graph, np.r_[batch, 0, 1])


def test_noise_replay_is_exact() -> None:
    rng = np.random.default_rng(6)
    graph = Graph(rng.integers(0, 6, (2, 12)), 6)
    model = GraphTransformer(
        2, 1, hidden_channels=4, num_layers=2, heads=2, dropout=0.3, attn_dropout=0.2
    )
    params = model.init_params(rng)
    x = rng.standard_normal((6, 2))
    out, cache = model.forward(params, x, graph, training=True, rng=rng)
    assert list(cache.noise) == [
        f"layer{i}.{key}" for i in range(2) for key in ("attn_dropout", "dropout1", "dropout2")
    ]
    np.testing.assert_array_equal(
        model.forward(params, x, graph, training=True, noise=cache.noise)[0], out
    )


@pytest.mark.parametrize(
    ("config", "inputs", "message"),
    [
        ({}, {"edge_attr": np.ones((2, 1))}, "no edge_dim"),
        ({"edge_dim": 1}, {}, "pass edge_attr"),
        ({"edge_dim": 1}, {"edge_attr": np.ones((3, 1))}, "edge_attr"),
        ({"pe_dim": 2}, {}, "pass pe"),
        ({}, {"batch": np.array([0, 1])}, "batch must be"),
        ({}, {"batch": np.array([0, 0, 1]), "num_graphs": 1}, "num_graphs"),
        # an edge between two graphs of a batch was accepted: attention mixed the graphs,
        # and the activations named each edge's graph by its target alone
        (
            {},
            {"batch": np.array([0, 0, 1])},
            r"^edge 1 \(1 -> 2\) joins graph 0 to graph 1: the graphs of a batch share no edge",
        ),
    ],
)
def test_bad_input_is_rejected(config: dict, inputs: dict, message: str) -> None:
    model = GraphTransformer(1, 1, hidden_channels=2, num_layers=1, heads=1, **config)
    params = model.init_params(np.random.default_rng(0))
    graph = Graph(np.array([[0, 1], [1, 2]]), 3)
    with pytest.raises(ValueError, match=message):
        model.forward(params, np.ones((3, 1)), graph, **inputs)


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="pool"):
        GraphTransformer(2, pool="median")
    with pytest.raises(ValueError, match="divisible"):
        GraphTransformer(2, hidden_channels=6, heads=4)
    with pytest.raises(ValueError, match="pe_dim"):
        GraphTransformer(2, pe_dim=-1)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@settings(max_examples=10)
@given(setup=model_setups())
def test_backend_matches_numpy(backend: str, setup: tuple) -> None:
    """The same model on the strict stand-in (CuPy where installed) gives NumPy's outputs and
    gradients: no stray NumPy call in the math, explicit transfers only."""
    model, params, inputs, kwargs = setup
    out, cache = model.forward(params, **inputs, **kwargs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_inputs, d_params = model.backward(params, cache, d_out)

    def on(value: Any) -> Any:
        return (
            value if value is None or isinstance(value, Graph) else asarray(value, backend=backend)
        )

    moved = {k: on(v) if k not in ("batch", "num_graphs") else v for k, v in inputs.items()}
    kwargs_on = dict(kwargs)
    if "noise" in kwargs:
        kwargs_on["noise"] = {k: on(v) for k, v in kwargs["noise"].items()}
    params_on = {k: on(v) for k, v in params.items()}
    out_b, cache_b = model.forward(params_on, **moved, **kwargs_on)
    d_inputs_b, d_params_b = model.backward(params_on, cache_b, on(d_out))
    assert not isinstance(out_b, np.ndarray)
    assert max_relative_error(to_numpy(out_b), out) <= RTOL64
    as_tuple = lambda d: d if isinstance(d, tuple) else (d,)  # noqa: E731
    ours = {f"input{i}": d for i, d in enumerate(as_tuple(d_inputs_b))}
    expected = {f"input{i}": d for i, d in enumerate(as_tuple(d_inputs))}
    errors = relative_errors({**d_params_b, **ours}, {**d_params, **expected})
    assert max(errors.values()) <= RTOL64, errors


def test_graphs_without_nodes_pool_to_zero() -> None:
    """num_graphs above the largest batch id: the empty graphs pool to 0 (GlobalPool's
    convention), so their outputs are the head applied to zeros."""
    rng = np.random.default_rng(8)
    model = GraphTransformer(2, 3, hidden_channels=4, num_layers=1, heads=2, pool="mean")
    params = {k: v + rng.standard_normal(v.shape) for k, v in model.init_params(rng).items()}
    graph = Graph(np.array([[0, 1], [1, 0]]), 3)  # graph 0: nodes 0 and 1; graph 1: node 2
    x = rng.standard_normal((3, 2))
    out, _ = model.forward(params, x, graph, batch=np.array([0, 0, 1]), num_graphs=4)
    hidden = np.maximum(params["head1.b"], 0)  # head1 applied to a zero pool
    expected = hidden @ params["head2.W"].T + params["head2.b"]
    np.testing.assert_allclose(out[2:], np.stack([expected, expected]), rtol=1e-14)
    alone, _ = model.forward(params, x, graph, batch=np.array([0, 0, 1]))
    np.testing.assert_array_equal(out[:2], alone)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's own word on the overflow
def test_an_overflowed_layer_norm_is_refused_naming_the_layer_not_returned_as_zero() -> None:
    # Regression (issue 33, item 7): float32 parameters grown by a huge step (here layer1's
    # FFN times 1e30) made LayerNorm's variance infinite, so it output its bias and the model
    # returned 0: finite and wrong, so training's divergence guard let the evaluation pass.
    # Earlier tests held the model to finite differences on well-scaled values only.
    model = GraphTransformer(3, 1, hidden_channels=4, num_layers=2, heads=2)
    params = model.init_params(np.random.default_rng(0), dtype=np.float32)
    params["layer1.ffn1.W"] = params["layer1.ffn1.W"] * np.float32(1e30)
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(NonFiniteError, match=r"^in layer1: LayerNorm\.forward: the variance"):
        model.forward(params, x, Graph([[0, 1, 2], [1, 2, 3]], 4))
