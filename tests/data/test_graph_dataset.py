"""GraphDataset (validation, access, subsets, splits) and its .npz file."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.data.graph_dataset import GraphDataset
from refimpl.data.graph_dataset_file import load_graph_dataset, save_graph_dataset
from refimpl.data.molecules import synthetic_molecules
from refimpl.testing.strategies import seeds

FIELDS = ("x", "edge_index", "edge_attr", "node_ptr", "edge_ptr", "y")


def make(**overrides: object) -> GraphDataset:
    """Three graphs: a directed triangle (3 nodes), a lone node, a bond stored both ways."""
    fields: dict[str, object] = {
        "name": "toy",
        "x": np.arange(12, dtype=np.float64).reshape(6, 2),
        "edge_index": np.array([[0, 1, 2, 0, 1], [1, 2, 0, 1, 0]], dtype=np.int64),
        "edge_attr": np.arange(5, dtype=np.float64).reshape(5, 1),
        "node_ptr": np.array([0, 3, 4, 6], dtype=np.int64),
        "edge_ptr": np.array([0, 3, 3, 5], dtype=np.int64),
        "y": np.array([[0.5], [-1.0], [2.0]]),
        "task": "regression",
    }
    fields.update(overrides)
    return GraphDataset(**fields)  # type: ignore[arg-type]


def assert_same(a: GraphDataset, b: GraphDataset) -> None:
    assert (a.name, a.task) == (b.name, b.task)
    for key in FIELDS:
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype, key
        np.testing.assert_array_equal(x, y, err_msg=key)
    assert (a.y_mask is None) == (b.y_mask is None)
    if a.y_mask is not None:
        np.testing.assert_array_equal(a.y_mask, b.y_mask)


# TOX21-like labels of make()'s three graphs on two tasks: graph 1 lacks task 0, graph 2 task 1
GAPPY = np.array([[1.0, 0.0], [np.nan, 1.0], [0.0, np.nan]])


# -- the dataset ------------------------------------------------------------------------------


def test_sizes_and_graph_access() -> None:
    ds = make()
    assert (len(ds), ds.num_node_features, ds.num_edge_features, ds.num_targets) == (3, 2, 1, 1)
    graph, x, edge_attr, y = ds.graph(2)
    assert graph.num_nodes == 2
    np.testing.assert_array_equal(graph.edge_index, [[0, 1], [1, 0]])  # still local
    np.testing.assert_array_equal(x, ds.x[4:6])
    np.testing.assert_array_equal(edge_attr, [[3.0], [4.0]])
    np.testing.assert_array_equal(y, [2.0])
    lone, _, no_edges, _ = ds.graph(1)
    assert (lone.num_nodes, lone.num_edges, no_edges.shape) == (1, 0, (0, 1))
    with pytest.raises(IndexError, match="out of range for 3 graphs"):
        ds.graph(3)
    assert repr(ds) == "GraphDataset(toy: graphs=3 N=6 E=5 F=2 B=1 T=1 task=regression)"


def test_subset_equals_the_chosen_graphs_one_by_one() -> None:
    ds = synthetic_molecules(num_graphs=12, seed=3)
    chosen = [7, 0, 7, 11]  # order kept, repeats allowed
    part = ds.subset(chosen)
    assert len(part) == 4
    for j, i in enumerate(chosen):
        got, want = part.graph(j), ds.graph(i)
        np.testing.assert_array_equal(got[0].edge_index, want[0].edge_index)
        for a, b in zip(got[1:], want[1:], strict=True):
            np.testing.assert_array_equal(a, b)
    mask = np.zeros(12, dtype=bool)
    mask[[2, 5]] = True
    assert_same(ds.subset(mask), ds.subset([2, 5]))
    empty = ds.subset([])
    assert len(empty) == 0 and empty.x.shape == (0, ds.num_node_features)


@given(num_graphs=st.integers(1, 40), seed=seeds(), train=st.integers(0, 10))
def test_split_is_a_seeded_partition(num_graphs: int, seed: int, train: int) -> None:
    ds = synthetic_molecules(num_graphs=num_graphs, seed=1, min_atoms=2, max_atoms=4)
    labelled = dataclasses.replace(ds, y=np.arange(num_graphs, dtype=np.float64)[:, None])
    fractions = (train / 10, (10 - train) / 20, (10 - train) / 20)
    parts = ds.split(fractions, seed=seed)
    assert len(parts[0]) == int(np.floor(fractions[0] * num_graphs + 1e-9))
    assert len(parts[1]) == int(np.floor(fractions[1] * num_graphs + 1e-9))
    assert sum(len(p) for p in parts) == num_graphs
    # Every graph lands in exactly one part: label the graphs by their index in y.
    ids = np.concatenate([p.y[:, 0] for p in labelled.split(fractions, seed=seed)])
    np.testing.assert_array_equal(np.sort(ids), np.arange(num_graphs))
    for part in labelled.split(fractions, seed=seed):
        assert np.all(np.diff(part.y[:, 0]) > 0)  # each part in dataset order
        assert_same(part, labelled.subset(part.y[:, 0].astype(np.int64)))
    again = ds.split(fractions, seed=seed)
    for a, b in zip(parts, again, strict=True):
        assert_same(a, b)


def test_split_sizes_for_the_default_fractions() -> None:
    parts = synthetic_molecules(num_graphs=1000, seed=0).split()
    assert [len(p) for p in parts] == [800, 100, 100]
    with pytest.raises(ValueError, match="sum to 1"):
        make().split((0.5, 0.2, 0.2))
    with pytest.raises(ValueError, match="three numbers >= 0"):
        make().split((1.2, -0.2, 0.0))


def test_astype_casts_float_arrays() -> None:
    ds32 = make().astype(np.float32)
    assert ds32.x.dtype == ds32.edge_attr.dtype == ds32.y.dtype == np.float32
    assert ds32.edge_index.dtype == np.int64
    with pytest.raises(TypeError, match="floating point"):
        make().astype(np.int64)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"task": "classification"}, ValueError, "task must be one of"),
        ({"name": 3}, TypeError, "name must be a str"),
        ({"x": np.zeros((6, 2), dtype=np.int64)}, TypeError, "x must be a floating-point"),
        ({"x": [[0.0, 1.0]] * 6}, TypeError, "x must be a floating-point NumPy array"),
        ({"x": np.zeros((5, 2))}, ValueError, r"node_ptr must start at 0 and end at .* \(5\)"),
        ({"x": np.full((6, 2), np.inf)}, ValueError, "x contains NaN or infinity"),
        (
            {"edge_index": np.array([[0, 1, 2, 0, 1], [1, 2, 0, 1, 0]], dtype=np.int32)},
            TypeError,
            r"edge_index must be an int64 .*\.astype\(np.int64\)",
        ),
        ({"edge_index": np.zeros((5, 2), np.int64)}, ValueError, r"transpose an \(E, 2\)"),
        # graph 2's bond written with global indices 4, 5: the fix is named
        (
            {"edge_index": np.array([[0, 1, 2, 4, 5], [1, 2, 0, 5, 4]], dtype=np.int64)},
            ValueError,
            r"edge 3 \(of graph 2, which has 2 nodes\) .* outside 0..1: .* local .*np.repeat",
        ),
        (
            {"edge_index": np.array([[0, 1, 2, 0, -1], [1, 2, 0, 1, 0]], dtype=np.int64)},
            ValueError,
            "edge 4",
        ),
        ({"edge_attr": np.zeros((4, 1))}, ValueError, r"one row per edge, \(E, B\) = \(5, B\)"),
        ({"edge_attr": np.zeros(5)}, ValueError, "edge_attr must be 2-D"),
        ({"node_ptr": np.array([0, 3, 3, 6])}, ValueError, "every graph needs at least one node"),
        ({"node_ptr": np.array([1, 3, 4, 6])}, ValueError, r"node_ptr\[0\] = 1"),
        ({"edge_ptr": np.array([0, 3, 2, 5])}, ValueError, "edge_ptr must never decrease"),
        ({"edge_ptr": np.array([0, 5])}, ValueError, "both have G \\+ 1 entries"),
        ({"y": np.zeros(3)}, ValueError, r"y must be 2-D .* y.reshape\(-1, 1\)"),
        ({"y": np.zeros((2, 1))}, ValueError, r"y must have shape \(G, T\) = \(3, T >= 1\)"),
        ({"y": np.full((3, 1), np.nan)}, ValueError, "y contains NaN"),
        ({"task": "multilabel", "y": np.full((3, 2), 0.5)}, ValueError, "only 0 and 1"),
    ],
)
def test_validation_errors(overrides: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make(**overrides)


def test_multilabel_and_featureless_edges_accepted() -> None:
    ds = make(task="multilabel", y=np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
    assert ds.num_targets == 2
    assert make(edge_attr=np.zeros((5, 0))).num_edge_features == 0


# -- the file -----------------------------------------------------------------------------------


def test_nan_labels_become_the_mask_and_y_stays_finite() -> None:
    ds = make(y=GAPPY.copy(), task="multilabel")
    np.testing.assert_array_equal(ds.y_mask, [[True, True], [False, True], [True, False]])
    np.testing.assert_array_equal(ds.y, [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    assert ds.summary().endswith("task=multilabel missing_labels=2")
    part = ds.subset([2, 1])
    np.testing.assert_array_equal(part.y_mask, [[True, False], [False, True]])
    assert ds.subset([0]).y_mask is None  # graph 0 has every label: no mask
    assert make(y=np.eye(3, 2), task="multilabel", y_mask=np.ones((3, 2), bool)).y_mask is None
    given = make(y=np.eye(3, 2), task="multilabel", y_mask=np.eye(3, 2, dtype=bool))
    np.testing.assert_array_equal(given.y_mask, np.eye(3, 2, dtype=bool))
    assert np.isnan(GAPPY).sum() == 2  # the caller's array is not filled in place


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"y": GAPPY[:, :1]}, ValueError, r"y contains NaN .*task='multilabel' only"),
        (
            {"y": np.zeros((3, 1)), "y_mask": np.array([[True], [False], [True]])},
            ValueError,
            r"missing labels .* task='multilabel' only",
        ),
        (
            {"y": np.zeros((3, 2)), "task": "multilabel", "y_mask": np.ones((3, 2))},
            TypeError,
            r"y_mask must be a bool NumPy array",
        ),
        (
            {"y": np.zeros((3, 2)), "task": "multilabel", "y_mask": np.ones((3, 1), bool)},
            ValueError,
            r"y_mask must have y's shape \(3, 2\)",
        ),
        (  # NaN with a mask given: which one is meant is unclear
            {"y": GAPPY.copy(), "task": "multilabel", "y_mask": ~np.isnan(GAPPY)},
            ValueError,
            r"y contains NaN",
        ),
    ],
)
def test_missing_labels_are_refused_where_nothing_could_skip_them(
    overrides: dict, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        make(**overrides)


def test_save_load_keeps_the_label_mask(tmp_path: Path) -> None:
    ds = make(y=GAPPY.copy(), task="multilabel")
    path = tmp_path / "tox.npz"
    save_graph_dataset(path, ds)
    assert_same(load_graph_dataset(path), ds)
    with np.load(path, allow_pickle=False) as archive:
        assert "y_mask" in archive.files and int(archive["format_version"]) == 1
    bad = {**_arrays(ds), "y_mask": ds.y_mask.astype(np.int8)}
    np.savez(path, **bad)
    with pytest.raises(TypeError, match=r"tox\.npz: y_mask must be a bool"):
        load_graph_dataset(path)


@pytest.mark.parametrize("task", ["regression", "multilabel"])
def test_save_load_round_trip_is_exact(tmp_path: Path, task: str) -> None:
    ds = synthetic_molecules(num_graphs=30, seed=4, task=task, name="mols-ü")  # non-ASCII name
    path = tmp_path / "mols.npz"
    save_graph_dataset(path, ds)
    assert_same(load_graph_dataset(path), ds)
    ds32 = ds.astype(np.float32)
    save_graph_dataset(path, ds32)  # overwrites in place
    assert_same(load_graph_dataset(str(path)), ds32)
    assert os.listdir(tmp_path) == ["mols.npz"]  # no temporary file left behind
    with np.load(path, allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted([*FIELDS, "name", "task", "format_version"])
        assert archive["format_version"].shape == () and int(archive["format_version"]) == 1


def test_save_leaves_no_file_when_writing_fails(tmp_path: Path, monkeypatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", broken)
    with pytest.raises(OSError, match="disk full"):
        save_graph_dataset(tmp_path / "d.npz", make())
    assert os.listdir(tmp_path) == []


def _arrays(ds: GraphDataset) -> dict[str, np.ndarray]:
    arrays = {key: getattr(ds, key) for key in FIELDS}
    arrays.update(name=np.array(ds.name), task=np.array(ds.task), format_version=np.array(1))
    return arrays


def _broken(**changes: object) -> dict[str, object]:
    arrays: dict[str, object] = dict(_arrays(make()))
    for key, value in changes.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value
    return arrays


@pytest.mark.parametrize(
    ("arrays", "error", "match"),
    [
        (_broken(y=None), ValueError, r"missing keys \['y'\], unexpected keys \[\]"),
        (_broken(extra=np.zeros(1)), ValueError, r"missing keys \[\], unexpected keys \['extra'\]"),
        (_broken(format_version=np.array(2)), ValueError, "this refimpl reads format_version = 1"),
        (_broken(format_version=np.array([1])), ValueError, "format_version"),
        (_broken(name=np.array(["toy"])), ValueError, "name must be a 0-d unicode array"),
        (_broken(task=np.array(1)), ValueError, "task must be a 0-d unicode array"),
        (_broken(task=np.array("graph")), ValueError, "task must be one of"),
        (_broken(name=np.array({"a": 1}, dtype=object)), ValueError, "name.npy holds pickled"),
        (
            _broken(edge_index=make().edge_index.astype(np.int32)),
            TypeError,
            r"d.npz: edge_index must be an int64",
        ),
        (_broken(node_ptr=np.array([0, 3, 4, 7])), ValueError, r"d.npz: node_ptr must .* \(6\)"),
        (_broken(y=np.zeros((3, 1, 1))), ValueError, "d.npz: y must be 2-D"),
    ],
)
def test_load_rejects_bad_files_naming_the_problem(
    tmp_path: Path, arrays: dict, error: type, match: str
) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    with pytest.raises(error, match=match):
        load_graph_dataset(path)


def test_load_rejects_missing_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no graph dataset file"):
        load_graph_dataset(tmp_path / "absent.npz")
    text = tmp_path / "notes.npz"
    text.write_text("not an archive")
    with pytest.raises(ValueError, match=r"is not a readable \.npz of plain arrays"):
        load_graph_dataset(text)
    single = tmp_path / "single.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(ValueError, match=r"single array \(.npy\)"):
        load_graph_dataset(single)


@pytest.mark.parametrize(
    "name",
    ["\x1b[2J\x1b[31mzinc", "zinc\nwrote /tmp/x", "zinc\r", "tab\there", "bell\x07", "\u202eabc"],
    ids=["escape-sequences", "newline", "carriage-return", "tab", "bell", "bidi-override"],
)
def test_graph_dataset_name_with_terminal_escapes_is_refused(tmp_path: Path, name: str) -> None:
    # A dataset file's name reached the terminal as stored: summary() and `refimpl train` printed
    # escape sequences that cleared the screen and a newline that forged a line of output. The
    # file tests only checked the name's dtype and shape, never its characters.
    path = tmp_path / "d.npz"
    np.savez(path, **{**_arrays(make()), "name": np.array(name)})
    with pytest.raises(ValueError, match=r"d\.npz: name '.*' holds characters a terminal") as info:
        load_graph_dataset(path)
    assert str(info.value).isprintable()  # the message shows the name escaped
    with pytest.raises(ValueError, match="holds characters a terminal does not print"):
        make(name=name)  # nor can one be built, so none is ever saved
    assert make(name="ZINC 12k (train) – ü").summary().startswith("ZINC 12k (train) – ü: graphs")
