"""Geom-GCN heterophilous node-classification sets with their 10 standard splits.

Sources (the user guide's Data page): ``new_data/<name>/`` raw TSV files and
``splits/<name>_split_0.6_0.2_<i>.npz`` from graphdml-uiuc-jlu/geom-gcn (Pei et
al., ICLR 2020); ``platonov2023/*.npz`` from yandex-research/heterophilous-graphs
(Platonov et al., ICLR 2023) for chameleon and squirrel (its npz edges and masks
equal the Geom-GCN ones) and for their de-duplicated ``*_filtered`` versions.

Edge convention: ``edges="symmetric"`` (default) symmetrises, deduplicates and
drops self-loops, as for Planetoid (cornell 554, texas 558, wisconsin 900, film
53,318, chameleon 62,742, squirrel 396,706 directed edges). ``edges="as_in_file"``
is PyG's ``WebKB`` / ``Actor`` / ``WikipediaNetwork``: the file's directed edges,
deduplicated, self-loops kept, not symmetrised (298 / 325 / 515 / 30,019 /
36,101 / 217,073).

Caveat: cornell's and texas's ``out1_node_feature_label.txt`` are byte-identical
upstream; their edge files differ. That is the data PyG's
``WebKB`` and most papers use, so it is loaded as is: cornell and texas share
``x`` and ``y``.

Every file is checked before use, one ``ValueError`` naming the file and what is wrong: each
data line has exactly its fields, node ids are ``0..N-1`` once each, labels integer class ids
in ``0..4``, feature values finite (film's indices in ``0..931``), edges integer pairs of node
ids, masks ``(N,)`` of bools or 0/1 integers. A text file must start with its header line
(``node_id<TAB>feature<TAB>label``, ``node_id<TAB>node_id``: a file without it would lose its
first line) and hold at least one node or edge; a message about a value names its line.
``.npz`` files go through :func:`refimpl.files.read_npz` (plain arrays, no allocation on a
forged header; at most 1 GiB of arrays, 20 times the largest published file's) and must hold
the keys named here, ``edges`` at least one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from refimpl.data.dataset import RESTORE, NodeDataset, coalesce, parse_ints, row_normalize
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
# what an archive's arrays may hold: 20 times the largest published one's (squirrel.npz, 47 MB)
_MAX_NPZ_BYTES = 2**30


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
    lines, fields = _data_lines(path, ("node_id", "feature", "label"), "nodes")
    n = len(fields)
    ids = parse_ints(path, lines, "node_id", [f[0] for f in fields])
    _check_node_ids(path, lines, ids)
    file_labels = parse_ints(path, lines, "label", [f[2] for f in fields])
    _check_labels(path, file_labels, lines)
    labels = np.empty(n, dtype=np.int64)
    labels[ids] = file_labels
    if name == "film":
        texts = [f[1].split(",") if f[1] else [] for f in fields]
        owner = np.repeat(np.arange(n), [len(t) for t in texts])  # (entries,) row of each
        where = [lines[i] for i in owner]
        cols = parse_ints(path, where, "feature index", [t for row in texts for t in row])
        _check_range(path, where, "feature index", cols, _FILM_DIM)
        x = np.zeros((n, _FILM_DIM))
        x[ids[owner], cols] = 1.0
    else:
        rows = [_dense_vector(path, line, f[1]) for line, f in zip(lines, fields, strict=True)]
        odd = [i for i, row in enumerate(rows) if row.size != rows[0].size]
        if odd:
            raise ValueError(
                f"{path}, line {lines[odd[0]]}: the feature vector has {rows[odd[0]].size} "
                f"values, where line {lines[0]}'s has {rows[0].size}; {RESTORE}"
            )
        x = np.empty((n, rows[0].size))
        x[ids] = np.stack(rows)  # (N, F)
    return x, labels


def _dense_vector(path: Path, line: int, vector: str) -> np.ndarray:
    """A WebKB row's comma-separated feature vector, finite numbers, as float64."""
    try:
        row = np.array(vector.split(","), dtype=np.float64)  # one C-level parse of the line
    except ValueError:
        raise ValueError(
            f"{path}, line {line}: the feature vector {vector[:40]!r} is not comma-separated "
            f"numbers; {RESTORE}"
        ) from None
    if not np.isfinite(row).all():
        raise ValueError(
            f"{path}, line {line}: the feature vector holds NaN or infinity; {RESTORE}"
        )
    return row


def _data_lines(
    path: Path, columns: tuple[str, ...], what: str
) -> tuple[list[int], list[list[str]]]:
    """The line numbers and tab-separated fields of every non-blank line after the header.

    The header (line 1) must name ``columns`` (film's says ``feature(feature_amount:931)``:
    each name is a prefix), so a file without one does not lose its first line; every data
    line must have exactly ``columns`` fields; a file of no data lines holds no ``what``.
    """
    try:
        text = _require(path).read_text()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a text file ({err}); {RESTORE}") from err
    if not text.strip():
        raise ValueError(f"{path} is empty: no header line, no {what}; {RESTORE}")
    rows = text.split("\n")  # not splitlines: a form feed or U+2028 does not end a line here
    header = rows[0].rstrip("\r").split("\t")
    if len(header) != len(columns) or not all(map(str.startswith, header, columns)):
        expected = "<TAB>".join(columns)
        raise ValueError(
            f"{path}, line 1: {rows[0][:60]!r} is not the header {expected}; {RESTORE}"
        )
    lines, fields = [], []
    for number, line in enumerate(rows[1:], start=2):
        if line.strip():
            row = line.split("\t")
            if len(row) != len(columns):
                raise ValueError(
                    f"{path}, line {number}: {len(row)} tab-separated fields, expected "
                    f"{len(columns)} ({', '.join(columns)}); {RESTORE}"
                )
            lines.append(number)
            fields.append(row)
    if not fields:
        raise ValueError(f"{path}: no {what} after the header line; {RESTORE}")
    return lines, fields


def _check_node_ids(path: Path, lines: list[int], ids: np.ndarray) -> None:
    """``ids`` are ``0..N-1``, each once; else name the line of the first outside or repeat."""
    n = ids.size
    outside = np.flatnonzero((ids < 0) | (ids >= n))
    if outside.size:
        raise ValueError(
            f"{path}, line {lines[outside[0]]}: node id {ids[outside[0]]} is outside 0..{n - 1} "
            f"(one line per node); {RESTORE}"
        )
    _, first = np.unique(ids, return_index=True)
    if first.size < n:
        repeat = int(np.setdiff1d(np.arange(n), first)[0])
        raise ValueError(
            f"{path}, line {lines[repeat]}: node id {ids[repeat]} appears a second time; {RESTORE}"
        )


def _check_range(path: Path, lines: list[int], what: str, values: np.ndarray, n: int) -> None:
    """Every ``values[i]`` (read from line ``lines[i]``) lies in ``0..n-1``."""
    outside = np.flatnonzero((values < 0) | (values >= n))
    if outside.size:
        at = outside[0]
        raise ValueError(
            f"{path}, line {lines[at]}: {what} {values[at]} is outside 0..{n - 1}; {RESTORE}"
        )


def _check_labels(path: Path, labels: np.ndarray, lines: list[int] | None = None) -> None:
    """Integer class ids in ``0..4``; ``lines[i]`` (when given) is where ``labels[i]`` was
    read."""
    if labels.dtype.kind not in "iu":
        raise ValueError(f"{path}: labels must be integer class ids, got {labels.dtype}; {RESTORE}")
    bad = np.flatnonzero((labels < 0) | (labels >= _NUM_CLASSES))
    if bad.size and lines:
        raise ValueError(
            f"{path}, line {lines[bad[0]]}: label {labels[bad[0]]} is not a class id "
            f"0..{_NUM_CLASSES - 1}; {RESTORE}"
        )
    if bad.size:
        raise ValueError(
            f"{path}: labels must be class ids 0..{_NUM_CLASSES - 1}, got range "
            f"{labels.min()}..{labels.max()}; {RESTORE}"
        )


def _read_edge_file(path: Path, n: int) -> np.ndarray:
    """``(E, 2)`` int64 directed edges from ``out1_graph_edges.txt`` (header checked), each a
    line of two node ids in ``0..n-1``; a file of no edges is refused (the real ones have
    hundreds to hundreds of thousands)."""
    lines, fields = _data_lines(path, ("node_id", "node_id"), "edges")
    where = [line for line in lines for _ in range(2)]  # the line of each node id
    ids = parse_ints(path, where, "node id", [text for row in fields for text in row])
    _check_range(path, where, "node id", ids, n)
    return ids.reshape(-1, 2)  # (E, 2)


def _check_edges(path: Path, edges: np.ndarray, n: int) -> np.ndarray:
    """``edges`` (an archive's ``(E, 2)``) as int64 node ids in ``[0, n)``, at least one, or a
    ``ValueError``."""
    if edges.dtype.kind not in "iu" or edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(
            f"{path}: edges must be an (E, 2) integer array, got {edges.dtype} of shape "
            f"{edges.shape}; {RESTORE}"
        )
    if edges.size == 0:
        raise ValueError(f"{path}: edges holds no edge; {RESTORE}")
    if edges.min() < 0 or edges.max() >= n:
        raise ValueError(
            f"{path}: edges name nodes outside 0..{n - 1} (range {edges.min()}..{edges.max()})"
            f"; {RESTORE}"
        )
    return edges.astype(np.int64)


def _as_masks(path: Path, key: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as a bool array of ``shape``: bools, or integers that are all 0 or 1."""
    if value.dtype.kind not in "biu" or value.shape != shape:
        raise ValueError(
            f"{path}: {key} must be bools or 0/1 integers of shape {shape}, got {value.dtype} "
            f"of shape {value.shape}; {RESTORE}"
        )
    if value.dtype.kind != "b" and not np.isin(value, (0, 1)).all():
        raise ValueError(f"{path}: {key} holds values other than 0 and 1; {RESTORE}")
    return value.astype(bool)


def _read_npz(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays = read_npz(
        _require(path), ValueError, RESTORE, what="Geom-GCN file", max_bytes=_MAX_NPZ_BYTES
    )
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} array in the archive; {RESTORE}")
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
        raise ValueError(f"{path}: node_labels must be 1-D, got shape {y.shape}; {RESTORE}")
    _check_labels(path, y)
    n = y.shape[0]
    if x.dtype.kind != "f" or x.ndim != 2 or x.shape[0] != n:
        raise ValueError(
            f"{path}: node_features must be a float (N, F) array with N = {n} (one row per "
            f"label), got {x.dtype} of shape {x.shape}; {RESTORE}"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{path}: node_features hold NaN or infinity; {RESTORE}")
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
    name : str
        One of ``GEOM_GCN_NAMES`` (``"actor"`` is an alias of ``"film"``), any case.
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
