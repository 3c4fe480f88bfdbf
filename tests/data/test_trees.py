"""TREES (LipschitzNorm Sec. 7.2, Tree-NeighborsMatch of Alon & Yahav 2021)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chi2_contingency

from refimpl.data import NodeDataset
from refimpl.data.trees import tree_neighbors_match
from refimpl.testing.strategies import seeds


def per_tree(ds: NodeDataset, depth: int, num_classes: int, num_counts: int) -> dict:
    """The dataset read back tree by tree, from ``x`` alone (no generator internals).

    Returns the blocks as (T, n, .) arrays and, per tree, the root's count, the
    leaves' counts and labels (argmax of one-hot blocks; -1 where a block is empty).
    """
    n = 2 ** (depth + 1) - 1
    t = ds.num_nodes // n
    assert t * n == ds.num_nodes
    x = ds.x.reshape(t, n, -1)
    labels = x[:, :, :num_classes]  # (T, n, C)
    counts = x[:, :, num_classes : num_classes + num_counts]  # (T, n, K)
    flag = x[:, :, num_classes + num_counts]  # (T, n)

    def index(block: np.ndarray) -> np.ndarray:
        return np.where(block.any(-1), block.argmax(-1), -1)

    leaf = slice(2**depth - 1, n)
    return {
        "t": t,
        "n": n,
        "labels": labels,
        "counts": counts,
        "flag": flag,
        "root_count": index(counts[:, 0]),  # (T,)
        "leaf_count": index(counts[:, leaf]),  # (T, L)
        "leaf_label": index(labels[:, leaf]),  # (T, L)
        "target": ds.y.reshape(t, n)[:, 0],  # (T,)
    }


def check_invariants(ds: NodeDataset, depth: int, num_classes: int, num_counts: int) -> None:
    """Everything the module docstring promises about one dataset."""
    r = per_tree(ds, depth, num_classes, num_counts)
    t, n, leaves = r["t"], r["n"], 2**depth
    assert ds.num_features == num_classes + num_counts + 1
    assert ds.x.dtype == np.float64 and ds.y.dtype == np.int64
    assert set(np.unique(ds.x)) <= {0.0, 1.0}
    # One-hot blocks: labels on leaves only, counts on root and leaves, flag on root only.
    row_labels, row_counts = r["labels"].sum(-1), r["counts"].sum(-1)  # (T, n)
    is_leaf = np.arange(n) >= leaves - 1
    is_root = np.arange(n) == 0
    np.testing.assert_array_equal(row_labels, np.broadcast_to(is_leaf, (t, n)))
    np.testing.assert_array_equal(row_counts, np.broadcast_to(is_leaf | is_root, (t, n)))
    np.testing.assert_array_equal(r["flag"], np.broadcast_to(is_root, (t, n)))
    # Exactly one leaf matches the root's count, and its label is the root's target.
    match = r["leaf_count"] == r["root_count"][:, None]  # (T, L)
    np.testing.assert_array_equal(match.sum(1), 1)
    np.testing.assert_array_equal(r["leaf_label"][match], r["target"])
    # Leaf labels are balanced within each tree: every class L / C times.
    hist = (r["leaf_label"][:, :, None] == np.arange(num_classes)).sum(1)  # (T, C)
    np.testing.assert_array_equal(hist, leaves // num_classes)
    # Every node carries its tree's target; only roots are in a mask, each in one.
    np.testing.assert_array_equal(ds.y.reshape(t, n), np.repeat(r["target"][:, None], n, 1))
    in_mask = ds.train_mask.astype(int) + ds.val_mask + ds.test_mask
    np.testing.assert_array_equal(in_mask.reshape(t, n), np.broadcast_to(is_root, (t, n)))


def check_structure(ds: NodeDataset, depth: int) -> None:
    """Disjoint complete binary trees, edges child -> parent, compared with networkx."""
    n = 2 ** (depth + 1) - 1
    t = ds.num_nodes // n
    assert ds.num_nodes == t * n and ds.graph.num_edges == t * (n - 1)
    src, dst = ds.graph.edge_index
    assert (src // n == dst // n).all()  # no edge between trees
    # Each tree, re-indexed, reversed (parent -> child) and undirected, is networkx's
    # balanced binary tree of height `depth` (heap order, root 0).
    reference = {frozenset(e) for e in nx.balanced_tree(2, depth).edges}
    for tree in range(t):
        keep = src // n == tree
        edges = {frozenset(e) for e in zip(src[keep] % n, dst[keep] % n, strict=True)}
        assert edges == reference
    # Direction: every node but the root sends exactly one message (to its
    # parent); the root sends none and receives from its two children.
    out_degree = np.asarray(ds.graph.out_degree()).reshape(t, n)
    in_degree = np.asarray(ds.graph.in_degree()).reshape(t, n)
    assert (out_degree[:, 0] == 0).all() and (out_degree[:, 1:] == 1).all()
    internal = np.arange(n) < 2**depth - 1
    np.testing.assert_array_equal(in_degree, np.broadcast_to(2 * internal, (t, n)))
    assert (dst < src).all()  # a parent precedes its children in heap order


# -- structure ---------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [2, 3, 5])
def test_structure_and_direction(depth: int) -> None:
    ds = tree_neighbors_match(depth, 4, seed=3)
    assert ds.name == f"trees(depth={depth})" and ds.num_classes == 4
    check_structure(ds, depth)
    check_invariants(ds, depth, 4, 8)


def test_depth_ten() -> None:
    ds = tree_neighbors_match(10, 3, seed=1)
    assert ds.num_nodes == 3 * 2047 and ds.graph.num_edges == 3 * 2046
    check_invariants(ds, 10, 4, 8)
    src, dst = ds.graph.edge_index
    assert (src // 2047 == dst // 2047).all() and (dst < src).all()


def test_root_is_exactly_depth_hops_from_the_green_leaves() -> None:
    # networkx distances on the directed graph: the root reaches nothing, every
    # leaf reaches its root in exactly `depth` hops, and the (depth - 1)-hop
    # in-neighbourhood of each root holds no green leaf and no feature at all
    # beyond the root's own row: a (depth - 1)-layer GNN sees only the root.
    depth, num_trees = 4, 3
    ds = tree_neighbors_match(depth, num_trees, seed=5)
    g = nx.DiGraph(ds.graph.edge_index.T.tolist())
    n = 2 ** (depth + 1) - 1
    r = per_tree(ds, depth, 4, 8)
    for tree in range(num_trees):
        root = tree * n
        assert g.out_degree(root) == 0
        dist = nx.single_target_shortest_path_length(g, root)  # {node: hops to root}
        assert set(dist) == set(range(root, root + n))
        leaves = np.arange(root + 2**depth - 1, root + n)
        assert {dist[v] for v in leaves} == {depth}
        matching = leaves[r["leaf_count"][tree] == r["root_count"][tree]]
        assert matching.size == 1 and dist[matching[0]] == depth
        near = [v for v, hops in dist.items() if hops <= depth - 1 and v != root]
        assert len(near) == 2**depth - 2  # the internal nodes
        assert not ds.x[near].any()


def sum_propagate(ds: NodeDataset, h: np.ndarray, steps: int, reverse: bool = False) -> np.ndarray:
    """``steps`` rounds of h[v] <- sum_{(u, v) in E} h[u] (no self-loops)."""
    src, dst = ds.graph.edge_index
    if reverse:
        src, dst = dst, src
    a = sp.csr_matrix((np.ones(src.size), (dst, src)), shape=(ds.num_nodes,) * 2)
    for _ in range(steps):
        h = a @ h
    return h


def test_depth_rounds_of_message_passing_solve_it_fewer_do_not() -> None:
    # A hand-made `depth`-layer solution: each leaf sends the outer product
    # count (x) label; `depth` rounds of sum aggregation deliver to each root the
    # table T[k, c] = #leaves with count k and label c; the root reads the row of
    # its own count, which holds exactly one leaf. This fails if edges point the
    # wrong way or the leaves are not `depth` hops out.
    depth, c, k = 3, 4, 8
    ds = tree_neighbors_match(depth, 200, seed=11)
    labels, counts = ds.x[:, :c], ds.x[:, c : c + k]
    leaf_only = labels.any(1)[:, None]
    h = (leaf_only * counts)[:, :, None] * labels[:, None, :]  # (N, K, C)
    roots = np.flatnonzero(ds.train_mask)
    root_count = counts[roots].argmax(1)

    def read(table: np.ndarray) -> np.ndarray:
        return table.reshape(-1, k, c)[roots, root_count]  # (T, C)

    rows = read(sum_propagate(ds, h.reshape(ds.num_nodes, -1), depth))
    np.testing.assert_array_equal(rows.sum(1), 1)  # exactly one matching leaf
    np.testing.assert_array_equal(rows.argmax(1), ds.y[roots])
    for steps in range(depth):  # shallower: the root has received nothing
        assert not read(sum_propagate(ds, h.reshape(ds.num_nodes, -1), steps)).any()
    assert not read(sum_propagate(ds, h.reshape(ds.num_nodes, -1), depth, reverse=True)).any()


# -- the root's own row does not give the answer -------------------------------------------


def test_root_label_not_recoverable_from_root_features() -> None:
    ds = tree_neighbors_match(3, 4000, seed=2)
    roots = np.flatnonzero(ds.train_mask)
    assert not ds.x[roots, :4].any()  # no label block at the root
    # The root row is (count one-hot, flag): test count against target for
    # independence. Fixed seed, so this is deterministic; under independence the
    # p-value is uniform, and 1e-3 leaves room.
    root_count = ds.x[roots, 4:12].argmax(1)
    table = np.zeros((8, 4))
    np.add.at(table, (root_count, ds.y[roots]), 1)
    assert chi2_contingency(table).pvalue > 1e-3
    # Sanity of the test itself: a leaking variant (target = count % 4) is caught.
    leaky = np.zeros((8, 4))
    np.add.at(leaky, (root_count, root_count % 4), 1)
    assert chi2_contingency(leaky).pvalue < 1e-6


def test_label_and_count_balance() -> None:
    # Root targets are uniform on C classes and root counts on K values: each
    # bin ~ Binomial(T, 1/B), held to 4 standard deviations (fixed seed).
    t = 4000
    ds = tree_neighbors_match(4, t, seed=7, num_classes=8, num_counts=5)
    roots = np.flatnonzero(ds.train_mask)
    for values, bins in ((ds.y[roots], 8), (ds.x[roots, 8:13].argmax(1), 5)):
        hist = np.bincount(values, minlength=bins)
        assert hist.size == bins
        sigma = np.sqrt(t * (1 / bins) * (1 - 1 / bins))
        assert np.abs(hist - t / bins).max() <= 4 * sigma, hist
    # Which leaf matches is uniform over the 16 leaf positions too.
    r = per_tree(ds, 4, 8, 5)
    position = (r["leaf_count"] == r["root_count"][:, None]).argmax(1)
    hist = np.bincount(position, minlength=16)
    assert np.abs(hist - t / 16).max() <= 4 * np.sqrt(t / 16 * (15 / 16)), hist


# -- seeds and splits ----------------------------------------------------------------------


def test_determinism_and_seeds() -> None:
    a = tree_neighbors_match(4, 50, seed=9)
    b = tree_neighbors_match(4, 50, seed=9)
    for field in ("x", "y", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    np.testing.assert_array_equal(a.graph.edge_index, b.graph.edge_index)
    c = tree_neighbors_match(4, 50, seed=10)
    assert not np.array_equal(a.x, c.x) and not np.array_equal(a.y, c.y)
    # The split has its own stream: another train_fraction, the same trees.
    d = tree_neighbors_match(4, 50, seed=9, train_fraction=0.5)
    np.testing.assert_array_equal(a.x, d.x)
    np.testing.assert_array_equal(a.y, d.y)
    e = tree_neighbors_match(4, 50, seed=10, train_fraction=0.5)
    assert not np.array_equal(d.train_mask, e.train_mask)


@pytest.mark.parametrize(
    ("num_trees", "fraction", "sizes"),
    [(10, 1.0, (10, 0, 0)), (10, 0.7, (7, 1, 2)), (9, 0.6, (5, 2, 2)), (3, 0.2, (1, 1, 1))],
)
def test_split_sizes(num_trees: int, fraction: float, sizes: tuple[int, int, int]) -> None:
    ds = tree_neighbors_match(2, num_trees, seed=4, train_fraction=fraction)
    got = tuple(int(m.sum()) for m in (ds.train_mask, ds.val_mask, ds.test_mask))
    assert got == sizes
    check_invariants(ds, 2, 4, 8)  # masks disjoint, roots only, every root once


@given(
    depth=st.integers(2, 6),
    num_trees=st.integers(1, 6),
    log_classes=st.integers(1, 6),
    num_counts=st.integers(2, 10),
    fraction=st.sampled_from([1.0, 0.75, 0.5]),
    seed=seeds(),
)
def test_invariants_hold_for_any_draw(
    depth: int, num_trees: int, log_classes: int, num_counts: int, fraction: float, seed: int
) -> None:
    num_classes = 2 ** min(log_classes, depth)
    if round(fraction * num_trees) < 1:
        with pytest.raises(ValueError, match="leaves no training root"):
            tree_neighbors_match(depth, num_trees, seed=seed, train_fraction=fraction)
        return
    ds = tree_neighbors_match(
        depth,
        num_trees,
        seed=seed,
        train_fraction=fraction,
        num_classes=num_classes,
        num_counts=num_counts,
    )
    check_structure(ds, depth)
    check_invariants(ds, depth, num_classes, num_counts)


def test_alon_yahav_sizes() -> None:
    # num_classes = num_counts = 2**depth: one class per leaf, as in Alon & Yahav.
    ds = tree_neighbors_match(3, 20, seed=0, num_classes=8, num_counts=8)
    check_invariants(ds, 3, 8, 8)
    r = per_tree(ds, 3, 8, 8)
    assert (np.sort(r["leaf_label"], axis=1) == np.arange(8)).all()  # a permutation


# -- argument validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"depth": 1}, ValueError, r"depth must be in \[2, 16\], got 1"),
        ({"depth": 17}, ValueError, r"depth must be in \[2, 16\]"),
        ({"depth": 3.0}, TypeError, "depth must be an int, got float"),
        ({"depth": True}, TypeError, "depth must be an int, got bool"),
        ({"num_trees": 0}, ValueError, "num_trees must be >= 1, got 0"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
        ({"num_classes": 1}, ValueError, "num_classes must be >= 2"),
        ({"num_classes": 3}, ValueError, r"must divide the number of leaves 2\*\*depth = 16"),
        ({"num_classes": 32}, ValueError, "use a power of two <= 16"),
        ({"num_counts": 1}, ValueError, "num_counts must be >= 2"),
        ({"train_fraction": 0.0}, ValueError, r"train_fraction must lie in \(0, 1\]"),
        ({"train_fraction": 1.5}, ValueError, r"train_fraction must lie in \(0, 1\]"),
        ({"train_fraction": "all"}, TypeError, "train_fraction must be a float"),
        ({"num_trees": 3, "train_fraction": 0.1}, ValueError, "leaves no training root"),
    ],
)
def test_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    args = {"depth": 4, "num_trees": 5, **kwargs}
    with pytest.raises(error, match=match):
        tree_neighbors_match(**args)
