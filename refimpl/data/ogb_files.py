"""The Open Graph Benchmark's raw files, read and checked: what the graph-property reader
(:mod:`refimpl.data.ogb_graph`) and the node-property reader (:mod:`refimpl.data.ogb_node`)
share.

Every OGB raw file is a gzip-compressed CSV without a header (``ogb/io/read_graph_raw.py``
reads them with ``pandas.read_csv(..., header=None)``). A bad file is one ``ValueError`` (a
missing one a ``FileNotFoundError``) naming the file, and its line where one is at fault;
``hint`` in each function is the sentence that tells the user where the layout is described.
"""

from __future__ import annotations

import gzip
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SPLIT_PARTS",
    "add_inverse_edges",
    "check_local",
    "check_rows",
    "raw_folder",
    "read_counts",
    "read_csv",
    "read_features",
    "read_split",
]

SPLIT_PARTS = ("train", "valid", "test")


def raw_folder(
    root: Path, required: tuple[str, ...], hint: str, other_layout: tuple[str, str]
) -> Path:
    """``root/raw``, checked to hold the ``required`` files. ``other_layout`` is
    ``(file, advice)``: a folder lacking a required file but holding ``raw/<file>`` is in the
    other OGB layout, and the error gives ``advice`` (the command that reads it)."""
    if not root.is_dir():
        raise FileNotFoundError(f"no folder at {root}; {hint}")
    raw = root / "raw"
    if not raw.is_dir():
        inside = sorted(p.name for p in root.iterdir() if (p / "raw").is_dir())
        where = f"; did you mean {root / inside[0]}?" if inside else ""
        raise FileNotFoundError(
            f"{root} has no raw/ folder: pass the folder that holds raw/ and split/{where} ({hint})"
        )
    marker, advice = other_layout
    for name in required:
        if not (raw / name).is_file():
            if (raw / marker).is_file():
                raise FileNotFoundError(f"{root} holds raw/{marker}, not raw/{name}: {advice}")
            raise FileNotFoundError(f"missing {raw / name}; {hint}")
    return raw


def read_csv(
    path: Path, dtype: Any, *, columns: int | None, hint: str, empty_is_nan: bool = False
) -> np.ndarray:
    """A headerless gzip CSV as a 2-D array of ``dtype`` with ``columns`` columns (any when
    None); an empty file is zero rows. ``empty_is_nan``: an empty cell reads as NaN (a
    missing label, as ``pandas.read_csv`` reads it)."""
    converters = (lambda cell: float(cell) if cell.strip() else np.nan) if empty_is_nan else None
    try:
        with gzip.open(path, "rt", encoding="utf-8") as stream, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "loadtxt: input contained no data")
            values = np.loadtxt(stream, delimiter=",", dtype=dtype, ndmin=2, converters=converters)
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable gzip-compressed text file ({err})") from err
    except ValueError as err:
        raise ValueError(f"{path}: {_numpy_reason(err)}") from err
    if values.size == 0:
        return np.zeros((0, columns or 0), dtype=dtype)
    if columns is not None and values.shape[1] != columns:
        raise ValueError(f"{path}: {values.shape[1]} columns per line, expected {columns}; {hint}")
    return values


def _numpy_reason(err: ValueError) -> str:
    """``numpy.loadtxt``'s message with its rows as the file's line numbers: it counts rows
    from 0 in "could not convert ... at row R, column C" but from 1 in "the number of columns
    changed ... at row R" (NumPy 2.x); its advice on ``usecols`` is for its own callers."""
    reason = str(err).split("; use `usecols`")[0]
    reason = re.sub(r"at row (\d+), column", lambda m: f"on line {int(m[1]) + 1}, column", reason)
    return re.sub(r"at row (\d+)$", r"on line \1", reason)


def read_counts(raw: Path, hint: str) -> tuple[np.ndarray, np.ndarray]:
    """``num-node-list`` and ``num-edge-list``: ``(G,)`` int64 each, one row per graph, at
    least one node and no negative edge count per graph."""
    num_nodes = read_csv(raw / "num-node-list.csv.gz", np.int64, columns=1, hint=hint)[:, 0]
    num_edges = read_csv(raw / "num-edge-list.csv.gz", np.int64, columns=1, hint=hint)[:, 0]
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
    return num_nodes, num_edges


def read_features(path: Path, rows: int, counts: str, hint: str) -> np.ndarray:
    """Optional feature file ``path`` as float64 (rows, F), or (rows, 0) without the file."""
    if not path.is_file():
        return np.zeros((rows, 0))
    values = read_csv(path, np.float64, columns=None, hint=hint)
    if values.shape[0] == 0 and rows == 0:
        return np.zeros((0, 0))
    check_rows(path, values, rows, f"the sum of {counts}")
    if not np.isfinite(values).all():
        raise ValueError(f"{path}: holds NaN or infinity; features must be finite numbers")
    return values


def check_rows(path: Path, values: np.ndarray, expected: int, what: str) -> None:
    """``values`` has ``expected`` rows (``what`` says where that number comes from)."""
    if values.shape[0] != expected:
        raise ValueError(
            f"{path}: {values.shape[0]} lines, but {what} is {expected}; the files must "
            "describe the same graphs"
        )


def check_local(path: Path, edges: np.ndarray, num_nodes: np.ndarray, num_edges: Any) -> None:
    """Every edge's two node indices (``edges`` (M, 2)) in ``[0, n_i)`` of its graph ``i``."""
    owner = np.repeat(np.arange(num_nodes.shape[0]), num_edges)  # (M,) graph of each edge
    limit = num_nodes[owner][:, None]  # (M, 1)
    bad = np.flatnonzero(((edges < 0) | (edges >= limit)).any(axis=1))
    if bad.size:
        e = int(bad[0])
        g, n = int(owner[e]), int(num_nodes[owner[e]])
        local = ": OGB stores node indices local to each graph" if num_nodes.shape[0] > 1 else ""
        raise ValueError(
            f"{path}: line {e + 1} joins nodes {edges[e].tolist()}, outside 0..{n - 1} of its "
            f"graph {g} ({n} nodes){local}"
        )


def add_inverse_edges(edges: np.ndarray, edge_feat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OGB's ``add_inverse_edge``: ``edges`` (M, 2) as ``edge_index`` (2, 2M) interleaved
    ``(u, v), (v, u)``, each with the edge's feature row (``edge_feat`` (M, B) -> (2M, B)),
    as ``read_csv_graph_raw`` builds it."""
    edge_index = np.repeat(edges.T, 2, axis=1)  # (2, 2M)
    edge_index[:, 1::2] = edge_index[::-1, 1::2].copy()
    return edge_index, np.repeat(edge_feat, 2, axis=0)


def read_split(folder: Path, count: int, item: str, hint: str) -> dict[str, np.ndarray]:
    """The split files' indices of ``item`` (``"graph"`` or ``"node"``), each in
    ``[0, count)``, none repeated or in two parts."""
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
        indices = read_csv(path, np.int64, columns=1, hint=hint)[:, 0]
        outside = indices[(indices < 0) | (indices >= count)]
        if outside.size:
            raise ValueError(
                f"{path}: {item} index {int(outside[0])} outside [0, {count}): the split "
                "belongs to another dataset?"
            )
        values, counts = np.unique(indices, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"{path}: {item} {int(values[counts > 1][0])} listed twice")
        for other, seen in owner.items():
            both = np.intersect1d(seen, values)
            if both.size:
                raise ValueError(
                    f"{path}: {item} {int(both[0])} is in both {other} and {key}; the parts of "
                    "a split must not overlap"
                )
        parts[key], owner[key] = indices, values
    return parts
