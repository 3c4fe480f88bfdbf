"""``refimpl train --model graph_transformer``: the graph-level graph transformer on batches of
graphs (synthetic molecules, a user's ``.npz`` graph dataset or a CSV of SMILES), one run per
seed.

The data: ``--dataset molecules`` (the default for this model: ``--graphs`` seeded
synthetic molecules, ZINC-like regression with a standardised target), a path to a
``.npz`` file in the graph-dataset format (``refimpl.data.load_graph_dataset``), or a path
to a ``.csv`` file of SMILES with ``--target`` columns (``refimpl.data.load_smiles_csv``:
OGB's atom and bond features, RDKit from the ``chem`` extra; raw targets). One
seeded 80/10/10 split (seed 0) serves every run, so the seeds vary the model alone.
Training is :func:`refimpl.train.train_graph_model` (Adam, L1 for regression, BCE for
multi-label targets; model selection on the validation MAE or ROC-AUC).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import warnings
from pathlib import Path
from typing import Any

from refimpl.cli.options import default_out
from refimpl.cli.run_log import best_epoch_words
from refimpl.cli.runs import open_cli_run
from refimpl.cli.training_options import schedule_from_args
from refimpl.cli.types import positive_int
from refimpl.train.resume import data_fingerprint

__all__ = ["NOT_FOR_GRAPHS", "add_graph_options", "run_graph"]

# options of the node-level models that mean nothing here: typed, they are refused
NOT_FOR_GRAPHS = (
    "normalize_features", "sparse_features", "split", "random_split", "graph", "knn",
    "version", "share_weights", "bias", "activation", "residual", "pairnorm",
    "random_features", "tau", "gumbel_samples", "gumbel", "relational_bias", "rb_order",
    "rb_powers", "qk_scale", "edge_loss_weight", "edge_loss_convention", "conv_activation",
    "loss_threshold", "init", "diagnostics",
)  # fmt: skip


def add_graph_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "graph transformer (--model graph_transformer; also --layers, --hidden (64), --heads "
        "(4), --dropout, --batch-size (64 graphs); transformer-conv also --attn-dropout, "
        "--layer-norm, --lipschitz-norm paper)"
    )
    group.add_argument(
        "--graphs", type=positive_int, default=1000, help="--dataset molecules: how many"
    )
    group.add_argument(
        "--target",
        nargs="+",
        metavar="COLUMN",
        help="--dataset FILE.csv: the target column(s) to regress on (e.g. score)",
    )
    group.add_argument(
        "--smiles-column",
        default="SMILES",
        metavar="COLUMN",
        help="--dataset FILE.csv: the column of SMILES strings",
    )
    group.add_argument(
        "--bad-smiles",
        choices=["raise", "skip"],
        default="raise",
        help="--dataset FILE.csv: a SMILES RDKit cannot use stops the run naming its row "
        "(raise), or its row is skipped with a warning listing the rows (skip)",
    )
    group.add_argument(
        "--pe-dim",
        type=int,
        default=8,
        help="Laplacian positional-encoding columns (0: none)",
    )
    group.add_argument(
        "--global-node", action="store_true", help="a virtual node joined to every node"
    )
    group.add_argument(
        "--pool", choices=["mean", "sum", "max"], default="mean", help="graph readout"
    )
    group.add_argument(
        "--arch",
        choices=["transformer-conv", "gt", "graphit", "san"],
        default="transformer-conv",
        help="the layers: the supplement's Sec. 2 model on PyG's TransformerConv (default), or "
        "the massive-activation study's GT (Dwivedi & Bresson, edge stream), GraphiT-GT or "
        "SAN as their released code builds them (docs: guide/gt.md, graphit.md, san.md)",
    )
    group.add_argument(
        "--norm",
        choices=["batch", "layer", "none"],
        help="normalisation in every layer: gt/graphit/san default batch (the released "
        "configurations'); transformer-conv: layer (default) or none, as --layer-norm",
    )
    group.add_argument(
        "--pe",
        choices=["none", "laplacian", "random-walk", "learned-laplacian"],
        help="positional encodings with --pe-dim columns (default laplacian; none: 0 "
        "columns); learned-laplacian: SAN's learned encoding of --pe-dim eigenpairs "
        "(gt/graphit/san)",
    )
    group.add_argument(
        "--explicit-bias",
        action="store_true",
        help="gt/graphit: the study's explicit key, value and edge bias vectors per head",
    )
    group.add_argument(
        "--full-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="graphit/san: attend over every pair of a graph's nodes (default on; the "
        "study's GraphiT runs had it off, which leaves its kernel unused)",
    )


def _load(args: argparse.Namespace) -> tuple[Any, tuple[Any, Any, Any], str]:
    """The data: ``(dataset, (train, val, test), how it was split)``; ``dataset`` gives the
    model's sizes and the run's data fingerprint (a dataset that comes split: the splits)."""
    name = args.dataset  # "molecules" unless one was typed (refimpl.cli.train.run)
    if Path(name).is_dir():  # the Open Graph Benchmark's raw layout, split as OGB splits it
        from refimpl.data.ogb_graph import load_ogb_graph_dataset

        _refuse_csv_options(args)
        parts = load_ogb_graph_dataset(Path(name))
        return parts, parts, "OGB's scaffold split"
    dataset = _load_one(args)
    return dataset, dataset.split(seed=0), "80/10/10"


def _refuse_csv_options(args: argparse.Namespace) -> None:
    typed = sorted({"target", "smiles_column", "bad_smiles"} & args.explicit)
    if typed:
        names = ", ".join("--" + option.replace("_", "-") for option in typed)
        raise ValueError(f"{names}: only for --dataset FILE.csv (molecules as SMILES)")


def _load_one(args: argparse.Namespace) -> Any:
    from refimpl.data import load_graph_dataset, load_smiles_csv, synthetic_molecules

    name = args.dataset
    if name.lower().endswith(".csv"):
        if not args.target:
            raise ValueError(
                f"--dataset {name} (SMILES) needs --target COLUMN [COLUMN ...]: the file's "
                "column(s) to regress on"
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dataset = load_smiles_csv(
                Path(name), targets=args.target, smiles=args.smiles_column,
                on_error=args.bad_smiles,
            )  # fmt: skip
        for warning in caught:  # the rows skipped: one line, not Python's warning format
            print(f"warning: {warning.message}", flush=True)
        return dataset
    _refuse_csv_options(args)
    if name == "molecules":
        return synthetic_molecules(args.graphs, seed=0, standardize=True)
    if not name.endswith(".npz"):
        raise ValueError(
            f"--model graph_transformer trains on graphs: --dataset molecules (synthetic), a "
            f".npz graph dataset, a .csv of SMILES or a folder in OGB's raw layout, not {name!r}"
        )
    return load_graph_dataset(Path(name))


def _check_options(args: argparse.Namespace) -> None:
    typed = sorted(set(NOT_FOR_GRAPHS) & set(args.explicit))
    if typed:
        names = ", ".join("--" + name.replace("_", "-") for name in typed)
        raise ValueError(f"{names} do not apply to --model graph_transformer")
    if args.optimizer != "adam":
        raise ValueError("--model graph_transformer trains with Adam (--optimizer adam)")
    if args.lipschitz_norm not in (None, "paper"):
        raise ValueError("--model graph_transformer takes --lipschitz-norm paper (Eq. 19)")
    if args.pe_dim < 0:
        raise ValueError(f"--pe-dim must be >= 0, got {args.pe_dim}")
    study = args.arch != "transformer-conv"
    typed = {"explicit_bias": "gt or graphit", "full_graph": "graphit or san"}
    for name, archs in typed.items():
        if name in args.explicit and args.arch not in archs.split(" or "):
            raise ValueError(f"--{name.replace('_', '-')} applies to --arch {archs}")
    if args.pe == "learned-laplacian" and args.pe_dim == 0:
        raise ValueError("--pe learned-laplacian needs --pe-dim >= 1: the eigenpairs it reads")
    if args.pe == "learned-laplacian" and not study:
        raise ValueError("--pe learned-laplacian is SAN's learned encoding: --arch gt/graphit/san")
    if study and ({"lipschitz_norm", "global_node", "attn_dropout", "layer_norm"} & args.explicit):
        raise ValueError(
            "--lipschitz-norm, --global-node, --attn-dropout and --layer-norm apply to --arch "
            "transformer-conv (--norm sets the study architectures' normalisation)"
        )
    if args.norm == "batch" and not study:
        raise ValueError("--norm batch applies to --arch gt, graphit or san")
    if args.heads is not None and len(args.heads) != 1:
        raise ValueError("--model graph_transformer takes one --heads value (every layer alike)")


def build_graph_model(args: argparse.Namespace, dataset: Any) -> Any:
    from refimpl.models import GraphTransformer

    common = {
        "in_channels": dataset.num_node_features,
        "out_channels": dataset.num_targets,
        "hidden_channels": 64 if args.hidden is None else args.hidden,
        "num_layers": args.layers,
        "heads": args.heads[0] if args.heads else 4,
        "edge_dim": dataset.num_edge_features or None,
        "pool": args.pool,
        "dropout": args.dropout,
    }
    columns = 0 if args.pe == "none" else args.pe_dim
    if args.arch == "transformer-conv":
        return GraphTransformer(
            **common,
            pe_dim=columns,
            global_node=args.global_node,
            attn_dropout=args.attn_dropout,
            layer_norm=args.layer_norm if args.norm is None else args.norm == "layer",
            lipschitz_norm=args.lipschitz_norm,
        )
    learned = args.pe == "learned-laplacian"
    options = {"arch": args.arch, "norm": args.norm}
    if args.arch in ("gt", "graphit"):
        options["explicit_bias"] = args.explicit_bias
    if args.arch in ("graphit", "san") and args.full_graph is not None:
        options["full_graph"] = args.full_graph
    if learned:  # SAN's 16 of 64 (its ZINC configuration), narrower in a narrow model
        options["lpe_channels"] = min(16, common["hidden_channels"] // 2)
    return GraphTransformer(
        **common,
        pe_dim=0 if learned else columns,
        lpe_eigenpairs=columns if learned else 0,
        **options,
    )


def graph_schedule(args: argparse.Namespace, train: Any) -> Any:
    """``--lr-schedule`` stepped per epoch; ReduceLROnPlateau watches the validation metric, so
    its mode follows it unless typed: min for the MAE of regression, max for ROC-AUC."""
    schedule = schedule_from_args(args)
    if getattr(schedule, "needs_metric", False) and "lr_mode" not in args.explicit:
        mode = "max" if train.task == "multilabel" else "min"
        schedule = dataclasses.replace(schedule, mode=mode)
    return schedule


def pe_kind(args: argparse.Namespace) -> str:
    """The encodings the training loop computes (GraphTrainConfig.pe); "none" has 0 columns."""
    return "laplacian" if args.pe in (None, "none") else args.pe


def run_graph(args: argparse.Namespace) -> int:
    """Load the data, open the run folder (``args.run_folder``), train one run per seed,
    print a line per seed and the summary; write summary.json."""
    from refimpl.train import GraphTrainConfig, train_graph_model
    from refimpl.train.experiment import mean_ci95
    from refimpl.train.run_folder import write_json

    _check_options(args)
    dataset, (train, val, test), how = _load(args)
    summary = train.summary() if isinstance(dataset, tuple) else dataset.summary()
    seeded = "seed 0" if how == "80/10/10" else how
    print(f"data   {summary}; split {len(train)}/{len(val)}/{len(test)} ({seeded})")
    empty = [name for name, part in (("validation", val), ("test", test)) if not len(part)]
    if empty:
        total = len(train) + len(val) + len(test)
        raise ValueError(
            f"the {total} graphs split {how} leave the {' and '.join(empty)} split empty: a run "
            "needs at least one graph in each; give more graphs (--graphs, or a larger dataset)"
        )
    model = build_graph_model(args, train)
    schedule = graph_schedule(args, train)  # a bad --lr-* option refused before the folder
    data = {args.dataset: data_fingerprint(dataset)}
    out = open_cli_run(args, "train", default_out("train"), data)
    print(f"model  {model}")
    runs = []
    for seed in args.seeds:
        run_dir = out if len(args.seeds) == 1 else out / f"seed{seed}"
        config = GraphTrainConfig(
            epochs=args.epochs,
            batch_size=args.batch_size or 64,
            lr=args.lr,
            weight_decay=args.weight_decay,
            seed=seed,
            checkpoint_every=args.checkpoint_every,
            dtype=args.dtype,
            pe=pe_kind(args),
            schedule=schedule,
        )
        checkpoint = run_dir / "checkpoint.npz"
        resume = checkpoint if args.resume is not None and checkpoint.is_file() else None
        result = train_graph_model(
            build_graph_model(args, train), train, val, test, config,
            out_dir=run_dir, resume=resume, progress=not args.no_progress,
        )  # fmt: skip
        runs.append(result)
        print(
            f"seed {seed}: best validation {result.metric} {result.val_metric:.4f} "
            f"{best_epoch_words(result.best_epoch)}, test there {result.test_metric:.4f}; "
            f"{result.epochs_run} epochs run",
            flush=True,
        )
    mean, ci = mean_ci95([r.test_metric for r in runs])
    summary = {
        "metric": runs[0].metric,
        "test_metric_mean": mean,
        "test_metric_ci95": ci,
        "epochs_to_best_mean": statistics.fmean(r.best_epoch + 1 for r in runs),
        "runs": [r.as_dict() for r in runs],
    }
    write_json(out / "summary.json", summary)
    spread = f" +- {ci:.4f} (95% CI)" if ci is not None else " (one seed: no interval)"
    print(f"test {runs[0].metric} at best validation: {mean:.4f}{spread}")
    return 0
