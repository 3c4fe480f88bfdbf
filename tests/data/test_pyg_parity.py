"""The loaders against PyTorch Geometric's on the same raw files (skipped without PyG).

PyG ``Planetoid`` (``read_planetoid_data``), ``WebKB`` and ``Actor`` process the
files written for them into tensors; ours must agree exactly: Planetoid edges
symmetric/deduplicated/loop-free, Geom-GCN edges with ``edges="as_in_file"``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from refimpl.data import NodeDataset, load_geom_gcn, load_planetoid
from tests.data import data_root


def pyg_datasets() -> ModuleType:
    """Skip without data first, so that a run without REFIMPL_DATA never imports torch."""
    data_root()
    return pytest.importorskip("torch_geometric.datasets")


def link(files: list[Path], raw_dir: Path) -> None:
    raw_dir.mkdir(parents=True)
    for f in files:
        (raw_dir / f.name).symlink_to(f)


def assert_same(ours: NodeDataset, theirs: Any, masks_column: int | None = None) -> None:
    """Edges (order included), features, labels and masks equal; ``theirs`` a PyG Data."""
    np.testing.assert_array_equal(ours.graph.edge_index, theirs.edge_index.numpy())
    np.testing.assert_array_equal(ours.x, theirs.x.numpy().astype(np.float64))
    np.testing.assert_array_equal(ours.y, theirs.y.numpy())
    for key in ("train_mask", "val_mask", "test_mask"):
        mask = getattr(theirs, key).numpy()
        if masks_column is not None:
            mask = mask[:, masks_column]
        np.testing.assert_array_equal(getattr(ours, key), mask)


@pytest.mark.parametrize(("name", "pyg_name"), [("cora", "Cora"), ("citeseer", "CiteSeer")])
def test_planetoid_matches_pyg(tmp_path: Path, name: str, pyg_name: str) -> None:
    planetoid = pyg_datasets().Planetoid
    folder = data_root() / "planetoid"
    link(sorted(folder.glob(f"ind.{name}.*")), tmp_path / pyg_name / "raw")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # old numpy/scipy module paths in the pickles
        theirs = planetoid(str(tmp_path), pyg_name)[0]
    assert_same(load_planetoid(folder, name), theirs)


def test_webkb_and_actor_match_pyg(tmp_path: Path) -> None:
    datasets = pyg_datasets()
    geom = data_root() / "geom_gcn"
    raw = ["out1_node_feature_label.txt", "out1_graph_edges.txt"]
    for name in ("cornell", "wisconsin"):
        files = [geom / "new_data" / name / f for f in raw]
        files += [geom / "splits" / f"{name}_split_0.6_0.2_{i}.npz" for i in range(10)]
        link(files, tmp_path / name / "raw")
        theirs = datasets.WebKB(str(tmp_path), name)[0]
        assert_same(load_geom_gcn(geom, name, 3, edges="as_in_file"), theirs, masks_column=3)
    files = [geom / "new_data" / "film" / f for f in raw]
    files += [geom / "splits" / f"film_split_0.6_0.2_{i}.npz" for i in range(10)]
    link(files, tmp_path / "actor" / "raw")
    theirs = datasets.Actor(str(tmp_path / "actor"))[0]
    assert_same(load_geom_gcn(geom, "actor", 5, edges="as_in_file"), theirs, masks_column=5)
