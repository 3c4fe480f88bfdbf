"""NodeDataset validation and the shared helpers (coalesce, row_normalize, edge_homophily)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given

from refimpl import Graph
from refimpl.data import NodeDataset, coalesce, edge_homophily, row_normalize
from refimpl.testing.strategies import graphs
from refimpl.train.resume import data_fingerprint


def make(**overrides: object) -> NodeDataset:
    """A valid 5-node dataset, with any field replaced."""
    n = 5
    fields: dict[str, object] = {
        "name": "toy",
        "graph": Graph([[0, 1, 2, 3], [1, 2, 3, 4]], n),
        "x": np.arange(10, dtype=np.float64).reshape(n, 2),
        "y": np.array([0, 1, 2, 0, 1]),
        "train_mask": np.array([1, 1, 0, 0, 0], dtype=bool),
        "val_mask": np.array([0, 0, 1, 0, 0], dtype=bool),
        "test_mask": np.array([0, 0, 0, 1, 1], dtype=bool),
        "num_classes": 3,
    }
    fields.update(overrides)
    return NodeDataset(**fields)  # type: ignore[arg-type]


def test_valid_dataset_conveniences() -> None:
    ds = make()
    assert (ds.num_nodes, ds.num_features, ds.is_multilabel) == (5, 2, False)
    assert ds.summary() == "toy: N=5 E=4 F=2 classes=3 train/val/test=2/1/2"
    assert "toy: N=5" in repr(ds)


def test_astype_copies_features_only() -> None:
    ds = make()
    ds32 = ds.astype(np.float32)
    assert ds32.x.dtype == np.float32 and ds.x.dtype == np.float64
    np.testing.assert_array_equal(ds32.x, ds.x)
    assert ds32.graph is ds.graph and ds32.y is ds.y
    with pytest.raises(TypeError, match="floating point"):
        ds.astype(np.int32)


def test_with_masks_validates() -> None:
    ds = make()
    t = np.array([1, 0, 0, 0, 0], dtype=bool)
    v = np.array([0, 1, 0, 0, 0], dtype=bool)
    assert ds.with_masks(t, v, ~(t | v)).summary().endswith("1/1/3")
    with pytest.raises(ValueError, match="train_mask and val_mask overlap on 1 nodes"):
        ds.with_masks(t, t, ~t)


def _corrupt_csr() -> sp.csr_matrix:
    x = sp.csr_matrix(np.eye(5, 2))
    x.indptr[-1] = 10**8
    return x


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"x": np.zeros((4, 2))}, ValueError, r"x must have shape \(num_nodes, F\) = \(5, F\)"),
        ({"x": np.zeros((5, 2), dtype=int)}, TypeError, "x must be a floating-point"),
        ({"x": np.full((5, 2), np.nan)}, ValueError, "NaN"),
        ({"y": np.array([0, 1, 2, 0, 3])}, ValueError, r"class ids must lie in \[0, num_cl"),
        ({"y": np.array([0, 1, 2, 0, -1])}, ValueError, "class ids must lie"),
        ({"y": np.zeros(5)}, TypeError, "integer class ids"),
        ({"y": np.zeros(4, dtype=int)}, ValueError, r"y must have shape \(5,\)"),
        ({"y": np.zeros((5, 2))}, ValueError, r"multi-label y must have shape .* \(5, 3\)"),
        ({"y": np.full((5, 3), 0.5)}, ValueError, "only 0 and 1"),
        ({"train_mask": np.ones(5, dtype=int)}, TypeError, "train_mask must be a bool"),
        ({"val_mask": np.ones(4, dtype=bool)}, ValueError, r"val_mask must have shape"),
        ({"test_mask": np.ones(5, dtype=bool)}, ValueError, "overlap.*disjoint"),
        ({"num_classes": 0}, ValueError, "num_classes must be >= 1"),
        ({"num_classes": 3.0}, TypeError, "num_classes must be an int"),
        ({"graph": np.zeros((2, 3))}, TypeError, "refimpl.Graph"),
        ({"name": b"cora"}, TypeError, "name must be a str, got bytes"),
        # a registered loader's name reached summary() and the CLI's "data" line as given
        ({"name": "cora\x1b[2J"}, ValueError, r"name 'cora\\x1b\[2J' holds characters a"),
        # a CSR whose indptr overruns its arrays reached row_normalize and SciPy unchecked
        ({"x": _corrupt_csr()}, ValueError, r"x \(CSR\) indptr runs from 0 to 100000000"),
    ],
)
def test_validation_errors(overrides: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make(**overrides)


def test_multilabel_y_accepted() -> None:
    y = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 0]], dtype=np.float64)
    assert make(y=y).is_multilabel


@given(graphs(max_nodes=8, max_edges=20))
def test_coalesce_against_python_sets(graph: Graph) -> None:
    src, dst = graph.edge_index
    expected = sorted(
        {(u, v) for u, v in zip(src, dst, strict=True) if u != v}
        | {(v, u) for u, v in zip(src, dst, strict=True) if u != v}
    )
    got = coalesce(src, dst, graph.num_nodes)
    assert [tuple(e) for e in got.T.tolist()] == expected
    by_dst = coalesce(src, dst, graph.num_nodes, sort_by_row=False)
    assert [tuple(e) for e in by_dst.T.tolist()] == sorted(expected, key=lambda e: (e[1], e[0]))
    # Without symmetrising and with loops kept: only deduplicated and sorted.
    raw = coalesce(src, dst, graph.num_nodes, symmetric=False, remove_self_loops=False)
    assert [tuple(e) for e in raw.T.tolist()] == sorted(
        set(zip(src.tolist(), dst.tolist(), strict=True))
    )


def test_row_normalize_rows_sum_to_one_zero_rows_stay() -> None:
    x = np.array([[1.0, 3.0], [0.0, 0.0], [0.2, 0.3]], dtype=np.float32)
    out = row_normalize(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.25, 0.75], [0.0, 0.0], [0.4, 0.6]], rtol=1e-6)
    np.testing.assert_array_equal(x[0], [1.0, 3.0])  # input not mutated


def test_edge_homophily() -> None:
    graph = Graph([[0, 1, 2, 3], [1, 0, 3, 0]], 4)
    assert edge_homophily(graph, np.array([0, 0, 1, 1])) == 0.75  # 3 -> 0 crosses
    with pytest.raises(ValueError, match="without edges"):
        edge_homophily(Graph(np.zeros((2, 0), dtype=int), 2), np.array([0, 1]))


MULTI = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 0]], dtype=np.float64)
OBSERVED = np.array([[1, 1, 0], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=bool)


def test_missing_labels_from_nan_or_a_mask_are_stored_as_zero() -> None:
    with_nan = np.where(OBSERVED, MULTI, np.nan)
    from_nan = make(y=with_nan)
    np.testing.assert_array_equal(from_nan.y_mask, OBSERVED)
    np.testing.assert_array_equal(from_nan.y, np.where(OBSERVED, MULTI, 0))
    assert np.isnan(with_nan).sum() == 2  # the caller's array is not changed
    # anything outside an explicit mask (NaN, 7, -3) is never read: stored as 0
    junk = np.where(OBSERVED, MULTI, [[7.0], [np.nan], [-3.0], [0.5], [2.0]])
    given = make(y=junk, y_mask=OBSERVED)
    np.testing.assert_array_equal(given.y, from_nan.y)
    assert make(y=MULTI, y_mask=np.ones((5, 3), bool)).y_mask is None  # nothing missing
    assert given.summary().endswith("train/val/test=2/1/2 missing_labels=2")


def test_edge_features_are_checked_cast_and_dropped_with_the_graph() -> None:
    attr = np.arange(8, dtype=np.float64).reshape(4, 2)  # one row per edge of make()'s graph
    ds = make(edge_attr=attr)
    assert ds.summary() == "toy: N=5 E=4 F=2 B=2 classes=3 train/val/test=2/1/2"
    assert ds.astype(np.float32).edge_attr.dtype == np.float32
    assert ds.with_masks(ds.train_mask, ds.val_mask, ds.test_mask).edge_attr is attr
    knn = ds.with_graph(Graph([[0, 1], [1, 0]], 5))
    assert knn.edge_attr is None and knn.graph.num_edges == 2
    # a new graph with the old edge features: refused, naming the method that drops them
    with pytest.raises(ValueError, match=r"\(E, B\) = \(2, B\), got \(4, 2\).*with_graph"):
        dataclasses.replace(ds, graph=Graph([[0, 1], [1, 0]], 5))


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"edge_attr": np.zeros((3, 2))}, ValueError, r"edge_attr must have one row per column"),
        ({"edge_attr": np.zeros(4)}, ValueError, r"edge_attr must have one row per column"),
        ({"edge_attr": np.zeros((4, 2), int)}, TypeError, r"edge_attr must be a floating-point"),
        ({"edge_attr": np.full((4, 2), np.inf)}, ValueError, r"edge_attr contains NaN or inf"),
        ({"y_mask": OBSERVED}, ValueError, r"y_mask marks the observed entries of a multi-label"),
        ({"y": MULTI, "y_mask": OBSERVED[:4]}, ValueError, r"y_mask must have y's shape \(5, 3\)"),
        ({"y": MULTI, "y_mask": OBSERVED.astype(int)}, TypeError, r"y_mask must be a bool"),
        ({"y": np.where(OBSERVED, 2.0, 0.0), "y_mask": OBSERVED}, ValueError, r"only 0 and 1"),
    ],
)
def test_edge_features_and_label_masks_refused_in_one_line(
    overrides: dict, error: type, match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        make(**overrides)
    assert "\n" not in str(info.value)


def test_the_data_fingerprint_sees_the_label_mask_and_the_edge_features() -> None:
    ds = make(y=MULTI, y_mask=OBSERVED, edge_attr=np.ones((4, 2)))
    prints = {
        data_fingerprint(other)
        for other in (
            ds,
            dataclasses.replace(ds, y_mask=OBSERVED[::-1].copy()),
            dataclasses.replace(ds, y_mask=None),
            dataclasses.replace(ds, edge_attr=np.zeros((4, 2))),
            dataclasses.replace(ds, edge_attr=None),
        )
    }
    assert len(prints) == 5
