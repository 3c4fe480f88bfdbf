"""Seeded train/val/test splits and the missing-feature setting.

``random_split`` is PyG ``RandomNodeSplit(split="random")`` with a NumPy
generator: per class, ``train_per_class`` nodes at random; then ``num_val`` and
``num_test`` nodes from a permutation of the rest. ``drop_features`` is the
missing-vector setting of LipschitzNorm Sec. 7.1 (Zhao & Akoglu 2020).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from refimpl.data.dataset import NodeDataset

__all__ = ["drop_features", "random_split"]


def _masks(n: int, *index_sets: np.ndarray) -> tuple[np.ndarray, ...]:
    out = []
    for index in index_sets:
        mask = np.zeros(n, dtype=bool)
        mask[index] = True
        out.append(mask)
    return tuple(out)


def random_split(
    y: np.ndarray,
    rng: np.random.Generator,
    *,
    train_per_class: int | None = None,
    fractions: tuple[float, float, float] | None = None,
    num_val: int = 500,
    num_test: int = 1000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint random ``(train, val, test)`` bool masks, each (N,).

    Parameters
    ----------
    y : array
        ``(N,)`` integer class ids (``train_per_class``), or any array with N rows
        (``fractions``).
    rng : numpy.random.Generator
        The only source of randomness: the same seed gives the same split.
    train_per_class : int, optional
        ``train_per_class`` training nodes from every class present in ``y``;
        then ``num_val`` validation and ``num_test`` test nodes drawn from the
        remaining ones (a uniformly random permutation). The default when
        neither ``train_per_class`` nor ``fractions`` is given: 20, the
        Planetoid setting.
    fractions : (train, val, test) floats, optional
        Shares of all N nodes, each >= 0, summing to at most 1, from one random
        permutation (sizes rounded down; not stratified). ``num_val``/``num_test`` are
        then ignored.
    num_val : int, default 500
        ``>= 0``: validation nodes (with ``train_per_class``), the Planetoid setting.
    num_test : int, default 1000
        ``>= 0``: test nodes (with ``train_per_class``), the Planetoid setting.

    Returns
    -------
    train, val, test : (N,) bool numpy.ndarray
        Pairwise disjoint masks.

    Raises
    ------
    ValueError
        Both modes given; a class with fewer than ``train_per_class`` nodes;
        fewer than ``num_val + num_test`` nodes left after training; bad fractions.
    """
    y = np.asarray(y)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    n = y.shape[0]
    if fractions is not None:
        if train_per_class is not None:
            raise ValueError("give train_per_class or fractions, not both")
        fractions = tuple(float(f) for f in fractions)
        if len(fractions) != 3 or min(fractions) < 0 or sum(fractions) > 1 + 1e-9:
            raise ValueError(
                f"fractions must be three non-negative shares (train, val, test) summing to "
                f"at most 1, got {fractions}"
            )
        sizes = np.floor(np.array(fractions) * n + 1e-9).astype(np.int64)  # (3,)
        ends = np.cumsum(sizes)
        perm = rng.permutation(n)
        return _masks(n, perm[: ends[0]], perm[ends[0] : ends[1]], perm[ends[1] : ends[2]])

    per_class = 20 if train_per_class is None else int(train_per_class)
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise ValueError(
            f"train_per_class needs (N,) integer class ids, got {y.dtype} array of shape "
            f"{y.shape}; use fractions= for multi-label data"
        )
    if per_class < 0 or num_val < 0 or num_test < 0:
        raise ValueError("train_per_class, num_val and num_test must be >= 0")
    classes, counts = np.unique(y, return_counts=True)
    small = counts < per_class
    if small.any():
        detail = ", ".join(
            f"class {c} has {k}" for c, k in zip(classes[small], counts[small], strict=True)
        )
        raise ValueError(
            f"too few nodes for train_per_class={per_class}: {detail}; lower train_per_class "
            "or use fractions="
        )
    train = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_class] for c in classes])
    rest = np.setdiff1d(np.arange(n), train)
    if rest.size < num_val + num_test:
        raise ValueError(
            f"only {rest.size} nodes remain after {train.size} training nodes, fewer than "
            f"num_val + num_test = {num_val} + {num_test}"
        )
    rest = rng.permutation(rest)
    return _masks(n, train, rest[:num_val], rest[num_val : num_val + num_test])


def drop_features(dataset: NodeDataset, p: float, rng: np.random.Generator) -> NodeDataset:
    """Zero the feature vectors of a fraction ``p`` of the non-training nodes.

    LipschitzNorm Sec. 7.1 (after Zhao & Akoglu 2020): for a subset ``M`` of the
    unlabelled nodes ``V_u`` (here every node outside ``train_mask``) the rows
    ``X_j, j in M`` are removed, with ``p = |M| / |V_u|``. ``|M| = round(p |V_u|)``
    nodes are drawn without replacement; ``p = 1`` is the paper's 100 % setting.
    Training rows are never touched.

    Parameters
    ----------
    dataset : NodeDataset
        The dataset; its ``x`` is copied, never changed.
    p : float
        In $[0, 1]$: the fraction of non-training nodes whose features are zeroed.
    rng : numpy.random.Generator
        Draws the nodes.

    Returns
    -------
    NodeDataset
        A new dataset (``x`` copied; same name, graph, labels and masks).
    """
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    unlabelled = np.flatnonzero(~dataset.train_mask)  # V_u
    count = round(p * unlabelled.size)
    missing = rng.choice(unlabelled, size=count, replace=False)  # M
    x = dataset.x.copy()
    x[missing] = 0
    return dataclasses.replace(dataset, x=x)
