"""Several seeds of one configuration: per-seed runs, the summary over seeds, its table."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scipy import stats

from refimpl.train.loop import RunResult, TrainConfig, train_model

__all__ = ["format_summary", "mean_ci95", "run_seeds", "summarize"]


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% Student-t interval (``None`` for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, float(half)


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """Mean +- 95% CI over seeds of the test accuracy at the best validation epoch."""
    test_mean, test_ci = mean_ci95([r.test_acc for r in results])
    val_mean, val_ci = mean_ci95([r.val_acc for r in results])
    return {
        "test_acc_mean": test_mean,
        "test_acc_ci95": test_ci,
        "val_acc_mean": val_mean,
        "val_acc_ci95": val_ci,
        "epochs_to_best_mean": statistics.fmean(r.best_epoch + 1 for r in results),
        "runs": [
            {
                "seed": r.seed,
                "test_acc": r.test_acc,
                "val_acc": r.val_acc,
                "best_epoch": r.best_epoch,
                "epochs_run": r.epochs_run,
                "final_train_loss": r.final_train_loss,
            }
            for r in results
        ],
    }


def run_seeds(
    build_model: Callable[[], Any],
    dataset: Any,
    config: TrainConfig,
    seeds: Sequence[int],
    out_dir: str | Path | None = None,
    *,
    progress: bool = False,
    backend: str | None = None,
    resume: str | Path | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train once per seed and summarise; with several seeds each gets ``seed{k}/`` in ``out_dir``.

    ``dataset``: a ``NodeDataset``, or a function ``seed -> NodeDataset`` (a split per seed).

    ``resume`` (a checkpoint) applies to a single seed only. ``extra`` is stored
    in ``summary.json`` under ``"config"`` (what was run, for the record).
    """
    if resume is not None and len(seeds) != 1:
        raise ValueError("--resume continues one run: give exactly one seed")
    out = Path(out_dir) if out_dir is not None else None
    results = []
    for seed in seeds:
        run_dir = None if out is None else (out if len(seeds) == 1 else out / f"seed{seed}")
        run_config = TrainConfig(**{**config.__dict__, "seed": seed})
        results.append(
            train_model(
                build_model(),
                dataset(seed) if callable(dataset) else dataset,
                run_config,
                out_dir=run_dir,
                resume=resume,
                progress=progress,
                backend=backend,
            )
        )
    summary = summarize(results)
    if extra is not None:
        summary["config"] = extra
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The per-seed table and the mean +- 95% CI line."""
    lines = [f"{'seed':>6} {'best epoch':>10} {'val acc':>8} {'test acc':>8} {'epochs':>7}"]
    for run in summary["runs"]:
        lines.append(
            f"{run['seed']:>6} {run['best_epoch']:>10} {run['val_acc']:>8.4f} "
            f"{run['test_acc']:>8.4f} {run['epochs_run']:>7}"
        )
    ci = summary["test_acc_ci95"]
    spread = f" +- {ci:.4f} (95% CI)" if ci is not None else " (one seed: no interval)"
    lines.append(
        f"test accuracy at best validation: {summary['test_acc_mean']:.4f}{spread}; "
        f"mean epochs to best {summary['epochs_to_best_mean']:.1f}"
    )
    return "\n".join(lines)
