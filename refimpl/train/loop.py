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
from dataclasses import asdict, dataclass, field
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
from refimpl.fields import (
    check_bool,
    check_choice,
    check_nonnegative_int,
    check_nonnegative_number,
    check_positive_int,
)
from refimpl.init import INITIALISERS
from refimpl.metrics import accuracy, roc_auc
from refimpl.ops.losses import BCEWithLogits, SoftmaxCrossEntropy
from refimpl.optim import OPTIMIZERS, make_optimizer
from refimpl.schedules import check_schedule, with_lr
from refimpl.train.checkpoint import atomic_savez, save_checkpoint
from refimpl.train.guards import (
    TrainingDiverged,
    check_gradients,
    checked_backward,
    checked_forward,
    checked_step,
    loss_of_zero_output,
)
from refimpl.train.node_data import label_masks, node_batches
from refimpl.train.records import strict_json
from refimpl.train.resume import data_fingerprint, diagnostic_baselines, restore_run, truncate_log
from refimpl.train.run_folder import write_json
from refimpl.train.run_lock import run_folder_lock
from refimpl.validation import all_finite, check_sparse_input

__all__ = ["RunResult", "TrainConfig", "TrainingDiverged", "relative_grad_norms", "train_model"]


@dataclass(frozen=True)
class TrainConfig:
    """How to train; the model and the data are passed separately."""

    epochs: int = 200
    optimizer: str = "adam"  # "adam" (PyTorch semantics) or "sgd" (plain gradient descent)
    lr: float = 0.005  # GAT paper, Cora
    weight_decay: float = 0.0  # L2, added to the gradient (both papers' experiments)
    loss_threshold: float | None = None  # stop once the training loss is below it
    checkpoint_every: int = 0  # epochs between checkpoints; 0: none
    seed: int = 0
    init: str = "xavier"  # initialisation scheme of the model
    diagnostics: bool = False  # log GAT-balance's balancedness and conservation residual
    batch_size: int | None = None  # None: full batch; else random node partitions per epoch
    batch_nodes: str = "all"  # batches of "all" nodes, or of the "train" nodes (main-batch.py)
    schedule: Any = None  # a refimpl.schedules configuration (MultiStepLR, ReduceLROnPlateau)
    schedule_every: str = "epoch"  # step the schedule per "epoch" or per "batch" (optimiser step)

    def __post_init__(self) -> None:
        """Each field checked here, in one line naming it, not when training meets it."""
        check_positive_int(self.epochs, "TrainConfig epochs")
        if not (isinstance(self.optimizer, str) and self.optimizer.lower() in OPTIMIZERS):
            raise ValueError(
                f"TrainConfig optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}, "
                f"got {self.optimizer!r}"
            )
        check_nonnegative_number(self.lr, "TrainConfig lr", allow_zero=False)
        check_nonnegative_number(self.weight_decay, "TrainConfig weight_decay")
        if self.loss_threshold is not None:  # a loss is >= 0: below a negative one never
            check_nonnegative_number(self.loss_threshold, "TrainConfig loss_threshold")
        check_nonnegative_int(self.checkpoint_every, "TrainConfig checkpoint_every")
        check_nonnegative_int(self.seed, "TrainConfig seed")  # default_rng([seed, k])
        check_choice(self.init, INITIALISERS, "TrainConfig init")
        object.__setattr__(
            self, "diagnostics", check_bool(self.diagnostics, "TrainConfig diagnostics")
        )
        size = self.batch_size
        if size is not None and (type(size) is not int or size < 1):  # a bool is refused too
            raise ValueError(f"TrainConfig batch_size must be None or a positive int, got {size!r}")
        check_choice(self.batch_nodes, ("all", "train"), "TrainConfig batch_nodes")
        if self.batch_nodes == "train" and self.batch_size is None:
            raise ValueError("TrainConfig batch_nodes='train' cuts batches: set batch_size too")
        check_schedule(self.schedule, self.schedule_every, "TrainConfig")


@dataclass
class RunResult:
    """Outcome of one run (one seed)."""

    seed: int
    best_epoch: int  # 0-based epoch with the best validation accuracy
    val_acc: float  # at best_epoch
    test_acc: float  # at best_epoch
    epochs_run: int
    final_train_loss: float
    params: dict[str, Any] = field(repr=False)  # final parameters

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "params"}


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

    ``out_dir`` receives ``log.jsonl``, ``final.npz``, ``summary.json`` and, with
    ``checkpoint_every``, ``checkpoint.npz``. With ``config.diagnostics`` each log
    line also holds ``balancedness`` and ``conservation`` (per hidden layer), and
    the run writes ``initial.npz``, ``best.npz`` (the parameters at the best
    validation epoch) and ``changes.json``: per layer, the fraction of parameters
    whose change exceeds 0, 0.05 and 0.5 (``refimpl.diagnostics.fraction_changed``).
    ``resume`` continues from such a checkpoint, which must have been written training on
    the same data (:func:`refimpl.train.resume.data_fingerprint`). The dtype of
    ``dataset.x`` sets the training precision. ``progress``: a tqdm bar per epoch; a string
    labels it ("seed 3"). ``out_dir`` is locked for the run
    (:func:`refimpl.train.run_lock.run_folder_lock`): another process writing it is refused.
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
                data = (x, y, scored["train"], graph)
            else:  # the nodes of one batch and the edges among them (NodeFormer Sec. 4.2)
                rows = asarray(batch, backend=x_backend)
                data = (x[rows], y[rows], scored["train"][rows], graph.subgraph(batch))
                if not bool(data[2].any()):
                    continue  # no training node (observed label): nothing to fit
            # 1-2 forward in training mode, loss on the training nodes
            if reused is None:
                kwargs = {"training": True, "rng": dropout_rng}
                reused = checked_forward(model, params, epoch, data[0], data[3], **kwargs)
            logits, cache = reused
            reused = None
            # 3 backward, 4 optimiser step
            step_loss, auxiliary, grads = _gradients(
                model, params, cache, logits, data, loss_block, epoch
            )
            count = int(data[2].sum())
            weighted_loss, weight = weighted_loss + step_loss * count, weight + count
            weighted_auxiliary += auxiliary * count
            step_params, step_grads = params, grads  # the epoch's last step is logged
            if schedule is not None:  # the rate is the optimiser's only field a schedule sets
                step_lr = schedule_state["lr"]
                optimizer = with_lr(optimizer, step_lr)
            params, opt_state = checked_step(optimizer, params, grads, opt_state, epoch)
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


def _gradients(
    model: Any, params: dict, cache: Any, logits: Any, data: tuple, loss_block: Any, epoch: int
) -> tuple[float, float, dict]:
    """The training loss (supervised plus the model's auxiliary loss, if any), the auxiliary
    loss alone (0 without one) and the gradients of every parameter, or
    :class:`TrainingDiverged` naming the first non-finite one or a loss grown past
    :mod:`refimpl.train.guards`' rule."""
    _, y, train_mask, _ = data
    if not all_finite(logits):
        last = getattr(model, "num_layers", 1) - 1
        raise TrainingDiverged(
            f"epoch {epoch}: the logits (output of layer{last}) became non-finite"
        )
    loss, loss_cache = loss_block.forward({}, logits, y, train_mask)
    auxiliary_loss = getattr(model, "auxiliary_loss", None)
    auxiliary = auxiliary_loss(cache) if auxiliary_loss is not None else 0.0
    train_loss = float(loss) + auxiliary
    d_logits, _ = loss_block.backward({}, loss_cache, 1.0)
    grads = checked_backward(model, params, cache, d_logits, epoch)
    zero_output = loss_of_zero_output(loss_block, logits, y, train_mask)
    check_gradients(train_loss, grads, epoch, zero_output)
    return train_loss, auxiliary, grads


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
