"""Synthetic data: karate club, contextual SBM (homophily knob), k-NN graphs."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.data import contextual_sbm, edge_homophily, karate_club, knn_graph
from refimpl.testing.strategies import seeds


def test_karate_club() -> None:
    ds = karate_club()
    assert ds.summary() == "karate: N=34 E=156 F=34 classes=2 train/val/test=8/10/16"
    np.testing.assert_array_equal(np.bincount(ds.y), [17, 17])
    np.testing.assert_array_equal(np.bincount(ds.y[ds.train_mask]), [4, 4])
    assert (ds.train_mask | ds.val_mask | ds.test_mask).all()
    np.testing.assert_array_equal(ds.x, np.eye(34))
    g = nx.karate_club_graph()
    assert ds.y[0] == (g.nodes[0]["club"] != "Mr. Hi") == 0 and ds.y[33] == 1
    edges = set(map(tuple, ds.graph.edge_index.T.tolist()))
    assert edges == {(u, v) for u, v in g.edges()} | {(v, u) for u, v in g.edges()}
    np.testing.assert_array_equal(karate_club(seed=0).train_mask, ds.train_mask)
    assert not np.array_equal(karate_club(seed=1).train_mask, ds.train_mask)


def test_karate_degree_features() -> None:
    ds = karate_club(features="degree")
    degree = np.asarray(ds.graph.in_degree())
    assert ds.num_features == degree.max() + 1 == 18
    np.testing.assert_array_equal(ds.x.argmax(1), degree)
    np.testing.assert_array_equal(ds.x.sum(1), 1.0)
    with pytest.raises(ValueError, match="'identity' or 'degree'"):
        karate_club(features="onehot")


@pytest.mark.parametrize("homophily", [0.0, 0.1, 0.5, 0.8, 1.0])
def test_csbm_homophily_matches_the_knob(homophily: float) -> None:
    n, c, degree = 3000, 4, 6.0
    ds = contextual_sbm(n, c, np.random.default_rng(12), homophily=homophily, average_degree=degree)
    m = ds.graph.num_edges / 2  # undirected edges after merging duplicates
    measured = edge_homophily(ds.graph, ds.y)
    # Intra-class edges ~ Binomial(M, h): 4 standard deviations. Plus the shift from
    # merging duplicate pairs: an intra edge collides with rate ~ hM / (N^2 / 2C) =
    # h d C / N, so the fraction moves by at most ~ d C / (2N) (0.004 here).
    sigma = np.sqrt(homophily * (1 - homophily) / m)
    assert abs(measured - homophily) <= 4 * sigma + degree * c / (2 * n)
    assert abs(2 * m / n - degree) < 0.05 * degree  # mean degree, few duplicates merged


def test_csbm_structure_and_seed() -> None:
    ds = contextual_sbm(200, 3, np.random.default_rng(1), feature_dim=8, feature_signal=3.0)
    src, dst = ds.graph.edge_index
    assert not (src == dst).any()
    keys = src * 200 + dst
    assert (np.diff(keys) > 0).all()  # sorted, no duplicates
    np.testing.assert_array_equal(np.sort(dst * 200 + src), keys)  # undirected
    assert np.bincount(ds.y).tolist() == [67, 67, 66]
    assert ds.x.shape == (200, 8) and ds.x.dtype == np.float64
    assert [int(m.sum()) for m in (ds.train_mask, ds.val_mask, ds.test_mask)] == [100, 50, 50]
    # Class means sit feature_signal from the origin (noise mean ~ 0 +- 1/sqrt(67) per entry).
    means = np.stack([ds.x[ds.y == k].mean(0) for k in range(3)])
    np.testing.assert_allclose(np.linalg.norm(means, axis=1), 3.0, atol=1.0)
    again = contextual_sbm(200, 3, np.random.default_rng(1), feature_dim=8, feature_signal=3.0)
    np.testing.assert_array_equal(again.graph.edge_index, ds.graph.edge_index)
    np.testing.assert_array_equal(again.x, ds.x)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((10, 1), {}, "num_classes must be >= 2"),
        ((5, 3), {}, "num_nodes must be >= 2 \\* num_classes = 6"),
        ((20, 2), {"homophily": 1.2}, r"homophily must lie in \[0, 1\]"),
        ((20, 2), {"average_degree": 0.0}, "average_degree must be > 0"),
    ],
)
def test_csbm_errors(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        contextual_sbm(*args, np.random.default_rng(0), **kwargs)


@given(n=st.integers(2, 40), f=st.integers(1, 4), data=st.data(), seed=seeds())
def test_knn_graph_against_brute_force(n: int, f: int, data: st.DataObject, seed: int) -> None:
    k = data.draw(st.integers(1, n - 1), label="k")
    points = np.random.default_rng(seed).standard_normal((n, f))  # no ties (a.s.)
    graph = knn_graph(points, k)
    distance = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)  # (N, N)
    np.fill_diagonal(distance, np.inf)
    expected = np.sort(np.argsort(distance, axis=1)[:, :k], axis=1)  # (N, k)
    src, dst = graph.edge_index
    np.testing.assert_array_equal(dst, np.repeat(np.arange(n), k))  # in-degree k each
    np.testing.assert_array_equal(np.sort(src.reshape(n, k), axis=1), expected)


def test_knn_graph_duplicate_points_never_self() -> None:
    points = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [5.0, 5.0]])
    graph = knn_graph(points, 2)
    src, dst = graph.edge_index
    assert not (src == dst).any()
    np.testing.assert_array_equal(graph.in_degree(), [2, 2, 2, 2])
    for v in range(3):  # each duplicate's two neighbours are the other two duplicates
        assert set(src[dst == v].tolist()) == {0, 1, 2} - {v}


@pytest.mark.parametrize("k", [0, 4, True, 1.0])
def test_knn_graph_bad_k(k: object) -> None:
    with pytest.raises(ValueError, match=r"k must be an int in \[1, N - 1\] = \[1, 3\]"):
        knn_graph(np.zeros((4, 2)), k)  # type: ignore[arg-type]
