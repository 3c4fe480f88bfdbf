"""Planetoid loader: exact statistics, preprocessing semantics, missing files, tampered pickles."""

from __future__ import annotations

import functools
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from refimpl.data import NodeDataset, UnsafePickleError, load_planetoid
from refimpl.data._unpickle import load_restricted_pickle
from refimpl.data.planetoid import planetoid_edge_index
from tests.data import data_root

# name: (N, directed edges, F, classes, train, val, test, feature non-zeros); datasets/README.md
STATS = {
    "cora": (2708, 10556, 1433, 7, 140, 500, 1000, 49216),
    "citeseer": (3327, 9104, 3703, 6, 120, 500, 1000, 105165),
}
PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")


def planetoid_dir() -> Path:
    return data_root() / "planetoid"


@functools.cache
def cached(name: str, normalize: bool = False) -> NodeDataset:
    """Each dataset loaded once per session (the loads dominate this module's runtime)."""
    return load_planetoid(data_root(), name, normalize_features=normalize)


@pytest.fixture(scope="module", params=sorted(STATS))
def loaded(request: pytest.FixtureRequest) -> tuple[str, NodeDataset]:
    return request.param, cached(request.param)


def linked_copy(tmp_path: Path, name: str, skip: tuple[str, ...] = ()) -> Path:
    """``tmp_path`` with symlinks to ``ind.{name}.*`` except the parts in ``skip``."""
    for part in PARTS:
        source = planetoid_dir() / f"ind.{name}.{part}"
        if part not in skip and source.exists():
            (tmp_path / source.name).symlink_to(source)
    return tmp_path


def test_statistics(loaded: tuple[str, NodeDataset]) -> None:
    name, ds = loaded
    n, e, f, c, n_train, n_val, n_test, nnz = STATS[name]
    assert (ds.num_nodes, ds.graph.num_edges, ds.num_features, ds.num_classes) == (n, e, f, c)
    assert [int(m.sum()) for m in (ds.train_mask, ds.val_mask, ds.test_mask)] == [
        n_train,
        n_val,
        n_test,
    ]
    assert np.count_nonzero(ds.x) == nnz
    assert ds.x.dtype == np.float64 and ds.y.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(ds.y[ds.train_mask]), [20] * c)
    src, dst = ds.graph.edge_index
    assert not (src == dst).any()
    keys = dst * n + src
    assert (np.diff(keys) > 0).all()  # sorted by target as in PyG, no duplicates
    np.testing.assert_array_equal(np.sort(src * n + dst), keys)  # symmetric


def test_citeseer_isolated_test_range_nodes() -> None:
    ds = cached("citeseer")
    assert int((ds.graph.in_degree() == 0).sum()) == 48
    in_no_mask = np.flatnonzero(~(ds.train_mask | ds.val_mask | ds.test_mask))
    padded = in_no_mask[in_no_mask >= 2312]  # the 15 ids missing from test.index
    assert padded.size == 15
    assert not ds.x[padded].any() and (ds.y[padded] == 0).all()


@pytest.mark.parametrize("name", sorted(STATS))
def test_test_rows_follow_test_index(name: str) -> None:
    # The i-th row of tx / ty belongs to node test.index[i] (file order).
    folder = planetoid_dir()
    ds = cached(name)
    test_idx = np.loadtxt(folder / f"ind.{name}.test.index", dtype=np.int64)
    tx = load_restricted_pickle(folder / f"ind.{name}.tx").toarray()
    ty = load_restricted_pickle(folder / f"ind.{name}.ty")
    np.testing.assert_array_equal(ds.x[test_idx], tx)
    np.testing.assert_array_equal(ds.y[test_idx], ty.argmax(1))


def test_cora_edges_against_python_sets() -> None:
    graph_dict = load_restricted_pickle(planetoid_dir() / "ind.cora.graph")
    expected = {(k, j) for k, js in graph_dict.items() for j in js if k != j}
    expected |= {(j, k) for k, j in expected}
    ds = cached("cora")
    assert set(map(tuple, ds.graph.edge_index.T.tolist())) == expected


def test_root_forms_and_case_agree() -> None:
    a = cached("cora")
    b = load_planetoid(planetoid_dir(), "CoRa")
    np.testing.assert_array_equal(a.graph.edge_index, b.graph.edge_index)
    np.testing.assert_array_equal(a.x, b.x)
    with pytest.raises(ValueError, match="unknown Planetoid dataset 'corra'"):
        load_planetoid(data_root(), "corra")


def test_normalize_features() -> None:
    raw, ds = cached("citeseer"), cached("citeseer", normalize=True)
    sums = ds.x.sum(axis=1)
    zero = ~raw.x.any(axis=1)
    assert zero.sum() > 0  # CiteSeer has all-zero rows; they must stay zero
    np.testing.assert_allclose(sums[~zero], 1.0, rtol=1e-12)
    assert not ds.x[zero].any()
    np.testing.assert_allclose(ds.x, raw.x / np.where(zero, 1, raw.x.sum(1))[:, None])


def test_pubmed_graph_labels_split_without_allx() -> None:
    # These do not depend on allx, which the shared copy lacks.
    folder = planetoid_dir()
    ally, ty = (load_restricted_pickle(folder / f"ind.pubmed.{p}") for p in ("ally", "ty"))
    n = ally.shape[0] + ty.shape[0]
    assert (n, ally.shape[1]) == (19717, 3)
    edge_index = planetoid_edge_index(load_restricted_pickle(folder / "ind.pubmed.graph"), n)
    assert edge_index.shape == (2, 88648)


def test_pubmed_full_or_missing_allx(tmp_path: Path) -> None:
    if (planetoid_dir() / "ind.pubmed.allx").exists():
        ds = load_planetoid(data_root(), "pubmed")
        assert ds.summary() == "pubmed: N=19717 E=88648 F=500 classes=3 train/val/test=60/500/1000"
        return
    with pytest.raises(FileNotFoundError, match=r"missing ind\.pubmed\.allx in .*planetoid"):
        load_planetoid(data_root(), "pubmed")


def test_pubmed_pipeline_with_a_stand_in_allx(tmp_path: Path) -> None:
    # A user who has allx gets the full dataset: stand in zeros below x's 60 rows.
    folder = linked_copy(tmp_path, "pubmed", skip=("allx",))
    x = load_restricted_pickle(folder / "ind.pubmed.x")
    allx = sp.vstack([x, sp.csr_matrix((18717 - x.shape[0], 500), dtype=np.float32)]).tocsr()
    (folder / "ind.pubmed.allx").write_bytes(pickle.dumps(allx, protocol=4))
    ds = load_planetoid(folder, "pubmed")
    assert ds.summary() == "pubmed: N=19717 E=88648 F=500 classes=3 train/val/test=60/500/1000"


def test_missing_file_is_named(tmp_path: Path) -> None:
    folder = linked_copy(tmp_path, "cora", skip=("ty", "test.index"))
    with pytest.raises(FileNotFoundError, match=r"missing ind\.cora\.ty, ind\.cora\.test\.index"):
        load_planetoid(folder, "cora")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no Planetoid files ind\.cora"):
        load_planetoid(tmp_path / "empty", "cora")


def call_pickle(module: str, name: str, argument: str) -> bytes:
    """Protocol-2 bytes that call ``module.name(argument)``, written opcode by opcode
    (GLOBAL, BINUNICODE, TUPLE1, REDUCE, STOP), as a tampered file would."""
    arg = argument.encode()
    head = f"c{module}\n{name}\n".encode()
    return b"\x80\x02" + head + b"X" + len(arg).to_bytes(4, "little") + arg + b"\x85R."


@pytest.mark.parametrize(
    ("part", "module", "name"),
    [("graph", "os", "system"), ("x", "__builtin__", "eval"), ("ally", "builtins", "eval")],
)
def test_tampered_cora_file_is_refused(tmp_path: Path, part: str, module: str, name: str) -> None:
    folder = tmp_path / "planetoid"
    folder.mkdir()
    linked_copy(folder, "cora", skip=(part,))
    marker = tmp_path / "marker"  # created only if the payload runs
    command = f"touch {marker}"
    if name == "eval":
        command = f"__import__('os').system({command!r})"
    (folder / f"ind.cora.{part}").write_bytes(call_pickle(module, name, command))
    expected = rf"refusing to load .*ind\.cora\.{part}: the file asks for {module}\.{name}"
    with pytest.raises(UnsafePickleError, match=expected + r".*may be tampered with") as info:
        load_planetoid(tmp_path, "cora")
    assert isinstance(info.value, ValueError) and isinstance(info.value, pickle.UnpicklingError)
    assert not marker.exists()


def test_restricted_unpickler_round_trips_allowed_objects(tmp_path: Path) -> None:
    from collections import defaultdict

    obj = {
        "csr": sp.csr_matrix(np.eye(3, dtype=np.float32)),
        "array": np.arange(6).reshape(2, 3),
        "graph": defaultdict(list, {0: [1, 2]}),
    }
    for key, value in obj.items():
        path = tmp_path / key
        path.write_bytes(pickle.dumps(value, protocol=4))
        loaded = load_restricted_pickle(path)
        assert type(loaded) is type(value)
    path = tmp_path / "function"
    path.write_bytes(pickle.dumps(shutil.copy, protocol=4))
    with pytest.raises(UnsafePickleError, match=r"asks for shutil\.copy"):
        load_restricted_pickle(path)
