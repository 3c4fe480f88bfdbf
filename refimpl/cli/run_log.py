"""A run's ``log.jsonl`` as ``refimpl plot`` reads it: which kind of run wrote it, every value
checked, and the epoch the run selected (and how the CLI words it).

Every log is read whole and checked: each line a JSON object with its kind of run's fields,
numbers where numbers belong (accuracies and ROC-AUC in 0..1; norms, MAE and residuals >= 0;
nothing beyond 1e100 in size, which no run logs and drawing cannot always scale), epochs
increasing, the same layers on every line. ``null`` (a log's NaN: an empty split's accuracy)
is read as NaN. A bad log is one ``ValueError`` naming the file, line and field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

from refimpl.train.run_folder import read_log

__all__ = [
    "GRAPH_KINDS",
    "NODE",
    "LogKind",
    "RunLog",
    "best_epoch",
    "best_epoch_words",
    "read_run_log",
]

# the largest size a logged number may have: far above what a run logs (float32 ends at
# 3.4e38, the divergence guards stop a loss long before), far below where drawing overflows
# (a log axis from the smallest double up to about 1e250 overflows matplotlib's ticks)
_LARGEST = 1e100


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


def best_epoch_words(best_epoch: int) -> str:
    """Where a run's best validation came, in both numberings a reader meets: the 0-based
    ``epoch`` of ``log.jsonl``, ``summary.json``'s ``best_epoch`` and the plots, and the count
    of epochs run to it (the printed table's "epochs to best")."""
    return f"at epoch {best_epoch} (0-based), after {best_epoch + 1} epochs"
