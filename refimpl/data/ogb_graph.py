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
import os
from pathlib import Path

import numpy as np

from refimpl.data.graph_dataset import GraphDataset
from refimpl.data.ogb_files import (
    SPLIT_PARTS,
    add_inverse_edges,
    check_local,
    check_rows,
    raw_folder,
    read_counts,
    read_csv,
    read_features,
    read_split,
)
from refimpl.data.pointers import _pointers

__all__ = ["load_ogb_graph_dataset"]

REQUIRED = ("edge.csv.gz", "num-node-list.csv.gz", "num-edge-list.csv.gz", "graph-label.csv.gz")
LAYOUT_HINT = "see the layout in refimpl.data.ogb_graph (OGB's tox21.zip, unzipped)"
# a folder of one graph with node labels: the node-level command reads it
NODE_LAYOUT = (
    "node-label.csv.gz",
    "a node-property dataset (ogbn-proteins' layout): train it with refimpl train --model gat "
    "(or nodeformer) --dataset FOLDER, or read it with refimpl.data.load_ogb_node_dataset",
)


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
        No such folder, or a required file missing (named); a folder in OGB's node-property
        layout (``raw/node-label.csv.gz``) is named with the command that reads it.
    ValueError
        One line per problem, naming the file: wrong column count, an unreadable value,
        counts that do not add up, an edge index outside its graph, a split index outside
        ``[0, G)``, repeated or in two parts.
    """
    root = Path(folder)
    raw = raw_folder(root, REQUIRED, LAYOUT_HINT, NODE_LAYOUT)
    num_nodes, num_edges = read_counts(raw, LAYOUT_HINT)  # (G,) each
    edges = read_csv(raw / "edge.csv.gz", np.int64, columns=2, hint=LAYOUT_HINT)  # (M, 2)
    check_rows(raw / "edge.csv.gz", edges, int(num_edges.sum()), "the sum of num-edge-list")
    node_feat = read_features(
        raw / "node-feat.csv.gz", int(num_nodes.sum()), "num-node-list", LAYOUT_HINT
    )
    edge_feat = read_features(
        raw / "edge-feat.csv.gz", int(num_edges.sum()), "num-edge-list", LAYOUT_HINT
    )
    check_local(raw / "edge.csv.gz", edges, num_nodes, num_edges)
    labels = read_csv(
        raw / "graph-label.csv.gz", np.float64, columns=None, hint=LAYOUT_HINT, empty_is_nan=True
    )
    check_rows(raw / "graph-label.csv.gz", labels, num_nodes.shape[0], "the number of graphs")
    task = _task(raw / "graph-label.csv.gz", labels, task)
    edge_index = edges.T  # (2, M)
    if add_inverse_edge:  # OGB's interleaving: (u, v), (v, u), each with the bond's features
        edge_index, edge_feat = add_inverse_edges(edges, edge_feat)  # (2, 2M), (2M, B)
        num_edges = 2 * num_edges
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
    parts = read_split(root / "split" / split, len(dataset), "graph", LAYOUT_HINT)
    train, valid, test = (
        dataclasses.replace(dataset.subset(parts[key]), name=f"{dataset.name}-{key}")
        for key in SPLIT_PARTS
    )
    return train, valid, test


def _task(path: Path, labels: np.ndarray, task: str | None) -> str:
    """The task: ``task``, or inferred from the labels (0/1 where present: multi-label)."""
    present = labels[~np.isnan(labels)]
    binary = bool(np.isin(present, (0, 1)).all())
    if task is None:
        return "multilabel" if binary else "regression"
    if task == "multilabel" and not binary:
        raise ValueError(f"{path}: task='multilabel' needs labels 0 or 1 (or empty cells)")
    return task
