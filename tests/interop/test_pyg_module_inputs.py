"""``check_pyg_module`` on the inputs PyG itself takes (issue 33): its own tests' 1-D
``edge_attr`` with ``edge_dim=1``, frozen parameters, sparse adjacencies (``torch.sparse`` and
``torch_sparse.SparseTensor``, read transposed as PyG reads them), and inputs it cannot read
(a float or boolean ``edge_index``, indices out of range, ``x = (x_src, None)``) refused in one
line naming the problem."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_utils = pytest.importorskip("torch_geometric.utils")

from refimpl.interop import CrosscheckError, check_pyg_module  # noqa: E402
from tests.interop.test_pyg_module import _randomised  # noqa: E402

# no duplicate edge (a sparse adjacency stores each entry once), not symmetric (read the wrong
# way round, it is another graph), a self-loop (2 -> 2) and an isolated node (6)
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2, 1], [1, 2, 3, 4, 5, 0, 3, 2, 3]])
NODES = 7


def rows(result) -> dict[str, tuple[tuple[int, ...], bool]]:
    return {t.name: (t.shape, t.passed) for t in result.tensors}


# -- PyG's own test inputs ------------------------------------------------------------------------
# test/nn/conv/test_gat_conv.py::test_gat_conv_with_edge_attr and test_gatv2_conv.py's twin
# (pyg-team/pytorch_geometric): conv(x, edge_index, edge_weight) with edge_dim=1 and a 1-D
# edge_weight, then edge_dim=4 with (E, 4) features, each with fill_value 0.5 and "mean".
PYG_EDGE_ATTR_CASES = [
    (layer, edge_dim, fill)
    for layer in ("GATConv", "GATv2Conv")
    for edge_dim in (1, 4)
    for fill in (0.5, "mean")
]


@pytest.mark.parametrize(("layer", "edge_dim", "fill"), PYG_EDGE_ATTR_CASES)
def test_one_dimensional_edge_attr_gradient_keeps_its_shape(layer, edge_dim, fill) -> None:
    # Issue 33: refimpl's GAT reads a 1-D edge_attr as PyG does (view(-1, 1)) but returned its
    # gradient (E, 1), and torch's is (E,): PyG's own test input failed on shape alone. The
    # earlier tests gave edge features as (E, edge_dim) only.
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 0, 1, 1]])
    edge_weight = torch.randn(edge_index.size(1))
    edge_attr = torch.randn(edge_index.size(1), 4)
    conv = _randomised(getattr(pyg_nn, layer)(8, 32, heads=2, edge_dim=edge_dim, fill_value=fill))
    result, notes = check_pyg_module(
        conv, x, edge_index, edge_weight if edge_dim == 1 else edge_attr
    )
    assert result.passed, result.table(layer)
    shape = (4,) if edge_dim == 1 else (4, 4)
    assert rows(result)["grad/input/edge_attr"] == (shape, True)
    assert rows(result)["grad/param/W_e"] == ((64, edge_dim), True)
    assert all("not compared" in note for note in notes), notes


@pytest.mark.parametrize("edge_dim", [None, 8])
@pytest.mark.parametrize("concat", [True, False])
def test_pygs_transformer_conv_inputs_pass(edge_dim, concat) -> None:
    # test/nn/conv/test_transformer_conv.py::test_transformer_conv: the edge list, the sparse
    # adjacency adj1.t() beside edge_attr, and the bipartite pair with its own adj1.t()
    torch.manual_seed(0)
    x1, x2 = torch.randn(4, 8), torch.randn(2, 16)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    edge_attr = torch.randn(edge_index.size(1), edge_dim) if edge_dim else None
    adj1 = pyg_utils.to_torch_csc_tensor(edge_index, size=(4, 4))
    conv = _randomised(
        pyg_nn.TransformerConv(8, 32, 2, beta=True, edge_dim=edge_dim, concat=concat)
    )
    for adjacency in (edge_index, adj1.t()):
        result, _ = check_pyg_module(conv, x1, adjacency, edge_attr)
        assert result.passed, result.table(str(adjacency.layout))
    adj1 = pyg_utils.to_torch_csc_tensor(edge_index, size=(4, 2))
    conv = _randomised(
        pyg_nn.TransformerConv((8, 16), 32, heads=2, beta=True, edge_dim=edge_dim, concat=concat)
    )
    for adjacency in (edge_index, adj1.t()):
        result, _ = check_pyg_module(conv, (x1, x2), adjacency, edge_attr)
        assert result.passed, result.table(str(adjacency.layout))


# -- frozen parameters ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "freeze", "skipped"),
    [
        (lambda: pyg_nn.GATConv(4, 3, heads=2), ["att_src"], ["att_src"]),
        (lambda: pyg_nn.GATConv(4, 3, heads=2, edge_dim=2), ["lin", "bias"], ["W", "bias"]),
        # one module under two names (lin_r is lin_l): named_parameters() lists lin_l only
        (
            lambda: pyg_nn.GATv2Conv(4, 3, heads=2, share_weights=True),
            ["lin_l"],
            ["W_s", "b_s"],
        ),
        (lambda: pyg_nn.TransformerConv(4, 3, heads=2, beta=True), ["lin_beta"], ["w_beta"]),
    ],
)
def test_a_frozen_parameter_is_skipped_and_named(build, freeze, skipped) -> None:
    # Issue 33: a parameter with requires_grad=False has no gradient (p.grad is None), which
    # the check read as zeros and compared with ours: a correct layer failed. The earlier
    # tests trained every parameter.
    module = _randomised(build())
    for name in freeze:
        getattr(module, name).requires_grad_(False)
    edge_attr = np.ones((EDGES.shape[1], 2)) if module.edge_dim else None
    rng = np.random.default_rng(4)
    result, notes = check_pyg_module(module, rng.standard_normal((NODES, 4)), EDGES, edge_attr)
    assert result.passed, result.table()
    frozen = [note.split(":")[0] for note in notes if "frozen" in note]
    assert sorted(frozen) == sorted(f"grad/param/{name}" for name in skipped)
    assert not set(frozen) & set(rows(result))  # skipped, not compared
    assert {"out", "grad/input/x"} <= set(rows(result))
    kept = [p.requires_grad for n, p in module.named_parameters() if n.split(".")[0] in freeze]
    assert kept and not any(kept)  # the caller's module stays frozen


def test_a_frozen_parameter_still_shapes_the_output() -> None:
    # frozen is about gradients only: the module's frozen values run in both forwards, so a
    # port that ignores a frozen parameter still fails
    class _DropsTheFrozenBias(pyg_nn.GATConv):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs) - self.bias

    module = _randomised(_DropsTheFrozenBias(4, 3, heads=2))
    module.bias.requires_grad_(False)
    result, notes = check_pyg_module(module, np.ones((NODES, 4)), EDGES)
    assert not rows(result)["out"][1]
    assert any(note.startswith("grad/param/bias: not compared (frozen") for note in notes)


# -- edge lists that are not a graph of the nodes -------------------------------------------------
@pytest.mark.parametrize(
    ("edge_index", "message"),
    [
        (EDGES + 0.7, "edge_index: edge_index must be an integer array, got dtype float32"),
        (EDGES.double(), "edge_index must be an integer array, got dtype float64"),
        (EDGES.numpy() + 0.0, "edge_index must be an integer array, got dtype float64"),
        (EDGES > 2, "edge_index is boolean"),
        (EDGES - 1, "negative node index (-1)"),
        (EDGES + 2, f"node index {NODES}, out of range for num_nodes={NODES}"),
        (EDGES[:1], "edge_index must have shape (2, E)"),
    ],
    ids=["float", "whole float64", "numpy float", "bool", "negative", "past the last", "1 row"],
)
def test_an_edge_index_that_is_not_a_graph_of_the_nodes_is_refused(edge_index, message) -> None:
    # Issue 33: a float edge_index was cast with np.array(..., dtype=int64): ei + 0.7 was
    # truncated to ei and passed, checking another input than the one given. No test gave a
    # float or out-of-range edge_index to check_pyg_module.
    module = pyg_nn.GATConv(4, 3, heads=2)
    with pytest.raises(CrosscheckError, match=re.escape(message)) as caught:
        check_pyg_module(module, np.ones((NODES, 4)), edge_index)
    assert "\n" not in str(caught.value)


def test_a_target_past_the_last_target_of_a_pair_is_refused() -> None:
    module = pyg_nn.TransformerConv((4, 2), 3, heads=2)
    x = (np.ones((NODES, 4)), np.ones((3, 2)))
    edge_index = torch.tensor([[0, 6, 2], [1, 0, 3]])  # target 3 of 3: PyG reads x_dst[3]
    with pytest.raises(CrosscheckError, match="target node index 3, out of range"):
        check_pyg_module(module, x, edge_index)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_a_pair_without_targets_is_refused_in_one_line(name: str) -> None:
    # Issue 33: x = (x_src, None) reached np.asarray(None) and PyG's modules, which raised raw
    # torch errors (or, for GATConv, scored edges by their sources alone)
    module = getattr(pyg_nn, name)(4, 3, heads=2)
    with pytest.raises(CrosscheckError, match=re.escape("(x_src, None) has no refimpl")) as caught:
        check_pyg_module(module, (np.ones((NODES, 4)), None), EDGES)
    assert "\n" not in str(caught.value)


# -- sparse adjacencies ---------------------------------------------------------------------------
def _adjacencies(edge_index, num_src: int, num_dst: int) -> dict[str, object]:
    """``adj_t`` (targets by sources) in each layout, as PyG's tests build it."""
    size = (num_src, num_dst)
    return {
        "csr": pyg_utils.to_torch_csc_tensor(edge_index, size=size).t(),
        "coo": pyg_utils.to_torch_coo_tensor(edge_index.flip(0), size=size[::-1]),
        "csc": pyg_utils.to_torch_csc_tensor(edge_index.flip(0), size=size[::-1]),
    }


SPARSE_MODULES = {
    "GATConv": lambda: pyg_nn.GATConv(4, 3, heads=2),
    "GATConv no self-loops": lambda: pyg_nn.GATConv(4, 3, heads=2, add_self_loops=False),
    "GATv2Conv": lambda: pyg_nn.GATv2Conv(4, 3, heads=2),
    "TransformerConv edges": lambda: pyg_nn.TransformerConv(4, 3, heads=2, edge_dim=2),
}


@pytest.mark.parametrize("layout", ["csr", "coo", "csc"])
@pytest.mark.parametrize("name", sorted(SPARSE_MODULES))
def test_a_sparse_adjacency_is_read_as_the_edge_list_it_stores(name: str, layout: str) -> None:
    # Issue 33: a torch.sparse edge_index raised a raw error advising to densify it. PyG reads
    # it transposed (adj_t: row the target): read the other way round this graph is another
    # graph, and the check fails.
    module = _randomised(SPARSE_MODULES[name]())
    adjacency = _adjacencies(EDGES, NODES, NODES)[layout]
    stored = pyg_utils.to_edge_index(adjacency.clone())[0]  # (targets, sources)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((NODES, 4))
    edge_attr = rng.standard_normal((EDGES.shape[1], 2)) if module.edge_dim else None
    if layout == "csc":
        # PyG's generated collect (torch_geometric/nn/conv/collect.jinja) takes COO and CSR
        # only: its own error, in one line
        with pytest.raises(CrosscheckError, match=r"PyG's \w+ itself fails on these inputs"):
            check_pyg_module(module, x, adjacency, edge_attr)
        return
    result, _ = check_pyg_module(module, x, adjacency, edge_attr)
    assert result.passed, result.table(f"{name}, {layout}")
    # the same check as the edge list it stores, in its stored order
    from_list, _ = check_pyg_module(module, x, stored.flip(0), edge_attr)
    assert [t.name for t in from_list.tensors] == [t.name for t in result.tensors]
    assert from_list.passed


def test_a_bipartite_sparse_adjacency_is_n_dst_by_n_src() -> None:
    module = _randomised(pyg_nn.GATConv((4, 2), 3, heads=2))
    edge_index = torch.tensor([[0, 6, 2, 5], [1, 0, 2, 2]])
    x = (np.ones((NODES, 4)), np.arange(6.0).reshape(3, 2))
    adjacency = _adjacencies(edge_index, NODES, 3)["csr"]
    assert tuple(adjacency.shape) == (3, NODES)
    result, _ = check_pyg_module(module, x, adjacency)
    assert result.passed, result.table()
    with pytest.raises(CrosscheckError, match=re.escape("it must be (3, 7) (N_dst, N_src)")):
        check_pyg_module(module, x, adjacency.t())  # not transposed: sources by targets


def test_a_sparse_adjacency_of_other_nodes_is_refused() -> None:
    adjacency = _adjacencies(EDGES, NODES + 1, NODES + 1)["coo"]
    with pytest.raises(CrosscheckError, match=re.escape("must be (7, 7)")) as caught:
        check_pyg_module(pyg_nn.GATConv(4, 3), np.ones((NODES, 4)), adjacency)
    assert "\n" not in str(caught.value)


def test_a_sparse_adjacency_with_duplicate_entries_is_refused() -> None:
    # an uncoalesced COO tensor can store an entry twice; PyG merges the two when it adds
    # self-loops (to_torch_coo_tensor coalesces) and keeps both otherwise
    twice = torch.cat([EDGES, EDGES[:, :1]], dim=1).flip(0)
    adjacency = torch.sparse_coo_tensor(twice, torch.ones(twice.shape[1]), (NODES, NODES))
    with pytest.raises(CrosscheckError, match="duplicate entries"):
        check_pyg_module(pyg_nn.GATConv(4, 3), np.ones((NODES, 4)), adjacency)
    assert not adjacency.is_coalesced()  # the caller's tensor as it was


def test_edge_features_as_sparse_values_are_refused() -> None:
    # (nnz, edge_dim) values are edge features to PyG; their gradient cannot be taken apart
    # from PyG's self-loop handling of them: refused, saying to pass edge_attr
    values = torch.randn(EDGES.shape[1], 2)
    adjacency = torch.sparse_coo_tensor(EDGES.flip(0), values, (NODES, NODES, 2))
    with pytest.raises(CrosscheckError, match="pass them as edge_attr="):
        check_pyg_module(pyg_nn.GATConv(4, 3, edge_dim=2), np.ones((NODES, 4)), adjacency)


def test_a_sparse_tensor_is_read_transposed_with_its_values_as_edge_features() -> None:
    torch_sparse = pytest.importorskip("torch_sparse")
    # PyG's test_transformer_conv: SparseTensor.from_edge_index(edge_index, edge_attr).t()
    module = _randomised(pyg_nn.TransformerConv(4, 3, heads=2, edge_dim=2))
    edge_attr = torch.randn(EDGES.shape[1], 2)
    adjacency = torch_sparse.SparseTensor.from_edge_index(
        EDGES, edge_attr, sparse_sizes=(NODES, NODES)
    ).t()
    result, _ = check_pyg_module(module, np.ones((NODES, 4)), adjacency)
    assert result.passed, result.table()
    assert rows(result)["grad/input/edge_attr"] == ((EDGES.shape[1], 2), True)
    plain = torch_sparse.SparseTensor.from_edge_index(EDGES, sparse_sizes=(NODES, NODES)).t()
    result, _ = check_pyg_module(_randomised(pyg_nn.GATConv(4, 3)), np.ones((NODES, 4)), plain)
    assert result.passed, result.table()
