"""The differential property test (refimpl.interop.differential): correct layers pass, and each
seeded GAT bug fails and shrinks to a graph of at most 3 nodes, for a PyG module, a torch module
of one's own through the adapter, and a JAX function.

Bound: every seeded bug is found within the first 100 cases (the derandomised profile's
``max_examples``; ``Disagreement.examples``), then shrunk by Hypothesis. The profile is
derandomised, so these tests draw the same cases on every run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from refimpl.cli import main
from refimpl.interop.crosscheck import crosscheck
from refimpl.interop.differential import Case, Disagreement, differential, replay
from refimpl.interop.differential_adapters import (
    AdapterError,
    JaxFunction,
    PyGModule,
    TorchModule,
)
from refimpl.testing import strategies as rst

torch = pytest.importorskip("torch")
pyg_nn = pytest.importorskip("torch_geometric.nn")

from tests.testing.buggy_gatv2 import (  # noqa: E402  (needs torch)
    BUGS,
    PARAMS,
    BipartiteLoopsOnTargets,
    GATv2,
    LinearsSwapped,
    SoftmaxOverSources,
)

MAX_EXAMPLES = settings.get_profile("refimpl-differential").max_examples
# The seeded modules implement GATv2Conv without shared weights, edge features or residual.
PLAIN = {"share_weights": False, "edge_dim": None, "residual": False}
CONFIGS = rst.layer_configs("GATv2Conv", **PLAIN)
BIPARTITE = rst.layer_configs("GATv2Conv", bipartite=True, **PLAIN)


def _nodes(error: Disagreement) -> int:
    case = error.case
    return case.num_nodes + (case.num_dst_nodes or 0)


@pytest.mark.parametrize(
    ("layer", "bipartite"),
    [("GATConv", False), ("GATv2Conv", False), ("TransformerConv", False), ("GATConv", True)],
)
def test_pyg_layers_agree_with_refimpl_on_every_drawn_case(layer: str, bipartite: bool) -> None:
    configs = rst.layer_configs(layer, bipartite=bipartite)
    report = differential(getattr(pyg_nn, layer), configs)
    assert report.examples == MAX_EXAMPLES and report.layers == {layer}
    assert report.max_rel_error < 1e-10


class SourceSoftmaxGATv2Conv(pyg_nn.GATv2Conv):
    """PyG's GATv2Conv with its softmax grouped by source (edge_index_j) instead of target."""

    def edge_update(
        self,
        x_j: torch.Tensor,
        x_i: torch.Tensor,
        edge_attr: torch.Tensor | None,
        edge_index_j: torch.Tensor,
        dim_size: int | None,
    ) -> torch.Tensor:
        from torch_geometric.utils import softmax

        x = x_i + x_j
        if edge_attr is not None:
            x = x + self.lin_edge(edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr)
        x = torch.nn.functional.leaky_relu(x.view(-1, self.heads, self.out_channels), 0.2)
        return softmax((x * self.att).sum(dim=-1), edge_index_j, None, dim_size)


def test_a_pyg_subclass_with_the_softmax_over_sources_fails_and_shrinks(tmp_path: Path) -> None:
    configs = rst.layer_configs("GATv2Conv", edge_dim=None)
    with pytest.raises(Disagreement) as caught:
        differential(SourceSoftmaxGATv2Conv, configs, save_to=tmp_path)
    assert _nodes(caught.value) <= 3 and caught.value.examples <= MAX_EXAMPLES
    assert "SourceSoftmaxGATv2Conv" in str(caught.value)


@pytest.mark.parametrize("configs", [CONFIGS, BIPARTITE], ids=["one node set", "bipartite"])
def test_a_correct_torch_gatv2_through_the_adapter_passes(configs: object) -> None:
    report = differential(TorchModule(GATv2, PARAMS), configs)
    assert report.examples == MAX_EXAMPLES and report.max_rel_error < 1e-10


@pytest.mark.parametrize("bug", BUGS, ids=[bug.__name__ for bug in BUGS])
def test_each_seeded_bug_fails_and_shrinks_to_at_most_three_nodes(
    bug: type, tmp_path: Path
) -> None:
    configs = BIPARTITE if bug is BipartiteLoopsOnTargets else CONFIGS
    with pytest.raises(Disagreement) as caught:
        differential(TorchModule(bug, PARAMS), configs, save_to=tmp_path)
    error = caught.value
    assert _nodes(error) <= 3 and error.examples <= MAX_EXAMPLES
    assert f"TorchModule({bug.__name__}" in str(error) and "reproducer:" in str(error)
    if bug is BipartiteLoopsOnTargets:  # an index past the sources: the module raises
        assert error.comparison is None and "your layer raised IndexError" in str(error)
        assert (error.case.num_nodes, error.case.num_dst_nodes) == (1, 2)
    else:  # the crosscheck file fails as the run did
        assert not error.comparison.passed
        comparison, _ = crosscheck(error.path)
        assert comparison.table() == error.comparison.table()


def test_the_printed_reproducer_runs_and_shows_the_disagreement(tmp_path: Path) -> None:
    with pytest.raises(Disagreement) as caught:
        differential(TorchModule(SoftmaxOverSources, PARAMS), CONFIGS, save_to=tmp_path)
    message = str(caught.value)
    snippet = message.split("reproducer:\n", 1)[1]
    namespace: dict = {}
    exec("\n".join(line.removeprefix("    ") for line in snippet.splitlines()), namespace)
    assert not namespace["comparison"].passed
    assert namespace["comparison"].table() == caught.value.comparison.table()
    assert main(["crosscheck", str(caught.value.path)]) == 1  # the command reads the file


def test_the_derandomised_profile_finds_the_same_smallest_case_every_run(tmp_path: Path) -> None:
    cases = [_a_case(tmp_path), _a_case(tmp_path)]
    assert cases[0] == cases[1]
    explore = settings.get_profile("refimpl-differential-explore")
    assert explore.derandomize is False and explore.max_examples > MAX_EXAMPLES


def test_a_failing_case_never_overwrites_a_file_already_there(tmp_path: Path) -> None:
    paths = []
    for _ in range(2):
        with pytest.raises(Disagreement) as caught:
            differential(TorchModule(LinearsSwapped, PARAMS), CONFIGS, save_to=tmp_path)
        paths.append(caught.value.path)
    assert paths[0] != paths[1] and all(path.exists() for path in paths)


def test_replay_reruns_one_case_and_passes_a_correct_layer(tmp_path: Path) -> None:
    comparison, _, arrays = replay(PyGModule(pyg_nn.GATv2Conv), _a_case(tmp_path))
    assert comparison.passed and "output/out" in arrays


def test_an_adapter_parameter_map_missing_a_name_is_refused_in_one_line(tmp_path: Path) -> None:
    params = {k: v for k, v in PARAMS.items() if k != "att"}
    with pytest.raises(AdapterError, match="your parameter 'att' is not in params="):
        replay(TorchModule(GATv2, params), _a_case(tmp_path))
    with pytest.raises(AdapterError, match="your parameter 'att' is not in params="):
        differential(TorchModule(GATv2, params), CONFIGS)  # raised as it is, not a finding


def test_a_torch_module_without_configs_is_refused_in_one_line() -> None:
    with pytest.raises(TypeError, match="configs= is needed"):
        differential(TorchModule(GATv2, PARAMS))


def _a_case(folder: Path) -> Case:
    """The smallest case where a GATv2 with lin_l and lin_r swapped fails."""
    with pytest.raises(Disagreement) as caught:
        differential(TorchModule(LinearsSwapped, PARAMS), CONFIGS, save_to=folder)
    return caught.value.case


# JAX: each new array shape (and each new sequence of operations) compiles anew, about a
# second a case on two cores, so the JAX cases hold the sizes and options that change them
# and the graphs at 3 nodes and 3 edges, where shapes repeat.
JAX_CONFIGS = rst.layer_configs(
    "GATv2Conv", in_channels=1, out_channels=1, heads=1, concat=True, bias=True, **PLAIN
)
JAX_SETTINGS = settings(settings.get_profile("refimpl-differential"), max_examples=10)


def test_a_jax_function_through_vjp_passes_and_a_seeded_bug_shrinks(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    from tests.testing.jax_gatv2 import make_gatv2, make_gatv2_softmax_over_sources

    graphs = rst.graphs(1, 3, 3)
    report = differential(
        JaxFunction(make_gatv2), JAX_CONFIGS, graphs=graphs, settings=JAX_SETTINGS
    )
    assert report.examples == 10 and report.max_rel_error < 1e-10
    with pytest.raises(Disagreement) as caught:
        differential(
            JaxFunction(make_gatv2_softmax_over_sources),
            JAX_CONFIGS,
            graphs=graphs,
            settings=JAX_SETTINGS,
            save_to=tmp_path,
        )
    assert _nodes(caught.value) <= 3 and not caught.value.comparison.passed
