"""The loader registry: names, errors, roots from REFIMPL_DATA, plugging in new loaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import refimpl.data as data
from refimpl.data import dataset_names, karate_club, load_dataset, register_loader
from tests.data import data_root

BUILTIN = {
    "trees",
    "cora",
    "citeseer",
    "pubmed",
    "cornell",
    "texas",
    "wisconsin",
    "film",
    "actor",
    "chameleon",
    "squirrel",
    "chameleon_filtered",
    "squirrel_filtered",
    "karate",
    "csbm",
}


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A private copy of the registry, restored after the test."""
    copy = dict(data._REGISTRY)
    monkeypatch.setattr(data, "_REGISTRY", copy)
    return copy


def test_builtin_names() -> None:
    assert set(dataset_names()) == BUILTIN


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown dataset 'coraa'; valid names: .*cora.*karate"):
        load_dataset("coraa")


def test_file_backed_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REFIMPL_DATA", raising=False)
    with pytest.raises(ValueError, match=r"pass its directory \(--data-root.*set REFIMPL_DATA"):
        load_dataset("cora")


def test_root_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    root = data_root()
    monkeypatch.setenv("REFIMPL_DATA", str(root))
    ds = load_dataset("Cora", normalize_features=True)
    assert ds.summary() == "cora: N=2708 E=10556 F=1433 classes=7 train/val/test=140/500/1000"
    assert load_dataset("actor", root, split=1).name == "film"


def test_synthetic_names_ignore_root() -> None:
    a = load_dataset("karate", root="/nonexistent")
    np.testing.assert_array_equal(a.train_mask, karate_club().train_mask)
    b = load_dataset("csbm", num_nodes=100, num_classes=2, seed=3, homophily=0.9)
    assert b.num_nodes == 100 and b.name == "csbm(h=0.9)"


def test_register_loader(registry: dict, tmp_path: Path) -> None:
    seen = []

    def from_files(root: str, scale: int = 1):
        seen.append((root, scale))
        return karate_club()

    register_loader("MyData", from_files)
    assert "mydata" in dataset_names()
    assert load_dataset("mydata", tmp_path, scale=2).name == "karate"
    assert seen == [(tmp_path, 2)]
    register_loader("gen", lambda **kw: karate_club(**kw), needs_root=False)
    assert load_dataset("GEN", features="degree").num_features == 18
    with pytest.raises(ValueError, match="'mydata' is already registered; pass overwrite=True"):
        register_loader("mydata", from_files)
    register_loader("mydata", lambda root: karate_club(seed=1), overwrite=True)
    with pytest.raises(ValueError, match="non-empty name and a callable"):
        register_loader("", from_files)
