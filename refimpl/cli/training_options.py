"""Command-line options of the training loops beside ``refimpl.cli.options``: the learning-rate
schedule, the checkpoint interval a run gets by default, and the training configuration they
build."""

from __future__ import annotations

import argparse
from typing import Any

from refimpl.cli.types import non_negative_float, non_negative_int, positive_float, positive_int
from refimpl.schedules import MultiStepLR, ReduceLROnPlateau
from refimpl.train import TrainConfig

__all__ = ["CHECKPOINT_EVERY", "add_schedule_options", "schedule_from_args", "train_config"]

# A run checkpoints by default, so that Ctrl-C then --resume continues it instead of starting
# over. A checkpoint is the parameters and the optimiser's state (three copies of the model
# with Adam), written whole and renamed: every 10 epochs keeps those writes a small part of a
# run's work, and a Ctrl-C loses at most 10 epochs. --checkpoint-every 0 turns them off.
CHECKPOINT_EVERY = 10


def add_schedule_options(parser: argparse.ArgumentParser) -> None:
    """Node-level learning-rate schedules (refimpl.schedules; docs/guide/training.md)."""
    group = parser.add_argument_group("learning-rate schedule (node-level training)")
    group.add_argument(
        "--lr-schedule", choices=["none", "plateau", "multistep"], default="none", help="torch's"
    )
    group.add_argument(
        "--lr-step", choices=["epoch", "batch"], default="epoch", help="step per epoch or batch"
    )
    group.add_argument(
        "--lr-milestones", type=positive_int, nargs="+", default=[100, 200], help="multistep"
    )
    group.add_argument("--lr-gamma", type=positive_float, default=0.5, help="multistep")
    group.add_argument(
        "--lr-mode",
        choices=["min", "max"],
        default="min",
        help="plateau: watch the validation loss (min) or accuracy (max)",
    )
    group.add_argument("--lr-factor", type=positive_float, default=0.1, help="plateau")
    group.add_argument("--lr-patience", type=non_negative_int, default=10, help="plateau")
    group.add_argument("--lr-min", type=non_negative_float, default=0.0, help="plateau")


def train_config(args: argparse.Namespace, init: str | None = None) -> TrainConfig:
    return TrainConfig(
        epochs=args.epochs,
        optimizer=args.optimizer,
        lr=args.lr,
        weight_decay=args.weight_decay,
        loss_threshold=args.loss_threshold,
        checkpoint_every=args.checkpoint_every,
        init=init or args.init,
        diagnostics=getattr(args, "diagnostics", False),
        batch_size=getattr(args, "batch_size", None),
        batch_nodes=getattr(args, "batch_nodes", "all"),
        schedule=schedule_from_args(args),
        schedule_every=getattr(args, "lr_step", "epoch"),
    )


def schedule_from_args(args: argparse.Namespace) -> Any:
    """The ``--lr-*`` options as a refimpl.schedules configuration, or None."""
    kind = getattr(args, "lr_schedule", "none")
    if kind == "multistep":
        return MultiStepLR(args.lr_milestones, args.lr_gamma)
    if kind == "plateau":
        return ReduceLROnPlateau(args.lr_mode, args.lr_factor, args.lr_patience, min_lr=args.lr_min)
    return None
