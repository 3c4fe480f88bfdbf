"""The Open Graph Benchmark's raw files of a graph-property dataset (``ogbg-moltox21`` and kin),
read without the ``ogb`` package (which downloads; refimpl never does).

Layout (as ``ogb.graphproppred.GraphPropPredDataset`` reads it: ``ogb/io/read_graph_raw.py``
``read_csv_graph_raw`` and ``ogb/graphproppred/dataset.py``, snap-stanford/ogb at 61e9784).
``G`` graphs, ``N`` nodes, ``M`` edges in all; every file is a gzip-compressed CSV without a
header::

    FOLDER/raw/edge.csv.gz            (M, 2) int: each edge once, node indices LOCAL to its graph
    FOLDER/raw/num-node-list.csv.gz   (G, 1) int: nodes of each graph, graphs in order
    FOLDER/raw/num-edge-list.csv.gz   (G, 1) int: edges of each graph (rows of edge.csv.gz)
    FOLDER/raw/node-feat.csv.gz       (N, F) node features (optional: F = 0 without it)
    FOLDER/raw/edge-feat.csv.gz       (M, B) edge features (optional: B = 0 without it)
    FOLDER/raw/graph-label.csv.gz     (G, T) labels; an empty cell is a missing label
    FOLDER/split/<split>/train.csv.gz (one column of graph indices; likewise valid, test)

(``mapping/`` beside ``raw/`` holds the SMILES and is not read.) Unzipping OGB's
``tox21.zip`` gives exactly this folder (``tox21/``), as does the ``ogb`` package's
``dataset/ogbg_moltox21/``.

Edges: OGB's molecule datasets store each bond once and its reader adds the reverse
(``add_inverse_edge=True`` in ``ogb/graphproppred/master.csv``), interleaved as
``(u, v), (v, u)`` with the feature row repeated; ``add_inverse_edge`` here does the same,
so the result matches ``GraphPropPredDataset`` edge for edge.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.data.graph_dataset import GraphDataset
from refimpl.data.pointers import _pointers

__all__ = ["load_ogb_graph_dataset"]

SPLIT_PARTS = ("train", "valid", "test")
REQUIRED = ("edge.csv.gz", "num-node-list.csv.gz", "num-edge-list.csv.gz", "graph-label.csv.gz")
LAYOUT_HINT = "see the layout in refimpl.data.ogb_graph (OGB's tox21.zip, unzipped)"


def load_ogb_graph_dataset(
    folder: str | os.PathLike,
    *,
    split: str = "scaffold",
    task: str | None = None,
    add_inverse_edge: bool = True,
) -> tuple[GraphDataset, GraphDataset, GraphDataset]:
    """The ``(train, valid, test)`` graphs of an OGB graph-property dataset in its raw layout.

    Parameters
    ----------
    folder : path
        The folder holding ``raw/`` and ``split/`` (the module docstring has the layout).
    split : str
        The folder under ``split/`` (OGB's molecule datasets ship ``scaffold``).
    task : ``"multilabel"``, ``"regression"`` or None
        None: ``"multilabel"`` when every label present is 0 or 1 (ogbg-moltox21, -molhiv,
        ...), else ``"regression"`` (ogbg-molesol, ...).
    add_inverse_edge : bool
        Add each edge's reverse, as OGB's reader does for every molecule dataset.

    Returns
    -------
    train, valid, test : GraphDataset
        Named ``<folder name>-train`` and so on; ``x`` (n, F) and ``edge_attr`` (e, B) are
        the files' values as float64 (OGB's integer category indices, which OGB's
        ``AtomEncoder`` and ``BondEncoder`` embed); ``y`` (g, T) with ``y_mask`` where
        cells are empty. Each split keeps the order of its file.

    Raises
    ------
    FileNotFoundError
        No such folder, or a required file missing (named).
    ValueError
        One line per problem, naming the file: wrong column count, an unreadable value,
        counts that do not add up, an edge index outside its graph, a split index outside
        ``[0, G)``, repeated or in two parts.
    """
    root = Path(folder)
    raw = _raw_folder(root)
    num_nodes = _read(raw / "num-node-list.csv.gz", np.int64, columns=1)[:, 0]  # (G,)
    num_edges = _read(raw / "num-edge-list.csv.gz", np.int64, columns=1)[:, 0]  # (G,)
    if num_nodes.shape != num_edges.shape:
        raise ValueError(
            f"{raw}: num-node-list.csv.gz has {num_nodes.shape[0]} graphs but "
            f"num-edge-list.csv.gz {num_edges.shape[0]}; both hold one row per graph"
        )
    for name, counts, least in (("num-node-list", num_nodes, 1), ("num-edge-list", num_edges, 0)):
        bad = np.flatnonzero(counts < least)
        if bad.size:
            raise ValueError(
                f"{raw / name}.csv.gz: line {bad[0] + 1} (graph {bad[0]}) is {counts[bad[0]]}; "
                f"each graph needs at least {least}"
            )
    edges = _read(raw / "edge.csv.gz", np.int64, columns=2)  # (M, 2)
    _check_rows(raw / "edge.csv.gz", edges, int(num_edges.sum()), "the sum of num-edge-list")
    node_feat = _features(raw / "node-feat.csv.gz", int(num_nodes.sum()), "num-node-list")
    edge_feat = _features(raw / "edge-feat.csv.gz", int(num_edges.sum()), "num-edge-list")
    _check_local(raw / "edge.csv.gz", edges, num_nodes, num_edges)
    labels = _read(raw / "graph-label.csv.gz", np.float64, columns=None, empty_is_nan=True)
    _check_rows(raw / "graph-label.csv.gz", labels, num_nodes.shape[0], "the number of graphs")
    task = _task(raw / "graph-label.csv.gz", labels, task)
    edge_index = edges.T  # (2, M)
    if add_inverse_edge:  # OGB's interleaving: (u, v), (v, u), each with the bond's features
        edge_index = np.repeat(edge_index, 2, axis=1)  # (2, 2M)
        edge_index[:, 1::2] = edge_index[::-1, 1::2].copy()
        edge_feat, num_edges = np.repeat(edge_feat, 2, axis=0), 2 * num_edges
    dataset = GraphDataset(
        name=root.resolve().name,
        x=node_feat,
        edge_index=np.ascontiguousarray(edge_index),
        edge_attr=edge_feat,
        node_ptr=_pointers(num_nodes),
        edge_ptr=_pointers(num_edges),
        y=labels,
        task=task,
    )
    parts = _splits(root / "split" / split, len(dataset))
    train, valid, test = (
        dataclasses.replace(dataset.subset(parts[key]), name=f"{dataset.name}-{key}")
        for key in SPLIT_PARTS
    )
    return train, valid, test


def _raw_folder(root: Path) -> Path:
    """``root/raw``, checked to hold the required files."""
    if not root.is_dir():
        raise FileNotFoundError(f"no folder at {root}; {LAYOUT_HINT}")
    raw = root / "raw"
    if not raw.is_dir():
        inside = sorted(p.name for p in root.iterdir() if (p / "raw").is_dir())
        where = f"; did you mean {root / inside[0]}?" if inside else ""
        raise FileNotFoundError(
            f"{root} has no raw/ folder: pass the folder that holds raw/ and split/{where} "
            f"({LAYOUT_HINT})"
        )
    for name in REQUIRED:
        if not (raw / name).is_file():
            raise FileNotFoundError(f"missing {raw / name}; {LAYOUT_HINT}")
    return raw


def _read(path: Path, dtype: Any, *, columns: int | None, empty_is_nan: bool = False) -> np.ndarray:
    """A headerless gzip CSV as a 2-D array of ``dtype`` with ``columns`` columns (any when
    None); an empty file is zero rows. ``empty_is_nan``: an empty cell reads as NaN."""
    converters = (lambda cell: float(cell) if cell.strip() else np.nan) if empty_is_nan else None
    try:
        with gzip.open(path, "rt", encoding="utf-8") as stream, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "loadtxt: input contained no data")
            values = np.loadtxt(stream, delimiter=",", dtype=dtype, ndmin=2, converters=converters)
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable gzip-compressed text file ({err})") from err
    except ValueError as err:  # numpy counts rows from 0 (after the first line: row 1)
        raise ValueError(f"{path}: {err} (numpy counts rows from 0)") from err
    if values.size == 0:
        return np.zeros((0, columns or 0), dtype=dtype)
    if columns is not None and values.shape[1] != columns:
        raise ValueError(
            f"{path}: {values.shape[1]} columns per line, expected {columns}; {LAYOUT_HINT}"
        )
    return values


def _features(path: Path, rows: int, counts: str) -> np.ndarray:
    """Optional feature file ``path`` as float64 (rows, F), or (rows, 0) without the file."""
    if not path.is_file():
        return np.zeros((rows, 0))
    values = _read(path, np.float64, columns=None)
    if values.shape[0] == 0 and rows == 0:
        return np.zeros((0, 0))
    _check_rows(path, values, rows, f"the sum of {counts}")
    if not np.isfinite(values).all():
        raise ValueError(f"{path}: holds NaN or infinity; features must be finite numbers")
    return values


def _check_rows(path: Path, values: np.ndarray, expected: int, what: str) -> None:
    if values.shape[0] != expected:
        raise ValueError(
            f"{path}: {values.shape[0]} lines, but {what} is {expected}; the files must "
            "describe the same graphs"
        )


def _check_local(path: Path, edges: np.ndarray, num_nodes: np.ndarray, num_edges: Any) -> None:
    """Every edge's two node indices in ``[0, n_i)`` of its graph ``i``."""
    owner = np.repeat(np.arange(num_nodes.shape[0]), num_edges)  # (M,) graph of each edge
    limit = num_nodes[owner][:, None]  # (M, 1)
    bad = np.flatnonzero(((edges < 0) | (edges >= limit)).any(axis=1))
    if bad.size:
        e = int(bad[0])
        g, n = int(owner[e]), int(num_nodes[owner[e]])
        raise ValueError(
            f"{path}: line {e + 1} joins nodes {edges[e].tolist()}, outside 0..{n - 1} of its "
            f"graph {g} ({n} nodes): OGB stores node indices local to each graph"
        )


def _task(path: Path, labels: np.ndarray, task: str | None) -> str:
    """The task: ``task``, or inferred from the labels (0/1 where present: multi-label)."""
    present = labels[~np.isnan(labels)]
    binary = bool(np.isin(present, (0, 1)).all())
    if task is None:
        return "multilabel" if binary else "regression"
    if task == "multilabel" and not binary:
        raise ValueError(f"{path}: task='multilabel' needs labels 0 or 1 (or empty cells)")
    return task


def _splits(folder: Path, num_graphs: int) -> dict[str, np.ndarray]:
    """The split files' graph indices, each in ``[0, G)``, none repeated or in two parts."""
    if not folder.is_dir():
        there = sorted(p.name for p in folder.parent.iterdir()) if folder.parent.is_dir() else []
        raise FileNotFoundError(
            f"no split folder {folder}; splits found: {there or 'none'} (pass split=...)"
        )
    parts, owner = {}, {}
    for key in SPLIT_PARTS:
        path = folder / f"{key}.csv.gz"
        if not path.is_file():
            raise FileNotFoundError(f"missing {path}; a split holds train, valid and test")
        indices = _read(path, np.int64, columns=1)[:, 0]
        outside = indices[(indices < 0) | (indices >= num_graphs)]
        if outside.size:
            raise ValueError(
                f"{path}: graph index {int(outside[0])} outside [0, {num_graphs}): the split "
                "belongs to another dataset?"
            )
        values, counts = np.unique(indices, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"{path}: graph {int(values[counts > 1][0])} listed twice")
        for other, seen in owner.items():
            both = np.intersect1d(seen, values)
            if both.size:
                raise ValueError(
                    f"{path}: graph {int(both[0])} is in both {other} and {key}; the parts of "
                    "a split must not overlap"
                )
        parts[key], owner[key] = indices, values
    return parts
