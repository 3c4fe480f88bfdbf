"""``refimpl sweep``: depths x initialisations x seeds x datasets, in the papers' table layout."""

from __future__ import annotations

import argparse
import functools
from typing import Any

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
from refimpl.cli.runs import (
    SWEEP_OUTPUT_ONLY,
    add_run_folder_options,
    add_scheduler_option,
    open_cli_run,
    resume_options,
)
from refimpl.cli.training_options import train_config
from refimpl.cli.types import DefaultsHelpFormatter, non_negative_int, positive_int
from refimpl.files import atomic_write
from refimpl.init import INITIALISERS
from refimpl.train import TrainingDiverged, run_seeds
from refimpl.train.parallel import run_jobs
from refimpl.train.resume import data_fingerprint
from refimpl.train.run_folder import write_json

__all__ = ["add_parser", "format_table", "run", "sweep_cell"]


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "sweep",
        formatter_class=DefaultsHelpFormatter,
        help="grid over depths x inits x seeds x datasets; prints the papers' table layout",
    )
    parser.add_argument(
        "--datasets", nargs="+", default=["csbm"], help="the grid's datasets (as train's)"
    )
    parser.add_argument(
        "--depths", type=positive_int, nargs="+", default=[2, 5], help="the grid's layer counts"
    )
    parser.add_argument(
        "--inits",
        nargs="+",
        default=["xavier"],
        choices=sorted(INITIALISERS),
        metavar="INIT",
        help=f"the grid's initialisation schemes: {', '.join(sorted(INITIALISERS))}",
    )
    parser.add_argument(
        "--seeds",
        type=non_negative_int,
        nargs="+",
        default=[0, 1],
        help="one run per seed in every cell",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="grid cells run at once on this machine, one process each (1: here, in turn)",
    )
    add_scheduler_option(parser)
    add_run_folder_options(parser, "runs/sweep-<time>")
    add_data_options(parser)
    add_model_options(parser)
    add_nodeformer_options(parser)
    add_training_options(parser)
    parser.set_defaults(run=run)


def format_table(cells: list[dict[str, Any]], depths: list[int]) -> str:
    """Rows dataset x init, columns depth; cells ``mean +- ci95 (epochs to best)`` in %."""
    header = f"{'dataset':<10} {'init':<14}" + "".join(f"{f'L={d}':>24}" for d in depths)
    lines = [header, "-" * len(header)]
    rows: dict[tuple[str, str], dict[int, str]] = {}
    for cell in cells:
        if cell["diverged"]:
            text = "diverged"
        else:
            ci = cell["test_acc_ci95"]
            spread = f" +- {100 * ci:.1f}" if ci is not None else ""
            text = f"{100 * cell['test_acc_mean']:.1f}{spread} ({cell['epochs_to_best_mean']:.0f})"
        rows.setdefault((cell["dataset"], cell["init"]), {})[cell["depth"]] = text
    for (dataset, init), by_depth in rows.items():
        lines.append(
            f"{dataset:<10} {init:<14}" + "".join(f"{by_depth.get(d, '-'):>24}" for d in depths)
        )
    lines.append(
        "test accuracy (%) at best validation, mean +- 95% CI over seeds "
        "(mean epochs to the best model)"
    )
    return "\n".join(lines)


def sweep_cell(
    options: dict[str, Any], datasets: dict[str, Any], job: dict[str, Any]
) -> dict[str, Any]:
    """One grid cell (dataset x init x depth): its seeds' runs and their summary. Runs in a
    worker (``refimpl.train.parallel``): the data comes from ``datasets`` (loaded by the
    caller, when the cells run in its process) or is loaded from ``options``."""
    args = argparse.Namespace(**options)
    name, init, depth = job["dataset"], job["init"], job["depth"]
    dataset = datasets[name] if name in datasets else load_data(name, args)
    cell = {**job, "diverged": False}
    try:
        summary = run_seeds(
            functools.partial(build_model, args, dataset, depth),
            dataset_for_seeds(dataset, args),
            train_config(args, init=init),
            args.seeds,
            job["run_dir"],
            progress=options["progress"],
            backend=args.backend,
            resume=True,  # a cell a killed run left half done keeps its finished seeds
        )
        cell.update(
            {k: summary[k] for k in ("test_acc_mean", "test_acc_ci95", "epochs_to_best_mean")}
        )
    except TrainingDiverged as err:
        cell.update(diverged=True, error=str(err))
    return cell


def _describe(cell: dict[str, Any]) -> str:
    result = "diverged" if cell["diverged"] else f"test {100 * cell['test_acc_mean']:.1f}%"
    return f"{cell['dataset']} {cell['init']} L={cell['depth']}: {result}"


def run(args: argparse.Namespace) -> int:
    for flag, values in (
        ("--datasets", args.datasets),
        ("--depths", args.depths),
        ("--inits", args.inits),
        ("--seeds", args.seeds),
    ):
        if len(set(values)) != len(values):
            raise ValueError(f"{flag} must be distinct, got {' '.join(map(str, values))}")
    if args.resume is not None:  # the run's own options; nothing written until the data load
        resume_options(args, "sweep", SWEEP_OUTPUT_ONLY)
    datasets = {}  # loaded here first: bad data fails in one line before any job starts
    for name in args.datasets:
        datasets[name] = load_data(name, args)
        print(f"data   {datasets[name].summary()}")
    data = {name: data_fingerprint(dataset) for name, dataset in datasets.items()}
    out = open_cli_run(args, "sweep", default_out("sweep"), data, SWEEP_OUTPUT_ONLY)
    jobs = [
        {
            "dataset": name,
            "init": init,
            "depth": depth,
            "run_dir": str(out / name / init / f"L{depth}"),
        }
        for name in args.datasets
        for init in args.inits
        for depth in args.depths
    ]
    here = args.scheduler is None and args.workers == 1
    options = {**vars(args), "progress": here and not args.no_progress}
    options.pop("run", None)  # the command's function: not an option, and not needed there
    # cells that run in this process reuse the data; workers elsewhere load their own
    cell = functools.partial(sweep_cell, options, datasets if here else {})
    cells = run_jobs(
        cell, jobs, args.workers, _describe, args.scheduler, args.worker_timeout
    )  # in grid order
    table = format_table(cells, args.depths)
    print(table)
    write_json(out / "sweep.json", cells)
    atomic_write(out / "table.txt", lambda stream: stream.write((table + "\n").encode()))
    print(f"wrote {out}/sweep.json and table.txt")
    return 0
