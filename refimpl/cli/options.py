"""Command-line options shared by ``refimpl train`` and ``refimpl sweep``, and what they build."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.cli.training_options import CHECKPOINT_EVERY, add_schedule_options
from refimpl.cli.types import (
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from refimpl.init import INITIALISERS
from refimpl.nn.norms.pairnorm import PAIRNORM_MODES

__all__ = [
    "add_data_options",
    "add_model_options",
    "add_nodeformer_options",
    "add_training_options",
    "build_model",
    "dataset_for_seeds",
    "default_out",
    "load_data",
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
    group.add_argument(
        "--sparse-features",
        action="store_true",
        help="hand the features to the model as a SciPy CSR matrix (the same values; GAT only): "
        "the first layer multiplies over the stored values alone",
    )
    group.add_argument(
        "--split",
        type=non_negative_int,
        default=None,
        help="Geom-GCN split index 0-9 (default 0); Planetoid sets have one public split",
    )
    group.add_argument(
        "--random-split",
        type=fraction,
        nargs=3,
        metavar=("TRAIN", "VAL", "TEST"),
        default=None,
        help="a random split per seed s, drawn from default_rng([s, 2]) (the same for every "
        "model); NodeFormer Sec. 4.1: 0.5 0.25 0.25",
    )
    group.add_argument(
        "--graph",
        choices=["input", "knn", "none"],
        default="input",
        help="the dataset's graph (default), a symmetrised k-NN graph over the features "
        "(--knn), or no edges (NodeFormer Sec. 4.3)",
    )
    group.add_argument("--knn", type=positive_int, default=10, help="k of --graph knn")
    group.add_argument(
        "--node-features",
        choices=["edge-mean", "species", "node-feat"],
        default=None,
        help="an OGB node-property folder's node features: the mean of each node's incoming "
        "edge features (default; NodeFormer's for ogbn-proteins), its species one-hot (the "
        "massive-activation study's), or the folder's node-feat file",
    )
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


def add_model_options(parser: argparse.ArgumentParser, graph_level: bool = False) -> None:
    group = parser.add_argument_group("model")
    models = ["gat", "nodeformer", "graph_transformer"] if graph_level else ["gat", "nodeformer"]
    group.add_argument(
        "--model",
        choices=models,
        default="gat",
        help="the model to train"
        + ("; graph_transformer: graph-level, on graphs (below)" if graph_level else ""),
    )
    group.add_argument(
        "--hidden",
        type=positive_int,
        default=None,
        help="GAT: channels per head in hidden layers (default 8); NodeFormer: width D (32)",
    )
    group.add_argument(
        "--heads",
        type=positive_int,
        nargs="+",
        default=None,
        help="heads: one number for every layer, or one per layer (GAT only); "
        "default 1 (GAT), 4 (NodeFormer)",
    )
    group.add_argument(
        "--version",
        choices=["v1", "v2"],
        default="v2",
        help="GAT attention: v2 (GATv2, GAT-balance Def. 2.1, whose experiments this CLI "
        "reproduces) or v1 (the original GAT, which GATConv, like PyG's, takes unless told)",
    )
    group.add_argument(
        "--share-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="v2: W_t = W_s (default on)",
    )
    group.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="GAT: a bias per layer (default off: GAT-balance Def. 2.1 has none)",
    )
    group.add_argument(
        "--activation",
        choices=["relu", "leaky_relu", "elu", "identity"],
        default="relu",
        help="GAT: phi between layers",
    )
    group.add_argument("--dropout", type=fraction, default=0.0, help="input dropout of every layer")
    group.add_argument("--attn-dropout", type=fraction, default=0.0, help="attention dropout")
    group.add_argument(
        "--residual",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="GAT: linear skips (default off); NodeFormer: identity skips (default on)",
    )
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


def add_nodeformer_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "NodeFormer (--model nodeformer; defaults: the authors' Cora)"
    )
    group.add_argument("--random-features", type=positive_int, default=30, help="m of Eq. 4")
    group.add_argument(
        "--tau", type=positive_float, default=0.25, help="Gumbel-Softmax temperature"
    )
    group.add_argument("--gumbel-samples", type=positive_int, default=10, help="K of Eq. 7")
    group.add_argument(
        "--gumbel", action=argparse.BooleanOptionalAction, default=True, help="Eq. 7 (else Eq. 5)"
    )
    group.add_argument(
        "--relational-bias",
        choices=["sigmoid", "identity", "none"],
        default="sigmoid",
        help="f of Eq. 8's gate f(b) A V, or none",
    )
    group.add_argument("--rb-order", type=positive_int, default=2, help="r of the relational bias")
    group.add_argument(
        "--rb-powers",
        choices=["paper", "authors"],
        default="paper",
        help="orders j >= 2: powers of A_hat (paper) or the code's A^(2^(j-1)) pattern",
    )
    group.add_argument(
        "--qk-scale",
        choices=["paper", "sqrt_d"],
        default="paper",
        help="queries and keys as printed (paper) or scaled by C^(-1/4) (the code)",
    )
    group.add_argument(
        "--edge-loss-weight", type=non_negative_float, default=1.0, help="lambda of Sec. 3.4"
    )
    group.add_argument(
        "--edge-loss-convention",
        choices=["paper", "authors"],
        default="paper",
        help="Eq. 10 with Eq. 12's pi and 1/N (paper), or the code's: tau in pi, the mean "
        "over the edges (authors)",
    )
    group.add_argument(
        "--layer-norm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="LayerNorm after every conv and its skip (the code's use_bn)",
    )
    group.add_argument(
        "--conv-activation",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="ELU after every conv (App. C.2; off on Cora, App. C.1)",
    )


def add_training_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    group.add_argument(
        "--optimizer", choices=["adam", "sgd"], default="adam", help="PyTorch's semantics"
    )
    group.add_argument("--lr", type=positive_float, default=0.005, help="learning rate")
    group.add_argument(
        "--weight-decay",
        type=non_negative_float,
        default=0.0,
        help="L2 penalty added to the gradient, as torch.optim's weight_decay",
    )
    group.add_argument(
        "--epochs", type=positive_int, default=200, help="a resumed run may be given more"
    )
    group.add_argument(
        "--loss-threshold",
        type=positive_float,
        default=None,
        help="stop once the training loss is below this (GAT-balance: 1e-4)",
    )
    group.add_argument(
        "--init", default="xavier", choices=sorted(INITIALISERS), help="initialisation scheme"
    )
    group.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        default=CHECKPOINT_EVERY,
        metavar="N",
        help="write checkpoint.npz every N epochs and at the last (atomic; 0: never); what "
        "--resume continues from after Ctrl-C",
    )
    group.add_argument(
        "--diagnostics",
        action="store_true",
        help="log balancedness c and the conservation residual every epoch, and the "
        "fraction of parameters changed (GAT-balance Sec. 2); refimpl plot draws them",
    )
    group.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="random node batches per epoch, each on its induced subgraph (NodeFormer Sec. 4.2)",
    )
    group.add_argument(
        "--batch-nodes",
        choices=["all", "train"],
        default="all",
        help="--batch-size cuts all nodes, or the training nodes only (NodeFormer's main-batch.py)",
    )
    group.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is off by itself where the output is not a terminal)",
    )
    add_schedule_options(parser)


def load_data(name: str, args: argparse.Namespace) -> Any:
    from refimpl.data import GEOM_GCN_NAMES, PLANETOID_NAMES, load_dataset

    kwargs: dict[str, Any] = {}
    if args.normalize_features and name in (*PLANETOID_NAMES, *GEOM_GCN_NAMES):
        kwargs["normalize_features"] = True
    if getattr(args, "node_features", None) is not None:
        if not Path(name).is_dir():
            raise ValueError(
                f"--node-features chooses an OGB node-property folder's features; {name} is "
                "not a folder"
            )
        kwargs["node_features"] = args.node_features
    if name in GEOM_GCN_NAMES:
        kwargs["split"] = 0 if args.split is None else args.split
    elif args.split is not None:
        raise ValueError(
            f"--split chooses one of a Geom-GCN set's ten splits; {name} has no such splits "
            "(Planetoid sets have one public split; --random-split draws others)"
        )
    dataset = load_dataset(name, root=args.data_root, **kwargs)
    if args.graph != "input":
        dataset = replace_graph(dataset, args.graph, args.knn)
    if getattr(args, "sparse_features", False):
        if getattr(args, "model", "gat") != "gat":
            raise ValueError(f"--sparse-features is for --model gat, not {args.model}")
        import dataclasses

        import scipy.sparse as sp

        dataset = dataclasses.replace(dataset, x=sp.csr_matrix(dataset.x))
    return dataset.astype(np.dtype(args.dtype))


def replace_graph(dataset: Any, kind: str, k: int) -> Any:
    """The dataset on a symmetrised k-NN graph over its features (``"knn"``: u -> v and v -> u
    for every k-nearest pair, once) or on no edges (``"none"``); its edge features, which
    belong to the replaced edges, are dropped."""
    from refimpl import Graph
    from refimpl.data import knn_graph

    n = dataset.num_nodes
    if kind == "none":
        return dataset.with_graph(Graph(np.zeros((2, 0), np.int64), n))
    src, dst = knn_graph(dataset.x, k).edge_index
    pairs = np.unique(np.concatenate([src * n + dst, dst * n + src]))  # both directions, once
    return dataset.with_graph(Graph(np.stack([pairs // n, pairs % n]), n))


def dataset_for_seeds(dataset: Any, args: argparse.Namespace) -> Any:
    """The dataset, or with ``--random-split`` a function ``seed -> dataset`` on its own split."""
    if args.random_split is None:
        return dataset
    from refimpl.data import random_split

    fractions = tuple(args.random_split)
    return lambda seed: dataset.with_masks(
        *random_split(dataset.y, np.random.default_rng([seed, 2]), fractions=fractions)
    )


def build_model(args: argparse.Namespace, dataset: Any, num_layers: int) -> Any:
    from refimpl.models import GAT, NodeFormer

    if getattr(args, "model", "gat") == "nodeformer":
        if args.heads is not None and len(args.heads) != 1:
            raise ValueError("--model nodeformer takes one --heads value (every layer alike)")
        return NodeFormer(
            dataset.num_features,
            32 if args.hidden is None else args.hidden,
            dataset.num_classes,
            num_layers,
            heads=args.heads[0] if args.heads else 4,
            num_random_features=args.random_features,
            tau=args.tau,
            num_samples=args.gumbel_samples,
            use_gumbel=args.gumbel,
            relational_bias=None if args.relational_bias == "none" else args.relational_bias,
            rb_order=args.rb_order,
            rb_powers=args.rb_powers,
            qk_scale=args.qk_scale,
            residual=True if args.residual is None else args.residual,
            layer_norm=args.layer_norm,
            activation=args.conv_activation,
            dropout=args.dropout,
            edge_loss_weight=args.edge_loss_weight,
            edge_loss_convention=args.edge_loss_convention,
        )
    heads = args.heads or [1]
    heads = heads[0] if len(heads) == 1 else tuple(heads)
    return GAT(
        dataset.num_features,
        8 if args.hidden is None else args.hidden,
        dataset.num_classes,
        num_layers,
        heads=heads,
        version=args.version,
        share_weights=args.share_weights,
        bias=args.bias,
        activation=args.activation,
        dropout=args.dropout,
        attn_dropout=args.attn_dropout,
        residual=bool(args.residual),
        lipschitz_norm=args.lipschitz_norm,
        pairnorm=args.pairnorm,
    )


def default_out(command: str) -> Path:
    return Path("runs") / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
