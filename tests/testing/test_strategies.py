"""The public Hypothesis strategies (refimpl.testing.strategies): bounds held, the edge cases
reachable, every drawn layer configuration one that PyG and refimpl both build."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import find, given
from hypothesis import strategies as st

from refimpl.interop.crosscheck import layer_from_config
from refimpl.testing import strategies as rst


@given(graph=rst.graphs(min_nodes=2, max_nodes=5, max_edges=6, self_loops=False))
def test_graphs_hold_their_bounds(graph: object) -> None:
    src, dst = np.asarray(graph.edge_index)
    assert 2 <= graph.num_nodes <= 5 and graph.num_edges <= 7  # one forced duplicate
    assert not np.any(src == dst)


def test_graphs_reach_the_edge_cases() -> None:
    def isolated_duplicate_and_loop(graph: object) -> bool:
        src, dst = np.asarray(graph.edge_index)
        pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
        isolated = np.bincount(dst, minlength=graph.num_nodes).min() == 0
        return isolated and len(set(pairs)) < len(pairs) and bool(np.any(src == dst))

    found = find(rst.graphs(), isolated_duplicate_and_loop)
    assert found.num_nodes == 2  # the smallest: a duplicated loop 0 -> 0 beside node 1
    assert find(rst.graphs(min_nodes=0), lambda g: g.num_nodes == 0).num_edges == 0
    looped = find(rst.graphs(self_loops=True), lambda g: True)
    assert np.any(np.equal(*np.asarray(looped.edge_index)))


@given(graph=rst.bipartite_graphs(max_src=3, max_dst=4))
def test_bipartite_graphs_index_each_side_in_its_own_range(graph: object) -> None:
    src, dst = np.asarray(graph.edge_index)
    assert graph.is_bipartite and 1 <= graph.num_nodes <= 3 and 1 <= graph.num_dst_nodes <= 4
    assert np.all(src < graph.num_nodes) and np.all(dst < graph.num_dst_nodes)


@given(x=rst.node_features(4, 3, scale=(1e-3, 1e3)))
def test_node_features_stay_within_their_magnitudes(x: np.ndarray) -> None:
    assert x.shape == (4, 3) and x.dtype == np.float64 and len(np.unique(x)) == x.size
    # the largest of 12 standard normals lies in (0.05, 6) but with odds below 1e-16
    assert 1e-3 * 0.05 < np.abs(x).max() < 1e3 * 6


def test_node_features_reach_both_ends_of_their_range() -> None:
    features = rst.node_features(4, 3, scale=(1e-3, 1e3))
    assert np.abs(find(features, lambda x: np.abs(x).max() > 100)).max() < 6e3
    assert np.abs(find(features, lambda x: np.abs(x).max() < 0.01)).max() > 5e-5


@given(x=rst.edge_features(0, 2))
def test_edge_features_of_no_edge_are_empty(x: np.ndarray) -> None:
    assert x.shape == (0, 2)


@given(batch=rst.graph_batches(max_graphs=3, max_nodes=5))
def test_graph_batches_are_molecule_like(batch: rst.GraphBatch) -> None:
    src, dst = np.asarray(batch.graph.edge_index)
    assert not np.any(src == dst)  # no self-loops
    assert sorted(zip(src, dst, strict=True)) == sorted(zip(dst, src, strict=True))  # undirected
    assert np.all(batch.batch[src] == batch.batch[dst])  # no edge joins two graphs
    assert np.all(np.diff(batch.batch) >= 0) and batch.batch.max() + 1 == batch.num_graphs
    for g in range(batch.num_graphs):  # each graph connected: a search from its first node
        nodes = np.flatnonzero(batch.batch == g)
        seen, queue = {nodes[0]}, deque([nodes[0]])
        while queue:
            for v in dst[src == queue.popleft()]:
                if v not in seen:
                    seen.add(v)
                    queue.append(v)
        assert len(seen) == nodes.size


@pytest.mark.parametrize("layer", rst.LAYERS)
@given(data=st.data())
def test_every_drawn_configuration_builds_in_pyg_and_refimpl(layer: str, data: object) -> None:
    bipartite = data.draw(st.booleans())
    config = data.draw(rst.layer_configs(layer, bipartite=bipartite))
    assert config["framework"] == "pyg" and config["layer"] == layer
    layer_from_config(config)  # refuses a combination refimpl has no counterpart for
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    getattr(pyg_nn, layer)(**config["kwargs"])


@given(config=rst.layer_configs("GATv2Conv", heads=2, negative_slope=st.just(0.3)))
def test_layer_configs_hold_the_options_given(config: dict) -> None:
    assert config["kwargs"]["heads"] == 2 and config["kwargs"]["negative_slope"] == 0.3


def test_layer_configs_refuse_an_unknown_layer_or_option_in_one_line() -> None:
    with pytest.raises(ValueError, match="layer must be one of"):
        find(rst.layer_configs("GCNConv"), lambda c: True)
    with pytest.raises(ValueError, match="GATConv has no option 'beta'"):
        find(rst.layer_configs("GATConv", beta=True), lambda c: True)
