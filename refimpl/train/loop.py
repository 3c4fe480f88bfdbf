"""Training of a node classifier (full batch or random node batches), with model selection, logs,
learning-rate schedules and checkpoints.

One epoch (with ``batch_size``: steps 1-4 once per batch, each on the subgraph its nodes
induce, NodeFormer Sec. 4.2; steps 5-8 on the whole graph). Batches cut a random permutation
of every node (``batch_nodes="all"``; a batch without training nodes is skipped) or, as
NodeFormer's ``main-batch.py``, of the training nodes only (``batch_nodes="train"``):

    1. forward in training mode (dropout drawn from the run's generator)
    2. loss on the training nodes (cross-entropy, or BCE for multi-label targets: over
       their observed entries where labels are missing, ``dataset.y_mask``),
       plus ``model.auxiliary_loss(cache)`` where the model has one (NodeFormer's
       ``lambda L_e``, whose gradient its backward includes)
    3. backward: gradients of every parameter; stop if any is non-finite, or if the
       loss grew by orders of magnitude (``refimpl.train.guards``)
    4. optimiser step at the schedule's learning rate (``config.schedule``); stop if a
       parameter or the optimiser's state became non-finite, or if the update changed no
       parameter although a gradient is non-zero; a schedule stepped per batch steps here
    5. forward in evaluation mode: train / val / test accuracy of the updated model
    6. model selection: the epoch with the best validation accuracy (the first,
       on ties) and its test accuracy, as both papers report; a dataset without
       validation nodes (TREES with ``train_fraction=1``) selects the last epoch. A
       schedule stepped per epoch steps here: ``ReduceLROnPlateau`` on the validation loss
       (``mode="min"``) or accuracy (``mode="max"``)
    7. one JSON line in ``log.jsonl`` (``train_loss`` is step 2's sum; a model with an
       auxiliary loss also logs ``supervised_loss`` and ``auxiliary_loss`` apart, a
       schedule ``lr``, the rate of the epoch's last step); a checkpoint every
       ``checkpoint_every``
    8. stop early once the training loss is below ``loss_threshold``
       (GAT-balance's protocol stops at 1e-4)

Determinism: parameters are drawn from ``default_rng([seed, 0])``, dropout (and
the batches, each epoch's permutation before that epoch's noise) from
``default_rng([seed, 1])``; a run resumed from a checkpoint restores the
parameters, the optimiser state, the schedule's state and the dropout generator, so it
ends bit-identical to a run that was never interrupted.

For multi-label targets (``y`` of shape ``(N, K)``) the "accuracy" columns hold
the macro ROC-AUC instead. With missing labels (``dataset.y_mask``) ``train_loss`` is the
mean over the training nodes' observed entries (batches weighted by their count of them), and
each task's ROC-AUC reads the split's observed entries, tasks without both classes there left
out (OGB's rule for ogbn-proteins). A split without nodes (or observed labels; multi-label:
without a task with both classes there) scores NaN (an empty training mask is an error: there
is nothing to fit), written as ``null`` in the strict-JSON log.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.backend import asarray, backend_name, get_array_module, is_sparse, to_numpy
from refimpl.diagnostics import (
    balancedness_summary,
    conservation_residuals,
    fraction_changed,
    grad_norms,
    relative_grad_norms,
)
from refimpl.metrics import accuracy, roc_auc
from refimpl.ops.losses import BCEWithLogits, SoftmaxCrossEntropy
from refimpl.optim import make_optimizer
from refimpl.schedules import with_lr
from refimpl.train.checkpoint import atomic_savez, save_checkpoint
from refimpl.train.config import RunResult, TrainConfig
from refimpl.train.guards import TrainingDiverged, checked_forward, deferred_step
from refimpl.train.node_data import label_masks, node_batches
from refimpl.train.node_step import node_step
from refimpl.train.records import strict_json
from refimpl.train.resume import data_fingerprint, diagnostic_baselines, restore_run, truncate_log
from refimpl.train.run_folder import write_json
from refimpl.train.run_lock import run_folder_lock
from refimpl.validation import check_sparse_input

__all__ = ["RunResult", "TrainConfig", "TrainingDiverged", "relative_grad_norms", "train_model"]


def train_model(
    model: Any,
    dataset: Any,
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    progress: bool | str = False,
    backend: str | None = None,
) -> RunResult:
    """Train ``model`` on ``dataset`` (a ``refimpl.data.NodeDataset``); see the module docstring.

    Parameters
    ----------
    model : GAT, NodeFormer or a model with their interface
        A node classifier: ``init_params``, ``forward(params, x, graph, ...)``, ``backward``.
    dataset : NodeDataset
        Features, labels, graph and masks; the dtype of ``dataset.x`` sets the training
        precision, and ``train_mask`` must select a node.
    config : TrainConfig
        How to train.
    out_dir : str or pathlib.Path, optional
        The run folder, locked for the run (:func:`refimpl.train.run_lock.run_folder_lock`:
        another process writing it is refused). It receives ``log.jsonl``, ``final.npz``,
        ``summary.json`` and, with ``checkpoint_every``, ``checkpoint.npz``. With
        ``config.diagnostics`` each log line also holds ``balancedness`` and
        ``conservation`` (per hidden layer), and the run writes ``initial.npz``,
        ``best.npz`` (the parameters at the best validation epoch) and ``changes.json``:
        per layer, the fraction of parameters whose change exceeds 0, 0.05 and 0.5
        (``refimpl.diagnostics.fraction_changed``). ``None``: nothing is written.
    resume : str or pathlib.Path, optional
        A ``checkpoint.npz`` to continue from, written training on the same data
        (:func:`refimpl.train.resume.data_fingerprint`).
    progress : bool or str, default False
        A tqdm bar per epoch; a string labels it (``"seed 3"``).
    backend : {"numpy", "cupy", "strict"} or None, default None
        Where the run computes (the data is moved there); ``None``: the global backend.

    Returns
    -------
    RunResult
        The accuracies at the best validation epoch and the final parameters.
    """
    if out_dir is None:
        return _train(model, dataset, config, None, resume, progress, backend)
    with run_folder_lock(out_dir, "refimpl.train.train_model"):
        return _train(model, dataset, config, Path(out_dir), resume, progress, backend)


def _train(
    model: Any,
    dataset: Any,
    config: TrainConfig,
    out: Path | None,
    resume: str | Path | None,
    progress: bool | str,
    backend: str | None,
) -> RunResult:
    """:func:`train_model`, its folder (if any) locked."""
    x = asarray(dataset.x, backend=backend)
    if is_sparse(x):  # the batches index it (compiled code) before the model checks it
        check_sparse_input(x, "x", x.shape[1])
    y = asarray(dataset.y, backend=backend)
    masks = {
        split: asarray(getattr(dataset, f"{split}_mask"), backend=backend)
        for split in ("train", "val", "test")
    }
    if not bool(masks["train"].any()):
        raise ValueError(
            "the dataset's train_mask selects no node, so there is no loss to train on; "
            "set masks with dataset.with_masks(train, val, test) or refimpl.data.random_split"
        )
    scored, empty = label_masks(dataset, backend)  # (N,) rows or (N, K) observed entries
    schedule = config.schedule
    if getattr(schedule, "needs_metric", False) and "val" in empty:
        raise ValueError(
            "ReduceLROnPlateau watches the validation split, but val_mask is empty (or holds "
            "no observed label, or no task with both classes)"
        )
    train_rows = np.flatnonzero(to_numpy(masks["train"])) if config.batch_nodes == "train" else None
    graph = dataset.graph
    multi_label = y.ndim == 2
    loss_block = BCEWithLogits() if multi_label else SoftmaxCrossEntropy()
    if multi_label:
        y = y.astype(x.dtype)
    # the full batch's loss rows and label checks, made once for the run, not every step
    full_batch_targets, full_batch_count = scored["train"], int(scored["train"].sum())
    if not multi_label and hasattr(model, "out_channels"):
        full_batch_targets = loss_block.select(y, scored["train"], model.out_channels, x.dtype)
    optimizer = make_optimizer(config.optimizer, lr=config.lr, weight_decay=config.weight_decay)

    params = model.init_params(
        np.random.default_rng([config.seed, 0]), init=config.init, backend=backend, dtype=x.dtype
    )
    opt_state = optimizer.init(params)
    schedule_state = schedule.init(config.lr) if schedule is not None else None
    dropout_rng = np.random.default_rng([config.seed, 1])
    best = {"epoch": -1, "val_acc": -math.inf, "test_acc": math.nan}
    start, train_loss = 0, math.nan
    keeps_state = out is not None and config.checkpoint_every
    fingerprint = data_fingerprint(dataset) if keeps_state or resume is not None else None
    if resume is not None:
        restored = restore_run(
            resume, params, optimizer, dropout_rng, config.epochs, fingerprint, None, schedule
        )
        params, opt_state, start, best, train_loss, _, schedule_state = restored
    if out is not None:
        truncate_log(out, start)
    # Diagnostics compare the parameters at the best epoch with the initial ones;
    # a resumed run finds both beside its checkpoint.
    initial = best_params = None
    if config.diagnostics:
        initial, best_params = diagnostic_baselines(out, params, resume)
    epochs = range(start, config.epochs)
    if progress:
        from tqdm import tqdm

        label = progress if isinstance(progress, str) else None  # "seed 3"
        epochs = tqdm(  # disable=None: off where the output is no terminal (no \r in logs)
            epochs, initial=start, total=config.epochs, unit="epoch", leave=False, desc=label,
            disable=None,
        )  # fmt: skip

    def metric(logits: Any, split: str) -> float:
        if split in empty:
            return math.nan
        mask = scored[split]
        return roc_auc(logits, y, mask) if multi_label else accuracy(logits, y, mask)

    # Without dropout the training forward of epoch t+1 equals the evaluation
    # forward of epoch t (same parameters, no noise drawn), so it is reused: a
    # third less work per epoch, bit-identical results.
    deterministic = bool(getattr(model, "deterministic_training", False))
    deterministic = deterministic and config.batch_size is None
    reused = None
    epoch = start - 1
    x_backend = backend_name(get_array_module(x))
    for epoch in epochs:
        batches = [None]
        if config.batch_size is not None:
            batches = node_batches(x.shape[0], config.batch_size, dropout_rng, train_rows)
        weighted_loss, weighted_auxiliary, weight = 0.0, 0.0, 0
        for batch in batches:
            if batch is None:  # full batch
                data, count = (x, y, full_batch_targets, graph), full_batch_count
            else:  # the nodes of one batch and the edges among them (NodeFormer Sec. 4.2)
                rows = asarray(batch, backend=x_backend)
                data = (x[rows], y[rows], scored["train"][rows], graph.subgraph(batch))
                if not bool(data[2].any()):
                    continue  # no training node (observed label): nothing to fit
                count = int(data[2].sum())
            if schedule is not None:  # the rate is the optimiser's only field a schedule sets
                step_lr = schedule_state["lr"]
                optimizer = with_lr(optimizer, step_lr)
            # 1-4 forward in training mode, loss, backward, optimiser step; on a device every
            # finiteness check of the step is read at once, at its end (guards.deferred_step)
            step = (model, params, opt_state, optimizer, reused, data, loss_block, epoch)
            step_loss, auxiliary, grads, updated = deferred_step(
                lambda step=step: node_step(*step, dropout_rng), dropout_rng
            )
            reused = None
            weighted_loss, weight = weighted_loss + step_loss * count, weight + count
            weighted_auxiliary += auxiliary * count
            step_params, step_grads = params, grads  # the epoch's last step is logged
            params, opt_state = updated
            if schedule is not None and config.schedule_every == "batch":
                schedule_state = schedule.step(schedule_state)
        train_loss = weighted_loss / weight
        # the model's auxiliary loss (NodeFormer's lambda L_e) is part of train_loss; it is
        # also logged apart, with the supervised part, so the two can be told apart
        auxiliary_record = {}
        if getattr(model, "auxiliary_loss", None) is not None:
            auxiliary = weighted_auxiliary / weight
            auxiliary_record = {
                "supervised_loss": train_loss - auxiliary,
                "auxiliary_loss": auxiliary,
            }
        norms = relative_grad_norms(step_params, step_grads)
        absolute_norms = grad_norms(step_params, step_grads)
        # GAT-balance diagnostics of the parameters the gradient was taken at
        balance_record = _balance_record(step_params, step_grads) if config.diagnostics else {}
        # 5-6 evaluate the updated model, select on validation accuracy
        eval_logits, eval_cache = checked_forward(model, params, epoch, x, graph, training=False)
        reused = (eval_logits, eval_cache) if deterministic else None
        accs = {split: metric(eval_logits, split) for split in masks}
        schedule_record = {} if schedule is None else {"lr": step_lr}
        if schedule is not None and config.schedule_every == "epoch":
            watched = accs["val"] if schedule.needs_metric else None  # accuracy or ROC-AUC
            if schedule.needs_metric and schedule.mode == "min":  # the validation loss
                watched = float(loss_block.forward({}, eval_logits, y, scored["val"])[0])
            schedule_state = schedule.step(schedule_state, watched)
        if "val" in empty or accs["val"] > best["val_acc"]:
            best = {"epoch": epoch, "val_acc": accs["val"], "test_acc": accs["test"]}
            if config.diagnostics:
                best_params = params
        # 7 log and checkpoint
        record = {
            "epoch": epoch,
            "train_loss": train_loss,
            **auxiliary_record,
            **{f"{split}_acc": value for split, value in accs.items()},  # train, val, test
            "grad_norms": norms,
            "grad_abs": absolute_norms,
            **balance_record,
            **schedule_record,
        }
        if out is not None:
            with open(out / "log.jsonl", "a") as stream:
                stream.write(strict_json(record) + "\n")  # NaN (an empty split) as null
        if progress:
            epochs.set_postfix(loss=f"{train_loss:.4f}", **{k: f"{v:.3f}" for k, v in accs.items()})
        stop = config.loss_threshold is not None and train_loss < config.loss_threshold
        if (
            out is not None
            and config.checkpoint_every
            and ((epoch + 1) % config.checkpoint_every == 0 or stop or epoch + 1 == config.epochs)
        ):
            state = {"epoch": epoch + 1, "best": best, "train_loss": train_loss}
            state["data"] = fingerprint
            if config.diagnostics:
                atomic_savez(out / "best.npz", {k: to_numpy(v) for k, v in best_params.items()})
            extra = {} if schedule is None else {"schedule_state": schedule_state}
            save_checkpoint(out / "checkpoint.npz", params, opt_state, dropout_rng, state, **extra)
        # 8 early stop on the training loss
        if stop:
            break
    if progress:
        epochs.close()

    result = RunResult(
        config.seed, best["epoch"], best["val_acc"], best["test_acc"], epoch + 1, train_loss, params
    )
    if out is not None:
        atomic_savez(out / "final.npz", params)
        # the epochs asked for beside those run: a later resume tells a finished run
        # (or one stopped early) from one to extend
        write_json(out / "summary.json", {**result.as_dict(), "epochs": config.epochs})
        if config.diagnostics:
            atomic_savez(out / "best.npz", {k: to_numpy(v) for k, v in best_params.items()})
            changed = {
                str(threshold): fraction_changed(initial, best_params, threshold)
                for threshold in CHANGE_THRESHOLDS
            }
            write_json(out / "changes.json", changed)
    return result


def _balance_record(params: dict, grads: dict) -> dict[str, Any]:
    """The log fields of ``config.diagnostics``: balancedness and the worst relative
    conservation residual, per hidden layer."""
    residuals = conservation_residuals(params, grads)
    return {
        "balancedness": balancedness_summary(params),
        "conservation": {f"layer{i}": float(r.relative.max()) for i, r in enumerate(residuals)},
    }


# Relative-change thresholds reported with diagnostics: any change (the complement
# of GAT-balance Fig. 8), Fig. 3a's 0.05 and Fig. 4a's 0.5.
CHANGE_THRESHOLDS = (0.0, 0.05, 0.5)
