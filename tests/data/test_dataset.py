"""NodeDataset validation and the shared helpers (coalesce, row_normalize, edge_homophily)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given

from refimpl import Graph
from refimpl.data import NodeDataset, coalesce, edge_homophily, row_normalize
from refimpl.testing.strategies import graphs


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
