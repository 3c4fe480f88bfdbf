"""The Open Graph Benchmark's raw files of a node-property dataset (``ogbn-proteins`` and kin),
read without the ``ogb`` package (which downloads; refimpl never does).

Layout (as ``ogb.nodeproppred.NodePropPredDataset`` reads it: ``ogb/io/read_graph_raw.py``
``read_csv_graph_raw``, ``ogb/nodeproppred/dataset.py`` and its ``master.csv``,
snap-stanford/ogb at 61e9784). One graph of ``N`` nodes and ``M`` stored edges; every file is
a gzip-compressed CSV without a header::

    FOLDER/raw/edge.csv.gz             (M, 2) int: each edge once (ogbn-proteins: 39,561,252)
    FOLDER/raw/num-node-list.csv.gz    (1, 1) int: N (ogbn-proteins: 132,534)
    FOLDER/raw/num-edge-list.csv.gz    (1, 1) int: M
    FOLDER/raw/node-label.csv.gz       (N, K) labels: 0/1 per task (ogbn-proteins: K = 112
                                       binary tasks), or one column of class ids
                                       (ogbn-arxiv); an empty cell is a missing label
    FOLDER/raw/edge-feat.csv.gz        (M, B) edge features (optional; ogbn-proteins: B = 8)
    FOLDER/raw/node-feat.csv.gz        (N, F) node features (optional; ogbn-proteins has none)
    FOLDER/raw/node_species.csv.gz     (N, 1) int: NCBI taxonomy id of each protein's species
                                       (optional; OGB's zip names it species.csv.gz, which the
                                       ``ogb`` package renames on first load: both are read)
    FOLDER/split/<split>/train.csv.gz  (one column of node indices; likewise valid, test;
                                       ogbn-proteins splits by ``species``)

(``mapping/`` and the ``ogb`` package's ``processed/`` are not read.) Unzipping OGB's
``proteins.zip`` (``http://snap.stanford.edu/ogb/data/nodeproppred/proteins.zip``) gives
exactly this folder (``proteins/``), as does the ``ogb`` package's ``dataset/ogbn_proteins/``.

Edges: ogbn-proteins stores each (undirected) association once and OGB's reader adds the
reverse (``add_inverse_edge=True`` in ``master.csv``), interleaved as ``(u, v), (v, u)`` with
the feature row repeated; ``add_inverse_edge`` here does the same (:mod:`refimpl.data.ogb_files`),
so ``graph.edge_index`` and ``edge_attr`` match ``NodePropPredDataset`` edge for edge
(79,122,504 directed edges for ogbn-proteins).

Node features, as the authors derive them (ogbn-proteins has none of its own):

- ``"edge-mean"``: node ``v``'s features are the mean of the features of the edges that end
  at ``v`` (``edge_index[1] == v``; 0 for a node without one). NodeFormer's
  ``load_proteins_dataset`` (``dataset.py``: ``to_sparse_tensor(...).mean(dim=1)`` over a
  ``SparseTensor`` whose rows are the targets), OGB's ``examples/nodeproppred/proteins/gnn.py``
  (``adj_t.mean(dim=1)``) and the massive-activation study's ``_add_node_features``
  (``gnn-lspe/data/ogbn.py``: ``edata['feat'][g.edges()[1] == i].mean``) group by the target;
  OGB's ``mlp.py`` groups by the source, which with the inverse edges gives the same means.
- ``"species"``: the massive-activation study's ``_node_species_to_feat``
  (``gnn-lspe/data/ogbn.py``): each species id replaced by its index among the sorted distinct
  ids (ogbn-proteins: 8 species), here one-hot (N, S) since refimpl's node models take float
  features where the study embeds the index.
- ``"node-feat"``: the file's own ``node-feat.csv.gz`` (ogbn-arxiv, -products).

Memory: ogbn-proteins' 39,561,252 edges become 79,123,504 directed ones, held as ``edge_index``
(int64, 1.3 GB) and ``edge_attr`` (float64, 5.1 GB); loading peaks near 10 GB of memory
(about 250 bytes per stored edge: the parsed features and their doubled copy are alive at
once), and training on the whole graph needs several times that (every attention layer keeps
per-edge arrays): train on a machine with well over 16 GB, in float32, with ``--batch-size``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from refimpl.data.dataset import NodeDataset
from refimpl.data.ogb_files import (
    add_inverse_edges,
    check_local,
    check_rows,
    raw_folder,
    read_counts,
    read_csv,
    read_features,
    read_split,
)
from refimpl.graph import Graph

__all__ = ["NODE_FEATURES", "load_ogb_node_dataset"]

NODE_FEATURES = ("edge-mean", "species", "node-feat")
REQUIRED = ("edge.csv.gz", "num-node-list.csv.gz", "num-edge-list.csv.gz", "node-label.csv.gz")
SPECIES_FILES = ("node_species.csv.gz", "species.csv.gz")  # the ogb package's name, the zip's
LAYOUT_HINT = "see the layout in refimpl.data.ogb_node (OGB's proteins.zip, unzipped)"
# a folder of many graphs with graph labels: the graph-level command reads it
GRAPH_LAYOUT = (
    "graph-label.csv.gz",
    "a graph-property dataset (ogbg-moltox21's layout): train it with refimpl train --model "
    "graph_transformer --dataset FOLDER, or read it with refimpl.data.load_ogb_graph_dataset",
)


def load_ogb_node_dataset(
    folder: str | os.PathLike,
    *,
    node_features: str = "edge-mean",
    split: str | None = None,
    task: str | None = None,
    add_inverse_edge: bool = True,
) -> NodeDataset:
    """An OGB node-property dataset in its raw layout, with its split as the three masks.

    Parameters
    ----------
    folder : path
        The folder holding ``raw/`` and ``split/`` (the module docstring has the layout).
    node_features : ``"edge-mean"``, ``"species"`` or ``"node-feat"``
        Where ``x`` comes from (module docstring): the mean of the features of each node's
        incoming edges (NodeFormer's and OGB's examples), the one-hot species (the
        massive-activation study), or ``raw/node-feat.csv.gz``.
    split : str or None
        The folder under ``split/``; None: the only one there (ogbn-proteins ships
        ``species``).
    task : ``"multilabel"``, ``"multiclass"`` or None
        None: ``"multilabel"`` when every label present is 0 or 1 (ogbn-proteins' binary
        tasks, scored by mean ROC-AUC), else ``"multiclass"`` (one column of class ids:
        ogbn-arxiv).
    add_inverse_edge : bool
        Add each edge's reverse, as OGB's reader does for ogbn-proteins (and -products).

    Returns
    -------
    NodeDataset
        Named after the folder; ``x`` (N, F) float64, ``edge_attr`` (E, B) float64 in
        ``graph.edge_index``'s order (None without ``edge-feat.csv.gz``); multi-label: ``y``
        (N, K) with ``y_mask`` where cells are empty, ``num_classes = K``; multiclass: ``y``
        (N,) int64 and ``num_classes`` one more than the largest id. The split's train,
        valid and test nodes are ``train_mask``, ``val_mask`` and ``test_mask``.

    Raises
    ------
    FileNotFoundError
        No such folder, a required file missing (named), the file ``node_features`` reads
        missing, or no such split; a folder in OGB's graph-property layout
        (``raw/graph-label.csv.gz``) is named with the command that reads it.
    ValueError
        One line per problem, naming the file (and its line where one is at fault): wrong
        column count, an unreadable value, counts that do not add up, more than one graph, an
        edge's node outside ``[0, N)``, labels neither 0/1 nor class ids, a split index
        outside ``[0, N)``, repeated or in two parts.
    """
    if node_features not in NODE_FEATURES:
        raise ValueError(
            f"node_features must be one of {', '.join(map(repr, NODE_FEATURES))}, got "
            f"{node_features!r}"
        )
    root = Path(folder)
    raw = raw_folder(root, REQUIRED, LAYOUT_HINT, GRAPH_LAYOUT)
    num_nodes, num_edges = read_counts(raw, LAYOUT_HINT)  # (G,) each
    if num_nodes.shape[0] != 1:
        raise ValueError(
            f"{raw / 'num-node-list.csv.gz'}: {num_nodes.shape[0]} graphs; a node-property "
            "dataset is one graph (one line here and in num-edge-list.csv.gz)"
        )
    n, m = int(num_nodes[0]), int(num_edges[0])
    edges = read_csv(raw / "edge.csv.gz", np.int64, columns=2, hint=LAYOUT_HINT)  # (M, 2)
    check_rows(raw / "edge.csv.gz", edges, m, "num-edge-list")
    check_local(raw / "edge.csv.gz", edges, num_nodes, num_edges)
    has_edge_feat = (raw / "edge-feat.csv.gz").is_file()
    edge_feat = read_features(raw / "edge-feat.csv.gz", m, "num-edge-list", LAYOUT_HINT)
    y, y_mask, num_classes = _labels(raw / "node-label.csv.gz", n, task)
    edge_index = edges.T  # (2, M)
    if add_inverse_edge:  # OGB's interleaving: (u, v), (v, u), each with the edge's features
        edge_index, edge_feat = add_inverse_edges(edges, edge_feat)  # (2, 2M), (2M, B)
    del edges
    graph = Graph(edge_index, n)
    x = _node_features(root, raw, node_features, graph, edge_feat if has_edge_feat else None)
    parts = read_split(_split_folder(root, split), n, "node", LAYOUT_HINT)
    masks = []
    for key in ("train", "valid", "test"):
        mask = np.zeros(n, dtype=bool)
        mask[parts[key]] = True
        masks.append(mask)
    return NodeDataset(
        root.resolve().name,
        graph,
        x,
        y,
        *masks,
        num_classes=num_classes,
        edge_attr=edge_feat if has_edge_feat else None,
        y_mask=y_mask,
    )


def _labels(path: Path, n: int, task: str | None) -> tuple[np.ndarray, np.ndarray | None, int]:
    """``(y, y_mask, num_classes)`` from ``node-label.csv.gz``: multi-label (N, K) float64
    with the observed entries' mask (None when all are), or class ids (N,) int64."""
    if task not in (None, "multilabel", "multiclass"):
        raise ValueError(f"task must be 'multilabel', 'multiclass' or None, got {task!r}")
    labels = read_csv(path, np.float64, columns=None, hint=LAYOUT_HINT, empty_is_nan=True)
    check_rows(path, labels, n, "num-node-list")
    observed = ~np.isnan(labels)  # (N, K)
    binary = bool(np.isin(labels[observed], (0, 1)).all())
    if task == "multilabel" or (task is None and binary):
        if not binary:
            row = int(np.flatnonzero((observed & ~np.isin(labels, (0, 1))).any(axis=1))[0])
            raise ValueError(
                f"{path}: line {row + 1} holds a label other than 0 or 1; multi-label tasks "
                "need 0/1 (or an empty cell for a missing label)"
            )
        return labels, None if observed.all() else observed, labels.shape[1]
    if labels.shape[1] != 1:
        wanted = "task='multiclass' reads one column of class ids"
        if task is None:
            wanted = "labels not all 0/1: multi-label tasks need 0/1 (or empty cells), class ids"
            wanted += " one column"
        raise ValueError(f"{path}: {labels.shape[1]} columns of labels; {wanted}; {LAYOUT_HINT}")
    bad = np.flatnonzero(~observed[:, 0] | (labels[:, 0] < 0) | (labels[:, 0] % 1 != 0))
    if bad.size:
        raise ValueError(
            f"{path}: line {bad[0] + 1} holds {labels[bad[0], 0]}, not a class id (an integer "
            ">= 0; no empty cell: a node without a class stays out of the split instead)"
        )
    ids = labels[:, 0].astype(np.int64)  # (N,)
    return ids, None, int(ids.max()) + 1


def _node_features(
    root: Path, raw: Path, kind: str, graph: Graph, edge_feat: np.ndarray | None
) -> np.ndarray:
    """``x`` (N, F) float64 of ``node_features=kind`` (module docstring)."""
    n = graph.num_nodes
    if kind == "node-feat":
        if not (raw / "node-feat.csv.gz").is_file():
            raise FileNotFoundError(
                f"node_features='node-feat' reads {raw / 'node-feat.csv.gz'}, which is missing; "
                f"{_offered(raw)}"
            )
        return read_features(raw / "node-feat.csv.gz", n, "num-node-list", LAYOUT_HINT)
    if kind == "species":
        return _species_one_hot(raw, n)
    if edge_feat is None:
        raise FileNotFoundError(
            f"node_features='edge-mean' averages {raw / 'edge-feat.csv.gz'}, which is missing; "
            f"{_offered(raw)}"
        )
    dst = np.asarray(graph.edge_index[1])  # (E,) the end each edge is grouped by
    counts = np.bincount(dst, minlength=n).astype(np.float64)  # (N,) in-degree
    sums = np.stack(  # (N, B) one pass over the edges per column
        [np.bincount(dst, weights=edge_feat[:, b], minlength=n) for b in range(edge_feat.shape[1])],
        axis=1,
    ).reshape(n, edge_feat.shape[1])
    return sums / np.maximum(counts, 1)[:, None]  # a node without incoming edges: 0


def _species_one_hot(raw: Path, n: int) -> np.ndarray:
    """The one-hot (N, S) index of each node's species among the sorted distinct ids."""
    path = next((raw / name for name in SPECIES_FILES if (raw / name).is_file()), None)
    if path is None:
        raise FileNotFoundError(
            f"node_features='species' reads {raw / SPECIES_FILES[0]} (or {SPECIES_FILES[1]}, "
            f"its name in OGB's zip), which is missing; {_offered(raw)}"
        )
    species = read_csv(path, np.int64, columns=1, hint=LAYOUT_HINT)[:, 0]  # (N,)
    check_rows(path, species, n, "num-node-list")
    ids, index = np.unique(species, return_inverse=True)  # sorted ids, (N,) index of each
    return np.eye(ids.shape[0])[index]  # (N, S)


def _offered(raw: Path) -> str:
    """Which ``node_features`` this folder's files allow."""
    files = {
        "edge-mean": ("edge-feat.csv.gz",),
        "species": SPECIES_FILES,
        "node-feat": ("node-feat.csv.gz",),
    }
    offered = [kind for kind, names in files.items() if any((raw / f).is_file() for f in names)]
    if not offered:
        return "this folder has no edge-feat, node_species or node-feat file to build x from"
    return f"this folder offers node_features={' or '.join(map(repr, offered))}"


def _split_folder(root: Path, split: str | None) -> Path:
    """``root/split/<split>``; with ``split=None`` the only folder under ``split/``."""
    if split is not None:
        return root / "split" / split
    there = sorted(p.name for p in (root / "split").glob("*") if p.is_dir())
    if len(there) != 1:
        raise FileNotFoundError(
            f"{root / 'split'} holds {len(there)} splits ({', '.join(there) or 'none'}); "
            "pass split=... to choose one"
        )
    return root / "split" / there[0]
