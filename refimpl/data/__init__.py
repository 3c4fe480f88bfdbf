"""Datasets: Planetoid and Geom-GCN loaders, the Open Graph Benchmark's raw layouts,
molecules from SMILES (RDKit, imported only when used), synthetic generators, splits, a
registry.

Nothing is downloaded: file-backed loaders take a directory (your datasets folder, as laid
out in the user guide's Data page, or the sub-folder of one collection). ``load_dataset``
looks names up in a registry that other modules extend with ``register_loader``, and reads
a folder in OGB's node-property layout (:func:`load_ogb_node_dataset`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.data._unpickle import UnsafePickleError
from refimpl.data.dataset import NodeDataset, coalesce, edge_homophily, row_normalize
from refimpl.data.geom_gcn import GEOM_GCN_NAMES, load_geom_gcn
from refimpl.data.graph_batch import GraphBatch, collate, iterate_batches
from refimpl.data.graph_dataset import GraphDataset
from refimpl.data.graph_dataset_file import load_graph_dataset, save_graph_dataset
from refimpl.data.molecules import synthetic_molecules
from refimpl.data.ogb_graph import load_ogb_graph_dataset
from refimpl.data.ogb_node import load_ogb_node_dataset
from refimpl.data.planetoid import PLANETOID_NAMES, load_planetoid
from refimpl.data.positional import laplacian_pe, random_sign_flip, random_walk_pe
from refimpl.data.smiles import load_smiles_csv, smiles_to_graph
from refimpl.data.splits import drop_features, random_split
from refimpl.data.synthetic import contextual_sbm, karate_club, knn_graph
from refimpl.data.trees import tree_neighbors_match

__all__ = [
    "GEOM_GCN_NAMES",
    "PLANETOID_NAMES",
    "GraphBatch",
    "GraphDataset",
    "NodeDataset",
    "UnsafePickleError",
    "coalesce",
    "collate",
    "contextual_sbm",
    "dataset_names",
    "drop_features",
    "edge_homophily",
    "iterate_batches",
    "karate_club",
    "knn_graph",
    "laplacian_pe",
    "load_dataset",
    "load_geom_gcn",
    "load_graph_dataset",
    "load_ogb_graph_dataset",
    "load_ogb_node_dataset",
    "load_planetoid",
    "load_smiles_csv",
    "random_sign_flip",
    "random_split",
    "random_walk_pe",
    "register_loader",
    "row_normalize",
    "save_graph_dataset",
    "smiles_to_graph",
    "synthetic_molecules",
    "tree_neighbors_match",
]

DATA_ENV = "REFIMPL_DATA"  # the environment variable naming the datasets folder

# name -> (loader, needs_root). A file-backed loader is called loader(root, **kwargs),
# a synthetic one loader(**kwargs).
_REGISTRY: dict[str, tuple[Callable[..., NodeDataset], bool]] = {}


def register_loader(
    name: str,
    function: Callable[..., NodeDataset],
    *,
    needs_root: bool = True,
    overwrite: bool = False,
) -> None:
    """Make ``load_dataset(name, ...)`` call ``function``.

    Parameters
    ----------
    name : str
        Non-empty; case-insensitive (stored lower-case).
    function : callable
        Returns a :class:`NodeDataset`: ``function(root, **kwargs)`` or, without a root,
        ``function(**kwargs)``.
    needs_root : bool, default True
        ``True``: called with the data directory first; ``False``: without (synthetic
        data).
    overwrite : bool, default False
        Replace a loader registered under the same name; otherwise that is a
        ``ValueError``.
    """
    key = name.lower()
    if not key or not callable(function):
        raise ValueError("register_loader needs a non-empty name and a callable")
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"a loader named {key!r} is already registered; pass overwrite=True")
    _REGISTRY[key] = (function, needs_root)


def dataset_names() -> list[str]:
    """The registered names, sorted.

    Returns
    -------
    list of str
        Lower-case names :func:`load_dataset` accepts (besides an OGB folder).
    """
    return sorted(_REGISTRY)


def load_dataset(name: str, root: str | Path | None = None, **kwargs: Any) -> NodeDataset:
    """Load a registered dataset by name, or a folder in OGB's node-property layout.

    Parameters
    ----------
    name : str
        A registered name (:func:`dataset_names`; case-insensitive), or a folder in OGB's
        node-property layout (ogbn-proteins' ``raw/`` and ``split/``, recognised by
        ``raw/node-label.csv.gz``), read by :func:`load_ogb_node_dataset`.
    root : str or pathlib.Path, optional
        The datasets folder (``root/planetoid``, ``root/geom_gcn``) or the collection's own
        folder; ``None``: the ``REFIMPL_DATA`` environment variable. Synthetic names and a
        folder ``name`` ignore it.
    **kwargs
        Passed to the loader (``normalize_features=True``, ``split=3``,
        ``num_nodes=500``, ``seed=1``, ``node_features="species"``, ...).

    Returns
    -------
    NodeDataset
        The loader's dataset.
    """
    key = name.lower()
    if key not in _REGISTRY and Path(name).is_dir():
        return load_ogb_node_dataset(name, **kwargs)
    if key not in _REGISTRY:
        raise ValueError(
            f"unknown dataset {name!r}; valid names: {', '.join(dataset_names())}, or a folder "
            "in OGB's node-property layout"
        )
    function, needs_root = _REGISTRY[key]
    if not needs_root:
        return function(**kwargs)
    root = root if root is not None else os.environ.get(DATA_ENV)
    if not root:
        raise ValueError(
            f"dataset {key!r} is read from files: pass its directory (--data-root on the "
            f"command line, root= in Python) or set {DATA_ENV} to the datasets folder"
        )
    return function(root, **kwargs)


def _csbm(
    *, num_nodes: int = 1000, num_classes: int = 4, seed: int = 0, **kwargs: Any
) -> NodeDataset:
    return contextual_sbm(num_nodes, num_classes, np.random.default_rng(seed), **kwargs)


def _register_builtins() -> None:
    for planetoid in PLANETOID_NAMES:
        register_loader(planetoid, lambda root, _n=planetoid, **kw: load_planetoid(root, _n, **kw))
    for geom in (*GEOM_GCN_NAMES, "actor"):
        register_loader(geom, lambda root, _n=geom, **kw: load_geom_gcn(root, _n, **kw))
    register_loader("karate", karate_club, needs_root=False)
    register_loader("csbm", _csbm, needs_root=False)
    register_loader("trees", tree_neighbors_match, needs_root=False)


_register_builtins()
