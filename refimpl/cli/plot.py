"""``refimpl plot RUN``: training curves and a per-layer gradient-norm heat map, as PNG.

Every figure is titled with its run (the folder's name) and the curves mark the best
validation epoch, the one the run selects. Runs trained with ``--diagnostics`` also get
``balance.png``: per hidden layer, the layer sum of the balancedness ``c`` (GAT-balance
Cor 2.4) and the spread of ``c`` over its neurons, with the conservation residual (Eq. 7)
per epoch. A multi-seed run also gets ``seeds.png`` in its folder: the mean over seeds
of the training loss and the validation and test accuracy, with their min..max band and
the mean best epoch.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.train.run_folder import read_log

__all__ = [
    "add_parser",
    "best_epoch",
    "curves_figure",
    "plot_run",
    "plot_seeds",
    "run",
    "seeds_figure",
]


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "plot", help="curves.png and grad_norms.png from a run directory's log.jsonl"
    )
    parser.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN",
        help="a run directory (or a multi-seed one: each seed is plotted)",
    )
    parser.add_argument(
        "--kind",
        choices=["feature", "attention"],
        default="feature",
        help="which parameters' relative gradient norms to map",
    )
    parser.set_defaults(run=run)


# what every line of a node-classification log holds (refimpl.train.loop)
LOG_KEYS = ("epoch", "train_loss", "train_acc", "val_acc", "test_acc", "grad_norms")


def _read_log(path: Path) -> list[dict[str, Any]]:
    """The log's records, with ``null`` (a value that was NaN or infinite) as NaN."""
    records = read_log(path, required=LOG_KEYS)
    for record in records:
        for key in LOG_KEYS[1:5]:
            if record[key] is None:
                record[key] = math.nan
    return records


def grad_norm_matrix(
    records: list[dict[str, Any]], kind: str, key: str = "grad_norms"
) -> tuple[list[str], np.ndarray]:
    """Layers x epochs matrix of gradient norms (NaN where undefined): relative
    (``key="grad_norms"``) or absolute (``"grad_abs"``)."""
    layers = list(records[0][key])  # in the model's order: layer0, layer1, ...
    matrix = np.full((len(layers), len(records)), np.nan)
    for j, record in enumerate(records):
        for i, layer in enumerate(layers):
            value = record[key].get(layer, {}).get(kind)
            if value is not None:
                matrix[i, j] = value
    return layers, matrix


def plot_run(run_dir: Path, kind: str = "feature") -> list[Path]:
    """Draw ``curves.png``, ``grad_norms.png`` and (logs that have it) ``grad_abs.png`` into
    ``run_dir``; returns the paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
    except ImportError as err:
        raise ImportError('refimpl plot needs matplotlib: pip install -e ".[plot]"') from err
    log = run_dir / "log.jsonl"
    if not log.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no log.jsonl; pass the directory of a refimpl train run"
        )
    records = _read_log(log)
    if not records:
        raise ValueError(f"{log} is empty: the run logged no epoch yet")
    epochs = [r["epoch"] for r in records]
    curves = _save(plt, curves_figure(plt, records, run_dir.name), run_dir / "curves.png")
    heat = _heat_map(
        plt,
        LogNorm,
        epochs,
        *grad_norm_matrix(records, kind),
        run_dir.name,
        ("relative gradient norm", f" ||grad W|| / ||W|| ({kind})"),
        run_dir / "grad_norms.png",
    )
    written = [curves, heat]
    if "grad_abs" in records[0]:  # LipschitzNorm Fig. 2: the attention's gradient norm
        written.append(
            _heat_map(
                plt,
                LogNorm,
                epochs,
                *grad_norm_matrix(records, "attention", key="grad_abs"),
                run_dir.name,
                ("gradient norm of the attention parameters", " ||grad a||"),
                run_dir / "grad_abs.png",
            )
        )
    if "balancedness" in records[0]:
        written.append(_plot_balance(plt, run_dir, epochs, records))
    return written


def _heat_map(
    plt: Any,
    log_norm: Any,
    epochs: list[int],
    layers: list[str],
    matrix: np.ndarray,
    run: str,
    quantity: tuple[str, str],
    path: Path,
) -> Path:
    """Layers x epochs, log colour scale (non-positive and undefined cells left blank);
    ``quantity`` is ``(name, formula)``: the title is ``run: name formula``, the colour
    bar's label the name."""
    figure, axis = plt.subplots(figsize=(10, 0.4 * len(layers) + 2))
    positive = matrix[np.isfinite(matrix) & (matrix > 0)]
    norm = log_norm(vmin=positive.min(), vmax=positive.max()) if positive.size else None
    image = axis.imshow(
        np.where(matrix > 0, matrix, np.nan),
        aspect="auto",
        norm=norm,
        cmap="viridis",
        interpolation="nearest",
        extent=(epochs[0] - 0.5, epochs[-1] + 0.5, len(layers) - 0.5, -0.5),
    )
    axis.set_yticks(range(len(layers)), layers)
    name, formula = quantity
    axis.set(xlabel="epoch", ylabel="layer", title=f"{run}: {name}{formula}")
    figure.colorbar(image, ax=axis, label=name)
    return _save(plt, figure, path)


def _plot_balance(plt: Any, run_dir: Path, epochs: list[int], records: list[dict]) -> Path:
    """``balance.png``: c per hidden layer (sum, min..max band) and the relative residual."""
    layers = list(records[0]["balancedness"])
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for layer in layers:
        series = [r["balancedness"][layer] for r in records]
        (line,) = left.plot(epochs, [b["sum"] for b in series], label=f"{layer} sum")
        left.fill_between(
            epochs,
            [b["min"] for b in series],
            [b["max"] for b in series],
            color=line.get_color(),
            alpha=0.2,
        )
        residual = [max(r["conservation"][layer], 1e-18) for r in records]
        right.semilogy(epochs, residual, label=layer, color=line.get_color())
    left.set(xlabel="epoch", ylabel="c", title="balancedness c (sum; band: min..max per neuron)")
    right.set(xlabel="epoch", ylabel="max |delta| / scale", title="conservation residual (Eq. 7)")
    if len(layers) <= 10:
        left.legend(fontsize="small")
        right.legend(fontsize="small")
    figure.suptitle(run_dir.name)
    return _save(plt, figure, run_dir / "balance.png")


def best_epoch(records: list[dict[str, Any]]) -> int:
    """The epoch the run selects: the first with the highest validation accuracy, or the
    last where the validation split is empty (NaN), as :mod:`refimpl.train.loop` does."""
    best, best_value = records[-1]["epoch"], -math.inf
    for record in records:
        if record["val_acc"] > best_value:  # NaN is never greater: an empty split keeps last
            best, best_value = record["epoch"], record["val_acc"]
    return best


def curves_figure(plt: Any, records: list[dict[str, Any]], label: str) -> Any:
    """Loss and accuracies of one run against the epoch, the best epoch marked."""
    epochs, best = [r["epoch"] for r in records], best_epoch(records)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.semilogy(epochs, [r["train_loss"] for r in records], label="training loss")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    for split in ("train", "val", "test"):
        right.plot(epochs, [r[f"{split}_acc"] for r in records], label=split)
    right.set(xlabel="epoch", ylabel="accuracy", title="accuracy (eval mode)")
    for axis in (left, right):
        axis.axvline(best, color="grey", linestyle="--", label=f"best validation (epoch {best})")
        axis.legend(fontsize="small")
    figure.suptitle(label)
    return figure


def seeds_figure(plt: Any, logs: dict[str, list[dict[str, Any]]], label: str) -> Any:
    """Mean over seeds (line) and min..max (band) of the loss and accuracies, over the epochs
    every seed ran, with the mean best epoch marked."""
    length = min(len(records) for records in logs.values())
    epochs = [r["epoch"] for r in next(iter(logs.values()))[:length]]
    mean_best = float(np.mean([best_epoch(records) for records in logs.values()]))
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    panels = [(left, "train_loss", "training loss")] + [
        (right, f"{split}_acc", split) for split in ("train", "val", "test")
    ]
    for axis, key, name in panels:
        values = np.array([[r[key] for r in records[:length]] for records in logs.values()])
        (line,) = axis.plot(epochs, np.nanmean(values, axis=0), label=f"{name} (mean)")
        axis.fill_between(
            epochs, np.nanmin(values, axis=0), np.nanmax(values, axis=0),
            color=line.get_color(), alpha=0.2,
        )  # fmt: skip
    left.set_yscale("log")
    left.set(xlabel="epoch", ylabel="training loss", title="loss (band: min..max over seeds)")
    right.set(xlabel="epoch", ylabel="accuracy", title="accuracy (band: min..max over seeds)")
    for axis in (left, right):
        axis.axvline(
            mean_best, color="grey", linestyle="--", label=f"mean best epoch {mean_best:.1f}"
        )
        axis.legend(fontsize="small")
    figure.suptitle(f"{label}: {len(logs)} seeds")
    return figure


def _save(plt: Any, figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_seeds(run_dir: Path, seed_dirs: list[Path]) -> Path:
    """``seeds.png`` in ``run_dir``: :func:`seeds_figure` over the seeds' logs."""
    import matplotlib.pyplot as plt  # plot_run has checked it is there

    logs = {directory.name: _read_log(directory / "log.jsonl") for directory in seed_dirs}
    if any(not records for records in logs.values()):
        raise ValueError(f"a seed of {run_dir} logged no epoch yet")
    return _save(plt, seeds_figure(plt, logs, run_dir.name), run_dir / "seeds.png")


def run(args: argparse.Namespace) -> int:
    seed_dirs = sorted(p for p in args.run_dir.glob("seed*") if p.is_dir())
    for directory in seed_dirs or [args.run_dir]:
        for path in plot_run(directory, args.kind):
            print(f"wrote {path}")
    if len(seed_dirs) > 1:
        print(f"wrote {plot_seeds(args.run_dir, seed_dirs)}")
    return 0
