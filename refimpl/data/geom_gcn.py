"""Geom-GCN heterophilous node-classification sets with their 10 standard splits.

Sources (datasets/README.md, section 2): ``new_data/<name>/`` raw TSV files and
``splits/<name>_split_0.6_0.2_<i>.npz`` from graphdml-uiuc-jlu/geom-gcn (Pei et
al., ICLR 2020); ``platonov2023/*.npz`` from yandex-research/heterophilous-graphs
(Platonov et al., ICLR 2023) for chameleon and squirrel, whose Geom-GCN feature
files are missing from the shared copy (the npz edges and masks equal the
Geom-GCN ones), and for their de-duplicated ``*_filtered`` versions.

Edge convention: ``edges="symmetric"`` (default) symmetrises, deduplicates and
drops self-loops, as for Planetoid (cornell 554, texas 558, wisconsin 900, film
53,318, chameleon 62,742, squirrel 396,706 directed edges). ``edges="as_in_file"``
is PyG's ``WebKB`` / ``Actor`` / ``WikipediaNetwork``: the file's directed edges,
deduplicated, self-loops kept, not symmetrised (298 / 325 / 515 / 30,019 /
36,101 / 217,073).

Caveat: cornell's and texas's ``out1_node_feature_label.txt`` are byte-identical
upstream (same git blob); their edge files differ. That is the data PyG's
``WebKB`` and most papers use, so it is loaded as is: cornell and texas share
``x`` and ``y``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from refimpl.data.dataset import NodeDataset, coalesce, row_normalize
from refimpl.graph import Graph

__all__ = ["GEOM_GCN_NAMES", "load_geom_gcn"]

_RAW = ("cornell", "texas", "wisconsin", "film")  # features in new_data/
_NPZ = ("chameleon", "squirrel")  # features in platonov2023/, splits in splits/
_FILTERED = ("chameleon_filtered", "squirrel_filtered")  # everything in platonov2023/
GEOM_GCN_NAMES = _RAW + _NPZ + _FILTERED
_ALIASES = {"actor": "film"}
_FILM_DIM = 932  # as PyG Actor; the file's header says feature_amount:931
_NUM_SPLITS = 10


def _geom_gcn_dir(root: str | Path) -> Path:
    """``root`` itself if it holds ``new_data``/``platonov2023``, else ``root/geom_gcn``."""
    root = Path(root)
    for candidate in (root, root / "geom_gcn"):
        if (candidate / "new_data").is_dir() or (candidate / "platonov2023").is_dir():
            return candidate
    raise FileNotFoundError(
        f"no Geom-GCN data (new_data/ or platonov2023/) in {root} or {root / 'geom_gcn'}; pass "
        "the folder that holds them (or its parent)"
    )


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"missing {path.name} (looked for {path})")
    return path


def _read_features_labels(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (N, F) float64 and ``y`` (N,) int64 from ``out1_node_feature_label.txt``.

    Rows are placed by their ``node_id`` (the file is not in id order). WebKB rows
    carry a dense comma-separated 0/1 vector; film rows the active feature indices.
    """
    lines = _require(path).read_text().splitlines()[1:]  # skip the header
    fields = [line.split("\t") for line in lines if line.strip()]
    ids = np.array([int(f[0]) for f in fields], dtype=np.int64)
    n = len(fields)
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise ValueError(f"{path}: node ids are not 0..{n - 1}")
    labels = np.empty(n, dtype=np.int64)
    labels[ids] = [int(f[2]) for f in fields]
    if name == "film":
        lists = [
            np.array(f[1].split(","), dtype=np.int64) if f[1] else np.zeros(0, np.int64)
            for f in fields
        ]
        rows = np.repeat(ids, [len(v) for v in lists])
        cols = np.concatenate(lists)
        if cols.size and cols.max() >= _FILM_DIM:
            raise ValueError(f"{path}: feature index {cols.max()} >= {_FILM_DIM}")
        x = np.zeros((n, _FILM_DIM))
        x[rows, cols] = 1.0
    else:  # one C-level parse of the dense vectors (a Python float() per entry is slow)
        dense = np.loadtxt(io.StringIO("\n".join(f[1] for f in fields)), delimiter=",", ndmin=2)
        x = np.empty_like(dense)
        x[ids] = dense  # (N, F)
    return x, labels


def _read_edge_file(path: Path) -> np.ndarray:
    """``(E, 2)`` int64 directed edges from ``out1_graph_edges.txt`` (header skipped)."""
    return np.loadtxt(_require(path), dtype=np.int64, skiprows=1, ndmin=2)


def _split_masks(folder: Path, name: str, split: int, n: int) -> tuple[np.ndarray, ...]:
    path = _require(folder / "splits" / f"{name}_split_0.6_0.2_{split}.npz")
    with np.load(path) as f:
        masks = tuple(f[k].astype(bool) for k in ("train_mask", "val_mask", "test_mask"))
    if any(m.shape != (n,) for m in masks):
        raise ValueError(f"{path}: masks have shape {masks[0].shape}, expected ({n},)")
    return masks


def load_geom_gcn(
    root: str | Path,
    name: str,
    split: int = 0,
    *,
    edges: str = "symmetric",
    normalize_features: bool = False,
) -> NodeDataset:
    """A Geom-GCN heterophilous dataset with standard split ``split`` (0..9).

    Parameters
    ----------
    root : path
        The ``geom_gcn`` folder (holding ``new_data/``, ``splits/``,
        ``platonov2023/``) or its parent.
    name : one of ``GEOM_GCN_NAMES`` (``"actor"`` is an alias of ``"film"``), any case.
    split : int
        Which of the 10 splits (Geom-GCN's 60/20/20 files, in fact about 48/32/20 %;
        Platonov et al.'s own 10 splits for ``*_filtered``).
    edges : ``"symmetric"`` or ``"as_in_file"``
        See the module docstring.
    normalize_features : bool
        Rows of ``x`` scaled to sum to 1 (``row_normalize``).

    Returns
    -------
    NodeDataset
        ``x`` (N, F) float64, ``y`` (N,) int64 (5 classes for all of them).
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in GEOM_GCN_NAMES:
        raise ValueError(
            f"unknown Geom-GCN dataset {name!r}; choose from {GEOM_GCN_NAMES} (or 'actor')"
        )
    if (
        isinstance(split, bool)
        or not isinstance(split, (int, np.integer))
        or not (0 <= split < _NUM_SPLITS)
    ):
        raise ValueError(f"split must be an int in 0..{_NUM_SPLITS - 1}, got {split!r}")
    if edges not in ("symmetric", "as_in_file"):
        raise ValueError(f"edges must be 'symmetric' or 'as_in_file', got {edges!r}")
    folder = _geom_gcn_dir(root)
    raw = folder / "new_data" / key

    if key in _RAW:
        x, y = _read_features_labels(raw / "out1_node_feature_label.txt", key)
        edge_list = _read_edge_file(raw / "out1_graph_edges.txt")  # (E, 2)
        masks = _split_masks(folder, key, split, len(y))
    else:
        with np.load(_require(folder / "platonov2023" / f"{key}.npz")) as f:
            x = f["node_features"].astype(np.float64)
            y = f["node_labels"].astype(np.int64)
            edge_list = f["edges"].astype(np.int64)  # (E, 2), each undirected edge once
            npz_masks = tuple(
                f[k][split].astype(bool) for k in ("train_masks", "val_masks", "test_masks")
            )
        if key in _NPZ:
            masks = _split_masks(folder, key, split, len(y))
            if edges == "as_in_file":
                edge_list = _read_edge_file(raw / "out1_graph_edges.txt")
        else:
            masks = npz_masks
    n = len(y)
    symmetric = edges == "symmetric"
    edge_index = coalesce(
        edge_list[:, 0], edge_list[:, 1], n, symmetric=symmetric, remove_self_loops=symmetric
    )
    if normalize_features:
        x = row_normalize(x)
    return NodeDataset(
        name=key,
        graph=Graph(edge_index, n),
        x=x,
        y=y,
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=int(y.max()) + 1,
    )
