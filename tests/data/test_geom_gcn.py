"""Geom-GCN heterophilous sets: statistics (datasets/README.md), the 10 splits, quirks."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from refimpl.data import GEOM_GCN_NAMES, NodeDataset, load_geom_gcn
from refimpl.data.dataset import coalesce
from tests.data import data_root

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
