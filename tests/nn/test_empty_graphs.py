"""The empty graph (``num_nodes = 0``) and graphs without edges (``E = 0``) through the layers
PyG users cross-check (GATConv v1 / v2, TransformerConv): empty outputs and zero gradients of
the right shapes, as PyG returns (issue 22), in every configuration that changes the
parameters. Graphs with nodes and no edges are also drawn by the layers' gradient checks
(refimpl.testing.strategies.graphs); here they get their exact values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from refimpl import Graph
from refimpl.nn import GATConv, TransformerConv

LAYERS = {
    "gat v1": GATConv(3, 2, heads=2),
    "gat v1 mean, lipschitz": GATConv(3, 2, heads=2, concat=False, lipschitz_norm="paper"),
    "gat v2 shared": GATConv(3, 2, heads=2, version="v2", share_weights=True),
    "gat v2 edges, biases, residual": GATConv(
        3, 2, heads=2, version="v2", edge_dim=2, projection_bias=True, residual=True
    ),
    "gat v1 edges, max fill": GATConv(3, 2, heads=2, edge_dim=2, fill_value="max"),
    "transformer": TransformerConv(3, 2, heads=2),
    "transformer edges, beta, mean": TransformerConv(
        3, 2, heads=2, edge_dim=2, beta=True, concat=False
    ),
}


def run(layer: Any, num_nodes: int) -> tuple:
    """Forward and backward on ``num_nodes`` nodes and no edges, all-ones cotangent."""
    graph = Graph(np.zeros((2, 0), dtype=np.int64), num_nodes)
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(v.shape) for k, v in layer.init_params(rng).items()}
    x = rng.standard_normal((num_nodes, 3))
    edge_attr = np.zeros((0, layer.edge_dim)) if layer.edge_dim else None
    out, cache = layer.forward(params, x, graph, edge_attr)
    d_inputs, d_params = layer.backward(params, cache, np.ones(out.shape))
    return params, x, out, d_inputs, d_params


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_the_empty_graph_gives_an_empty_output_and_zero_gradients(name: str) -> None:
    layer = LAYERS[name]
    params, _, out, d_inputs, d_params = run(layer, 0)
    width = layer.heads * layer.out_channels if layer.concat else layer.out_channels
    assert out.shape == (0, width)
    d_x, d_edge_attr = d_inputs if layer.edge_dim else (d_inputs, None)
    assert d_x.shape == (0, 3)
    if layer.edge_dim:
        assert d_edge_attr.shape == (0, layer.edge_dim)
    assert list(d_params) == list(params)
    for key, grad in d_params.items():
        assert grad.shape == params[key].shape and not np.any(grad), key


@pytest.mark.parametrize("name", [n for n in sorted(LAYERS) if n.startswith("gat")])
def test_nodes_without_edges_output_the_bias_and_skip(name: str) -> None:
    # with the self-loops a GAT layer adds, a node attends to itself alone (alpha = 1):
    # out = W_s x (+ b_s), heads combined, (+ x W_res^T) + bias
    layer = LAYERS[name]
    params, x, out, _, _ = run(layer, 3)
    h = x @ params["W" if layer.version == "v1" else "W_s"].T + params.get("b_s", 0.0)
    h = h.reshape(3, layer.heads, layer.out_channels)
    expected = h.reshape(3, -1) if layer.concat else h.mean(axis=1)
    if layer.residual:
        expected = expected + x @ params["W_res"].T
    np.testing.assert_allclose(out, expected + params["bias"], rtol=1e-14, atol=0)
