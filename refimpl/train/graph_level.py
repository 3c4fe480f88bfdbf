"""Training of a graph-level model (regression or multi-label classification) on mini-batches of
graphs, with model selection, logs and checkpoints.

One epoch:

    1. a random permutation of the training graphs, cut into batches of
       ``batch_size`` (the last may be smaller), each collated into one
       block-diagonal graph (``refimpl.data.collate``)
    2. per batch: the positional encodings' random sign flip (one sign per
       column, the usual augmentation for Laplacian eigenvectors, whose sign is
       arbitrary), the forward in training mode, the loss (L1 = MAE as on ZINC,
       MSE, or BCE for multi-label targets, averaged over the observed labels when some
       are missing: ``GraphDataset.y_mask``; a batch without any observed label is
       skipped), the backward and an optimiser step;
       the guards of ``refimpl.train.guards`` (a non-finite loss, gradient,
       parameter or optimiser state, a loss grown by orders of magnitude, a frozen
       optimiser) stop the run naming the layer
    3. evaluation of the updated model on the validation and test graphs (no
       flips, no dropout): the mean absolute error for regression, the macro
       ROC-AUC for multi-label targets (each task over its observed labels, OGB's rule)
    4. model selection at the best validation metric (lowest MAE, highest AUC;
       the first on ties), reporting the test metric there; without a validation
       metric (no validation graph, or multi-label labels that leave the ROC-AUC
       undefined there, NaN every epoch), the last epoch (as the node-level loop does)
    5. one JSON line in ``log.jsonl``; a checkpoint every ``checkpoint_every``

Determinism: parameters from ``default_rng([seed, 0])``; the permutations,
sign flips and dropout masks, in that order per batch, from ``default_rng([seed,
1])``. A run resumed from a checkpoint (parameters, model state, optimiser state, that
generator, the best epoch) ends bit-identical to one never interrupted.
Positional encodings are computed once per dataset (``laplacian_pe``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.backend import asarray
from refimpl.data.graph_batch import GraphBatch, collate
from refimpl.data.graph_dataset import GraphDataset
from refimpl.data.pointers import index_ranges
from refimpl.data.positional import laplacian_pe, random_sign_flip, random_walk_pe
from refimpl.metrics import roc_auc
from refimpl.nn.transformer.san_lpe import eigenpairs_padded
from refimpl.optim import make_optimizer
from refimpl.schedules import with_lr
from refimpl.train.checkpoint import atomic_savez, save_checkpoint
from refimpl.train.config import LOSSES, GraphRunResult, GraphTrainConfig
from refimpl.train.guards import (
    check_gradients,
    checked_backward,
    checked_forward,
    checked_step,
    loss_of_zero_output,
)
from refimpl.train.records import strict_json
from refimpl.train.resume import data_fingerprint, restore_run, truncate_log
from refimpl.train.run_folder import write_json
from refimpl.train.run_lock import run_folder_lock

__all__ = ["GraphRunResult", "GraphTrainConfig", "train_graph_model"]


class _Split:
    """One split's graphs with their positional encodings, batched on demand."""

    def __init__(self, dataset: GraphDataset, pe_dim: int, kind: str, dtype: Any) -> None:
        self.dataset, self.dtype = dataset, dtype
        self.pe = None
        if pe_dim and len(dataset):
            whole = collate(dataset, np.arange(len(dataset)))
            self.pe = _encodings(whole, pe_dim, kind).astype(dtype, copy=False)
        self._eval_batches: tuple[int, list] | None = None  # (batch size, batches)

    def batch(self, indices: np.ndarray) -> tuple[GraphBatch, Any]:
        """The collated graphs ``indices`` and their encodings (in the training dtype)."""
        batch = collate(self.dataset, indices)
        pe = None
        if self.pe is not None:
            node_ptr = self.dataset.node_ptr
            pe = self.pe[index_ranges(node_ptr[indices], np.diff(node_ptr)[indices])]
        return batch, pe

    def eval_batches(self, batch_size: int) -> list[tuple[GraphBatch, Any]]:
        """The split in order, in batches of ``batch_size``: built once, as evaluation reads
        the same batches every epoch (and the model caches per batch graph)."""
        if self._eval_batches is None or self._eval_batches[0] != batch_size:
            count = len(self.dataset)
            batches = [
                self.batch(np.arange(start, min(start + batch_size, count)))
                for start in range(0, count, batch_size)
            ]
            self._eval_batches = (batch_size, batches)
        return self._eval_batches[1]


def _encodings(batch: GraphBatch, columns: int, kind: str) -> np.ndarray:
    """The positional encodings of every node of ``batch``: ``(N, columns)`` Laplacian
    eigenvectors or random-walk return probabilities, or ``(N, columns, 3)`` padded eigenpairs
    (entries, eigenvalues, 1.0 where valid) for SAN's learned encoding."""
    if kind == "laplacian":
        return laplacian_pe(batch.graph, columns, batch.node_ptr)
    if kind == "random-walk":
        return random_walk_pe(batch.graph, columns, batch.batch)
    vectors, values, valid = eigenpairs_padded(batch.graph, columns, batch.node_ptr)
    return np.stack([vectors, values, valid.astype(np.float64)], axis=2)


def _init_state(model: Any, dtype: Any) -> dict[str, Any]:
    """The model's initial state beside its parameters (``model.init_state``), or none."""
    init_state = getattr(model, "init_state", None)
    return {} if init_state is None else init_state(dtype=dtype)


def _inputs(
    model: Any, batch: GraphBatch, pe: Any, dtype: Any, model_state: dict[str, Any]
) -> dict[str, Any]:
    """The model's forward arguments for one batch, in the training dtype."""
    edge_attr = batch.edge_attr.astype(dtype) if model.edge_dim is not None else None
    inputs = {
        "x": batch.x.astype(dtype),
        "graph": batch.graph,
        "edge_attr": edge_attr,
        "pe": pe,
        "batch": batch.batch,
        "num_graphs": batch.num_graphs,
    }
    if model_state:
        inputs["state"] = model_state
    return inputs


def _evaluate(
    model: Any,
    params: dict[str, Any],
    model_state: dict[str, Any],
    split: _Split,
    multi_label: bool,
    batch_size: int,
    epoch: int,
) -> float:
    """Mean absolute error (regression) or macro ROC-AUC (multi-label, over the observed
    labels: ``y_mask``) over a split."""
    outputs, targets = [], []
    for batch, pe in split.eval_batches(batch_size):
        inputs = _inputs(model, batch, pe, split.dtype, model_state)
        out, _ = checked_forward(model, params, epoch, **inputs)
        outputs.append(np.asarray(out, dtype=np.float64))
        targets.append(batch.y)
    out, y = np.concatenate(outputs), np.concatenate(targets)
    if multi_label:  # the eval batches hold the split in order: its y_mask lines up
        return roc_auc(out, y, split.dataset.y_mask)
    return float(np.abs(out - y).mean())


def _unscored(evaluated: dict[str, GraphDataset], multi_label: bool) -> dict[str, str]:
    """Why each of the ``evaluated`` splits that cannot be scored has no metric, by name.

    A split cannot be scored when it holds no graph or, for multi-label targets, when the
    macro ROC-AUC is undefined on it: no observed label, or no task with both a positive and
    a negative one (OGB's evaluator raises). Its metric is then NaN every epoch, as the
    node-level loop scores such a split (:func:`refimpl.train.node_data.label_masks`).
    Known before training, from the labels alone: :func:`refimpl.metrics.roc_auc` on
    constant scores says whether, and why, as its scores play no part in that.
    """
    reasons = {}
    for name, part in evaluated.items():
        if not len(part):
            reasons[name] = "the split holds no graph"
        elif multi_label:
            try:  # the labels are checked 0/1 by GraphDataset: only undefinedness is left
                roc_auc(np.zeros(part.y.shape), part.y, part.y_mask)
            except ValueError as err:
                reasons[name] = str(err)
    return reasons


def train_graph_model(
    model: Any,
    train: GraphDataset,
    val: GraphDataset,
    test: GraphDataset,
    config: GraphTrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    progress: bool = False,
) -> GraphRunResult:
    """Train a graph-level model on ``train``, selecting on ``val``; see the module docstring.

    Parameters
    ----------
    model : GraphTransformer or a model with its interface
        A graph-level model (``refimpl.models.GraphTransformer``): ``init_params``,
        ``forward`` and ``backward`` over a batch of graphs, ``pe_dim`` or
        ``lpe_eigenpairs``, ``edge_dim``.
    train, val, test : GraphDataset
        The splits; ``train`` must hold a graph with an observed label. ``val`` and ``test``
        may hold none, or (multi-label) no task with both a positive and a negative observed
        label: their metric, undefined, is then NaN (``null`` in ``log.jsonl``), the reason
        is in ``summary.json``'s ``unscored``, and without a validation metric the last
        epoch is selected.
    config : GraphTrainConfig
        How to train.
    out_dir : str or pathlib.Path, optional
        The run folder, locked for the run (:func:`refimpl.train.run_lock.run_folder_lock`:
        another process writing it is refused). It receives ``log.jsonl``, ``final.npz``
        (and ``final_state.npz`` for a model with state), ``summary.json`` and, with
        ``checkpoint_every``, ``checkpoint.npz``. ``None``: nothing is written.
    resume : str or pathlib.Path, optional
        A ``checkpoint.npz`` to continue from, written training on the same splits
        (:func:`refimpl.train.resume.data_fingerprint`); the run then ends bit-identical to
        one never interrupted.
    progress : bool, default False
        A tqdm bar over the epochs (needs tqdm), off where the output is no terminal.

    Returns
    -------
    GraphRunResult
        The metric at the best validation epoch and the final parameters.
    """
    if len(train) == 0:
        raise ValueError("the training split holds no graph; there is nothing to fit")
    if train.y_mask is not None and not train.y_mask.any():
        raise ValueError("the training split has no observed label; there is nothing to fit")
    if out_dir is None:
        return _train(model, (train, val, test), config, None, resume, progress)
    with run_folder_lock(out_dir, "refimpl.train.train_graph_model"):
        return _train(model, (train, val, test), config, Path(out_dir), resume, progress)


def _train(
    model: Any,
    data: tuple[GraphDataset, GraphDataset, GraphDataset],
    config: GraphTrainConfig,
    out: Path | None,
    resume: str | Path | None,
    progress: bool,
) -> GraphRunResult:
    """:func:`train_graph_model`, its folder (if any) locked."""
    train, val, test = data
    multi_label = train.task == "multilabel"
    loss_name = config.loss or ("bce" if multi_label else "l1")
    loss_block = LOSSES[loss_name]()
    if loss_name != "bce" and any(part.y_mask is not None for part in data):
        raise ValueError(
            f"GraphTrainConfig loss={loss_name!r} cannot skip missing labels; the data has "
            "some (y_mask): use loss='bce', which averages over the observed ones"
        )
    metric_name = "roc_auc" if multi_label else "mae"
    better = (lambda a, b: a > b) if multi_label else (lambda a, b: a < b)
    dtype = np.dtype(config.dtype)
    pe_dim = getattr(model, "lpe_eigenpairs", 0) or getattr(model, "pe_dim", 0)
    if bool(getattr(model, "lpe_eigenpairs", 0)) != (config.pe == "learned-laplacian"):
        raise ValueError(
            "GraphTrainConfig pe='learned-laplacian' goes with a model with lpe_eigenpairs "
            f"(SAN's learned encoding) and only with one; got pe={config.pe!r}"
        )
    splits = {
        name: _Split(data, pe_dim, config.pe, dtype)
        for name, data in [("train", train), ("val", val), ("test", test)]
    }
    optimizer = make_optimizer("adam", lr=config.lr, weight_decay=config.weight_decay)
    params = model.init_params(np.random.default_rng([config.seed, 0]), dtype=dtype)
    model_state = _init_state(model, dtype)  # BatchNorm's running statistics; {} without
    opt_state = optimizer.init(params)
    schedule = config.schedule
    # refused now, not at the first evaluation: a run that cannot select needs no epochs
    unscored = _unscored({"val": val, "test": test}, multi_label)
    if getattr(schedule, "needs_metric", False) and "val" in unscored:
        raise ValueError(
            "ReduceLROnPlateau watches the validation metric, which is undefined here "
            f"({unscored['val']}): give validation graphs it can score"
        )
    lr_state = None if schedule is None else schedule.init(config.lr)
    rng = np.random.default_rng([config.seed, 1])
    best = {"epoch": -1, "val": math.nan, "test": math.nan}
    start, train_loss = 0, math.nan
    keeps_state = out is not None and config.checkpoint_every
    fingerprint = data_fingerprint(*data) if keeps_state or resume is not None else None
    if resume is not None:
        restored = restore_run(
            resume, params, optimizer, rng, config.epochs, fingerprint, model_state, schedule
        )
        params, opt_state, start, best, train_loss, model_state, lr_state = restored
    if out is not None:
        truncate_log(out, start)
    epochs = range(start, config.epochs)
    if progress:
        from tqdm import tqdm

        # disable=None: off where the output is no terminal (a log file would fill with \r)
        epochs = tqdm(
            epochs, initial=start, total=config.epochs, unit="epoch", leave=False, disable=None
        )
    epoch = start - 1
    for epoch in epochs:
        # 1 the epoch's batches
        order = rng.permutation(len(train))
        weighted_loss, counted = 0.0, 0
        for begin in range(0, len(train), config.batch_size):
            indices = order[begin : begin + config.batch_size]
            mask = None if train.y_mask is None else train.y_mask[indices]  # (g, T) observed
            if mask is not None and not mask.any():
                continue  # no observed label: nothing to learn from this batch
            batch, pe = splits["train"].batch(indices)
            # 2 sign flip, forward, loss, backward, step
            if pe is not None and config.sign_flip and config.pe == "laplacian":
                pe, _ = random_sign_flip(pe, rng)
            inputs = _inputs(model, batch, pe, dtype, model_state)
            out_batch, cache = checked_forward(
                model, params, epoch, **inputs, training=True, rng=rng
            )
            if model_state:  # the running statistics this batch updated (BatchNorm)
                model_state = cache.state
            y = asarray(batch.y, dtype=dtype)
            if mask is not None:
                mask = asarray(mask)
            loss, loss_cache = loss_block.forward({}, out_batch, y, mask)
            d_out, _ = loss_block.backward({}, loss_cache, 1.0)
            grads = checked_backward(model, params, cache, d_out, epoch)
            check_gradients(
                float(loss), grads, epoch, loss_of_zero_output(loss_block, out_batch, y, mask)
            )
            if lr_state is not None:  # the scheduled rate; the optimiser's state carries over
                optimizer = with_lr(optimizer, lr_state["lr"])
            params, opt_state = checked_step(optimizer, params, grads, opt_state, epoch)
            weighted_loss += float(loss) * len(indices)
            counted += len(indices)
        train_loss = weighted_loss / counted if counted else math.nan
        # 3-4 evaluate and select
        scores = {
            name: math.nan
            if name in unscored
            else _evaluate(
                model, params, model_state, splits[name], multi_label, config.eval_batch_size, epoch
            )
            for name in ("val", "test")
        }
        if "val" in unscored or best["epoch"] < 0 or better(scores["val"], best["val"]):
            best = {"epoch": epoch, "val": scores["val"], "test": scores["test"]}
        # 5 log and checkpoint
        record = {"epoch": epoch, "train_loss": train_loss, f"val_{metric_name}": scores["val"]}
        if lr_state is not None:  # the rate this epoch trained with, then the next one's
            record["lr"] = lr_state["lr"]
            lr_state = schedule.step(lr_state, scores["val"] if schedule.needs_metric else None)
        record[f"test_{metric_name}"] = scores["test"]
        if out is not None:
            with open(out / "log.jsonl", "a") as stream:
                stream.write(strict_json(record) + "\n")  # NaN (an unscored split) as null
            last = epoch + 1 == config.epochs  # a finished run can be extended from here
            if config.checkpoint_every and ((epoch + 1) % config.checkpoint_every == 0 or last):
                saved = {"epoch": epoch + 1, "best": best, "train_loss": train_loss}
                saved["data"] = fingerprint
                scheduled = {} if lr_state is None else {"schedule_state": lr_state}
                save_checkpoint(
                    out / "checkpoint.npz", params, opt_state, rng, saved, model_state, **scheduled
                )
        if progress:
            epochs.set_postfix(loss=f"{train_loss:.4f}", val=f"{scores['val']:.4f}")
        if config.stop_below_lr is not None and lr_state["lr"] < config.stop_below_lr:
            break  # the study's rule: training ends once the schedule has cut the rate so far
    if progress:
        epochs.close()
    result = GraphRunResult(
        config.seed,
        metric_name,
        best["epoch"],
        best["val"],
        best["test"],
        epoch + 1,
        train_loss,
        params,
        model_state,
        unscored,  # why a metric is NaN: said once for the run, not on every log line
    )
    if out is not None:
        atomic_savez(out / "final.npz", params)
        if model_state:  # the statistics evaluation normalises with, beside the parameters
            atomic_savez(out / "final_state.npz", model_state)
        write_json(out / "summary.json", result.as_dict())
    return result
