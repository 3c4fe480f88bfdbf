"""The data fingerprint a run records: a change in any array, dtype or shape changes it; the
name and the backend do not."""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

from refimpl import Graph
from refimpl.backend import asarray
from refimpl.data import contextual_sbm, synthetic_molecules
from refimpl.train.resume import data_fingerprint


def test_any_change_in_the_arrays_changes_the_fingerprint() -> None:
    dataset = contextual_sbm(30, 2, np.random.default_rng(0), feature_dim=3)
    reference = data_fingerprint(dataset)
    assert len(reference) == 64 and data_fingerprint(dataset) == reference
    x = dataset.x.copy()
    x[4, 1] = np.nextafter(x[4, 1], np.inf)  # one ulp in one feature
    mask = dataset.val_mask.copy()
    mask[np.flatnonzero(mask)[0]] = False
    edges = dataset.graph.edge_index.copy()
    edges[:, [0, 1]] = edges[:, [1, 0]]  # the same edges in another order
    changed = [
        dataclasses.replace(dataset, x=x),
        dataclasses.replace(dataset, x=dataset.x.astype(np.float32)),
        dataclasses.replace(dataset, val_mask=mask),
        dataclasses.replace(dataset, graph=Graph(edges, dataset.graph.num_nodes)),
        dataclasses.replace(dataset, graph=Graph(edges[:, :0], dataset.graph.num_nodes)),
    ]
    prints = {data_fingerprint(other) for other in changed}
    assert reference not in prints and len(prints) == len(changed)


def test_the_name_and_the_backend_do_not_change_it() -> None:
    dataset = contextual_sbm(30, 2, np.random.default_rng(0), feature_dim=3)
    assert data_fingerprint(dataclasses.replace(dataset, name="other")) == data_fingerprint(dataset)
    strict = asarray(dataset.x, backend="strict")
    assert data_fingerprint(strict) == data_fingerprint(dataset.x)


def test_sparse_features_and_graph_datasets_are_fingerprinted() -> None:
    dense = np.array([[0.0, 1.5], [2.0, 0.0]])
    csr = sp.csr_matrix(dense)
    assert data_fingerprint(csr) != data_fingerprint(dense)
    other = csr.copy()
    other.data[0] = 1.25
    assert data_fingerprint(other) != data_fingerprint(csr)
    molecules = synthetic_molecules(6, seed=0)
    splits = molecules.split(seed=0)
    assert data_fingerprint(*splits) != data_fingerprint(*molecules.split(seed=1))
    assert data_fingerprint(*splits) == data_fingerprint(*molecules.split(seed=0))


def test_a_node_dataset_without_the_new_fields_hashes_as_before_they_existed() -> None:
    # Adding edge_attr and y_mask to NodeDataset changed every node dataset's fingerprint, so
    # every run folder and checkpoint written before was refused on resume ("other data").
    # The fields a NodeDataset had then, under the name the digest records:
    @dataclasses.dataclass(frozen=True)
    class NodeDataset:
        name: str
        graph: Graph
        x: np.ndarray
        y: np.ndarray
        train_mask: np.ndarray
        val_mask: np.ndarray
        test_mask: np.ndarray
        num_classes: int

    dataset = contextual_sbm(30, 2, np.random.default_rng(0), feature_dim=3)
    assert dataset.edge_attr is None and dataset.y_mask is None
    before = NodeDataset(
        **{f.name: getattr(dataset, f.name) for f in dataclasses.fields(NodeDataset)}
    )
    assert data_fingerprint(dataset) == data_fingerprint(before)
    with_edges = dataclasses.replace(dataset, edge_attr=np.ones((dataset.graph.num_edges, 1)))
    assert data_fingerprint(with_edges) != data_fingerprint(before)
