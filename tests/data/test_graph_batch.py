"""collate and GraphBatch: one graph round-trips, block-diagonal structure, the batch vector,
the relabelling of networkx's disjoint union, epochs of batches, backends."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import array_module, to_numpy
from refimpl.data.graph_batch import GraphBatch, collate, iterate_batches
from refimpl.data.molecules import synthetic_molecules
from refimpl.kernels.segment import Segments

DATASET = synthetic_molecules(num_graphs=20, seed=5, min_atoms=1, max_atoms=9)
indices_strategy = st.lists(st.integers(0, len(DATASET) - 1), min_size=1, max_size=8)


@pytest.mark.parametrize("i", [0, 7, 19])
def test_collate_of_one_graph_is_that_graph(i: int) -> None:
    graph, x, edge_attr, y = DATASET.graph(i)
    batch = collate(DATASET, [i])
    np.testing.assert_array_equal(batch.graph.edge_index, graph.edge_index)
    assert batch.graph.num_nodes == graph.num_nodes and batch.num_graphs == 1
    np.testing.assert_array_equal(batch.x, x)
    np.testing.assert_array_equal(batch.edge_attr, edge_attr)
    np.testing.assert_array_equal(batch.y, y[None, :])
    np.testing.assert_array_equal(batch.batch, np.zeros(graph.num_nodes, dtype=np.int64))
    np.testing.assert_array_equal(batch.node_ptr, [0, graph.num_nodes])


@given(indices=indices_strategy)
def test_batch_is_block_diagonal_with_the_right_batch_vector(indices: list[int]) -> None:
    batch = collate(DATASET, indices)
    sizes = [DATASET.graph(i)[0].num_nodes for i in indices]
    expected = np.concatenate([np.full(n, j) for j, n in enumerate(sizes)])  # a naive loop
    np.testing.assert_array_equal(batch.batch, expected)
    np.testing.assert_array_equal(batch.node_ptr, np.concatenate([[0], np.cumsum(sizes)]))
    src, dst = batch.graph.edge_index
    assert np.array_equal(batch.batch[src], batch.batch[dst])  # no edge crosses two graphs
    # each graph's block holds exactly its own edges, shifted by its first node
    for j, i in enumerate(indices):
        own = batch.batch[src] == j
        np.testing.assert_array_equal(
            batch.graph.edge_index[:, own] - batch.node_ptr[j], DATASET.graph(i)[0].edge_index
        )
        np.testing.assert_array_equal(batch.edge_attr[own], DATASET.graph(i)[2])
    np.testing.assert_array_equal(batch.y, DATASET.y[indices])


def _networkx(i: int) -> nx.MultiDiGraph:
    graph, x, edge_attr, _ = DATASET.graph(i)
    g = nx.MultiDiGraph()
    g.add_nodes_from((v, {"x": tuple(row)}) for v, row in enumerate(x.tolist()))
    for (u, v), row in zip(graph.edge_index.T.tolist(), edge_attr.tolist(), strict=True):
        g.add_edge(u, v, attr=tuple(row))
    return g


@given(indices=indices_strategy)
def test_relabelling_agrees_with_networkx_disjoint_union(indices: list[int]) -> None:
    union = nx.disjoint_union_all([_networkx(i) for i in indices])  # nodes renumbered in order
    batch = collate(DATASET, indices)
    assert union.number_of_nodes() == batch.num_nodes
    features = [union.nodes[v]["x"] for v in range(union.number_of_nodes())]
    np.testing.assert_array_equal(batch.x.reshape(batch.num_nodes, -1), np.array(features))
    ours = sorted(
        (u, v, tuple(row))
        for (u, v), row in zip(
            batch.graph.edge_index.T.tolist(), batch.edge_attr.tolist(), strict=True
        )
    )
    theirs = sorted((u, v, a) for u, v, a in union.edges(data="attr"))
    assert ours == theirs


def test_batch_segments_group_nodes_by_graph_and_are_cached() -> None:
    batch = collate(DATASET, [3, 1, 3])
    segments = batch.batch_segments(np)
    assert isinstance(segments, Segments) and segments is batch.batch_segments()
    assert segments.num_segments == 3 and segments.num_items == batch.num_nodes
    np.testing.assert_array_equal(segments.counts(), np.diff(batch.node_ptr))
    strict = array_module("strict")
    on_strict = batch.batch_segments(strict)
    assert on_strict is batch.batch_segments(strict) and on_strict.backend == "strict"


def test_to_backend_and_astype() -> None:
    batch = collate(DATASET, [0, 2])
    moved = batch.to_backend("strict")
    assert moved.to_backend("strict") is moved
    for key in ("x", "edge_attr", "batch", "node_ptr", "y"):
        assert type(getattr(moved, key)).__module__ == "refimpl.testing.strict"
        np.testing.assert_array_equal(to_numpy(getattr(moved, key)), getattr(batch, key))
    assert moved.batch_segments().xp is array_module("strict")
    single = batch.astype(np.float32)
    assert single.x.dtype == single.edge_attr.dtype == single.y.dtype == np.float32
    assert single.batch.dtype == np.int64
    with pytest.raises(TypeError, match="floating point"):
        batch.astype(np.int32)


@given(
    num_graphs=st.integers(1, 20),
    batch_size=st.integers(1, 25),
    seed=st.integers(0, 2**32 - 1),
)
def test_an_epoch_visits_every_graph_once(num_graphs: int, batch_size: int, seed: int) -> None:
    ds = DATASET.subset(np.arange(num_graphs))
    batches = list(iterate_batches(ds, batch_size, rng=np.random.default_rng(seed)))
    sizes = [b.num_graphs for b in batches]
    assert sizes == [batch_size] * (num_graphs // batch_size) + (
        [num_graphs % batch_size] if num_graphs % batch_size else []
    )
    # the order is the seeded permutation: replayed by the same seed
    order = np.random.default_rng(seed).permutation(num_graphs)
    expected = collate(ds, order)
    np.testing.assert_array_equal(np.concatenate([b.y for b in batches]), expected.y)
    np.testing.assert_array_equal(np.concatenate([b.x for b in batches]), expected.x)


def test_iterate_without_shuffle_keeps_dataset_order_and_needs_rng_to_shuffle() -> None:
    batches = list(iterate_batches(DATASET, 6, shuffle=False))
    assert [b.num_graphs for b in batches] == [6, 6, 6, 2]
    np.testing.assert_array_equal(np.concatenate([b.y for b in batches]), DATASET.y)
    seeded = [b.y for b in iterate_batches(DATASET, 6, rng=4)]  # an int seed
    replay = [b.y for b in iterate_batches(DATASET, 6, rng=np.random.default_rng(4))]
    for a, b in zip(seeded, replay, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="shuffle=True needs rng"):
        iterate_batches(DATASET, 6)  # raised at the call, not at the first batch
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        iterate_batches(DATASET, 0, shuffle=False)


def test_collate_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one graph"):
        collate(DATASET, [])
    with pytest.raises(ValueError, match=r"graph indices must lie in \[0, 20\)"):
        collate(DATASET, [20])
    with pytest.raises(TypeError, match="GraphDataset"):
        collate(DATASET.x, [0])


def test_graph_batch_constructor_checks_shapes() -> None:
    good = collate(DATASET, [0, 1])
    fields = {
        "graph": good.graph,
        "x": good.x,
        "edge_attr": good.edge_attr,
        "batch": good.batch,
        "node_ptr": good.node_ptr,
        "num_graphs": good.num_graphs,
        "y": good.y,
    }
    with pytest.raises(ValueError, match=r"y must have shape \(2, \*\)"):
        GraphBatch(**{**fields, "y": good.y[:1]})
    with pytest.raises(ValueError, match=r"node_ptr must have shape \(3,\)"):
        GraphBatch(**{**fields, "num_graphs": 2, "node_ptr": good.node_ptr[:2]})
    with pytest.raises(TypeError, match="batch must be an integer array"):
        GraphBatch(**{**fields, "batch": good.batch.astype(float)})
    with pytest.raises(TypeError, match=r"refimpl\.Graph"):
        GraphBatch(**{**fields, "graph": Graph.__name__})
