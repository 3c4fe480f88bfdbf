"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from the ``ind.*`` pickles.

Preprocessing is tkipf/gcn ``load_data``, which PyG ``read_planetoid_data``
matches:

1. ``test.index`` in file order (unsorted) and its sorted copy.
2. CiteSeer: the test ids span ``2312..3326`` (1015 ids) but ``tx`` has 1000
   rows; the 15 missing ids are isolated nodes, padded with zero features and
   zero one-hot labels (class 0 after ``argmax``, as in PyG), in no mask.
3. ``X = vstack(allx, tx)`` and ``X[test_idx] = X[test_sorted]``; labels alike.
4. Edges from the ``graph`` dict (one ``k -> j`` per list entry), symmetrised,
   deduplicated, self-loops removed, sorted by target (PyG ``remove_self_loops``
   + ``coalesce(sort_by_row=False)``, the same edge order as PyG);
   the lists hold duplicates and (CiteSeer, PubMed) self-loops. The attention
   layers add one self-loop per node themselves.
5. Public split: train = ``range(len(y))``, val = the next 500, test = the
   sorted test ids.

Every file is checked before use, one ``ValueError`` naming the file and what is wrong:
sparse matrices get SciPy's full format check done in NumPy on the raw pickled arrays
before any SciPy code touches them (a bad index makes SciPy's C++ ``toarray`` write out of
bounds, killing the process), and are rebuilt from the checked arrays; labels must be 0/1
integer one-hot rows; test ids distinct and in the rows after ``allx``; the graph dict
integer ids in range; sizes consistent across the files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from refimpl.data._unpickle import load_restricted_pickle
from refimpl.data.dataset import RESTORE, NodeDataset, coalesce, parse_ints, row_normalize
from refimpl.graph import Graph

__all__ = ["PLANETOID_NAMES", "load_planetoid", "planetoid_edge_index"]

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")
_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
_NUM_VAL = 500  # Yang et al. 2016 / Kipf & Welling 2017 public split
# where the files are published (PyG's Planetoid downloads them from there too)
_SOURCE = "https://github.com/kimiyoung/planetoid"
# Dense cells a sparse matrix may claim per byte of its file: the real files claim 1-15
# (PubMed's TF-IDF 1.3, CiteSeer 14); a claim far beyond is a forged shape whose dense
# form would exhaust memory.
_MAX_CELLS_PER_BYTE = 1024


def _planetoid_dir(root: str | Path, name: str) -> Path:
    """``root`` itself if it holds ``ind.{name}.*``, else ``root/planetoid``."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"data root {root} is not a directory")
    for candidate in (root, root / "planetoid"):
        if any(candidate.glob(f"ind.{name}.*")):
            return candidate
    raise FileNotFoundError(
        f"no Planetoid files ind.{name}.* in {root} or {root / 'planetoid'}; pass the folder "
        f"that holds them (or its parent), copied from the data/ folder of {_SOURCE}"
    )


def _check_files(folder: Path, name: str, parts: tuple[str, ...]) -> None:
    names = [f"ind.{name}.{part}" for part in (*parts, "test.index")]
    missing = [f for f in names if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{name}: missing {', '.join(missing)} in {folder}; all 8 files "
            f"ind.{name}.{{x,y,tx,ty,allx,ally,graph,test.index}} are needed, as in the data/ "
            f"folder of {_SOURCE} (docs: guide/data.md, 'Getting the files')"
        )


def _load(folder: Path, name: str, part: str, kind: type) -> object:
    path = folder / f"ind.{name}.{part}"
    obj = load_restricted_pickle(path)
    if not isinstance(obj, kind):
        raise ValueError(f"{path}: expected a {kind.__name__}, got {type(obj).__name__}")
    return obj


def _load_csr(folder: Path, name: str, part: str) -> sp.csr_matrix:
    """The pickled ``csr_matrix``, format-checked in NumPy and rebuilt from its checked arrays.

    Unpickling sets the matrix's attributes as the file gives them, unchecked (stale
    "sorted" flags included), so nothing of SciPy runs on them: the checks read the raw
    arrays, and a fresh matrix is built from them only once they pass.
    """
    path = folder / f"ind.{name}.{part}"
    state = vars(_load(folder, name, part, sp.csr_matrix))
    arrays = {key: state.get(key) for key in ("data", "indices", "indptr")}
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray) or value.ndim != 1:
            raise ValueError(f"{path}: the sparse matrix's {key} is not a 1-D array; {RESTORE}")
    data, indices, indptr = arrays.values()
    shape = state.get("_shape")
    if not (
        isinstance(shape, tuple)
        and len(shape) == 2
        and all(_is_int(extent) and extent >= 0 for extent in shape)
    ):
        raise ValueError(f"{path}: the sparse matrix's shape {shape!r} is not 2 sizes; {RESTORE}")
    rows, cols = (int(extent) for extent in shape)
    if indices.dtype.kind not in "iu" or indptr.dtype.kind not in "iu":
        raise ValueError(
            f"{path}: the sparse matrix's indices/indptr have dtypes {indices.dtype}/"
            f"{indptr.dtype}, not integers; {RESTORE}"
        )
    if data.dtype.kind != "f":
        raise ValueError(
            f"{path}: the sparse matrix holds {data.dtype} values, not floats; {RESTORE}"
        )
    if rows * cols > _MAX_CELLS_PER_BYTE * path.stat().st_size:
        raise ValueError(
            f"{path}: the sparse matrix claims shape {rows} x {cols}, far more than a file of "
            f"{path.stat().st_size} bytes describes; {RESTORE}"
        )
    if indptr.size != rows + 1 or indptr[0] != 0 or (np.diff(indptr.astype(np.int64)) < 0).any():
        raise ValueError(
            f"{path}: the sparse matrix's indptr is not {rows + 1} non-decreasing row offsets "
            f"from 0; {RESTORE}"
        )
    if int(indptr[-1]) != indices.size or indices.size != data.size:
        raise ValueError(
            f"{path}: the sparse matrix's indptr ends at {int(indptr[-1])} but it holds "
            f"{indices.size} column indices and {data.size} values; {RESTORE}"
        )
    if indices.size and (indices.min() < 0 or indices.max() >= cols):
        raise ValueError(
            f"{path}: the sparse matrix has column indices outside [0, {cols}) "
            f"(range {indices.min()}..{indices.max()}); {RESTORE}"
        )
    if not np.isfinite(data).all():
        raise ValueError(f"{path}: the sparse matrix holds NaN or infinite values; {RESTORE}")
    return sp.csr_matrix(
        (data, indices.astype(np.int64), indptr.astype(np.int64)), shape=(rows, cols)
    )


def _load_onehot(folder: Path, name: str, part: str) -> np.ndarray:
    """The pickled label matrix (rows, classes), checked to be integer one-hot rows."""
    path = folder / f"ind.{name}.{part}"
    labels = _load(folder, name, part, np.ndarray)
    if labels.dtype.kind not in "iu" or labels.ndim != 2 or labels.shape[1] == 0:
        raise ValueError(
            f"{path}: labels must be a (nodes, classes) integer one-hot array, got "
            f"{labels.dtype} of shape {labels.shape}; {RESTORE}"
        )
    bad = np.flatnonzero(((labels != 0) & (labels != 1)).any(axis=1) | (labels.sum(axis=1) != 1))
    if bad.size:
        raise ValueError(
            f"{path}: {bad.size} label rows are not one-hot (a single 1, zeros elsewhere; "
            f"first: row {bad[0]}); {RESTORE}"
        )
    return labels


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _read_test_index(folder: Path, name: str, first: int, count: int, limit: int) -> np.ndarray:
    """The ``count`` test ids in file order (unsorted), checked to be distinct node ids in
    ``[first, limit)``: the rows after ``allx``, where ``tx``'s rows go."""
    path = folder / f"ind.{name}.test.index"
    try:
        rows = path.read_text().split("\n")  # not splitlines: a form feed ends no line here
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a text file ({err}); {RESTORE}") from err
    numbered = [(number, row) for number, row in enumerate(rows, 1) if row.strip()]
    texts = [row for _, row in numbered]  # one id a line
    test_idx = parse_ints(path, [number for number, _ in numbered], "test id", texts)  # (1000,)
    if test_idx.size != count:
        raise ValueError(
            f"{path}: expected {count} test ids, one per line (one per row of tx), got "
            f"{test_idx.size}; {RESTORE}"
        )
    outside = test_idx[(test_idx < first) | (test_idx >= limit)]
    if outside.size:
        raise ValueError(
            f"{path}: test id {outside[0]} lies outside [{first}, {limit}), the ids of the "
            f"nodes after allx's rows; {RESTORE}"
        )
    if np.unique(test_idx).size != count:
        raise ValueError(f"{path}: test ids repeat; each test node must appear once; {RESTORE}")
    return test_idx


def planetoid_edge_index(
    graph_dict: dict, num_nodes: int, *, source: str = "graph dict"
) -> np.ndarray:
    """``(2, E)`` edge_index from the ``{node: [neighbours]}`` dict (step 4 above).

    One edge ``k -> j`` per list entry, then both directions, duplicates and
    self-loops removed, sorted by (dst, src) as PyG's ``edge_index_from_dict``
    (``sort_by_row=False``), so the edge order matches PyG's edge for edge.
    Keys and list entries must be integer node ids in ``[0, num_nodes)``; anything
    else raises ``ValueError`` starting with ``source`` (the file's name).
    """
    keys = _node_ids(list(graph_dict), f"{source}: keys")
    lists = [_node_ids(v, f"{source}: the neighbours of node {k}") for k, v in graph_dict.items()]
    lengths = np.array([len(v) for v in lists], dtype=np.int64)
    src = np.repeat(keys, lengths)  # (entries,)
    dst = np.concatenate(lists) if lists else np.zeros(0, np.int64)
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise ValueError(f"{source}: names nodes outside [0, {num_nodes})")
    return coalesce(src, dst, num_nodes, sort_by_row=False)


def _node_ids(values: object, what: str) -> np.ndarray:
    """``values`` (a list of ints) as an int64 array, or ``ValueError`` saying ``what`` is not."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{what} must be a list of node ids, got {type(values).__name__}")
    if not values:
        return np.zeros(0, np.int64)
    try:
        ids = np.asarray(values)
    except ValueError:  # ragged nesting
        ids = np.asarray(0.5)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":  # floats, bools, nested lists, huge ints
        raise ValueError(f"{what} must be a flat list of integer node ids")
    return ids.astype(np.int64)


def _check_sizes(folder: Path, name: str, parts: dict[str, sp.csr_matrix | np.ndarray]) -> None:
    """x, tx, allx share the feature count, y, ty, ally the class count; each label file has
    a row per row of its feature file; x's rows are allx's first rows."""
    shapes = {part: value.shape for part, value in parts.items()}
    for group in (("x", "tx", "allx"), ("y", "ty", "ally")):
        if len({shapes[part][1] for part in group}) > 1:
            found = ", ".join(f"{part} {shapes[part][1]}" for part in group)
            raise ValueError(
                f"{folder}: ind.{name}.{{{','.join(group)}}} disagree on their column count "
                f"({found}); the files come from different datasets"
            )
    for features, labels in (("x", "y"), ("tx", "ty"), ("allx", "ally")):
        if shapes[features][0] != shapes[labels][0]:
            raise ValueError(
                f"{folder}: ind.{name}.{features} has {shapes[features][0]} rows but "
                f"ind.{name}.{labels} {shapes[labels][0]}; one label row per node is needed"
            )
    if shapes["x"][0] > shapes["allx"][0]:
        raise ValueError(
            f"{folder}: ind.{name}.x has more rows than allx ({shapes['x'][0]} > "
            f"{shapes['allx'][0]}); x must be allx's first rows"
        )


def load_planetoid(
    root: str | Path, name: str, normalize_features: bool = False, sparse_features: bool = False
) -> NodeDataset:
    """Cora, CiteSeer or PubMed with the public split (Yang et al. 2016).

    Parameters
    ----------
    root : path
        The folder holding ``ind.{name}.*``, or its parent with ``planetoid/``.
    name : str
        ``"cora"``, ``"citeseer"`` or ``"pubmed"`` (any case).
    normalize_features : bool
        Rows of ``x`` scaled to sum to 1 (``row_normalize``), the usual GAT/GCN setup.
    sparse_features : bool
        ``x`` as a ``scipy.sparse`` CSR matrix (the same values): the GAT model's first
        layer then multiplies over the stored values only (Cora's are 1.3% of the matrix).

    Returns
    -------
    NodeDataset
        ``x`` (N, F) float64, ``y`` (N,) int64, public masks. Cora: N=2708,
        E=10556, F=1433, 7 classes, 140/500/1000; CiteSeer: 3327, 9104, 3703,
        6, 120/500/1000; PubMed: 19717, 88648, 500, 3, 60/500/1000.

    Raises
    ------
    FileNotFoundError
        A file is missing (named in the message, with the folder searched and where the
        Planetoid files are published).
    ValueError
        A file's content is malformed (see the module docstring), named in the message.
    UnsafePickleError
        A pickle names a global outside the allow-list (``refimpl.data._unpickle``).
    """
    key = name.lower()
    if key not in PLANETOID_NAMES:
        raise ValueError(f"unknown Planetoid dataset {name!r}; choose from {PLANETOID_NAMES}")
    folder = _planetoid_dir(root, key)
    _check_files(folder, key, _PARTS)
    x, tx, allx = (_load_csr(folder, key, p) for p in ("x", "tx", "allx"))
    y, ty, ally = (_load_onehot(folder, key, p) for p in ("y", "ty", "ally"))
    graph_dict = _load(folder, key, "graph", dict)
    _check_sizes(folder, key, {"x": x, "tx": tx, "allx": allx, "y": y, "ty": ty, "ally": ally})
    # x/y are the first rows of allx/ally (the training nodes); a mismatch means
    # files from different datasets or versions.
    if (allx[: x.shape[0]] != x).nnz or not np.array_equal(ally[: y.shape[0]], y):
        raise ValueError(f"{folder}: ind.{key}.x/y are not the first rows of allx/ally")
    first = allx.shape[0]
    # F1 file order. The ids follow allx's rows: tx's rows, and for CiteSeer (step 2) up to
    # the graph dict's last node (it has a key per node, isolated ones included), which
    # bounds the zero padding.
    limit = len(graph_dict) if key == "citeseer" else first + tx.shape[0]
    test_idx = _read_test_index(folder, key, first, tx.shape[0], limit)
    test_sorted = np.sort(test_idx)

    tx_dense = tx.toarray()  # (1000, F)
    if key == "citeseer":  # F2 pad the isolated test-range ids with zero rows
        # tkipf/PyG span min..max of the ids; from allx's last row instead, the same for the
        # real file (its ids start there) and never misaligned for one whose ids do not
        span = int(test_sorted[-1]) - first + 1
        tx_ext = np.zeros((span, tx_dense.shape[1]), dtype=tx_dense.dtype)
        tx_ext[test_sorted - first] = tx_dense
        ty_ext = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        ty_ext[test_sorted - first] = ty
        tx_dense, ty = tx_ext, ty_ext

    features = np.vstack([allx.toarray(), tx_dense]).astype(np.float64)  # F3 (N, F)
    features[test_idx] = features[test_sorted]
    onehot = np.vstack([ally, ty])  # (N, C)
    onehot[test_idx] = onehot[test_sorted]
    labels = onehot.argmax(axis=1).astype(np.int64)  # (N,)
    n = features.shape[0]

    graph_file = str(folder / f"ind.{key}.graph")
    edge_index = planetoid_edge_index(graph_dict, n, source=graph_file)  # F4

    train = np.zeros(n, dtype=bool)  # F5 public split
    train[: y.shape[0]] = True
    val = np.zeros(n, dtype=bool)
    val[y.shape[0] : y.shape[0] + _NUM_VAL] = True
    test = np.zeros(n, dtype=bool)
    test[test_sorted] = True
    if normalize_features:
        features = row_normalize(features)
    if sparse_features:
        features = sp.csr_matrix(features)
    return NodeDataset(
        name=key,
        graph=Graph(edge_index, n),
        x=features,
        y=labels,
        train_mask=train,
        val_mask=val,
        test_mask=test,
        num_classes=int(onehot.shape[1]),
    )
