"""``refimpl crosscheck`` files judged right (issue 33): a 1-D ``edge_attr``'s gradient in its
own shape, frozen parameters left out and named, and files that mean two things (or that the
reader cannot map, or whose ``edge_index`` is not a graph of their nodes) refused in one line,
exit 2. Written from our own layers (``write_file``), so no torch is needed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from refimpl import Graph
from refimpl.cli import main
from refimpl.interop.crosscheck import CrosscheckError, crosscheck
from refimpl.nn import GATConv, TransformerConv
from tests.interop.test_crosscheck import write_file
from tests.interop.test_crosscheck_files import refused


@pytest.fixture
def parts() -> tuple[np.random.Generator, Graph, np.ndarray]:
    rng = np.random.default_rng(7)
    graph = Graph(np.array([[0, 1, 2, 3, 3, 1], [1, 2, 0, 0, 1, 1]]), 5)  # node 4 isolated
    return rng, graph, rng.standard_normal((5, 4))


def one_dimensional_edge_file(path: Path, parts, version: str, framework: str) -> dict:
    """A file of a GAT layer with ``edge_dim=1`` and ``edge_attr`` of shape (E,) (PyG's own
    test input: ``conv(x, edge_index, edge_weight)``), its gradient (E,) as torch gives it."""
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2, version=version, edge_dim=1, fill_value="mean")
    params = layer.init_params(rng)
    edge_attr = rng.standard_normal(graph.num_edges)
    arrays = write_file(path, layer, params, x, graph, edge_attr[:, None], framework)
    arrays["input/edge_attr"] = edge_attr
    arrays["grad/input/edge_attr"] = arrays["grad/input/edge_attr"][:, 0]
    np.savez(path, **arrays)
    return arrays


@pytest.mark.parametrize("framework", ["refimpl", "pyg"])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_one_dimensional_edge_attr_gradient_keeps_its_shape(
    version, framework, parts, tmp_path, capsys
) -> None:
    # Issue 33: the layer reads a 1-D edge_attr as PyG does (view(-1, 1)) but its gradient
    # came back (E, 1), so the comparison with torch's (E,) failed on shape alone. Every
    # earlier edge-feature test gave (E, edge_dim) arrays.
    arrays = one_dimensional_edge_file(tmp_path / "f.npz", parts, version, framework)
    assert main(["crosscheck", str(tmp_path / "f.npz")]) == 0, capsys.readouterr()
    row = next(r for r in capsys.readouterr().out.splitlines() if "grad/input/edge_attr" in r)
    assert row.split()[1] == "6" and row.endswith("yes")  # shape E, compared
    arrays["grad/input/edge_attr"] = arrays["grad/input/edge_attr"] * (1 + 1e-6)
    np.savez(tmp_path / "g.npz", **arrays)
    assert main(["crosscheck", str(tmp_path / "g.npz")]) == 1  # still compared, not excused


def frozen_file(path: Path, parts, frozen: list[str], framework: str = "pyg", **extra) -> dict:
    """A GATConv file whose ``frozen`` parameters have no ``grad/param/`` entry, as an
    export of ``named_parameters()`` skipping those with ``requires_grad=False`` writes."""
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2, edge_dim=2)
    edge_attr = rng.standard_normal((graph.num_edges, 2))
    arrays = write_file(path, layer, layer.init_params(rng), x, graph, edge_attr, framework)
    config = json.loads(str(arrays["config"]))
    arrays["config"] = np.array(json.dumps({**config, "frozen": frozen}))
    for name in frozen:
        del arrays[f"grad/param/{name}"]
    arrays.update(extra)
    np.savez(path, **arrays)
    return arrays


def notes_of(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("note:")]


@pytest.mark.parametrize(
    ("framework", "frozen", "ours"),
    [("pyg", ["att_src", "lin.weight"], ["att_src", "W"]), ("refimpl", ["W_e"], ["W_e"])],
)
def test_frozen_parameters_are_skipped_and_named(
    framework, frozen, ours, parts, tmp_path, capsys
) -> None:
    # Issue 33: a parameter with requires_grad=False has no gradient; compared against zeros
    # it failed a correct layer. Every earlier test trained every parameter.
    frozen_file(tmp_path / "f.npz", parts, frozen, framework)
    assert main(["crosscheck", str(tmp_path / "f.npz")]) == 0, capsys.readouterr().out
    printed = capsys.readouterr().out
    skipped = [n.split()[1].removesuffix(":") for n in notes_of(printed) if "frozen" in n]
    assert skipped == [f"grad/param/{name}" for name in ours]
    rows = {line.split()[0] for line in printed.splitlines()}
    assert not rows & set(skipped)  # not in the table
    assert {"grad/param/att_dst", "grad/param/bias", "grad/input/x"} <= rows


def test_a_frozen_parameters_value_still_counts(parts, tmp_path) -> None:
    # skipped means no gradient, not no parameter: a changed frozen value changes the output
    arrays = frozen_file(tmp_path / "f.npz", parts, ["att_src"])
    arrays["param/att_src"] = arrays["param/att_src"] + 1e-3
    np.savez(tmp_path / "g.npz", **arrays)
    result, _ = crosscheck(tmp_path / "g.npz")
    assert not next(t for t in result.tensors if t.name == "out").passed


@pytest.mark.parametrize(
    ("frozen", "extra", "message"),
    [
        (["att_src", "lin.wieght"], {}, "frozen lists 'lin.wieght', which is no param/ entry"),
        (["att_src"], {"grad/param/att_src": np.zeros((1, 2, 3))}, "grad/param/att_src is given"),
        ("att_src", {}, "frozen must be a list of parameter names"),
    ],
)
def test_a_frozen_list_that_contradicts_the_file_is_refused(
    frozen, extra, message, parts, tmp_path, capsys
) -> None:
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2, edge_dim=2)
    edge_attr = rng.standard_normal((graph.num_edges, 2))
    arrays = write_file(tmp_path / "f.npz", layer, layer.init_params(rng), x, graph, edge_attr,
                        "pyg")  # fmt: skip
    config = json.loads(str(arrays["config"]))
    arrays["config"] = np.array(json.dumps({**config, "frozen": frozen}))
    arrays.pop("grad/param/att_src")
    arrays.update(extra)
    np.savez(tmp_path / "f.npz", **arrays)
    assert message in refused(tmp_path / "f.npz", capsys)


@pytest.mark.parametrize(
    ("edge_index", "message"),
    [
        (np.array([[0, 1, 2, 3, 3, 1], [1, 2, 0, 0, 1, 1]]) + 0.7, "must be an integer array"),
        (np.array([[0, 1, 2, 3, 3, 1], [1, 2, 0, 0, 1, 1]], dtype=float), "dtype float64"),
        (np.ones((2, 6), dtype=bool), "input/edge_index is boolean"),
        (np.array([[0, 1, 2, 3, 3, -1], [1, 2, 0, 0, 1, 1]]), "negative node index (-1)"),
        (np.array([[0, 1, 2, 3, 3, 5], [1, 2, 0, 0, 1, 1]]), "node index 5, out of range"),
    ],
    ids=["float", "whole floats", "bool", "negative", "past the last node"],
)
def test_an_edge_index_that_is_not_a_graph_of_the_nodes_is_refused(
    edge_index, message, parts, tmp_path, capsys
) -> None:
    # Issue 33: check_pyg_module truncated a float edge_index (ei + 0.7 passed, as ei); the
    # file route raised Graph's TypeError without naming the entry. No test gave either.
    arrays = frozen_file(tmp_path / "f.npz", parts, [])
    arrays["input/edge_index"] = edge_index
    np.savez(tmp_path / "f.npz", **arrays)
    err = refused(tmp_path / "f.npz", capsys)
    assert "input/edge_index" in err and message in err and err.count("\n") == 1


def test_an_edge_index_past_the_last_target_of_a_bipartite_file_is_refused(parts, tmp_path):
    # the targets' bound is N_dst, the rows of input/x_dst, not N_src
    rng, _, _ = parts
    layer = TransformerConv((4, 2), 3, heads=2)
    params = layer.init_params(rng)
    x = (rng.standard_normal((5, 4)), rng.standard_normal((3, 2)))
    out, _ = layer.forward(params, x, Graph(np.array([[0, 4, 2], [1, 0, 2]]), 5, 3))
    config = {"framework": "refimpl", "layer": "TransformerConv", "kwargs": {
        "in_channels": [4, 2], "out_channels": 3, "heads": 2}}  # fmt: skip
    np.savez(
        tmp_path / "f.npz",
        config=json.dumps(config),
        **{"input/x_src": x[0], "input/x_dst": x[1], "output/out": out},
        **{"input/edge_index": np.array([[0, 4, 2], [1, 0, 3]])},  # target 3 of 3
        **{f"param/{k}": v for k, v in params.items()},
    )
    with pytest.raises(CrosscheckError, match="target node index 3, out of range"):
        crosscheck(tmp_path / "f.npz")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"input/x_src": "x", "input/x_dst": "x"}, "has input/x and input/x_src and input/x_dst"),
        ({"input/x_src": "x"}, "has input/x and input/x_src: node features twice"),
        ({"grad/input/x_dst": "x"}, "has grad/input/x_dst but no input/x_dst"),
        ({"grad/input/edge_attr": "w"}, "has grad/input/edge_attr but no input/edge_attr"),
        ({"grad/param/att_edge": "w"}, "has grad/param/att_edge but no param/att_edge"),
        (
            {"input/edge_weight": "w"},
            "entries a crosscheck file does not hold: ['input/edge_weight']",
        ),
        ({"grad/input/edge_index": "w"}, "does not hold: ['grad/input/edge_index']"),
        ({"output/alpha": "w"}, "does not hold: ['output/alpha']"),
        ({"param/": "w"}, "does not hold: ['param/']"),
    ],
)
def test_entries_that_mean_two_things_or_nothing_are_refused(
    change, message, parts, tmp_path, capsys
) -> None:
    # Issue 33: input/x beside input/x_src was silently ignored, and so was any key the
    # reader does not map (an edge weight the layer never saw); a gradient without its input
    # failed as "missing in ours" (exit 1, a verdict on the layer) instead of exit 2.
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2)  # no edge features
    arrays = write_file(tmp_path / "f.npz", layer, layer.init_params(rng), x, graph,
                        framework="pyg")  # fmt: skip
    values = {"x": x, "w": rng.standard_normal(graph.num_edges)}
    arrays.update({key: values[value] for key, value in change.items()})
    np.savez(tmp_path / "f.npz", **arrays)
    err = refused(tmp_path / "f.npz", capsys)
    assert message in err and err.count("\n") == 1


def test_an_unknown_config_key_is_refused(parts, tmp_path, capsys) -> None:
    # a misspelt "frozen" would have left the parameters compared against zeros
    arrays = frozen_file(tmp_path / "f.npz", parts, [])
    config = json.loads(str(arrays["config"]))
    arrays["config"] = np.array(json.dumps({**config, "frozn": ["att_src"]}))
    np.savez(tmp_path / "f.npz", **arrays)
    assert "config has 'frozn', which the crosscheck does not read" in refused(
        tmp_path / "f.npz", capsys
    )


def test_a_cotangent_without_gradients_is_noted(parts, tmp_path) -> None:
    arrays = frozen_file(tmp_path / "f.npz", parts, [])
    kept = {k: v for k, v in arrays.items() if not k.startswith("grad/")}
    np.savez(tmp_path / "g.npz", **kept)
    result, notes = crosscheck(tmp_path / "g.npz")
    assert result.passed and [t.name for t in result.tensors] == ["out"]
    assert notes == ["cotangent: given without any grad/ entry, so only out is compared"]


@pytest.mark.parametrize("key", ["output/out", "cotangent", "grad/input/x", "param/att_src"])
@pytest.mark.parametrize("dtype", ["U8", np.int64, np.bool_])
def test_an_entry_that_does_not_hold_floats_is_refused(key, dtype, parts, tmp_path, capsys) -> None:
    # a text member (np.str_) reached the comparison: NumPy's "could not convert string to
    # float", which names no entry (the reliability harness's crosscheck surface found it)
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2)
    arrays = write_file(tmp_path / "f.npz", layer, layer.init_params(rng), x, graph,
                        framework="pyg")  # fmt: skip
    arrays[key] = np.zeros(np.shape(arrays[key])).astype(dtype)
    np.savez(tmp_path / "f.npz", **arrays)
    err = refused(tmp_path / "f.npz", capsys)
    assert f"{key} has dtype {np.dtype(dtype)}; every entry but config and input/edge_index" in err
    assert err.count("\n") == 1
