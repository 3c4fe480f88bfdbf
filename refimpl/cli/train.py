"""``refimpl train``: train a model over one or several seeds, with logs, checkpoints, summary."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from refimpl.cli.options import (
    add_data_options,
    add_model_options,
    add_nodeformer_options,
    add_training_options,
    build_model,
    dataset_for_seeds,
    default_out,
    load_data,
    train_config,
)
from refimpl.train import TrainingDiverged, format_summary, run_seeds

__all__ = ["add_parser", "run"]


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "train",
        help="train a GAT or a NodeFormer (default: a synthetic graph, under a minute)",
        description="Full-batch training with model selection at the best validation "
        "accuracy; writes log.jsonl, final.npz and summary.json to --out.",
    )
    parser.add_argument(
        "--dataset",
        default="csbm",
        help="cora, citeseer, pubmed, a Geom-GCN set, karate or csbm (default)",
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="run directory (default runs/train-<time>)"
    )
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="continue one run from its checkpoint.npz",
    )
    add_data_options(parser)
    add_model_options(parser)
    add_nodeformer_options(parser)
    add_training_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    out = args.out or (args.resume.parent if args.resume else default_out("train"))
    dataset = load_data(args.dataset, args)
    print(f"data   {dataset.summary()}")
    if args.random_split is not None:
        print(f"split  random {tuple(args.random_split)} per seed s, from default_rng([s, 2])")
    model = build_model(args, dataset, args.layers)
    print(f"model  {model}")
    config = train_config(args)
    print(f"train  {config}; seeds {args.seeds}; output {out}")
    record = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "run"
    }
    try:
        summary = run_seeds(
            lambda: build_model(args, dataset, args.layers),
            dataset_for_seeds(dataset, args),
            config,
            args.seeds,
            out,
            progress=not args.no_progress,
            backend=args.backend,
            resume=args.resume,
            extra=record,
        )
    except TrainingDiverged as err:
        print(f"training diverged: {err}")
        return 1
    print(format_summary(summary))
    print(f"wrote {out}/summary.json ({time.perf_counter() - started:.1f} s)")
    return 0
