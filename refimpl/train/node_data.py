"""What the node-level loop (:mod:`refimpl.train.loop`) reads from its dataset besides the
features: the masks its loss and its metric select with, and its random node batches."""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.backend import asarray

__all__ = ["label_masks", "node_batches"]


def label_masks(dataset: Any, backend: str | None) -> tuple[dict[str, Any], set[str]]:
    """Per split (``"train"``, ``"val"``, ``"test"``), what the loss and the metric select,
    on ``backend``, and the splits that cannot be scored.

    The selection is the split's mask (N,) as it is or, with missing labels
    (``dataset.y_mask`` (N, K)), the split's observed entries ``mask[:, None] & y_mask``
    (N, K): OGB's rule for ogbn-proteins' tasks (``ogb/nodeproppred/evaluate.py`` scores each
    task over its labelled nodes). A split cannot be scored when it selects nothing or, for
    multi-label targets, when no task has both a positive and a negative label among its
    selection (the macro ROC-AUC is then undefined; OGB's evaluator raises): the loop scores
    it NaN. A ``ValueError`` when the training nodes have no observed label (nothing to fit).
    """
    selected = {split: getattr(dataset, f"{split}_mask") for split in ("train", "val", "test")}
    y, y_mask = dataset.y, getattr(dataset, "y_mask", None)
    if y_mask is not None:
        selected = {split: mask[:, None] & y_mask for split, mask in selected.items()}  # (N, K)
        if not selected["train"].any():
            raise ValueError(
                "the training nodes have no observed label (y_mask is False on every one of "
                "their entries), so there is no loss to train on; check the split and y_mask"
            )
    unscored = set()
    for split, mask in selected.items():
        entries = mask if y.ndim == 1 or mask.ndim == 2 else mask[:, None]  # (N,) or (N, K)
        both = ((y == 1) & entries).any(axis=0) & ((y == 0) & entries).any(axis=0)
        if not mask.any() or (y.ndim == 2 and not both.any()):
            unscored.add(split)
    return {split: asarray(mask, backend=backend) for split, mask in selected.items()}, unscored


def node_batches(
    num_nodes: int, batch_size: int, rng: np.random.Generator, train_rows: np.ndarray | None
) -> list[np.ndarray]:
    """Batches of ``batch_size`` (the last may be smaller) cut from a permutation, drawn
    from the run's noise generator, of every node or of ``train_rows`` (the training nodes, as
    NodeFormer's ``main-batch.py``'s ``train_idx[randperm(n_train)]``; its
    ``n_train // batch_size + 1`` batches end with an empty one when ``batch_size`` divides
    ``n_train``: not here)."""
    rows = np.arange(num_nodes) if train_rows is None else train_rows
    order = rows[rng.permutation(rows.size)]  # (N,) or (n_train,) on the host
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
