"""``refimpl sweep``: depths x initialisations x seeds x datasets, in the papers' table layout."""

from __future__ import annotations

import argparse
import functools
import time
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
    train_config,
)
from refimpl.cli.runs import add_run_folder_options, open_cli_run
from refimpl.cli.types import DefaultsHelpFormatter, non_negative_int, positive_int
from refimpl.files import atomic_write
from refimpl.init import INITIALISERS
from refimpl.train import TrainingDiverged, run_seeds
from refimpl.train.run_folder import write_json

__all__ = ["add_parser", "format_table", "run"]


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "sweep",
        formatter_class=DefaultsHelpFormatter,
        help="grid over depths x inits x seeds x datasets; prints the papers' table layout",
    )
    parser.add_argument("--datasets", nargs="+", default=["csbm"])
    parser.add_argument("--depths", type=positive_int, nargs="+", default=[2, 5])
    parser.add_argument("--inits", nargs="+", default=["xavier"], choices=sorted(INITIALISERS))
    parser.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0, 1])
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


class _Progress:
    """One line per finished grid cell: its place, result, time, and the time left at the
    mean pace of the cells so far."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.started = total, 0, time.perf_counter()
        self.last = self.started

    def line(self, label: str, cell: dict[str, Any]) -> str:
        now = time.perf_counter()
        took, self.last = now - self.last, now
        self.done += 1
        left = (now - self.started) / self.done * (self.total - self.done)
        if cell["diverged"]:
            result = "diverged"
        else:
            result = f"test {100 * cell['test_acc_mean']:.1f}%"
        eta = f"about {_duration(left)} left" if self.done < self.total else "the last"
        return f"[{self.done}/{self.total}] {label}: {result} ({_duration(took)}; {eta})"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def run(args: argparse.Namespace) -> int:
    for flag, values in (
        ("--datasets", args.datasets),
        ("--depths", args.depths),
        ("--inits", args.inits),
        ("--seeds", args.seeds),
    ):
        if len(set(values)) != len(values):
            raise ValueError(f"{flag} must be distinct, got {' '.join(map(str, values))}")
    out = open_cli_run(args, "sweep", default_out("sweep"))
    cells = []
    progress = _Progress(len(args.datasets) * len(args.inits) * len(args.depths))
    for name in args.datasets:
        dataset = load_data(name, args)
        print(f"data   {dataset.summary()}")
        for init in args.inits:
            for depth in args.depths:
                run_dir = out / name / init / f"L{depth}"
                cell: dict[str, Any] = {
                    "dataset": name,
                    "init": init,
                    "depth": depth,
                    "diverged": False,
                }
                try:
                    summary = run_seeds(
                        functools.partial(build_model, args, dataset, depth),
                        dataset_for_seeds(dataset, args),
                        train_config(args, init=init),
                        args.seeds,
                        run_dir,
                        progress=not args.no_progress,
                        backend=args.backend,
                        resume=args.resume is not None,
                    )
                    cell.update(
                        {
                            k: summary[k]
                            for k in ("test_acc_mean", "test_acc_ci95", "epochs_to_best_mean")
                        }
                    )
                except TrainingDiverged as err:
                    cell["diverged"] = True
                    print(f"  {name} {init} L={depth}: diverged ({err})")
                cells.append(cell)
                print(f"  {progress.line(f'{name} {init} L={depth}', cell)}", flush=True)
    table = format_table(cells, args.depths)
    print(table)
    write_json(out / "sweep.json", cells)
    atomic_write(out / "table.txt", lambda stream: stream.write((table + "\n").encode()))
    print(f"wrote {out}/sweep.json and table.txt")
    return 0
