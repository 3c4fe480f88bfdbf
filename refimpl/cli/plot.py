"""``refimpl plot RUN``: a run's curves and, for node classification, its per-layer
gradient-norm heat maps, as PNG.

A node-level run (:mod:`refimpl.train.loop`) gets ``curves.png`` (loss and accuracies),
``grad_norms.png`` and ``grad_abs.png`` (layers x epochs), and, trained with
``--diagnostics``, ``balance.png``: per hidden layer, the layer sum of the balancedness ``c``
(GAT-balance Cor 2.4) and its spread over the neurons, with the conservation residual (Eq. 7)
per epoch. A graph-level run (``refimpl train --model graph_transformer``,
:mod:`refimpl.train.graph_level`) gets ``curves.png``: the training loss and the validation
and test metric (MAE for regression, ROC-AUC for multi-label targets). A figure a run has
nothing for is not drawn, and a note says why: a graph-level run logs no per-layer gradient
norms, and a model without attention vectors (``att*``: NodeFormer's attention is its query
and key projections) has no attention gradient norms for ``grad_abs.png`` (LipschitzNorm
Fig. 2) or ``--kind attention``. Every figure is titled with its run (the folder's name); the
curves mark the best validation epoch, the one the run selects. Epochs are numbered from 0,
as ``log.jsonl`` and ``summary.json``'s ``best_epoch`` number them, and the axes say so. A
multi-seed run also gets ``seeds.png`` in its folder: the mean over seeds of the loss and the
metrics, with their min..max band and the mean best epoch.

Every log is read whole and checked before anything is drawn
(:func:`refimpl.cli.run_log.read_run_log`); ``null`` (a log's NaN: an empty split's accuracy)
is drawn as a gap. A bad log is one ``ValueError`` naming the file, line and field, and
nothing is drawn. Figures are written atomically (:func:`refimpl.files.atomic_write`): a
failure leaves an earlier figure as it was.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.cli.run_log import NODE, LogKind, RunLog, best_epoch, read_run_log
from refimpl.files import atomic_write

__all__ = ["add_parser", "curves_figure", "grad_norm_matrix", "plot_run", "run", "seeds_figure"]

# Agg draws at most 2**16 pixels a side: 546 inches at dpi 120 (a heat map grows per layer)
_TALLEST = 500
# the epoch axis's label: the log's "epoch" field counts from 0 (the CLI prints both numbers)
EPOCH = "epoch (0-based)"
# what each kind of parameter is in a heat map's formula: LipschitzNorm Fig. 2's a, the W's
_SYMBOLS = {"feature": "W", "attention": "a"}
# why a heat map of a kind is not drawn, when no layer has parameters of that kind
_MISSING = {
    "attention": "the model has no attention vectors (att*) to map; a NodeFormer's attention "
    "is its W_q and W_k matrices, in grad_norms.png (--kind feature)",
    "feature": "the model has no feature matrices (W*) to map",
}


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


def _plain(text: str) -> str:
    r"""``text`` as matplotlib draws it literally: a ``$`` would start mathtext (a folder or
    layer named ``a$b$`` drew ``b`` in italics, ``$\x$`` failed to draw)."""
    return text.replace("$", r"\$")


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


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError('refimpl plot needs matplotlib: pip install -e ".[plot]"') from err
    return plt


def _log_of(run_dir: Path) -> RunLog:
    log = run_dir / "log.jsonl"
    cells = sorted(p for p in run_dir.glob("*/*/L*") if p.is_dir())  # refimpl sweep's cells
    if not log.is_file() and cells:
        raise FileNotFoundError(
            f"{run_dir} is a refimpl sweep, not one run: plot one of its cells, such as "
            f"{cells[0]} ({len(cells)} in all)"
        )
    if not log.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no log.jsonl; pass the directory of a refimpl train run"
        )
    return read_run_log(log)


def plot_run(run_dir: Path, kind: str = "feature", notes: list[str] | None = None) -> list[Path]:
    """Draw ``curves.png`` and, for a node-level run, ``grad_norms.png``, ``grad_abs.png``
    and ``balance.png`` (logs that have them) into ``run_dir``; returns the paths. A figure
    the run has nothing for is skipped, with a line saying why appended to ``notes``."""
    return _draw_run(_pyplot(), run_dir, _log_of(run_dir), kind, [] if notes is None else notes)


def _draw_run(plt: Any, run_dir: Path, log: RunLog, kind: str, notes: list[str]) -> list[Path]:
    records, name = log.records, _plain(run_dir.name)
    written = [_save(plt, curves_figure(plt, records, name, log.kind), run_dir / "curves.png")]
    if log.kind is not NODE:
        notes.append(
            f"{run_dir}: no grad_norms.png or grad_abs.png: a graph-level run logs no "
            "per-layer gradient norms"
        )
        return written
    epochs = [r["epoch"] for r in records]
    symbol = _SYMBOLS[kind]
    relative = (f"relative gradient norm ({kind})", f"||grad {symbol}|| / ||{symbol}||")
    maps = [("grad_norms", kind, relative)]
    if "grad_abs" in records[0]:  # LipschitzNorm Fig. 2: the attention's gradient norm
        maps.append(("grad_abs", "attention", ("attention vectors' gradient norm", "||grad a||")))
    for key, which, title in maps:
        if not any(which in norms for r in records for norms in r[key].values()):
            notes.append(f"{run_dir}: no {key}.png: {_MISSING[which]}")
            continue
        layers, matrix = grad_norm_matrix(records, which, key=key)
        written.append(_heat_map(plt, epochs, layers, matrix, name, title, run_dir / f"{key}.png"))
    if records[0].get("balancedness"):
        written.append(_plot_balance(plt, run_dir, epochs, records))
    elif "balancedness" in records[0]:  # GAT-balance's c is per hidden layer
        notes.append(f"{run_dir}: no balance.png: the model has no hidden layer to balance")
    return written


def _heat_map(
    plt: Any,
    epochs: list[int],
    layers: list[str],
    matrix: np.ndarray,
    run: str,
    quantity: tuple[str, str],
    path: Path,
) -> Path:
    """Layers x epochs, log colour scale (non-positive and undefined cells left blank);
    ``quantity`` is ``(name, formula)``: the title is ``run: name formula``, the colour
    bar's label the formula (the name ran past a short figure's edge)."""
    from matplotlib.colors import LogNorm

    figure, axis = plt.subplots(figsize=(10, min(0.4 * len(layers) + 2, _TALLEST)))
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
    axis.set_yticks(range(len(layers)), [_plain(layer) for layer in layers])
    name, formula = quantity
    axis.set(xlabel=EPOCH, ylabel="layer", title=f"{run}: {name} {formula}")
    _whole_epochs(axis)
    figure.colorbar(image, ax=axis, label=formula)
    return _save(plt, figure, path)


def _whole_epochs(axis: Any) -> None:
    """Ticks at whole epochs only (a short run drew 0.25, 0.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def _plot_balance(plt: Any, run_dir: Path, epochs: list[int], records: list[dict]) -> Path:
    """``balance.png``: c per hidden layer (sum, min..max band) and the relative residual."""
    layers = list(records[0]["balancedness"])
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for layer in layers:
        series = [r["balancedness"][layer] for r in records]
        label = _plain(layer)
        (line,) = left.plot(epochs, [b["sum"] for b in series], label=f"{label} sum")
        left.fill_between(
            epochs,
            [b["min"] for b in series],
            [b["max"] for b in series],
            color=line.get_color(),
            alpha=0.2,
        )
        residual = [max(r["conservation"][layer], 1e-18) for r in records]
        right.semilogy(epochs, residual, label=label, color=line.get_color())
    left.set(xlabel=EPOCH, ylabel="c", title="balancedness c (sum; band: min..max per neuron)")
    right.set(xlabel=EPOCH, ylabel="max |delta| / scale", title="conservation residual (Eq. 7)")
    _whole_epochs(left)
    _whole_epochs(right)
    if len(layers) <= 10:
        left.legend(fontsize="small")
        right.legend(fontsize="small")
    figure.suptitle(_plain(run_dir.name))
    return _save(plt, figure, run_dir / "balance.png")


def curves_figure(plt: Any, records: list[dict[str, Any]], label: str, kind: LogKind = NODE) -> Any:
    """Loss and the metric of one run against the epoch, the best epoch marked."""
    epochs, best = [r["epoch"] for r in records], best_epoch(records, kind)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.semilogy(epochs, [r["train_loss"] for r in records], label="training loss")
    left.set(xlabel=EPOCH, ylabel="training loss", title="loss")
    for split in kind.splits:
        right.plot(epochs, [r[f"{split}_{kind.metric}"] for r in records], label=split)
    right.set(xlabel=EPOCH, ylabel=kind.name, title=f"{kind.name} (eval mode)")
    for axis in (left, right):
        axis.axvline(best, color="grey", linestyle="--", label=f"best validation (epoch {best})")
        axis.legend(fontsize="small")
        _whole_epochs(axis)
    figure.suptitle(label)
    return figure


def seeds_figure(
    plt: Any, logs: dict[str, list[dict[str, Any]]], label: str, kind: LogKind = NODE
) -> Any:
    """Mean over seeds (line) and min..max (band) of the loss and the metric, over the
    epochs every seed ran, with the mean best epoch marked."""
    length = min(len(records) for records in logs.values())
    epochs = [r["epoch"] for r in next(iter(logs.values()))[:length]]
    mean_best = float(np.mean([best_epoch(records, kind) for records in logs.values()]))
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    panels = [(left, "train_loss", "training loss")] + [
        (right, f"{split}_{kind.metric}", split) for split in kind.splits
    ]
    for axis, key, name in panels:
        values = np.array([[r[key] for r in records[:length]] for records in logs.values()])
        (line,) = axis.plot(epochs, np.nanmean(values, axis=0), label=f"{name} (mean)")
        axis.fill_between(
            epochs, np.nanmin(values, axis=0), np.nanmax(values, axis=0),
            color=line.get_color(), alpha=0.2,
        )  # fmt: skip
    left.set_yscale("log")
    left.set(xlabel=EPOCH, ylabel="training loss", title="loss (band: min..max over seeds)")
    right.set(xlabel=EPOCH, ylabel=kind.name, title=f"{kind.name} (band: min..max over seeds)")
    for axis in (left, right):
        axis.axvline(
            mean_best, color="grey", linestyle="--", label=f"mean best epoch {mean_best:.1f}"
        )
        axis.legend(fontsize="small")
        _whole_epochs(axis)
    figure.suptitle(f"{label}: {len(logs)} seeds")
    return figure


def _save(plt: Any, figure: Any, path: Path) -> Path:
    """Write ``figure`` to ``path`` atomically (all of it, or the earlier file untouched)."""
    try:
        figure.tight_layout()
        atomic_write(path, lambda stream: figure.savefig(stream, format="png", dpi=120))
    finally:
        plt.close(figure)
    return path


def run(args: argparse.Namespace) -> int:
    seed_dirs = sorted(p for p in args.run_dir.glob("seed*") if p.is_dir())
    plt = _pyplot()
    # every log read and checked before the first figure: a bad one leaves all as they were
    logs = {directory: _log_of(directory) for directory in seed_dirs or [args.run_dir]}
    kinds = {log.kind for log in logs.values()}
    if len(kinds) > 1:
        found = ", ".join(sorted(kind.name for kind in kinds))
        raise ValueError(
            f"the seeds of {args.run_dir} log different metrics ({found}): they are not one "
            "run; plot each seed's folder alone"
        )
    for directory, log in logs.items():
        notes: list[str] = []
        for path in _draw_run(plt, directory, log, args.kind, notes):
            print(f"wrote {path}")
        for note in notes:
            print(f"note: {note}")
    if len(seed_dirs) > 1:  # seeds.png: every seed's curves in one figure
        records = {directory.name: log.records for directory, log in logs.items()}
        figure = seeds_figure(plt, records, _plain(args.run_dir.name), kinds.pop())
        print(f"wrote {_save(plt, figure, args.run_dir / 'seeds.png')}")
    return 0
