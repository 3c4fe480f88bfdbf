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

Every file is checked before use, one ``ValueError`` naming the file and what is wrong: each
data line has exactly its fields, node ids are ``0..N-1`` once each, labels integer class ids
in ``0..4``, feature values finite (film's indices in ``0..931``), edges integer pairs of node
ids, masks ``(N,)`` of bools or 0/1 integers; ``.npz`` files go through
:func:`refimpl.files.read_npz` (plain arrays, no allocation on a forged header) and must hold
the keys named here.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from refimpl.data.dataset import NodeDataset, coalesce, row_normalize
from refimpl.files import read_npz
from refimpl.graph import Graph

__all__ = ["GEOM_GCN_NAMES", "load_geom_gcn"]

_RAW = ("cornell", "texas", "wisconsin", "film")  # features in new_data/
_NPZ = ("chameleon", "squirrel")  # features in platonov2023/, splits in splits/
_FILTERED = ("chameleon_filtered", "squirrel_filtered")  # everything in platonov2023/
GEOM_GCN_NAMES = _RAW + _NPZ + _FILTERED
_ALIASES = {"actor": "film"}
_FILM_DIM = 932  # as PyG Actor; the file's header says feature_amount:931
_NUM_SPLITS = 10
_NUM_CLASSES = 5  # every Geom-GCN and Platonov et al. set here
_RESTORE = "restore the file from its source (check it against SHA256SUMS)"


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
    fields = _data_lines(path, ("node_id", "feature", "label"))
    n = len(fields)
    ids = _parse_ints(path, "node_id", [f[0] for f in fields])
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise ValueError(f"{path}: node ids are not 0..{n - 1}, each once; {_RESTORE}")
    labels = np.empty(n, dtype=np.int64)
    labels[ids] = _parse_ints(path, "label", [f[2] for f in fields])
    _check_labels(path, labels)
    if name == "film":
        lists = [
            _parse_ints(path, "feature index", f[1].split(",") if f[1] else []) for f in fields
        ]
        rows = np.repeat(ids, [len(v) for v in lists])
        cols = np.concatenate(lists)
        if cols.size and (cols.min() < 0 or cols.max() >= _FILM_DIM):
            raise ValueError(
                f"{path}: feature indices must lie in 0..{_FILM_DIM - 1}, got range "
                f"{cols.min()}..{cols.max()}; {_RESTORE}"
            )
        x = np.zeros((n, _FILM_DIM))
        x[rows, cols] = 1.0
    else:  # one C-level parse of the dense vectors (a Python float() per entry is slow)
        try:
            dense = np.loadtxt(io.StringIO("\n".join(f[1] for f in fields)), delimiter=",", ndmin=2)
        except ValueError as err:  # a non-number, or rows of different lengths
            raise ValueError(f"{path}: feature vectors are malformed ({err}); {_RESTORE}") from err
        if not np.isfinite(dense).all():
            raise ValueError(f"{path}: feature vectors hold NaN or infinity; {_RESTORE}")
        x = np.empty_like(dense)
        x[ids] = dense  # (N, F)
    return x, labels


def _data_lines(path: Path, columns: tuple[str, ...]) -> list[list[str]]:
    """The tab-separated fields of every non-blank line after the header, each line checked
    to have exactly ``columns`` (an extra or a missing field is a malformed file)."""
    try:
        lines = _require(path).read_text().splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a text file ({err}); {_RESTORE}") from err
    fields = []
    for number, line in enumerate(lines[1:], start=2):  # line 1: the header
        if line.strip():
            row = line.split("\t")
            if len(row) != len(columns):
                raise ValueError(
                    f"{path}, line {number}: {len(row)} tab-separated fields, expected "
                    f"{len(columns)} ({', '.join(columns)}); {_RESTORE}"
                )
            fields.append(row)
    return fields


def _parse_ints(path: Path, what: str, texts: list[str]) -> np.ndarray:
    """``texts`` as int64; a float, an exponent or a word is an error naming ``what``."""
    try:
        return np.array(texts, dtype=np.int64)
    except (ValueError, OverflowError) as err:  # "1.0", "1e8", "x", or beyond int64
        raise ValueError(f"{path}: every {what} must be an integer ({err}); {_RESTORE}") from err


def _check_labels(path: Path, labels: np.ndarray) -> None:
    if labels.dtype.kind not in "iu":
        raise ValueError(
            f"{path}: labels must be integer class ids, got {labels.dtype}; {_RESTORE}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= _NUM_CLASSES):
        raise ValueError(
            f"{path}: labels must be class ids 0..{_NUM_CLASSES - 1}, got range "
            f"{labels.min()}..{labels.max()}; {_RESTORE}"
        )


def _read_edge_file(path: Path, n: int) -> np.ndarray:
    """``(E, 2)`` int64 directed edges from ``out1_graph_edges.txt`` (header skipped)."""
    try:  # one C-level parse (squirrel has 217,073 lines)
        edges = np.loadtxt(_require(path), dtype=np.int64, skiprows=1, ndmin=2)
    except ValueError as err:  # a non-integer, or a line with another number of fields
        raise ValueError(f"{path}: not two integer node ids per line ({err}); {_RESTORE}") from err
    return _check_edges(path, edges.reshape(0, 2) if edges.size == 0 else edges, n)


def _check_edges(path: Path, edges: np.ndarray, n: int) -> np.ndarray:
    """``edges`` as int64 ``(E, 2)`` node ids in ``[0, n)``, or a ``ValueError``."""
    if edges.dtype.kind not in "iu" or edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(
            f"{path}: edges must be an (E, 2) integer array, got {edges.dtype} of shape "
            f"{edges.shape}; {_RESTORE}"
        )
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise ValueError(
            f"{path}: edges name nodes outside 0..{n - 1} (range {edges.min()}..{edges.max()})"
            f"; {_RESTORE}"
        )
    return edges.astype(np.int64)


def _as_masks(path: Path, key: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as a bool array of ``shape``: bools, or integers that are all 0 or 1."""
    if value.dtype.kind not in "biu" or value.shape != shape:
        raise ValueError(
            f"{path}: {key} must be bools or 0/1 integers of shape {shape}, got {value.dtype} "
            f"of shape {value.shape}; {_RESTORE}"
        )
    if value.dtype.kind != "b" and not np.isin(value, (0, 1)).all():
        raise ValueError(f"{path}: {key} holds values other than 0 and 1; {_RESTORE}")
    return value.astype(bool)


def _read_npz(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays = read_npz(_require(path), ValueError, _RESTORE, what="Geom-GCN file")
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} array in the archive; {_RESTORE}")
    return arrays


def _split_masks(folder: Path, name: str, split: int, n: int) -> tuple[np.ndarray, ...]:
    path = folder / "splits" / f"{name}_split_0.6_0.2_{split}.npz"
    keys = ("train_mask", "val_mask", "test_mask")
    arrays = _read_npz(path, keys)
    return tuple(_as_masks(path, key, arrays[key], (n,)) for key in keys)


def _read_platonov(path: Path, split: int) -> tuple[np.ndarray, ...]:
    """``x``, ``y``, ``(E, 2)`` edges and split ``split``'s three masks of a Platonov et al.
    ``.npz``."""
    masks = ("train_masks", "val_masks", "test_masks")
    arrays = _read_npz(path, ("node_features", "node_labels", "edges", *masks))
    x, y = arrays["node_features"], arrays["node_labels"]
    if y.ndim != 1:
        raise ValueError(f"{path}: node_labels must be 1-D, got shape {y.shape}; {_RESTORE}")
    _check_labels(path, y)
    n = y.shape[0]
    if x.dtype.kind != "f" or x.ndim != 2 or x.shape[0] != n:
        raise ValueError(
            f"{path}: node_features must be a float (N, F) array with N = {n} (one row per "
            f"label), got {x.dtype} of shape {x.shape}; {_RESTORE}"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{path}: node_features hold NaN or infinity; {_RESTORE}")
    edges = _check_edges(path, arrays["edges"], n)  # each undirected edge once
    split_masks = (_as_masks(path, key, arrays[key], (_NUM_SPLITS, n))[split] for key in masks)
    return (x.astype(np.float64), y.astype(np.int64), edges, *split_masks)


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
        edge_list = _read_edge_file(raw / "out1_graph_edges.txt", len(y))  # (E, 2)
        masks = _split_masks(folder, key, split, len(y))
    else:
        x, y, edge_list, *npz_masks = _read_platonov(folder / "platonov2023" / f"{key}.npz", split)
        masks = tuple(npz_masks)
        if key in _NPZ:
            masks = _split_masks(folder, key, split, len(y))
            if edges == "as_in_file":
                edge_list = _read_edge_file(raw / "out1_graph_edges.txt", len(y))
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
