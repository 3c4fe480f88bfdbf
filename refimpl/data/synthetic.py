"""Synthetic node-classification data that needs no files.

``karate_club`` (Zachary 1977, via networkx), ``contextual_sbm`` (a stochastic
block model with a homophily knob and class-dependent Gaussian features) and
``knn_graph`` (k nearest neighbours by Euclidean distance).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.data.dataset import NodeDataset, coalesce
from refimpl.data.splits import random_split
from refimpl.graph import Graph

__all__ = ["contextual_sbm", "karate_club", "knn_graph"]


def karate_club(*, features: str = "identity", seed: int = 0) -> NodeDataset:
    """Zachary's karate club: 34 nodes, 156 directed edges (78 undirected), 2 classes.

    Labels: the club each member joined after the split (networkx ``club``
    attribute), 0 = ``"Mr. Hi"`` (17 members), 1 = ``"Officer"`` (17).

    Parameters
    ----------
    features : str, default "identity"
        ``"identity"`` (x = I, (34, 34), Kipf & Welling's featureless setting) or
        ``"degree"`` (one-hot degree, (34, max_degree + 1)).
    seed : int, default 0
        Seeds the split: 4 training nodes per class, 10 validation, 16 test
        (all 34 nodes), drawn by ``random_split``.

    Returns
    -------
    NodeDataset
        Named ``"karate"``, float64 features, the split above.
    """
    import networkx as nx

    g = nx.karate_club_graph()
    n = g.number_of_nodes()
    y = np.array([g.nodes[v]["club"] != "Mr. Hi" for v in range(n)], dtype=np.int64)  # (N,)
    graph = Graph.from_networkx(nx.Graph(g.edges()))  # drop the weights; both directions
    if features == "identity":
        x = np.eye(n)
    elif features == "degree":
        degree = np.asarray(graph.in_degree())
        x = np.eye(int(degree.max()) + 1)[degree]  # (N, max_degree + 1)
    else:
        raise ValueError(f"features must be 'identity' or 'degree', got {features!r}")
    train, val, test = random_split(
        y, np.random.default_rng(seed), train_per_class=4, num_val=10, num_test=16
    )
    return NodeDataset("karate", graph, x, y, train, val, test, num_classes=2)


def contextual_sbm(
    num_nodes: int,
    num_classes: int,
    rng: np.random.Generator,
    *,
    homophily: float = 0.8,
    average_degree: float = 5.0,
    feature_dim: int = 16,
    feature_signal: float = 1.0,
) -> NodeDataset:
    """A contextual stochastic block model with edge homophily ``homophily`` in expectation.

    Classes are balanced (sizes differ by at most one; ``y`` a random
    permutation of ``arange(N) % num_classes``). ``M = round(N * average_degree / 2)``
    undirected edges are drawn independently: a uniform endpoint ``u``, then with
    probability ``homophily`` a uniform other node of ``u``'s class, otherwise a
    uniform node of another class. Every intra-class pair is then equally likely,
    and so is every inter-class pair: an SBM with its edge count fixed. Edges go
    in both directions, duplicates are merged (rare when sparse: it moves the
    measured homophily by O(M / N^2)), there are no self-loops. The number of
    intra-class edges is Binomial(M, homophily), so the measured edge homophily
    has standard deviation ``sqrt(h (1 - h) / M)``.

    Features: ``x_v = mu_{y_v} + eps_v`` with ``eps_v ~ N(0, I_F)`` and class
    means ``mu_c`` random directions of norm ``feature_signal``.

    Parameters
    ----------
    num_nodes : int
        ``N >= 2 * num_classes`` (every class needs two nodes).
    num_classes : int
        ``>= 2``.
    rng : numpy.random.Generator
        The only source of randomness.
    homophily : float, default 0.8
        In [0, 1]: the expected fraction of intra-class edges.
    average_degree : float, default 5.0
        ``> 0``: the expected mean degree ``2M / N``.
    feature_dim : int, default 16
        ``F >= 1``.
    feature_signal : float, default 1.0
        ``>= 0``: ``||mu_c||`` (0: features carry no label information).

    Returns
    -------
    NodeDataset
        ``x`` (N, F) float64, ``y`` (N,) int64, a 50/25/25 % random split
        (``random_split(fractions=(0.5, 0.25, 0.25))`` from ``rng``).
    """
    n, c = int(num_nodes), int(num_classes)
    if c < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if n < 2 * c:
        raise ValueError(f"num_nodes must be >= 2 * num_classes = {2 * c}, got {num_nodes}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must lie in [0, 1], got {homophily}")
    if average_degree <= 0 or feature_dim < 1 or feature_signal < 0:
        raise ValueError("average_degree must be > 0, feature_dim >= 1, feature_signal >= 0")

    y = rng.permutation(np.arange(n) % c).astype(np.int64)  # (N,)
    # Nodes sorted by class: class k occupies order[start[k] : start[k] + size[k]].
    order = np.argsort(y, kind="stable")  # (N,)
    size = np.bincount(y, minlength=c)  # (C,)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])  # (C,)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - start[y[order]]  # position of each node within its class

    m = round(n * float(average_degree) / 2)
    u = rng.integers(0, n, size=m)  # (M,)
    cu = y[u]
    intra = rng.random(m) < homophily  # (M,)
    # Intra: uniform over the size - 1 other members of u's class (skip u's own slot).
    r_in = np.floor(rng.random(m) * (size[cu] - 1)).astype(np.int64)
    r_in += r_in >= rank[u]
    v_in = order[start[cu] + r_in]
    # Inter: uniform over the N - size nodes outside u's class (skip that class's block).
    r_out = np.floor(rng.random(m) * (n - size[cu])).astype(np.int64)
    r_out += np.where(r_out >= start[cu], size[cu], 0)
    v_out = order[r_out]
    v = np.where(intra, v_in, v_out)
    edge_index = coalesce(u, v, n)  # both directions, duplicates merged

    means = rng.standard_normal((c, feature_dim))  # (C, F)
    means *= feature_signal / np.linalg.norm(means, axis=1, keepdims=True)
    x = means[y] + rng.standard_normal((n, feature_dim))  # (N, F)
    train, val, test = random_split(y, rng, fractions=(0.5, 0.25, 0.25))
    return NodeDataset(
        f"csbm(h={homophily:g})", Graph(edge_index, n), x, y, train, val, test, num_classes=c
    )


def knn_graph(features: Any, k: int) -> Graph:
    """Edges ``u -> v`` from each of ``v``'s ``k`` nearest neighbours ``u`` (Euclidean).

    Parameters
    ----------
    features : (N, F) float array
        Finite points, one per node.
    k : int
        ``1 <= k <= N - 1``: neighbours per node.

    Returns
    -------
    Graph
        ``N * k`` edges, sorted by target; every node has in-degree exactly ``k`` and no
        self-loop (``N(v)`` = its k nearest other points; PyG
        ``knn_graph(flow="source_to_target", loop=False)``). Ties between equally distant
        points are broken by ``scipy.spatial.cKDTree``; a duplicate point is a neighbour
        at distance 0, the node itself never.
    """
    from scipy.spatial import cKDTree

    points = np.asarray(features, dtype=np.float64)
    if points.ndim != 2:
        raise ValueError(f"features must have shape (N, F), got {points.shape}")
    n = points.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n - 1:
        raise ValueError(f"k must be an int in [1, N - 1] = [1, {n - 1}], got {k!r}")
    if not np.isfinite(points).all():
        raise ValueError("features contain NaN or infinity")
    _, idx = cKDTree(points).query(points, k=k + 1)  # (N, k + 1), nearest first
    idx = idx.reshape(n, k + 1)
    is_self = idx == np.arange(n)[:, None]  # (N, k + 1)
    # With duplicate points the node may not come first, or not at all: drop the
    # farthest candidate instead.
    is_self[~is_self.any(axis=1), k] = True
    neighbours = idx[~is_self].reshape(n, k)  # (N, k)
    dst = np.repeat(np.arange(n), k)  # (N k,)
    return Graph(np.stack([neighbours.ravel(), dst]), n)
