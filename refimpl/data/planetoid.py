"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from the ``ind.*`` pickles.

Preprocessing is tkipf/gcn ``load_data``, which PyG ``read_planetoid_data``
matches (datasets/README.md, "Standard preprocessing"):

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
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from refimpl.data._unpickle import load_restricted_pickle
from refimpl.data.dataset import NodeDataset, coalesce, row_normalize
from refimpl.graph import Graph

__all__ = ["PLANETOID_NAMES", "load_planetoid", "planetoid_edge_index"]

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")
_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
_NUM_VAL = 500  # Yang et al. 2016 / Kipf & Welling 2017 public split


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
        "that holds them (or its parent)"
    )


def _check_files(folder: Path, name: str, parts: tuple[str, ...]) -> None:
    names = [f"ind.{name}.{part}" for part in (*parts, "test.index")]
    missing = [f for f in names if not (folder / f).is_file()]
    if missing:
        hint = ""
        if f"ind.{name}.allx" in missing and name == "pubmed":
            hint = (
                " (the shared datasets copy lacks ind.pubmed.allx, git blob "
                "3b86bccf08111c37c632a9dd8ab63db25ea76361; see datasets/README.md, 'Gaps')"
            )
        raise FileNotFoundError(
            f"{name}: missing {', '.join(missing)} in {folder}{hint}; all 8 files "
            f"ind.{name}.{{x,y,tx,ty,allx,ally,graph,test.index}} are needed"
        )


def _load(folder: Path, name: str, part: str, kind: type) -> object:
    path = folder / f"ind.{name}.{part}"
    obj = load_restricted_pickle(path)
    if not isinstance(obj, kind):
        raise ValueError(f"{path}: expected a {kind.__name__}, got {type(obj).__name__}")
    return obj


def _read_test_index(folder: Path, name: str) -> np.ndarray:
    path = folder / f"ind.{name}.test.index"
    return np.loadtxt(path, dtype=np.int64, ndmin=1)  # (1000,) in file order (unsorted)


def planetoid_edge_index(graph_dict: dict, num_nodes: int) -> np.ndarray:
    """``(2, E)`` edge_index from the ``{node: [neighbours]}`` dict (step 4 above).

    One edge ``k -> j`` per list entry, then both directions, duplicates and
    self-loops removed, sorted by (dst, src) as PyG's ``edge_index_from_dict``
    (``sort_by_row=False``), so the edge order matches PyG's edge for edge.
    """
    keys = np.fromiter(graph_dict.keys(), dtype=np.int64, count=len(graph_dict))
    lists = [np.asarray(v, dtype=np.int64).ravel() for v in graph_dict.values()]
    lengths = np.array([len(v) for v in lists], dtype=np.int64)
    src = np.repeat(keys, lengths)  # (entries,)
    dst = np.concatenate(lists) if lists else np.zeros(0, np.int64)
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise ValueError(f"graph dict names nodes outside [0, {num_nodes})")
    return coalesce(src, dst, num_nodes, sort_by_row=False)


def load_planetoid(root: str | Path, name: str, normalize_features: bool = False) -> NodeDataset:
    """Cora, CiteSeer or PubMed with the public split (Yang et al. 2016).

    Parameters
    ----------
    root : path
        The folder holding ``ind.{name}.*``, or its parent with ``planetoid/``.
    name : ``"cora"``, ``"citeseer"`` or ``"pubmed"`` (any case).
    normalize_features : bool
        Rows of ``x`` scaled to sum to 1 (``row_normalize``), the usual GAT/GCN setup.

    Returns
    -------
    NodeDataset
        ``x`` (N, F) float64, ``y`` (N,) int64, public masks. Cora: N=2708,
        E=10556, F=1433, 7 classes, 140/500/1000; CiteSeer: 3327, 9104, 3703,
        6, 120/500/1000; PubMed: 19717, 88648, 500, 3, 60/500/1000.

    Raises
    ------
    FileNotFoundError
        A file is missing (named in the message; PubMed's ``allx`` is absent
        from the shared copy).
    UnsafePickleError
        A pickle names a global outside the allow-list (``refimpl.data._unpickle``).
    """
    key = name.lower()
    if key not in PLANETOID_NAMES:
        raise ValueError(f"unknown Planetoid dataset {name!r}; choose from {PLANETOID_NAMES}")
    folder = _planetoid_dir(root, key)
    _check_files(folder, key, _PARTS)
    x, tx, allx = (sp.csr_matrix(_load(folder, key, p, sp.spmatrix)) for p in ("x", "tx", "allx"))
    y, ty, ally = (np.asarray(_load(folder, key, p, np.ndarray)) for p in ("y", "ty", "ally"))
    graph_dict = _load(folder, key, "graph", dict)
    # x/y are the first rows of allx/ally (the training nodes); a mismatch means
    # files from different datasets or versions.
    if (allx[: x.shape[0]] != x).nnz or not np.array_equal(ally[: y.shape[0]], y):
        raise ValueError(f"{folder}: ind.{key}.x/y are not the first rows of allx/ally")
    test_idx = _read_test_index(folder, key)  # F1 file order
    test_sorted = np.sort(test_idx)

    tx_dense = tx.toarray()  # (1000, F)
    if key == "citeseer":  # F2 pad the isolated test-range ids with zero rows
        span = int(test_sorted[-1] - test_sorted[0] + 1)
        tx_ext = np.zeros((span, tx_dense.shape[1]), dtype=tx_dense.dtype)
        tx_ext[test_sorted - test_sorted[0]] = tx_dense
        ty_ext = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        ty_ext[test_sorted - test_sorted[0]] = ty
        tx_dense, ty = tx_ext, ty_ext

    features = np.vstack([allx.toarray(), tx_dense]).astype(np.float64)  # F3 (N, F)
    features[test_idx] = features[test_sorted]
    onehot = np.vstack([ally, ty])  # (N, C)
    onehot[test_idx] = onehot[test_sorted]
    labels = onehot.argmax(axis=1).astype(np.int64)  # (N,)
    n = features.shape[0]

    edge_index = planetoid_edge_index(graph_dict, n)  # F4

    train = np.zeros(n, dtype=bool)  # F5 public split
    train[: y.shape[0]] = True
    val = np.zeros(n, dtype=bool)
    val[y.shape[0] : y.shape[0] + _NUM_VAL] = True
    test = np.zeros(n, dtype=bool)
    test[test_sorted] = True
    if normalize_features:
        features = row_normalize(features)
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
