"""The bound on every count (refimpl.kernels.limits): 2**31 - 1, what the device kernels index
with int32; beyond it a count is refused in one line that says the bound and why."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import Graph
from refimpl.fields import check_positive_int
from refimpl.kernels.limits import MAX_COUNT
from refimpl.models import GAT, GraphTransformer, NodeFormer
from refimpl.nn import GATConv, LayerNorm, NodeFormerConv, TransformerConv
from refimpl.nn.nodeformer.random_features import draw_projection
from refimpl.ops.linear import Linear

BOUND = r"must be at most 2\*\*31 - 1, got 4611686018427387904: .*int32"


def test_the_bound_is_the_largest_int32() -> None:
    # Not a value copied from the code: the largest index an int32 holds.
    assert MAX_COUNT == np.iinfo(np.int32).max
    check_positive_int(MAX_COUNT, "heads")  # the bound itself is a count
    with pytest.raises(ValueError, match=r"^heads must be at most 2\*\*31 - 1, got 2147483648"):
        check_positive_int(MAX_COUNT + 1, "heads")


@pytest.mark.parametrize("keyword", ["num_nodes", "num_dst_nodes"])
def test_graph_node_counts_over_int32_are_refused_not_left_to_numpy(keyword: str) -> None:
    # Regression (issue 33, item 7): Graph(edges, 2**62) was accepted and in_degree() then
    # failed in NumPy's words ("array is too big"); the tests of bad node counts stopped at
    # negative numbers and non-ints.
    counts = {"num_nodes": 3, "num_dst_nodes": 3, keyword: 2**62}
    with pytest.raises(ValueError, match=f"^{keyword} {BOUND}"):
        Graph([[0], [1]], counts["num_nodes"], num_dst_nodes=counts["num_dst_nodes"])


def test_graph_edge_count_over_int32_is_refused_before_its_entries_are_read() -> None:
    # 2**31 edges as a broadcast view (no memory): refused by count, before the range checks
    # read 2**32 entries or the int64 copy asks for 32 GiB.
    edges = np.broadcast_to(np.zeros((2, 1), dtype=np.int8), (2, MAX_COUNT + 1))
    with pytest.raises(ValueError, match=r"^the number of edges must be at most 2\*\*31 - 1"):
        Graph(edges, 1)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: GraphTransformer(3, num_layers=2**62), "GraphTransformer num_layers"),
        (lambda: GraphTransformer(3, pe_dim=2**62), "GraphTransformer pe_dim"),
        (lambda: GraphTransformer(3, edge_dim=2**62), "GraphTransformer edge_dim"),
        (lambda: GAT(3, 2, 2, num_layers=2**62), "GAT num_layers"),
        (lambda: GAT(3, 2, 2, num_layers=2, heads=2**62), "GAT heads"),
        (lambda: GAT(3, 2, 2, num_layers=2, heads=(1, 2**62)), "GAT heads"),
        (lambda: NodeFormer(3, num_layers=2**62), "NodeFormer num_layers"),
        (lambda: NodeFormerConv(3, 2, num_random_features=2**62), "NodeFormerConv num_random"),
        (lambda: TransformerConv(3, 2, heads=2**62), "TransformerConv heads"),
        (lambda: LayerNorm(2**62, "node"), "LayerNorm channels"),
        (lambda: draw_projection(np.random.default_rng(0), 2**62, 3), "draw_projection m"),
        (lambda: GATConv(2**62, 2), "GATConv in_channels"),
        (lambda: Linear(3, 2**62), "Linear out_features"),
    ],
)
def test_sizes_over_int32_are_refused_before_anything_is_built(build, name: str) -> None:
    # Regression (issue 33, item 7): sizes of 2**62 reached NumPy ("array is too big",
    # "Maximum allowed dimension exceeded"), a MemoryError, or GraphTransformer's loop over
    # 2**62 layers, which ran until stopped; the size checks asked only for a positive int.
    with pytest.raises(ValueError, match=f"^{name}.* {BOUND}"):
        build()


@pytest.mark.parametrize(
    "num_graphs", [float("nan"), float("inf"), 1e308, 2**62, "2", [2], 2 + 1j, 0, 2.0]
)
def test_num_graphs_is_checked_before_numpy_reads_it(num_graphs: object) -> None:
    # Regression (issue 33, item 7): GraphTransformer.forward passed num_graphs to NumPy and
    # Python unchecked: NaN and infinity gave "cannot convert float NaN to integer" and an
    # OverflowError, 2**62 "array is too big", a string Python's "'>' not supported". No test
    # gave num_graphs anything but a valid count.
    model = GraphTransformer(3, 1, hidden_channels=4, num_layers=1, heads=2)
    params = model.init_params(np.random.default_rng(0))
    graph, batch = Graph([[0, 2], [1, 3]], 4), np.array([0, 0, 1, 1])
    with pytest.raises(ValueError, match=r"^num_graphs must be (a positive int|at most 2\*\*31)"):
        model.forward(params, np.ones((4, 3)), graph, batch=batch, num_graphs=num_graphs)
    out, _ = model.forward(params, np.ones((4, 3)), graph, batch=batch, num_graphs=np.int64(3))
    assert out.shape == (3, 1)  # a NumPy int is a count; the third graph has no node
