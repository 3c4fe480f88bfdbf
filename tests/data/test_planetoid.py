"""Planetoid loader: exact statistics, preprocessing semantics, missing files, tampered pickles."""

from __future__ import annotations

import functools
import pickle
import shutil
import tracemalloc
import warnings
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


def test_sparse_features_hold_the_dense_values() -> None:
    dense = cached("cora", normalize=True)
    sparse = load_planetoid(data_root(), "cora", normalize_features=True, sparse_features=True)
    assert sp.issparse(sparse.x) and sparse.x.format == "csr"
    np.testing.assert_array_equal(sparse.x.toarray(), dense.x)
    assert sparse.x.nnz == np.count_nonzero(dense.x)  # Cora: 49216 of 3.9e6 entries (1.3%)
    np.testing.assert_array_equal(sparse.y, dense.y)


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


# -- malformed files made only of allowed classes (no REFIMPL_DATA needed) ------------------------
# A small Planetoid set laid out like the real one: allx 505 nodes (x its first 2; val the
# next 500, as the public split takes 500), tx 3 test nodes with ids 507, 505, 506 in file
# order, F = 4 features, C = 3 classes, N = 508, a key per node in the graph dict.
def tiny_parts(num_nodes: int = 508) -> dict[str, object]:
    from collections import defaultdict

    rng = np.random.default_rng(0)
    allx = sp.csr_matrix((rng.random((505, 4)) < 0.5).astype(np.float32))
    ally = np.eye(3, dtype=np.int32)[np.arange(505) % 3]
    neighbours = {k: [(k + 1) % num_nodes, (k + 3) % num_nodes] for k in range(num_nodes)}
    return {
        "x": allx[:2].tocsr(),
        "y": ally[:2],
        "allx": allx,
        "ally": ally,
        "tx": sp.csr_matrix(np.eye(3, 4, dtype=np.float32)),  # nnz 3, indptr [0, 1, 2, 3]
        "ty": np.eye(3, dtype=np.int32),
        "graph": defaultdict(list, neighbours),
        "test.index": "507\n505\n506\n",
    }


def write_tiny(folder: Path, name: str = "cora", **changes: object) -> Path:
    """``folder`` holding ``ind.{name}.*`` of the small set, with ``changes`` (part -> object
    to pickle, or the file's text or bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    for part, value in {**tiny_parts(), **changes}.items():
        path = folder / f"ind.{name}.{part}"
        if isinstance(value, str):
            path.write_text(value)
        elif isinstance(value, bytes):  # the file's raw content
            path.write_bytes(value)
        else:
            path.write_bytes(pickle.dumps(value, protocol=4))
    return folder


def tampered_tx(**state: object) -> sp.csr_matrix:
    """The small tx with raw attributes replaced: unpickling restores them unchecked."""
    matrix = sp.csr_matrix(np.eye(3, 4, dtype=np.float32))
    for key, value in state.items():
        setattr(matrix, key, value)
    return matrix


def refused_with(folder: Path, name: str, part: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        load_planetoid(folder, name)
    text = str(info.value)
    assert f"ind.{name}.{part}" in text and "\n" not in text


def test_the_small_set_loads_as_the_real_preprocessing_says(tmp_path: Path) -> None:
    # The fixture the malformed-file tests change one part of: it must load untouched.
    ds = load_planetoid(write_tiny(tmp_path), "cora")
    assert ds.summary() == "cora: N=508 E=2032 F=4 classes=3 train/val/test=2/500/3"
    np.testing.assert_array_equal(ds.x[[507, 505, 506]], np.eye(3, 4))  # tx row i: id i
    np.testing.assert_array_equal(ds.y[[507, 505, 506]], [0, 1, 2])


def test_the_small_citeseer_pads_its_missing_test_ids(tmp_path: Path) -> None:
    # Test ids 508, 505, 507 of N = 509 (graph keys 0..508): 506 is padded with zeros.
    changes = {"graph": tiny_parts(509)["graph"], "test.index": "508\n505\n507\n"}
    ds = load_planetoid(write_tiny(tmp_path, "citeseer", **changes), "citeseer")
    assert ds.num_nodes == 509 and not ds.x[506].any() and ds.y[506] == 0
    np.testing.assert_array_equal(np.flatnonzero(ds.test_mask), [505, 507, 508])
    np.testing.assert_array_equal(ds.x[[508, 505, 507]], np.eye(3, 4))


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"indices": np.array([0, 1, 99], np.int32)}, r"column indices outside \[0, 4\)"),
        ({"indices": np.array([0, -1, 2], np.int32)}, r"outside \[0, 4\) \(range -1\.\.2\)"),
        ({"indptr": np.array([0, 2, 1, 3], np.int32)}, "not 4 non-decreasing row offsets"),
        ({"indptr": np.array([1, 1, 2, 3], np.int32)}, "row offsets from 0"),
        ({"indptr": np.array([0, 1, 2, 2], np.int32)}, "ends at 2 but it holds 3 column"),
        ({"indptr": np.array([0, 1, 3], np.int32)}, "not 4 non-decreasing"),
        ({"indices": np.zeros(3)}, "indices/indptr have dtypes float64/int32, not integers"),
        ({"data": np.ones(3, dtype=np.int64)}, "holds int64 values, not floats"),
        ({"data": np.array([1, np.nan, 1], np.float32)}, "NaN or infinite values"),
        ({"data": [1.0, 1.0, 1.0]}, "data is not a 1-D array"),
        ({"_shape": (3, 4.0)}, r"shape \(3, 4\.0\) is not 2 sizes"),
        ({"_shape": (3, 10**12)}, r"claims shape 3 x 1000000000000, far more than a file"),
    ],
)
def test_planetoid_csr_with_out_of_range_column_is_refused(
    tmp_path: Path, state: dict[str, object], message: str
) -> None:
    # SciPy's C++ toarray trusts a csr_matrix's raw arrays: an out-of-range or negative
    # column, or a bad indptr, in a pickle of allowed classes wrote out of bounds and killed
    # the process (SIGSEGV). The tests only ever loaded the real files or refused foreign
    # globals; nothing built a well-typed but malformed matrix. (A regression here crashes.)
    refused_with(write_tiny(tmp_path, tx=tampered_tx(**state)), "cora", "tx", message)


@pytest.mark.parametrize(
    ("test_index", "message"),
    [
        ("507\n505\n-1\n", r"test id -1 lies outside \[505, 508\)"),
        ("507\n505\n508\n", r"test id 508 lies outside \[505, 508\)"),
        ("507\n505\n3\n", r"test id 3 lies outside"),  # a training node
        ("507\n505\n505\n", "test ids repeat"),
        ("507\n505\n", "expected 3 test ids, one per line .* got 2"),
        ("507\n505\n506.5\n", r"test\.index, line 3: test id '506\.5' is not an integer"),
        ("507\n505 506\n", r"test\.index, line 2: test id '505 506' is not an integer"),
        ("", r"expected 3 test ids, one per line .* got 0"),
    ],
)
def test_planetoid_test_index_minus_one_is_refused(
    tmp_path: Path, test_index: str, message: str
) -> None:
    # A test id of -1 wrapped around to the last node, a repeated id silently dropped a test
    # row, and an id past N raised a bare IndexError: nothing checked test.index's ids. Then
    # np.loadtxt named a bad id's row from 0 (line 3 was "row 2") and warned on an empty
    # file, a Python warning printed before the error line.
    folder = write_tiny(tmp_path, **{"test.index": test_index})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refused_with(folder, "cora", "test.index", message)


def test_planetoid_citeseer_padding_is_bounded_by_the_graph(tmp_path: Path) -> None:
    # CiteSeer pads up to its largest test id: an id of 10**9 would allocate a 10**9-row
    # zero block. The graph dict (a key per node) bounds it.
    folder = write_tiny(tmp_path, "citeseer", **{"test.index": "507\n505\n1000000000\n"})
    refused_with(folder, "citeseer", "test.index", r"test id 1000000000 lies outside \[505, 508\)")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (np.array([[np.nan, 1, 0]] * 3), r"integer one-hot array, got float64"),
        (np.eye(3, dtype=np.int32)[[0, 0, 0]] * 2, "3 label rows are not one-hot"),
        (np.array([[1, 1, 0], [0, 1, 0], [0, 0, 1]], np.int32), "first: row 0"),
        (np.array([[0, 1, 0], [0, 0, 0], [0, 0, 1]], np.int32), "1 label rows .* first: row 1"),
        (np.ones(3, np.int32), r"got int32 of shape \(3,\)"),
    ],
)
def test_planetoid_nan_onehot_label_is_refused(
    tmp_path: Path, labels: np.ndarray, message: str
) -> None:
    # argmax of a NaN (or all-zero, or doubled) one-hot row is class 0: a corrupt label file
    # became silently wrong labels. Label files were never checked beyond their type.
    refused_with(write_tiny(tmp_path, ty=labels), "cora", "ty", message)


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        ({0.5: [1]}, "keys must be a flat list of integer node ids"),
        ({0: [1.0, 2.0]}, "the neighbours of node 0 must be a flat list of integer"),
        ({0: ["1"]}, "the neighbours of node 0 must be a flat list of integer"),
        ({0: 3}, "the neighbours of node 0 must be a list of node ids, got int"),
        ({0: [508]}, r"names nodes outside \[0, 508\)"),
        ({0: [-1]}, r"names nodes outside \[0, 508\)"),
    ],
)
def test_planetoid_graph_dict_with_float_ids_is_refused(
    tmp_path: Path, graph: dict, message: str
) -> None:
    # A float id was truncated and a string id parsed by np.asarray(v, dtype=int64): a
    # malformed graph file became a different graph, and its errors named no file.
    refused_with(write_tiny(tmp_path, graph=graph), "cora", "graph", message)


def test_planetoid_files_of_different_sizes_are_refused(tmp_path: Path) -> None:
    # Mismatched files raised SciPy's "inconsistent shapes" or NumPy's broadcast errors,
    # naming no file; the real files always agreed, so no test saw it.
    wide = sp.csr_matrix(np.eye(3, 5, dtype=np.float32))
    with pytest.raises(ValueError, match=r"ind\.cora\.\{x,tx,allx\} disagree .*tx 5"):
        load_planetoid(write_tiny(tmp_path / "a", tx=wide), "cora")
    with pytest.raises(ValueError, match=r"ind\.cora\.tx has 3 rows but ind\.cora\.ty 2"):
        load_planetoid(write_tiny(tmp_path / "b", ty=np.eye(3, dtype=np.int32)[:2]), "cora")


class ForgedArray:
    """Pickles as an int32 ndarray whose state claims 10**12 entries over 16 bytes of data."""

    def __reduce__(self) -> tuple:
        from refimpl.data._unpickle import _reconstruct

        state = (1, (10**12,), np.dtype("<i4"), False, b"\0" * 16)
        return _reconstruct, (np.ndarray, (0,), b"b"), state


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"not a readable pickle \(ValueError: pickle exhausted before seeing STOP"),
        (pickle.dumps(np.eye(3, dtype=np.int32), protocol=4)[:-9], r"but only \d+ remain"),
        (pickle.dumps(ForgedArray(), protocol=4), "buffer size does not match array size"),
    ],
)
def test_planetoid_truncated_pickle_is_refused_naming_the_file(
    tmp_path: Path, content: bytes, message: str
) -> None:
    # EOFError, UnpicklingError and NumPy's ValueError came out of pickle's internals with no
    # file named: the tests only fed whole pickles, or ones naming foreign globals.
    refused_with(write_tiny(tmp_path, ty=content), "cora", "ty", message)


class ClaimedShape:
    """Pickles as ``_reconstruct(ndarray, (2**20,), "b")``: an array of a claimed shape, with
    no data to fill it."""

    def __reduce__(self) -> tuple:
        from refimpl.data._unpickle import _reconstruct

        return _reconstruct, (np.ndarray, (2**20,), b"b")


def test_planetoid_pickle_memo_index_bomb_is_refused(tmp_path: Path) -> None:
    # The unpickler sizes its memo by the largest index stored to: a 9-byte pickle storing at
    # index 2**26 took 1 GiB, from allowed opcodes alone. The tampering tests fed foreign
    # globals and malformed matrices, never an opcode's own claim. (Here 2**22: 64 MiB.)
    bomb = b"\x80\x02]r" + (2**22).to_bytes(4, "little") + b"."  # [] stored at memo 2**22
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"memo index 4194304, beyond what a pickle of 9"):
            load_restricted_pickle(write_tiny(tmp_path, graph=bomb) / "ind.cora.graph")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    refused_with(tmp_path, "cora", "graph", "a memory bomb")


def test_planetoid_array_of_a_claimed_shape_is_refused(tmp_path: Path) -> None:
    # _reconstruct (allowed: every NumPy pickle calls it) allocated whatever shape the pickle
    # gave it, before any data: a 100-byte file could make a label array of gigabytes, which
    # the one-hot check then read through. NumPy's own pickles always build (0,).
    content = pickle.dumps(ClaimedShape(), protocol=4)
    with pytest.raises(UnsafePickleError, match=r"ind\.cora\.ty: it builds an array of shape "):
        load_planetoid(write_tiny(tmp_path, ty=content), "cora")
    assert len(content) < 200


def test_planetoid_global_named_with_terminal_escapes_is_shown_escaped(tmp_path: Path) -> None:
    # The refusal quoted the global a pickle asked for as the pickle spelled it: a module
    # name holding escape sequences or a newline rewrote the terminal that printed the error.
    def short_unicode(text: str) -> bytes:
        data = text.encode()
        return b"\x8c" + bytes([len(data)]) + data

    content = b"\x80\x04" + short_unicode("os\x1b[2J") + short_unicode("sys\ntem") + b"\x93."
    with pytest.raises(UnsafePickleError) as info:
        load_planetoid(write_tiny(tmp_path, ty=content), "cora")
    assert r"asks for os\x1b[2J.sys\ntem, which" in str(info.value)
    assert str(info.value).isprintable()
