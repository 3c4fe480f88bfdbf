"""``refimpl train``: train a model over one or several seeds, with logs, checkpoints, summary."""

from __future__ import annotations

import argparse
import time
from typing import Any

from refimpl.cli.graph_train import add_graph_options, run_graph
from refimpl.cli.options import (
    add_data_options,
    add_model_options,
    add_nodeformer_options,
    add_training_options,
    build_model,
    dataset_for_seeds,
    default_out,
    load_data,
)
from refimpl.cli.run_log import best_epoch_words
from refimpl.cli.runs import (
    add_run_folder_options,
    open_cli_run,
    resume_options,
    stored_options,
)
from refimpl.cli.training_options import train_config
from refimpl.cli.types import DefaultsHelpFormatter, non_negative_int, positive_int
from refimpl.train import TrainingDiverged, format_summary, run_seeds
from refimpl.train.resume import data_fingerprint

__all__ = ["add_parser", "run"]

# options of the node-level loop that run_graph does not read
NODE_LEVEL_ONLY = {"batch_nodes", "lr_step"}  # the graph-level loop steps its schedule per epoch


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "train",
        formatter_class=DefaultsHelpFormatter,
        help="train a GAT, a NodeFormer or a graph transformer (default: a synthetic graph, "
        "under a minute)",
        description="Full-batch training with model selection at the best validation "
        "accuracy; writes run.json, log.jsonl, final.npz and summary.json to --out. "
        "An existing run is never replaced unless --overwrite is given; --resume RUN "
        "continues it with its own options.",
    )
    parser.add_argument(
        "--dataset",
        default="csbm",
        help="cora, citeseer, pubmed (Planetoid); chameleon, squirrel (and their _filtered "
        "versions), actor (or film), cornell, texas, wisconsin (Geom-GCN); trees (the TREES "
        "task); karate, csbm (synthetic); a folder in OGB's raw node-property layout "
        "(ogbn-proteins; --node-features); with --model graph_transformer: molecules "
        "(synthetic), a .npz graph dataset, a .csv of SMILES with --target COLUMN, or a folder "
        "in OGB's raw graph-property layout",
    )
    parser.add_argument("--layers", type=positive_int, default=2, help="the model's layers")
    parser.add_argument(
        "--seeds",
        type=non_negative_int,
        nargs="+",
        default=[0],
        help="one run per seed (distinct); several get seed<k>/ subfolders",
    )
    add_run_folder_options(parser, "runs/train-<time>")
    add_data_options(parser)
    add_model_options(parser, graph_level=True)
    add_nodeformer_options(parser)
    add_graph_options(parser)
    add_training_options(parser)
    parser.set_defaults(run=run)


def _print_seed(result: Any, earlier: bool) -> None:
    """One line per seed as it ends, so a long multi-seed run shows its progress."""
    when = " (finished earlier)" if earlier else ""
    print(
        f"seed {result.seed}: best validation {result.val_acc:.4f} "
        f"{best_epoch_words(result.best_epoch)}, test there {result.test_acc:.4f}; "
        f"{result.epochs_run} epochs run{when}",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.resume is not None:  # the run's own options; nothing written until the data load
        resume_options(args, "train")
    elif args.model == "graph_transformer":
        # the node-level default (csbm) is no graph dataset: this model's default is stored
        args.dataset = args.dataset if "dataset" in args.explicit else "molecules"
    if args.model == "graph_transformer":
        node_only = sorted(set(args.explicit) & NODE_LEVEL_ONLY)
        if node_only:  # not silently ignored
            named = ", ".join("--" + name.replace("_", "-") for name in node_only)
            raise ValueError(f"{named}: node-level training only, not --model graph_transformer")
        code = run_graph(args)
        print(f"wrote {args.run_folder}/summary.json ({time.perf_counter() - started:.1f} s)")
        return code
    # the run folder is opened once the data and model load, so that a refused option or a
    # missing file leaves no folder behind, and a resume on other data rewrites nothing
    config = train_config(args)  # a refused option leaves no folder behind
    dataset = load_data(args.dataset, args)
    model = build_model(args, dataset, args.layers)
    data = {args.dataset: data_fingerprint(dataset)}
    out = open_cli_run(args, "train", default_out("train"), data)
    print(f"data   {dataset.summary()}")
    if args.random_split is not None:
        print(f"split  random {tuple(args.random_split)} per seed s, from default_rng([s, 2])")
    print(f"model  {model}")
    resumed = " (resumed)" if args.resume is not None else ""
    print(f"train  {config}; seeds {args.seeds}; output {out}{resumed}")
    try:
        summary = run_seeds(
            lambda: build_model(args, dataset, args.layers),
            dataset_for_seeds(dataset, args),
            config,
            args.seeds,
            out,
            progress=not args.no_progress,
            backend=args.backend,
            resume=args.resume is not None,
            extra=stored_options(args),
            report=_print_seed,
        )
    except TrainingDiverged as err:
        print(f"training diverged: {err}")
        return 1
    print(format_summary(summary, "ROC-AUC" if dataset.is_multilabel else "accuracy"))
    print(f"wrote {out}/summary.json ({time.perf_counter() - started:.1f} s)")
    return 0
