"""GraphTransformer with the massive-activation study's architectures (GT, GraphiT-GT, SAN):
finite differences through the whole model, BatchNorm's state, a batch computed as its graphs
apart, the streams the study logs, and the fields an architecture does not read."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.models import GraphTransformer
from refimpl.nn.transformer.san_lpe import eigenpairs_padded
from refimpl.testing import check_gradients
from refimpl.testing.strategies import graph_batches, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]


def padded_eigenpairs(graph: Graph, batch: np.ndarray, m: int) -> np.ndarray:
    """SAN's encoding input ``(N, m, 3)`` for a batch whose graphs are contiguous blocks."""
    node_ptr = np.concatenate([[0], np.cumsum(np.bincount(batch))])
    vectors, values, valid = eigenpairs_padded(graph, m, node_ptr)
    return np.stack([vectors, values, valid.astype(np.float64)], axis=2)


@st.composite
def study_setups(draw: st.DrawFn) -> tuple:
    """A small model of a drawn architecture and options, parameters moved off their init, a
    batch of molecule-like graphs (one-atom graphs included) and its inputs."""
    training = draw(st.booleans())
    batch = draw(graph_batches(max_graphs=3, max_nodes=4))
    # training BatchNorm needs two rows per stream (torch refuses one as well)
    if training and (batch.graph.num_nodes < 2 or batch.graph.num_edges == 1):
        training = False
    arch = draw(st.sampled_from(["gt", "graphit", "san"]))
    options: dict[str, Any] = {"arch": arch, "norm": draw(st.sampled_from(["batch", "layer"]))}
    if arch in ("gt", "graphit"):
        options["explicit_bias"] = draw(st.booleans())
    if arch in ("graphit", "san"):
        options["full_graph"] = not options.get("explicit_bias") and draw(st.booleans())
    if arch == "graphit":
        options["kernel"] = draw(st.sampled_from(["random-walk", "diffusion"]))
    # SAN's learned encoding (a transformer with 2048-wide FFNs, its own finite-difference
    # tests in tests/nn/transformer/test_san.py) is checked inside the model once, below
    encoding = draw(st.sampled_from(["none", "columns"]))
    options["pe_dim"] = 2 if encoding == "columns" else 0
    model = GraphTransformer(
        in_channels=2,
        out_channels=draw(st.integers(1, 2)),
        hidden_channels=8,
        num_layers=draw(st.integers(1, 2)),
        heads=2,
        edge_dim=draw(st.sampled_from([None, 2])),
        pool=draw(st.sampled_from(["mean", "sum", "max", None])),
        **options,
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {
        name: value + 0.3 * rng.standard_normal(value.shape)
        for name, value in model.init_params(rng).items()
    }
    graph, n = batch.graph, batch.graph.num_nodes
    pe = rng.standard_normal((n, 2)) if encoding == "columns" else None
    edge_attr = None if model.edge_dim is None else rng.standard_normal((graph.num_edges, 2))
    inputs = {
        "x": rng.standard_normal((n, 2)),
        "graph": graph,
        "edge_attr": edge_attr,
        "pe": pe,
        "batch": batch.batch,
        "num_graphs": batch.num_graphs,
    }
    state = {k: v + 0.5 * rng.random(v.shape) for k, v in model.init_state().items()}
    kwargs: dict[str, Any] = {"training": training, "state": state}
    if training:
        _, cache = model.forward(params, **inputs, training=True, rng=rng, state=state)
        kwargs["noise"] = cache.noise
    return model, params, inputs, kwargs


@given(setup=study_setups())
def test_study_model_backward_matches_central_differences(setup: tuple) -> None:
    model, params, inputs, kwargs = setup
    positional = (inputs["x"], inputs["graph"], inputs["edge_attr"], inputs["pe"])
    wrt = [0] + [i for i in (2, 3) if positional[i] is not None]
    report = check_gradients(
        model,
        params,
        positional,
        forward_kwargs={"batch": inputs["batch"], "num_graphs": inputs["num_graphs"], **kwargs},
        wrt_inputs=wrt,
        max_entries=6,
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("training", [False, True])
def test_the_learned_laplacian_encoding_inside_the_model_matches_central_differences(
    training: bool,
) -> None:
    # the model splits pe (N, m, 3) into eigenvectors, eigenvalues and validity, and puts the
    # encoding's gradient back in the first two columns; the validity column is a step (its
    # finite difference is 0, as its stored gradient), and padded eigenpairs get none
    model = GraphTransformer(
        2, 1, hidden_channels=16, num_layers=1, heads=2, arch="san", lpe_eigenpairs=3,
        lpe_channels=4,
    )  # fmt: skip
    rng = np.random.default_rng(3)  # a draw whose readout ReLUs are not all dead
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in model.init_params(rng).items()}
    graph = Graph(np.array([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]]), 5)
    batch = np.array([0, 0, 0, 1, 1])  # graph 1 has 2 nodes: its third eigenpair is padding
    pe = padded_eigenpairs(graph, batch, 3)
    kwargs: dict[str, Any] = {"batch": batch, "num_graphs": 2, "training": training}
    kwargs["state"] = model.init_state()
    x = rng.standard_normal((5, 2))
    if training:
        kwargs["noise"] = model.forward(params, x, graph, None, pe, **kwargs, rng=rng)[1].noise
    report = check_gradients(
        model, params, (x, graph, None, pe), forward_kwargs=kwargs, wrt_inputs=[0, 3],
        max_entries=6,
    )  # fmt: skip
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()
    _, cache = model.forward(params, x, graph, None, pe, **kwargs)
    (_, d_pe), _ = model.backward(params, cache, np.ones((2, 1)))
    assert not d_pe[:, :, 2].any() and not d_pe[3:, 2, :2].any()
    assert np.abs(d_pe[:, :, :2]).max() > 0


@pytest.mark.parametrize("arch", ["gt", "graphit", "san"])
def test_training_updates_batchnorm_state_and_evaluation_reads_it(arch: str) -> None:
    # BatchNorm's running statistics are the model's state: a training forward returns them
    # updated (momentum 0.1 towards the batch's), evaluation normalises with them and changes
    # nothing; without state the running statistics were lost between steps.
    model = GraphTransformer(2, 1, hidden_channels=4, num_layers=2, heads=2, edge_dim=1, arch=arch)
    rng = np.random.default_rng(0)
    params = model.init_params(rng)
    graph = Graph(np.array([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]]), 5)
    inputs = (rng.standard_normal((5, 2)), graph, rng.standard_normal((6, 1)))
    batch = {"batch": np.array([0, 0, 0, 1, 1]), "num_graphs": 2}
    state = model.init_state()
    assert set(state) == set(model.state_shapes()) and state
    _, cache = model.forward(params, *inputs, **batch, training=True, state=state)
    moved = [k for k in state if not np.array_equal(cache.state[k], state[k])]
    assert sorted(moved) == sorted(state)  # every running mean and variance moved
    _, eval_cache = model.forward(params, *inputs, **batch, state=cache.state)
    assert all(np.array_equal(eval_cache.state[k], cache.state[k]) for k in state)
    _, fresh = model.forward(params, *inputs, **batch, state=state)
    # evaluation reads the statistics it is given (the last layer's nodes: the readout's
    # ReLUs may all be off at init)
    outputs = [model.activations(c)["layer1.h.output"][0] for c in (eval_cache, fresh)]
    assert not np.allclose(*outputs)
    with pytest.raises(ValueError, match="state"):
        model.forward(params, *inputs, **batch)  # evaluation without statistics


@pytest.mark.parametrize("arch", ["gt", "graphit", "san"])
def test_a_batch_in_evaluation_is_its_graphs_computed_apart(arch: str) -> None:
    # In evaluation (running statistics) nothing crosses a graph's boundary: the full graph of
    # GraphiT and SAN pairs nodes of one graph only, the kernel is per graph.
    model = GraphTransformer(2, 2, hidden_channels=4, num_layers=2, heads=2, edge_dim=1, arch=arch)
    rng = np.random.default_rng(1)
    params = model.init_params(rng)
    state = {k: v + rng.random(v.shape) for k, v in model.init_state().items()}
    parts = [np.array([[0, 1, 1, 2], [1, 0, 2, 1]]), np.array([[0, 1], [1, 0]])]
    sizes = [3, 2]
    xs = [rng.standard_normal((n, 2)) for n in sizes]
    attrs = [rng.standard_normal((p.shape[1], 1)) for p in parts]
    alone = [
        model.forward(params, x, Graph(p, n), a, state=state)[0]
        for x, p, n, a in zip(xs, parts, sizes, attrs, strict=True)
    ]
    edges = np.concatenate([parts[0], parts[1] + 3], axis=1)
    together, _ = model.forward(
        params,
        np.concatenate(xs),
        Graph(edges, 5),
        np.concatenate(attrs),
        batch=np.array([0, 0, 0, 1, 1]),
        num_graphs=2,
        state=state,
    )
    np.testing.assert_allclose(together, np.concatenate(alone), rtol=RTOL64, atol=1e-15)


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("gt", {"h.attention", "e.attention", "h.output", "e.output"}),
        ("graphit", {"h.attention", "e.attention", "h.output"}),
        ("san", {"h.attention", "e.attention", "h.output"}),
    ],
)
def test_activations_name_the_streams_the_study_logs(arch: str, expected: set) -> None:
    model = GraphTransformer(2, 1, hidden_channels=4, num_layers=2, heads=2, edge_dim=1, arch=arch)
    rng = np.random.default_rng(2)
    params = model.init_params(rng)
    graph = Graph(np.array([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)
    _, cache = model.forward(
        params, rng.standard_normal((3, 2)), graph, rng.standard_normal((4, 1)),
        training=True, state=model.init_state(),
    )  # fmt: skip
    found = model.activations(cache)
    assert set(found) == {f"layer{i}.{name}" for i in range(2) for name in expected}
    pairs = 4 if arch == "gt" else 6  # GraphiT and SAN attend over all 3 * 2 ordered pairs
    values, graph_ids = found["layer1.e.attention"]
    assert values.shape == (pairs, 4) and graph_ids.shape == (pairs,)
    # what the study logs as the attention output is the layer's attention, before the stream
    layer = cache.layers[1]
    attention_out = layer.attention_h if arch == "gt" else layer.attention_out
    np.testing.assert_array_equal(found["layer1.h.attention"][0], attention_out)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"explicit_bias": True}, r"explicit_bias=True applies to arch gt or graphit"),
        ({"arch": "san", "explicit_bias": True}, r"applies to arch gt or graphit, not 'san'"),
        ({"arch": "gt", "global_node": True}, r"global_node=True applies to arch transformer"),
        ({"arch": "gt", "lipschitz_norm": "paper"}, r"lipschitz_norm='paper' applies"),
        ({"arch": "gt", "full_graph": False}, r"full_graph=False applies to arch graphit or san"),
        ({"arch": "gt", "gamma": 0.5}, r"gamma=0.5 applies to arch san"),
        # GraphiT-GT's and SAN's FFN is always 2 D: ffn_channels was ignored there silently
        ({"arch": "graphit", "ffn_channels": 7}, r"ffn_channels=7 applies to arch transf"),
        ({"arch": "san", "ffn_channels": 7}, r"ffn_channels=7 applies to arch transf"),
        ({"norm": "batch"}, r"norm='batch' applies to arch gt or graphit or san"),
        ({"arch": "gt", "norm": "group"}, r"norm must be one of"),
        ({"arch": "graphit", "kernel": "heat"}, r"kernel must be one of"),
        ({"arch": "vit"}, r"arch must be one of"),
        ({"arch": "san", "pe_dim": 2, "lpe_eigenpairs": 2}, r"one positional encoding"),
        ({"arch": "san", "lpe_eigenpairs": 2, "lpe_channels": 8}, r"lpe_channels \(8\) must be"),
    ],
)
def test_fields_an_architecture_does_not_read_are_refused(fields: dict, message: str) -> None:
    # a value set where the architecture never reads it would be ignored without a word
    with pytest.raises(ValueError, match=message):
        GraphTransformer(2, hidden_channels=8, heads=2, **fields)


def test_the_existing_architecture_is_the_default_and_has_no_state() -> None:
    model = GraphTransformer(2, hidden_channels=4, heads=2)
    assert model.arch == "transformer-conv" and model.norm is None and model.init_state() == {}
    params = model.init_params(np.random.default_rng(0))
    graph = Graph(np.array([[0], [1]]), 2)
    with pytest.raises(ValueError, match="has no state"):
        model.forward(params, np.ones((2, 2)), graph, state={"x": np.ones(1)})
