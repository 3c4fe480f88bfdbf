"""Command-line options shared by ``refimpl train`` and ``refimpl sweep``, and what they build."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.init import INITIALISERS
from refimpl.nn.pairnorm import PAIRNORM_MODES
from refimpl.train import TrainConfig

__all__ = [
    "add_data_options",
    "add_model_options",
    "add_training_options",
    "build_model",
    "default_out",
    "load_data",
    "train_config",
]


def add_data_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(
        "--data-root",
        default=os.environ.get("REFIMPL_DATA"),
        help="dataset directory (default: $REFIMPL_DATA); synthetic sets need none",
    )
    group.add_argument(
        "--normalize-features", action="store_true", help="row-normalise features (rows sum to 1)"
    )
    group.add_argument("--split", type=int, default=0, help="Geom-GCN split index 0-9")
    group.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        default="float32",
        help="training precision (float64 for exact reproducibility checks)",
    )
    group.add_argument(
        "--backend",
        choices=["numpy", "cupy", "strict"],
        default=None,
        help="array backend (default: $REFIMPL_BACKEND or numpy)",
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", choices=["gat"], default="gat")
    group.add_argument("--hidden", type=int, default=8, help="channels per head in hidden layers")
    group.add_argument(
        "--heads",
        type=int,
        nargs="+",
        default=[1],
        help="heads: one number for every layer, or one per layer",
    )
    group.add_argument("--version", choices=["v1", "v2"], default="v2")
    group.add_argument(
        "--share-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="v2: W_t = W_s (default on)",
    )
    group.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False)
    group.add_argument(
        "--activation", choices=["relu", "leaky_relu", "elu", "identity"], default="relu"
    )
    group.add_argument("--dropout", type=float, default=0.0, help="input dropout of every layer")
    group.add_argument("--attn-dropout", type=float, default=0.0, help="attention dropout")
    group.add_argument("--residual", action="store_true", help="linear skip connections")
    group.add_argument(
        "--lipschitz-norm",
        choices=["paper", "reference-code"],
        default=None,
        help="LipschitzNorm on every layer's attention scores (reference-code: GATv1 only)",
    )
    group.add_argument(
        "--pairnorm",
        choices=list(PAIRNORM_MODES),
        default=None,
        help="PairNorm on every hidden layer's output, before the activation (GAT-Pn)",
    )


def add_training_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    group.add_argument("--lr", type=float, default=0.005)
    group.add_argument("--weight-decay", type=float, default=0.0)
    group.add_argument("--epochs", type=int, default=200)
    group.add_argument(
        "--loss-threshold",
        type=float,
        default=None,
        help="stop once the training loss is below this (GAT-balance: 1e-4)",
    )
    group.add_argument(
        "--init", default="xavier", choices=sorted(INITIALISERS), help="initialisation scheme"
    )
    group.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="write checkpoint.npz every N epochs (atomic)",
    )
    group.add_argument(
        "--diagnostics",
        action="store_true",
        help="log balancedness c and the conservation residual every epoch, and the "
        "fraction of parameters changed (GAT-balance Sec. 2); refimpl plot draws them",
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def load_data(name: str, args: argparse.Namespace) -> Any:
    from refimpl.data import GEOM_GCN_NAMES, PLANETOID_NAMES, load_dataset

    kwargs: dict[str, Any] = {}
    if args.normalize_features and name in (*PLANETOID_NAMES, *GEOM_GCN_NAMES):
        kwargs["normalize_features"] = True
    if name in GEOM_GCN_NAMES:
        kwargs["split"] = args.split
    dataset = load_dataset(name, root=args.data_root, **kwargs)
    return dataset.astype(np.dtype(args.dtype))


def build_model(args: argparse.Namespace, dataset: Any, num_layers: int) -> Any:
    from refimpl.models import GAT

    heads = args.heads[0] if len(args.heads) == 1 else tuple(args.heads)
    return GAT(
        dataset.num_features,
        args.hidden,
        dataset.num_classes,
        num_layers,
        heads=heads,
        version=args.version,
        share_weights=args.share_weights,
        bias=args.bias,
        activation=args.activation,
        dropout=args.dropout,
        attn_dropout=args.attn_dropout,
        residual=args.residual,
        lipschitz_norm=args.lipschitz_norm,
        pairnorm=args.pairnorm,
    )


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
    )


def default_out(command: str) -> Path:
    return Path("runs") / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
