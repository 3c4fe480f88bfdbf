"""``refimpl plot RUN``: training curves and a per-layer gradient-norm heat map, as PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["add_parser", "plot_run", "run"]


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


def _read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def grad_norm_matrix(records: list[dict[str, Any]], kind: str) -> tuple[list[str], np.ndarray]:
    """Layers x epochs matrix of relative gradient norms (NaN where undefined)."""
    layers = list(records[0]["grad_norms"])  # in the model's order: layer0, layer1, ...
    matrix = np.full((len(layers), len(records)), np.nan)
    for j, record in enumerate(records):
        for i, layer in enumerate(layers):
            value = record["grad_norms"].get(layer, {}).get(kind)
            if value is not None:
                matrix[i, j] = value
    return layers, matrix


def plot_run(run_dir: Path, kind: str = "feature") -> list[Path]:
    """Draw ``curves.png`` and ``grad_norms.png`` into ``run_dir``; returns the paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
    except ImportError as err:
        raise SystemExit('refimpl plot needs matplotlib: pip install -e ".[plot]"') from err
    log = run_dir / "log.jsonl"
    if not log.is_file():
        raise SystemExit(f"{run_dir} has no log.jsonl; pass the directory of a refimpl train run")
    records = _read_log(log)
    if not records:
        raise SystemExit(f"{log} is empty")
    epochs = [r["epoch"] for r in records]

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.semilogy(epochs, [r["train_loss"] for r in records])
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    for split in ("train", "val", "test"):
        right.plot(epochs, [r[f"{split}_acc"] for r in records], label=split)
    right.set(xlabel="epoch", ylabel="accuracy", title="accuracy (eval mode)")
    right.legend()
    figure.tight_layout()
    curves = run_dir / "curves.png"
    figure.savefig(curves, dpi=120)
    plt.close(figure)

    layers, matrix = grad_norm_matrix(records, kind)
    figure, axis = plt.subplots(figsize=(10, 0.4 * len(layers) + 2))
    positive = matrix[np.isfinite(matrix) & (matrix > 0)]
    norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size else None
    image = axis.imshow(
        np.where(matrix > 0, matrix, np.nan),
        aspect="auto",
        norm=norm,
        cmap="viridis",
        interpolation="nearest",
        extent=(epochs[0] - 0.5, epochs[-1] + 0.5, len(layers) - 0.5, -0.5),
    )
    axis.set_yticks(range(len(layers)), layers)
    axis.set(xlabel="epoch", title=f"relative gradient norm ||grad W|| / ||W|| ({kind})")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    heat = run_dir / "grad_norms.png"
    figure.savefig(heat, dpi=120)
    plt.close(figure)
    return [curves, heat]


def run(args: argparse.Namespace) -> int:
    directories = sorted(p for p in args.run_dir.glob("seed*") if p.is_dir()) or [args.run_dir]
    for directory in directories:
        for path in plot_run(directory, args.kind):
            print(f"wrote {path}")
    return 0
