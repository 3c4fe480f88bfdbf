"""``refimpl plot RUN``: a run's curves and, for node classification, its per-layer
gradient-norm heat maps, as PNG.

A node-level run (:mod:`refimpl.train.loop`) gets ``curves.png`` (loss and accuracies),
``grad_norms.png`` and ``grad_abs.png`` (layers x epochs), and, trained with
``--diagnostics``, ``balance.png``: per hidden layer, the layer sum of the balancedness ``c``
(GAT-balance Cor 2.4) and its spread over the neurons, with the conservation residual (Eq. 7)
per epoch. A graph-level run (``refimpl train --model graph_transformer``,
:mod:`refimpl.train.graph_level`) gets ``curves.png``: the training loss and the validation
and test metric (MAE for regression, ROC-AUC for multi-label targets). Every figure is titled
with its run (the folder's name) and the curves mark the best validation epoch, the one the
run selects. A multi-seed run also gets ``seeds.png`` in its folder: the mean over seeds of
the loss and the metrics, with their min..max band and the mean best epoch.

Every log is read whole and checked before anything is drawn: each line a JSON object with
its kind of run's fields, numbers where numbers belong (accuracies and ROC-AUC in 0..1;
norms, MAE and residuals >= 0; nothing beyond 1e100 in size, which no run logs and drawing
cannot always scale), epochs increasing, the same layers on every line. ``null`` (a log's
NaN: an empty split's accuracy) is drawn as a gap. A bad log is one ``ValueError`` naming
the file, line and field, and nothing is drawn. Figures are written atomically
(:func:`refimpl.files.atomic_write`): a failure leaves an earlier figure as it was.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from refimpl.files import atomic_write
from refimpl.train.run_folder import read_log

__all__ = [
    "NODE",
    "LogKind",
    "RunLog",
    "add_parser",
    "best_epoch",
    "curves_figure",
    "plot_run",
    "read_run_log",
    "run",
    "seeds_figure",
]

# the largest size a logged number may have: far above what a run logs (float32 ends at
# 3.4e38, the divergence guards stop a loss long before), far below where drawing overflows
# (a log axis from the smallest double up to about 1e250 overflows matplotlib's ticks)
_LARGEST = 1e100
# Agg draws at most 2**16 pixels a side: 546 inches at dpi 120 (a heat map grows per layer)
_TALLEST = 500


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


class LogKind(NamedTuple):
    """What a kind of run logs per epoch besides ``epoch`` and ``train_loss``: its metric,
    ``{split}_{metric}`` for each split, in ``0..high``, and which way is better."""

    metric: str
    name: str  # as the axes say it
    splits: tuple[str, ...]
    high: float
    lower_is_better: bool


# node classification (refimpl.train.loop), with grad_norms; graph level by target
NODE = LogKind("acc", "accuracy", ("train", "val", "test"), 1.0, False)
GRAPH_KINDS = {
    "mae": LogKind("mae", "MAE", ("val", "test"), _LARGEST, True),
    "roc_auc": LogKind("roc_auc", "ROC-AUC", ("val", "test"), 1.0, False),
}


class RunLog(NamedTuple):
    """A checked ``log.jsonl``: its kind and its records (``null`` numbers as NaN)."""

    path: Path
    kind: LogKind
    records: list[dict[str, Any]]


def read_run_log(path: Path) -> RunLog:
    """The log at ``path``, every value checked (module docstring); ``ValueError`` naming
    the file, line and field of the first that is wrong."""
    records = read_log(path, required=("epoch", "train_loss"))
    if not records:
        raise ValueError(f"{path} is empty: the run logged no epoch yet")
    # read_log keeps every line but a last one cut short: record i is line i + 1
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {number}: not a JSON object; the log is damaged")
    first = records[0]
    graph = [kind for key, kind in GRAPH_KINDS.items() if f"val_{key}" in first]
    kind = graph[0] if len(graph) == 1 and "val_acc" not in first else NODE
    fields = [f"{split}_{kind.metric}" for split in kind.splits]
    required = [*fields, "grad_norms"] if kind is NODE else fields
    other = " (a graph-level one has val_mae or val_roc_auc)" if kind is NODE else ""
    previous = -1
    for number, record in enumerate(records, 1):
        where = f"{path}, line {number}"
        missing = [key for key in required if key not in record]
        if missing:
            raise ValueError(
                f"{where}: no {', '.join(missing)} in the record; not a refimpl training log{other}"
            )
        epoch = record["epoch"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= previous:
            raise _bad(where, "epoch", epoch, f"a whole number above {previous}")
        previous = epoch
        record["train_loss"] = _number(where, "train_loss", record["train_loss"], -_LARGEST)
        for key in fields:
            record[key] = _number(where, key, record[key], 0.0, kind.high)
        if kind is NODE:
            _check_diagnostics(where, record, first)
    return RunLog(path, kind, records)


def _check_diagnostics(where: str, record: dict[str, Any], first: dict[str, Any]) -> None:
    """A node-level record's gradient norms (``{layer: {kind: norm}}``) and, where the
    first record has them, its absolute norms and balance diagnostics, on line 1's layers."""
    for key in ("grad_norms", "grad_abs"):
        if key == "grad_norms" or key in first:
            for layer, norms in _layers(where, key, record.get(key), first.get(key)).items():
                for name in _layers(where, f"{key}.{layer}", norms):
                    norms[name] = _number(where, f"{key}.{layer}.{name}", norms[name], 0.0)
    if "balancedness" in first:  # with conservation: GAT-balance's diagnostics
        layers = _layers(where, "balancedness", record.get("balancedness"), first["balancedness"])
        for layer, c in layers.items():
            _layers(where, f"balancedness.{layer}", c)
            for name in ("sum", "min", "max"):  # the layer sum of c and its spread
                c[name] = _number(where, f"balancedness.{layer}.{name}", c.get(name), -_LARGEST)
        residuals = _layers(where, "conservation", record.get("conservation"), layers)
        for layer, value in residuals.items():
            residuals[layer] = _number(where, f"conservation.{layer}", value, 0.0)


def _layers(where: str, field: str, value: Any, first: Any = None) -> dict[str, Any]:
    """``value``, checked to be a JSON object (with the keys of ``first``, when given)."""
    if not isinstance(value, dict):
        raise _bad(where, field, value, "an object")
    if first is not None and value.keys() != first.keys():
        raise ValueError(
            f"{where}: {field} holds the layers {_shown(list(value))}, line 1 "
            f"{_shown(list(first))}; the log is damaged"
        )
    return value


def _number(where: str, field: str, value: Any, low: float, high: float = _LARGEST) -> float:
    """``value`` as a float in ``low..high`` (``null``: NaN), else the error naming it."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _bad(where, field, value, f"a number in {low:g}..{high:g} or null")
    return float(value)


def _bad(where: str, field: str, value: Any, expected: str) -> ValueError:
    return ValueError(
        f"{where}: {field} is {_shown(value)}, expected {expected}; the log is damaged"
    )


def _shown(value: Any) -> str:
    """A value read from a log, short and printable (``repr`` escapes control characters)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        return "a list"
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else None
    text = text or repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _plain(text: str) -> str:
    """``text`` as matplotlib draws it literally: a ``$`` would start mathtext (a folder or
    layer named ``a$b$`` drew ``b`` in italics, ``$\\x$`` failed to draw)."""
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
    if not log.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no log.jsonl; pass the directory of a refimpl train run"
        )
    return read_run_log(log)


def plot_run(run_dir: Path, kind: str = "feature") -> list[Path]:
    """Draw ``curves.png`` and, for a node-level run, ``grad_norms.png``, ``grad_abs.png``
    and ``balance.png`` (logs that have them) into ``run_dir``; returns the paths."""
    return _draw_run(_pyplot(), run_dir, _log_of(run_dir), kind)


def _draw_run(plt: Any, run_dir: Path, log: RunLog, kind: str) -> list[Path]:
    records, name = log.records, _plain(run_dir.name)
    written = [_save(plt, curves_figure(plt, records, name, log.kind), run_dir / "curves.png")]
    if log.kind is not NODE:  # a graph-level log has no per-layer norms
        return written
    epochs = [r["epoch"] for r in records]
    maps = [("grad_norms", kind, "relative gradient norm", f" ||grad W|| / ||W|| ({kind})")]
    if "grad_abs" in records[0]:  # LipschitzNorm Fig. 2: the attention's gradient norm
        maps.append(("grad_abs", "attention", "gradient norm of the attention parameters", ""))
    for key, which, quantity, formula in maps:
        layers, matrix = grad_norm_matrix(records, which, key=key)
        title = (quantity, formula or " ||grad a||")
        written.append(_heat_map(plt, epochs, layers, matrix, name, title, run_dir / f"{key}.png"))
    if "balancedness" in records[0]:
        written.append(_plot_balance(plt, run_dir, epochs, records))
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
    bar's label the name."""
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
    axis.set(xlabel="epoch", ylabel="layer", title=f"{run}: {name}{formula}")
    figure.colorbar(image, ax=axis, label=name)
    return _save(plt, figure, path)


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
    left.set(xlabel="epoch", ylabel="c", title="balancedness c (sum; band: min..max per neuron)")
    right.set(xlabel="epoch", ylabel="max |delta| / scale", title="conservation residual (Eq. 7)")
    if len(layers) <= 10:
        left.legend(fontsize="small")
        right.legend(fontsize="small")
    figure.suptitle(_plain(run_dir.name))
    return _save(plt, figure, run_dir / "balance.png")


def best_epoch(records: list[dict[str, Any]], kind: LogKind = NODE) -> int:
    """The epoch the run selects, by its training loop's rule. Node level: the first with
    the highest validation accuracy, or the last where the validation split is empty (NaN).
    Graph level: the first epoch, then each that improves on the best so far (NaN never
    does; ``kind.lower_is_better`` for MAE)."""
    key = f"val_{kind.metric}"
    if kind is NODE:
        best, best_value = records[-1]["epoch"], -math.inf
        for record in records:
            if record[key] > best_value:  # NaN is never greater: an empty split keeps last
                best, best_value = record["epoch"], record[key]
        return best
    best_record = records[0]
    for record in records[1:]:
        value, best_value = record[key], best_record[key]
        if value < best_value if kind.lower_is_better else value > best_value:
            best_record = record
    return best_record["epoch"]


def curves_figure(plt: Any, records: list[dict[str, Any]], label: str, kind: LogKind = NODE) -> Any:
    """Loss and the metric of one run against the epoch, the best epoch marked."""
    epochs, best = [r["epoch"] for r in records], best_epoch(records, kind)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.semilogy(epochs, [r["train_loss"] for r in records], label="training loss")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    for split in kind.splits:
        right.plot(epochs, [r[f"{split}_{kind.metric}"] for r in records], label=split)
    right.set(xlabel="epoch", ylabel=kind.name, title=f"{kind.name} (eval mode)")
    for axis in (left, right):
        axis.axvline(best, color="grey", linestyle="--", label=f"best validation (epoch {best})")
        axis.legend(fontsize="small")
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
    left.set(xlabel="epoch", ylabel="training loss", title="loss (band: min..max over seeds)")
    right.set(xlabel="epoch", ylabel=kind.name, title=f"{kind.name} (band: min..max over seeds)")
    for axis in (left, right):
        axis.axvline(
            mean_best, color="grey", linestyle="--", label=f"mean best epoch {mean_best:.1f}"
        )
        axis.legend(fontsize="small")
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
        for path in _draw_run(plt, directory, log, args.kind):
            print(f"wrote {path}")
    if len(seed_dirs) > 1:  # seeds.png: every seed's curves in one figure
        records = {directory.name: log.records for directory, log in logs.items()}
        figure = seeds_figure(plt, records, _plain(args.run_dir.name), kinds.pop())
        print(f"wrote {_save(plt, figure, args.run_dir / 'seeds.png')}")
    return 0
