"""``check_pyg_module``: a PyG module against refimpl in one call (the README's first
cross-checking example), every supported layer, a perturbed module caught, the caller's module
left as it was, and configurations without a refimpl counterpart refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given

torch = pytest.importorskip("torch")
pyg_nn = pytest.importorskip("torch_geometric.nn")

from refimpl.interop import (  # noqa: E402
    CrosscheckError,
    check_pyg_module,
    crosscheck,
    layer_from_config,
    pyg_config,
)
from refimpl.testing.strategies import bipartite_graphs, seeds  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
EDGES = np.array([[0, 1, 2, 3, 4, 5, 0, 2, 1], [1, 2, 3, 4, 5, 0, 3, 2, 2]])  # a loop, a twin


def readme_module_example() -> str:
    blocks = re.findall(r"```py\n(.*?)```", README.read_text(), flags=re.DOTALL)
    found = [b for b in blocks if "check_pyg_module(" in b]
    assert len(found) == 1, "the README lost its check_pyg_module example"
    return found[0]


def test_the_readme_example_runs_and_its_checks_hold(capsys) -> None:
    exec(compile(readme_module_example(), str(README), "exec"), {"__name__": "readme_example"})
    assert "PASS: all 6 tensors agree" in capsys.readouterr().out


def _randomised(module):
    """Every parameter redrawn: a trained module, not PyG's zero biases."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return module


MODULES = {
    "GATConv": lambda: pyg_nn.GATConv(4, 3, heads=2),
    "GATConv mean, no self-loops": lambda: pyg_nn.GATConv(
        4, 3, heads=2, concat=False, add_self_loops=False, negative_slope=0.1
    ),
    "GATv2Conv": lambda: pyg_nn.GATv2Conv(4, 3, heads=2),
    "GATv2Conv shared": lambda: pyg_nn.GATv2Conv(4, 3, heads=3, share_weights=True, bias=False),
    # residual=True (PyG >= 2.6): a linear skip before the bias, here W_res
    "GATConv residual": lambda: pyg_nn.GATConv(4, 3, heads=2, residual=True),
    "GATv2Conv residual, mean": lambda: pyg_nn.GATv2Conv(
        4, 3, heads=2, residual=True, concat=False
    ),
    # edge features (issue 22), with each fill_value of the added self-loops
    "GATConv edges": lambda: pyg_nn.GATConv(4, 3, heads=2, edge_dim=2),
    "GATConv edges, max fill, residual": lambda: pyg_nn.GATConv(
        4, 3, heads=2, edge_dim=2, fill_value="max", residual=True
    ),
    "GATConv edges, constant fill, mean": lambda: pyg_nn.GATConv(
        4, 3, heads=2, edge_dim=2, fill_value=0.5, concat=False
    ),
    "GATConv edges, no self-loops": lambda: pyg_nn.GATConv(
        4, 3, heads=2, edge_dim=2, add_self_loops=False
    ),
    "GATv2Conv edges, add fill": lambda: pyg_nn.GATv2Conv(
        4, 3, heads=2, edge_dim=2, fill_value="add"
    ),
    "GATv2Conv edges, mul fill, shared": lambda: pyg_nn.GATv2Conv(
        4, 3, heads=2, edge_dim=2, fill_value="mul", share_weights=True
    ),
    "GATv2Conv edges, min fill, no bias": lambda: pyg_nn.GATv2Conv(
        4, 3, heads=2, edge_dim=2, fill_value="min", bias=False
    ),
    "GATv2Conv edges, tensor fill": lambda: pyg_nn.GATv2Conv(
        4, 3, heads=2, edge_dim=2, fill_value=torch.tensor([1.0, -2.0])
    ),
    "GATv2Conv edges, sum fill, residual": lambda: pyg_nn.GATv2Conv(
        4, 3, heads=1, edge_dim=2, fill_value="sum", residual=True
    ),
    "TransformerConv": lambda: pyg_nn.TransformerConv(4, 3, heads=2),
    "TransformerConv edges, beta": lambda: pyg_nn.TransformerConv(
        4, 3, heads=2, edge_dim=2, beta=True, concat=False
    ),
    "TransformerConv no root, no bias": lambda: pyg_nn.TransformerConv(
        4, 3, heads=2, root_weight=False, bias=False
    ),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_supported_layer_agrees_tensor_by_tensor(name: str) -> None:
    torch.manual_seed(0)
    module = _randomised(MODULES[name]())
    rng = np.random.default_rng(2)
    x = torch.tensor(rng.standard_normal((6, 4)), dtype=torch.float32)
    edge_attr = rng.standard_normal((EDGES.shape[1], 2)) if module.edge_dim else None
    result, notes = check_pyg_module(module, x, torch.tensor(EDGES), edge_attr)
    assert result.passed, result.table(name)
    compared = {t.name for t in result.tensors}
    assert {"out", "grad/input/x"} <= compared
    assert ("grad/input/edge_attr" in compared) is (edge_attr is not None)
    ours = layer_from_config(pyg_config(module))  # every parameter's gradient compared
    assert {f"grad/param/{k}" for k in ours.param_shapes()} <= compared
    assert all("not compared" in note for note in notes), notes


def test_the_callers_module_is_left_as_it_was() -> None:
    module = _randomised(pyg_nn.GATConv(4, 3, heads=2)).train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    result, _ = check_pyg_module(module, np.ones((6, 4)), EDGES)
    assert result.passed
    assert module.training and all(p.dtype == torch.float32 for p in module.parameters())
    assert all(p.grad is None for p in module.parameters())
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_one_call_and_the_file_route_give_the_same_table(tmp_path) -> None:
    # The one call hands crosscheck the arrays a README export would write: same rows.
    torch.manual_seed(0)
    module = _randomised(pyg_nn.GATConv(4, 3, heads=2))
    x = np.random.default_rng(3).standard_normal((6, 4))
    result, _ = check_pyg_module(module, x, EDGES, seed=5)
    reference = module.double().eval()
    x_t = torch.tensor(x, requires_grad=True)
    out = reference(x_t, torch.tensor(EDGES))
    cotangent = np.random.default_rng(5).standard_normal(tuple(out.shape))
    (out * torch.tensor(cotangent)).sum().backward()
    np.savez(
        tmp_path / "exported.npz",
        config=json.dumps(
            {"framework": "pyg", "layer": "GATConv", "kwargs": {"in_channels": 4,
             "out_channels": 3, "heads": 2}}
        ),
        **{"input/x": x, "input/edge_index": EDGES, "output/out": out.detach().numpy(),
           "cotangent": cotangent, "grad/input/x": x_t.grad.numpy()},
        **{f"param/{k}": v.numpy() for k, v in reference.state_dict().items()},
        **{f"grad/param/{k}": p.grad.numpy() for k, p in reference.named_parameters()},
    )  # fmt: skip
    from_file, _ = crosscheck(tmp_path / "exported.npz")
    assert result.table() == from_file.table()


class _Perturbed(pyg_nn.GATConv):
    """A port with a bug of one part in a million in its output."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) * (1 + 1e-6)


def test_an_output_off_by_one_part_in_a_million_fails() -> None:
    torch.manual_seed(0)
    module = _randomised(_Perturbed(4, 3, heads=2))
    result, _ = check_pyg_module(module, np.ones((6, 4)) * 0.3, EDGES)
    assert not result.passed
    assert not next(t for t in result.tensors if t.name == "out").passed


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: torch.nn.Linear(4, 3), "not a PyG layer refimpl checks"),
        (lambda: pyg_nn.GATConv(4, 3, aggr="max"), "aggr='max'"),
        (lambda: pyg_nn.TransformerConv(4, 3, flow="target_to_source"), "flow='target_to_source'"),
    ],
)
def test_a_configuration_without_a_counterpart_is_refused_in_one_line(build, message) -> None:
    with pytest.raises(CrosscheckError, match=re.escape(message)) as caught:
        check_pyg_module(build(), np.ones((6, 4)), EDGES)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "name", ["GATConv edges", "GATv2Conv edges, sum fill, residual", "TransformerConv edges, beta"]
)
def test_the_empty_graph_agrees_with_pyg(name: str) -> None:
    # num_nodes = 0: PyG returns an empty output, and so do we, with zero gradients
    module = _randomised(MODULES[name]())
    result, _ = check_pyg_module(
        module, np.zeros((0, 4)), np.zeros((2, 0), dtype=np.int64), np.zeros((0, 2))
    )
    assert result.passed, result.table(name)
    width = module.out_channels * (module.heads if module.concat else 1)
    assert next(t for t in result.tensors if t.name == "out").shape == (0, width)


BIPARTITE = {
    "GATConv (4, 3)": lambda: pyg_nn.GATConv((4, 3), 3, heads=2),
    "GATConv one in_channels, a pair x": lambda: pyg_nn.GATConv(4, 3, heads=2, concat=False),
    "GATConv (4, 3) edges, max fill, residual": lambda: pyg_nn.GATConv(
        (4, 3), 3, heads=2, edge_dim=2, fill_value="max", residual=True
    ),
    "GATv2Conv (4, 3)": lambda: pyg_nn.GATv2Conv((4, 3), 3, heads=2),
    "GATv2Conv shared, a pair x": lambda: pyg_nn.GATv2Conv(4, 3, heads=2, share_weights=True),
    "GATv2Conv (4, 3) edges, residual, no loops": lambda: pyg_nn.GATv2Conv(
        (4, 3), 3, heads=2, edge_dim=2, residual=True, add_self_loops=False
    ),
    "TransformerConv (4, 3)": lambda: pyg_nn.TransformerConv((4, 3), 3, heads=2),
    "TransformerConv (4, 3) edges, beta, mean": lambda: pyg_nn.TransformerConv(
        (4, 3), 3, heads=2, edge_dim=2, beta=True, concat=False
    ),
    "TransformerConv one in_channels, a pair x, no root": lambda: pyg_nn.TransformerConv(
        4, 3, heads=2, root_weight=False
    ),
}


@pytest.mark.parametrize("name", sorted(BIPARTITE))
@given(graph=bipartite_graphs(max_src=7, max_dst=5), seed=seeds())
def test_bipartite_layers_agree_on_drawn_graphs(name: str, graph, seed: int) -> None:
    # x = (x_src, x_dst) on a graph whose targets are a second node set; PyG adds the loops
    # i -> i for the min(N_src, N_dst) nodes both sets have, and so do we
    module = _randomised(BIPARTITE[name]())
    if module.edge_dim and getattr(module, "add_self_loops", False):
        # PyG reduces the loops' features over min(N_src, N_dst) targets and fails (an index
        # out of range) on a graph with more targets than sources; ours reads the loops' rows
        assume(graph.num_dst_nodes <= graph.num_nodes)
    sizes = module.in_channels if isinstance(module.in_channels, tuple) else (4, 4)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((graph.num_nodes, sizes[0])),
         rng.standard_normal((graph.num_dst_nodes, sizes[1])))  # fmt: skip
    edge_attr = rng.standard_normal((graph.num_edges, 2)) if module.edge_dim else None
    result, notes = check_pyg_module(module, x, graph.edge_index, edge_attr)
    assert result.passed, result.table(name)
    compared = {t.name for t in result.tensors}
    assert {"grad/input/x_src", "grad/input/x_dst"} <= compared
    assert all("not compared" in note for note in notes), notes
