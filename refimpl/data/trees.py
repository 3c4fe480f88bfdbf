r"""TREES: the Tree-NeighborsMatch task of LipschitzNorm Sec. 7.2 (after Alon & Yahav 2021).

A long-range lookup: the root of a complete binary tree must read the label of
the one green leaf, ``depth`` hops away, whose count of blue neighbours equals
its own. Message passing with fewer than ``depth`` layers sees nothing of the
leaves, so it can do no better than chance.

Definition (one tree, ``d = depth``; ``L = 2**d`` green leaves)
----------------------------------------------------------------
Nodes
    The complete binary tree of depth ``d``: ``n = 2**(d+1) - 1`` nodes in heap
    order, node ``i`` the parent of ``2i+1`` and ``2i+2``, level ``l`` holding
    nodes ``[2**l - 1, 2**(l+1) - 1)``. Node 0 is the root, nodes
    ``[L - 1, n)`` (level ``d``) the leaves.
Colours
    Green: the root and the ``L`` leaves. Uncoloured: the ``L - 2`` internal
    nodes (levels ``1 .. d-1``). The blue neighbours are *not* nodes: each green
    node carries their number ("count", in ``{1, ..., K}``) as a one-hot attribute.
Counts
    The root's count ``c`` is uniform on ``{1..K}``; one leaf ``m``, uniform among
    the ``L``, also gets ``c``; every other leaf gets a count uniform on
    ``{1..K} \ {c}``, independently. So exactly one leaf matches the root.
Labels
    Each tree's leaves get the labels ``0, 1, ..., C-1`` each exactly ``L / C``
    times, in a uniformly random order (``C`` must divide ``L``). The root's
    label, the target, is the label of leaf ``m``: uniform on ``{0..C-1}`` and
    independent of everything the root itself carries. Balanced leaf labels keep
    the label histogram, which a shallow pooling could read, uninformative.
Features ``x`` (n, F), ``F = C + K + 1``, float64
    columns ``[0, C)``: one-hot leaf label (leaves only; zero at the root and the
    internal nodes: the root's label is nowhere in its own row);
    columns ``[C, C + K)``: one-hot count, count ``k`` in column ``C + k - 1``
    (root and leaves; zero at internal nodes);
    column ``C + K``: 1 at the root (it tells the root from a leaf of equal count).
Edges
    ``child -> parent`` in the ``refimpl.Graph`` convention (row 0 the source,
    messages flow ``u -> v``): ``N(v)`` is ``v``'s two children, information flows
    from the leaves to the root, and the root is reachable from every node
    while it reaches none. Every leaf is exactly ``d`` edges from the root, so a
    ``d``-layer message-passing network can solve the task (LipschitzNorm and
    Alon & Yahav train ``d + 1`` layers) and one with fewer layers computes the
    same root output for every tree with the same root count. No self-loops
    (the attention layers add them).

The dataset is the disjoint union of ``num_trees`` such trees, tree ``t`` on nodes
``[t n, (t+1) n)``, its root ``t n``. ``y`` of *every* node is its tree's target
(only the roots appear in the masks; a leaf's own label is in its features).

Reconciling the sources
-----------------------
Alon & Yahav (2021, Sec. 4.1) hang the blue neighbours off the green nodes of the
last level; in their code the blue neighbours are not nodes but the leaf's key
(its count), leaf keys are a permutation of ``1..L``, labels a permutation of
``1..L`` (``L`` classes), the root's key uniform, edges point to the root, and a
tree of depth ``d`` has ``2**(d+1) - 1`` nodes. LipschitzNorm's "leaves blue, the
root and the predecessors of the leaves green" describes the same tree with the
blue neighbours drawn in: the green nodes are the parents of the (virtual) blue
leaves, which the paper, like Alon & Yahav, does not materialise ("encoded ...
with 1-hot vectors of their cardinality as node attributes of the green
nodes"). Our "leaf-parents" are therefore the leaves of the stored tree, and
``depth`` is the root-to-green distance, as in Alon & Yahav, whose ``d + 1``
layers the paper copies. Two departures from Alon & Yahav, both so that the
one-hot features stay small at depth 10 (``L = 1024``): ``C`` classes instead of
``L`` and ``K`` counts drawn as above instead of a permutation of ``1..L``. With
``num_classes = num_counts = 2**depth`` the task is Alon & Yahav's except that
their non-matching keys are distinct. The paper gives neither ``C`` nor ``K``;
the default ``C = 4`` puts chance at 25 %, the level below which the paper's
failing variants sit at depth 10.
"""

from __future__ import annotations

import numpy as np

from refimpl.data.dataset import NodeDataset
from refimpl.graph import Graph

__all__ = ["MAX_DEPTH", "tree_neighbors_match"]

MAX_DEPTH = 16  # 131071 nodes per tree; the paper's range is 2..10


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {span}, got {value}")
    return int(value)


def tree_neighbors_match(
    depth: int = 4,
    num_trees: int = 1000,
    *,
    seed: int = 0,
    train_fraction: float = 1.0,
    num_classes: int = 4,
    num_counts: int = 8,
) -> NodeDataset:
    """The TREES dataset (LipschitzNorm Sec. 7.2): ``num_trees`` trees in one graph.

    The exact definition is in the module docstring.

    Parameters
    ----------
    depth : int in ``[2, MAX_DEPTH]``
        ``d``: the distance from each root to its green leaves (paper: 2..10).
    num_trees : int >= 1
        Trees in the disjoint union (paper: 5000 per depth).
    seed : int >= 0
        Seeds everything. The trees and the split come from two independent
        streams (``numpy.random.SeedSequence(seed).spawn(2)``), so the trees of a
        seed do not depend on ``train_fraction``.
    train_fraction : float in ``(0, 1]``
        ``round(train_fraction * num_trees)`` random roots (at least one) form the
        training mask; the other roots are split between validation
        (``floor(rest / 2)``) and test (the remainder). 1.0: every root trains
        and the validation and test masks are empty (the paper reports training
        accuracy). Non-root nodes are in no mask.
    num_classes : int ``C >= 2`` dividing ``2**depth`` (a power of two)
        Leaf labels are balanced within each tree, which needs ``C | 2**depth``.
    num_counts : int ``K >= 2``
        Blue-neighbour counts range over ``1..K``.

    Returns
    -------
    NodeDataset
        ``N = num_trees * (2**(depth+1) - 1)`` nodes, ``E = num_trees * (2**(depth+1) - 2)``
        directed edges child -> parent, ``x`` (N, C + K + 1) float64, ``y`` (N,)
        int64 (each tree's target on all its nodes), masks over the roots only.
        Named ``trees(depth=d)``.
    """
    d = _check_int("depth", depth, 2, MAX_DEPTH)
    t = _check_int("num_trees", num_trees, 1)
    seed = _check_int("seed", seed, 0)
    c = _check_int("num_classes", num_classes, 2)
    k = _check_int("num_counts", num_counts, 2)
    leaves = 2**d  # L
    if leaves % c:
        raise ValueError(
            f"num_classes must divide the number of leaves 2**depth = {leaves} (each tree's "
            f"leaves carry every label equally often), got {c}; use a power of two <= {leaves}"
        )
    if isinstance(train_fraction, bool) or not isinstance(
        train_fraction, (int, float, np.floating, np.integer)
    ):
        raise TypeError(f"train_fraction must be a float, got {type(train_fraction).__name__}")
    if not 0.0 < float(train_fraction) <= 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1], got {train_fraction}")
    num_train = round(float(train_fraction) * t)
    if num_train < 1:
        raise ValueError(
            f"train_fraction={train_fraction} of {t} trees leaves no training root; "
            f"raise it to at least {1 / t:.3g}"
        )
    data_rng, split_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))

    n = 2 * leaves - 1  # nodes per tree
    first_leaf = leaves - 1  # heap index of the leftmost leaf
    offset = np.arange(t, dtype=np.int64) * n  # (T,) root of each tree

    # Edges child -> parent, tree by tree (heap order: parent of i is (i - 1) // 2).
    child = np.arange(1, n, dtype=np.int64)  # (n - 1,)
    src = (offset[:, None] + child).ravel()  # (T (n - 1),)
    dst = (offset[:, None] + (child - 1) // 2).ravel()
    graph = Graph(np.stack([src, dst]), t * n)

    # Counts, 0-based (count k + 1 is stored as k): the root's, the matching leaf's
    # position, and the others uniform on the K - 1 values != the root's.
    root_count = data_rng.integers(0, k, size=t)  # (T,)
    match = data_rng.integers(0, leaves, size=t)  # (T,) leaf position in [0, L)
    counts = data_rng.integers(0, k - 1, size=(t, leaves))  # (T, L)
    counts += counts >= root_count[:, None]  # skip the root's value
    rows = np.arange(t)
    counts[rows, match] = root_count
    # Labels: each of the C classes L / C times per tree, shuffled per tree.
    labels = data_rng.permuted(np.tile(np.arange(leaves) % c, (t, 1)), axis=1)  # (T, L)
    target = labels[rows, match]  # (T,)

    x = np.zeros((t, n, c + k + 1))  # (T, n, F)
    leaf = np.arange(first_leaf, n)  # (L,) heap indices of the leaves
    x[rows[:, None], leaf, labels] = 1.0  # label block
    x[rows[:, None], leaf, c + counts] = 1.0  # count block
    x[rows, 0, c + root_count] = 1.0
    x[rows, 0, c + k] = 1.0  # root flag
    y = np.repeat(target, n).astype(np.int64)  # (T n,)

    order = split_rng.permutation(t)
    num_val = (t - num_train) // 2
    masks = []
    for part in (
        order[:num_train],
        order[num_train : num_train + num_val],
        order[num_train + num_val :],
    ):
        mask = np.zeros(t * n, dtype=bool)
        mask[offset[part]] = True
        masks.append(mask)
    return NodeDataset(f"trees(depth={d})", graph, x.reshape(t * n, -1), y, *masks, num_classes=c)
