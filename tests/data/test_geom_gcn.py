"""Geom-GCN heterophilous sets: statistics (datasets/README.md), the 10 splits, quirks."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from refimpl.data import GEOM_GCN_NAMES, NodeDataset, geom_gcn, load_geom_gcn
from refimpl.data.dataset import coalesce
from tests.data import data_root
from tests.test_files import forge_header

# name: (N, edges symmetric/dedup/no loops, edges as in file deduplicated, F,
#        train/val/test of split 0; the same for all 10 splits except the *_filtered ones)
STATS = {
    "cornell": (183, 554, 298, 1703, (87, 59, 37)),
    "texas": (183, 558, 325, 1703, (87, 59, 37)),
    "wisconsin": (251, 900, 515, 1703, (120, 80, 51)),
    "film": (7600, 53318, 30019, 932, (3648, 2432, 1520)),
    "chameleon": (2277, 62742, 36101, 2325, (1092, 729, 456)),
    "squirrel": (5201, 396706, 217073, 2089, (2496, 1664, 1041)),
    "chameleon_filtered": (890, 17708, 8854, 2325, (409, 287, 194)),
    "squirrel_filtered": (2223, 93996, 46998, 2089, (1053, 718, 452)),
}
SMALL = ("cornell", "texas", "wisconsin", "chameleon_filtered")


@functools.cache
def cached(name: str, split: int = 0, edges: str = "symmetric") -> NodeDataset:
    return load_geom_gcn(data_root(), name, split, edges=edges)


def test_names_cover_the_table() -> None:
    assert set(GEOM_GCN_NAMES) == set(STATS)


@pytest.mark.parametrize("name", sorted(STATS))
def test_statistics(name: str) -> None:
    n, e_sym, _, f, sizes = STATS[name]
    ds = cached(name)
    assert (ds.num_nodes, ds.graph.num_edges, ds.num_features, ds.num_classes) == (n, e_sym, f, 5)
    assert tuple(int(m.sum()) for m in (ds.train_mask, ds.val_mask, ds.test_mask)) == sizes
    assert ds.x.dtype == np.float64 and np.isin(ds.x, (0.0, 1.0)).all()
    src, dst = ds.graph.edge_index
    assert not (src == dst).any()
    np.testing.assert_array_equal(np.sort(dst * n + src), src * n + dst)  # symmetric, sorted


@pytest.mark.parametrize("name", ["cornell", "texas", "wisconsin", "film", "chameleon"])
def test_edges_as_in_file(name: str) -> None:
    # PyG WebKB / Actor / WikipediaNetwork convention: deduplicated, loops kept.
    assert cached(name, edges="as_in_file").graph.num_edges == STATS[name][2]


@pytest.mark.parametrize("name", SMALL)
def test_ten_splits_disjoint_and_distinct(name: str) -> None:
    sizes = STATS[name][4]
    trains = []
    for split in range(10):
        ds = load_geom_gcn(data_root(), name, split)  # NodeDataset checks disjointness
        assert not (ds.train_mask & ds.val_mask).any() and not (ds.val_mask & ds.test_mask).any()
        got = tuple(int(m.sum()) for m in (ds.train_mask, ds.val_mask, ds.test_mask))
        if name.endswith("_filtered"):  # Platonov et al.'s splits: sizes vary, all nodes used
            assert sum(got) == ds.num_nodes
        else:
            assert got == sizes
        trains.append(ds.train_mask)
    assert len({t.tobytes() for t in trains}) == 10


@pytest.mark.parametrize("name", ["film", "chameleon", "squirrel_filtered"])
def test_last_split_of_the_larger_sets(name: str) -> None:
    ds, first = load_geom_gcn(data_root(), name, 9), cached(name)
    assert not np.array_equal(ds.train_mask, first.train_mask)
    assert not (ds.train_mask & ds.test_mask).any()
    if not name.endswith("_filtered"):
        assert int(ds.test_mask.sum()) == STATS[name][4][2]


@pytest.mark.parametrize("split", [-1, 10, 1.0, True, "0"])
def test_split_out_of_range(split: object) -> None:
    with pytest.raises(ValueError, match=r"split must be an int in 0\.\.9"):
        load_geom_gcn(data_root(), "cornell", split)  # type: ignore[arg-type]


def test_bad_name_and_edges_mode() -> None:
    with pytest.raises(ValueError, match="unknown Geom-GCN dataset 'cornel'"):
        load_geom_gcn(data_root(), "cornel")
    with pytest.raises(ValueError, match="edges must be 'symmetric' or 'as_in_file'"):
        load_geom_gcn(data_root(), "cornell", edges="undirected")


def test_actor_alias_and_root_forms() -> None:
    a = load_geom_gcn(data_root() / "geom_gcn", "Actor", 2)
    b = cached("film", 2)
    assert a.name == "film"
    np.testing.assert_array_equal(a.graph.edge_index, b.graph.edge_index)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.train_mask, b.train_mask)


def test_cornell_texas_share_the_feature_file() -> None:
    # Upstream quirk (datasets/README.md): byte-identical feature/label files,
    # different edge files. Loaded as is, like PyG WebKB.
    cornell, texas = cached("cornell"), cached("texas")
    np.testing.assert_array_equal(cornell.x, texas.x)
    np.testing.assert_array_equal(cornell.y, texas.y)
    assert cornell.graph.num_edges != texas.graph.num_edges


def test_chameleon_npz_edges_equal_the_geom_gcn_edge_file() -> None:
    # Two independent sources of the same graph: Platonov et al.'s npz edges (the
    # default) and the Geom-GCN edge file, symmetrised without loops.
    raw = np.loadtxt(
        data_root() / "geom_gcn/new_data/chameleon/out1_graph_edges.txt", dtype=np.int64, skiprows=1
    )
    expected = coalesce(raw[:, 0], raw[:, 1], 2277)
    np.testing.assert_array_equal(cached("chameleon").graph.edge_index, expected)


def test_film_features_are_sparse_indices() -> None:
    ds = cached("film")
    first = (data_root() / "geom_gcn/new_data/film/out1_node_feature_label.txt").read_text()
    node, feats, label = first.splitlines()[1].split("\t")  # "4873  521,92,111,77,770  3"
    np.testing.assert_array_equal(
        np.flatnonzero(ds.x[int(node)]), sorted(int(i) for i in feats.split(","))
    )
    assert ds.y[int(node)] == int(label)


def test_normalize_features() -> None:
    ds = load_geom_gcn(data_root(), "wisconsin", normalize_features=True)
    sums = ds.x.sum(axis=1)
    assert np.all(np.isclose(sums, 1.0) | (sums == 0))


# -- malformed files (no REFIMPL_DATA needed) ------------------------------------------------------
# A small set laid out like the real one: cornell with 6 nodes (3 features, labels 0..4) and
# its split 0, and chameleon_filtered's Platonov et al. archive with the same graph.
FEATURES = "node_id\tfeature\tlabel\n" + "".join(
    f"{i}\t{','.join('1' if (i + j) % 2 else '0' for j in range(3))}\t{i % 5}\n" for i in range(6)
)
EDGES = "node_id\tnode_id\n" + "".join(f"{i}\t{(i + 1) % 6}\n" for i in range(6))
MASKS = {
    "train_mask": np.array([1, 1, 0, 0, 0, 0], np.uint8),  # uint8 0/1, as the real files
    "val_mask": np.array([0, 0, 1, 1, 0, 0], np.uint8),
    "test_mask": np.array([0, 0, 0, 0, 1, 1], np.uint8),
}


def platonov_arrays() -> dict[str, np.ndarray]:
    masks = {f"{key}s": np.tile(value.astype(bool), (10, 1)) for key, value in MASKS.items()}
    return {
        "node_features": np.eye(6, 3, dtype=np.float32),
        "node_labels": np.arange(6) % 5,
        "edges": np.array([[i, (i + 1) % 6] for i in range(6)]),
        **masks,
    }


def write_small(
    root: Path,
    features: str = FEATURES,
    edges: str = EDGES,
    masks: dict[str, np.ndarray] | None = None,
    platonov: dict[str, np.ndarray] | None = None,
    name: str = "cornell",
) -> Path:
    raw = root / "new_data" / name
    raw.mkdir(parents=True)
    (raw / "out1_node_feature_label.txt").write_text(features)
    (raw / "out1_graph_edges.txt").write_text(edges)
    (root / "splits").mkdir()
    np.savez(root / "splits" / f"{name}_split_0.6_0.2_0.npz", **(MASKS if masks is None else masks))
    (root / "platonov2023").mkdir()
    arrays = platonov_arrays() if platonov is None else platonov
    np.savez(root / "platonov2023" / "chameleon_filtered.npz", **arrays)
    return root


def refused_with(root: Path, name: str, file_name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        load_geom_gcn(root, name)
    text = str(info.value)
    assert file_name in text and "\n" not in text


def test_the_small_sets_load(tmp_path: Path) -> None:
    # The fixture the malformed-file tests change one part of: it must load untouched.
    root = write_small(tmp_path)
    for name in ("cornell", "chameleon_filtered"):
        ds = load_geom_gcn(root, name)
        assert ds.summary() == f"{name}: N=6 E=12 F=3 classes=5 train/val/test=2/2/2"
        np.testing.assert_array_equal(ds.y, [0, 1, 2, 3, 4, 0])


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("100000000", r"line 2: label 100000000 is not a class id 0\.\.4"),
        ("-1", r"line 2: label -1 is not a class id 0\.\.4"),
        ("1e8", r"line 2: label '1e8' is not an integer"),
        ("1.0", r"line 2: label '1\.0' is not an integer"),
    ],
)
def test_geom_gcn_label_of_1e8_is_refused(tmp_path: Path, label: str, message: str) -> None:
    # num_classes was max(label) + 1: a label of 1e8 made a one-hot of N x 1e8 (68 GiB
    # for film) downstream, and a float label was truncated. Only the real files were loaded.
    features = FEATURES.replace("\t0\n", f"\t{label}\n", 1)
    refused_with(write_small(tmp_path, features=features), "cornell", "out1_node_feature", message)


def test_geom_gcn_platonov_float_labels_are_refused(tmp_path: Path) -> None:
    # node_labels went through astype(int64): 2.7 became class 2 and 1e8 a 1e8-class set.
    for labels, message in [
        (np.array([0, 1, 2.7, 3, 4, 0]), "labels must be integer class ids, got float64"),
        (np.array([0, 1, 10**8, 3, 4, 0]), r"class ids 0\.\.4, got range 0\.\.100000000"),
    ]:
        root = tmp_path / message[:12]
        root.mkdir()
        write_small(root, platonov={**platonov_arrays(), "node_labels": labels})
        refused_with(root, "chameleon_filtered", "chameleon_filtered.npz", message)


@pytest.mark.parametrize(
    ("masks", "message"),
    [
        ({**MASKS, "val_mask": np.array([0, 0, 0.5, 1, 0, 0])}, "val_mask must be bools or 0/1"),
        ({**MASKS, "test_mask": np.array([0, 0, 0, 0, 2, 1])}, "test_mask holds values other"),
        ({**MASKS, "train_mask": np.ones(5, bool)}, r"shape \(6,\), got bool of shape \(5,\)"),
        ({"train_mask": MASKS["train_mask"]}, "no val_mask, test_mask array"),
    ],
)
def test_geom_gcn_float_masks_are_refused(tmp_path: Path, masks: dict, message: str) -> None:
    # astype(bool) made 0.5 and 2 members of the split; a missing key was a KeyError.
    refused_with(write_small(tmp_path, masks=masks), "cornell", "split_0.6_0.2_0.npz", message)


@pytest.mark.parametrize(
    ("features", "edges", "file_name", "message"),
    [
        (FEATURES.replace("\t0\n", "\t0\textra\n", 1), EDGES, "node", "line 2: 4 tab-sep"),
        (FEATURES.replace("1,0,1", "1,nan,1", 1), EDGES, "node", "line 3: .* NaN or infinity"),
        (FEATURES.replace("1,0,1", "1,0", 1), EDGES, "node", "line 3: .* has 2 values, where"),
        (FEATURES.replace("5\t", "6\t", 1), EDGES, "node", r"line 7: node id 6 is outside 0\.\.5"),
        (FEATURES, EDGES + "1\t2\t3\n", "graph_edges", "line 8: 3 tab-separated fields"),
        (FEATURES, EDGES + "1\t2.5\n", "graph_edges", r"line 8: node id '2\.5' is not an int"),
        (FEATURES, EDGES + "-1\t2\n", "graph_edges", r"line 8: node id -1 is outside 0\.\.5"),
        (FEATURES, EDGES + "1\t6\n", "graph_edges", r"line 8: node id 6 is outside 0\.\.5"),
    ],
    ids=[
        "extra-field",
        "nan-feature",
        "short-vector",
        "id-gap",
        "edge-extra-field",
        "float-edge",
        "negative-edge",
        "edge-past-n",
    ],
)
def test_geom_gcn_extra_columns_are_refused(
    tmp_path: Path, features: str, edges: str, file_name: str, message: str
) -> None:
    # Extra fields were ignored, a node id of -1 wrapped around in the edge keys, and parse
    # errors named no file: the tests only loaded the real files.
    root = write_small(tmp_path, features=features, edges=edges)
    refused_with(root, "cornell", f"out1_{file_name}", message)


def test_geom_gcn_npz_with_a_forged_header_is_refused(tmp_path: Path) -> None:
    # np.load allocated whatever a member's header claimed; the archive now goes through
    # read_npz, which compares the claim with the member's size first.
    root = write_small(tmp_path)
    path = root / "platonov2023" / "chameleon_filtered.npz"
    forge_header(path, "node_features.npy", (2**40, 3))
    message = r"member node_features\.npy claims shape \(1099511627776, 3\)"
    refused_with(root, "chameleon_filtered", "chameleon_filtered.npz", message)


@pytest.mark.parametrize(
    "edges",
    ["", "\n\n", "node_id\tnode_id\n", "node_id\tnode_id\n\n  \n"],
    ids=["empty", "blank", "header-only", "header-and-blanks"],
)
def test_geom_gcn_empty_edge_file_is_refused(tmp_path: Path, edges: str) -> None:
    # An empty or header-only edge file was read as E = 0: a graph with no edges, loaded
    # without a word (np.loadtxt only warns on no data). The malformed-file tests all added a
    # bad line to a good file; none took the lines away.
    message = "is empty: no header line, no edges" if not edges.strip() else "no edges after the"
    refused_with(write_small(tmp_path, edges=edges), "cornell", "out1_graph_edges", message)


def test_geom_gcn_file_without_its_header_is_refused(tmp_path: Path) -> None:
    # The header was skipped unread: a file without one lost its first edge (or node) silently.
    root = write_small(tmp_path, edges=EDGES.split("\n", 1)[1])
    refused_with(root, "cornell", "out1_graph_edges", r"line 1: '0\\t1' is not the header node_id")
    features = "\n".join(FEATURES.split("\n")[1:])
    refused_with(
        write_small(tmp_path / "f", features=features), "cornell", "feature_label", "line 1"
    )
    empty = write_small(tmp_path / "e", features="node_id\tfeature\tlabel\n")
    refused_with(empty, "cornell", "out1_node_feature_label", "no nodes after the header line")


@pytest.mark.parametrize(
    ("features", "edges", "file_name", "message"),
    [
        (FEATURES.replace("5\t", "4\t", 1), EDGES, "node", r"line 7: node id 4 appears a second"),
        (FEATURES, EDGES + "1\t99999999999999999999\n", "graph_edges", r"line 8: node id '9+'"),
        (FEATURES, EDGES + "1\t\n", "graph_edges", r"line 8: node id '' is not an integer"),
        (FEATURES, EDGES + "1 2\n", "graph_edges", "line 8: 1 tab-separated fields"),
        (FEATURES, "node_id\tnode_id\n0\t1\n\x0c\n\n9\t1\n", "graph_edges", "line 5: node id 9"),
        (FEATURES.replace("1,0,1", "1,0,x", 1), EDGES, "node", r"line 3: .* '1,0,x' is not comma"),
    ],
    ids=["repeated-id", "beyond-int64", "missing-field", "spaces", "form-feed", "word-in-vector"],
)
def test_geom_gcn_bad_lines_are_named(
    tmp_path: Path, features: str, edges: str, file_name: str, message: str
) -> None:
    # A repeated node id, a number beyond int64 or a missing field was refused (or not: a
    # beyond-int64 id raised OverflowError, which no clause caught) without its line.
    root = write_small(tmp_path, features=features, edges=edges)
    refused_with(root, "cornell", f"out1_{file_name}", message)


def test_geom_gcn_crlf_files_read_as_the_plain_ones(tmp_path: Path) -> None:
    # Line numbers come from "\n" alone; a Windows "\r\n" copy must still read, and the same.
    crlf = write_small(
        tmp_path / "crlf", FEATURES.replace("\n", "\r\n"), EDGES.replace("\n", "\r\n")
    )
    plain = write_small(tmp_path / "plain")
    a, b = load_geom_gcn(crlf, "cornell"), load_geom_gcn(plain, "cornell")
    np.testing.assert_array_equal(a.graph.edge_index, b.graph.edge_index)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)


def test_geom_gcn_film_feature_index_names_its_line(tmp_path: Path) -> None:
    features = "node_id\tfeature(feature_amount:931)\tlabel\n" + "".join(
        f"{i}\t{i},{i + 900}\t{i % 5}\n" for i in range(6)
    )
    root = write_small(tmp_path, features=features, name="film")
    ds = load_geom_gcn(root, "film", edges="as_in_file")  # the fixture itself loads, right
    assert ds.x.shape == (6, 932) and ds.x.sum() == 12 and ds.x[5, 905] == 1.0
    bad = write_small(tmp_path / "bad", features=features.replace("3,903", "3,932"), name="film")
    refused_with(bad, "film", "out1_node_feature", r"line 5: feature index 932 is outside 0\.\.931")


def test_geom_gcn_npz_without_edges_or_beyond_its_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An archive with an empty (0, 2) edges array was a graph without edges, silently; and
    # the archives had only the machine-wide limit, not what a Geom-GCN file can hold.
    root = write_small(tmp_path, platonov={**platonov_arrays(), "edges": np.zeros((0, 2), int)})
    refused_with(root, "chameleon_filtered", "chameleon_filtered.npz", "edges holds no edge")
    root = write_small(tmp_path / "big")
    held = sum(value.nbytes for value in platonov_arrays().values())
    monkeypatch.setattr(geom_gcn, "_MAX_NPZ_BYTES", held - 1)
    message = rf"more than the limit for a Geom-GCN file \({held - 1} bytes\).*; restore the file"
    refused_with(root, "chameleon_filtered", "chameleon_filtered.npz", message)
