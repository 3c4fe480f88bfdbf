"""Several seeds of one configuration: per-seed runs, the summary over seeds, its table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scipy import stats

from refimpl.files import read_npz
from refimpl.train.config import RunResult, TrainConfig
from refimpl.train.loop import train_model
from refimpl.train.run_folder import read_json, write_json

__all__ = ["finished_run", "format_summary", "mean_ci95", "run_seeds", "summarize"]


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    r"""Mean and the half-width of its 95% Student-t interval.

    Parameters
    ----------
    values : sequence of float
        At least one value (the per-seed results).

    Returns
    -------
    mean : float
        Their mean.
    half_width : float or None
        $t_{0.975, n-1} \, s / \sqrt{n}$ for $n$ values of standard deviation $s$;
        ``None`` for one value.
    """
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, float(half)


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """Mean +- 95% CI over seeds of the test accuracy at the best validation epoch.

    Parameters
    ----------
    results : sequence of RunResult
        One per seed, at least one.

    Returns
    -------
    dict
        ``test_acc_mean``, ``test_acc_ci95``, ``val_acc_mean``, ``val_acc_ci95``
        (:func:`mean_ci95`; the interval ``None`` for one seed), ``epochs_to_best_mean``
        (mean of ``best_epoch + 1``) and ``runs``, one dict per seed.
    """
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
    resume: bool = False,
    extra: dict[str, Any] | None = None,
    report: Callable[[RunResult, bool], None] | None = None,
) -> dict[str, Any]:
    """Train once per seed and summarise; with several seeds each gets ``seed{k}/`` in ``out_dir``.

    Parameters
    ----------
    build_model : callable
        ``() -> model``: a fresh model for each seed.
    dataset : NodeDataset or callable
        The data, or a function ``seed -> NodeDataset`` (a split per seed).
    config : TrainConfig
        How to train; its ``seed`` is replaced by each of ``seeds``.
    seeds : sequence of int
        Distinct seeds, one run each.
    out_dir : str or pathlib.Path, optional
        The run folder: the runs (in ``seed{k}/`` with several seeds) and ``summary.json``.
        ``None``: nothing is written.
    progress : bool, default False
        A progress bar per run, labelled with its seed.
    backend : {"numpy", "cupy", "strict"} or None, default None
        Where the runs compute, as in :func:`~refimpl.train.loop.train_model`.
    resume : bool, default False
        Continue the runs already in ``out_dir`` (opened by
        :func:`refimpl.train.run_folder.open_run_folder`): a seed that finished is read back
        (``summary.json`` and ``final.npz``), one with a ``checkpoint.npz`` continues from
        it, any other starts again (the same seed gives the same run).
    extra : dict, optional
        Stored in ``summary.json`` under ``"config"`` (what was run, for the record).
    report : callable, optional
        ``report(result, earlier)``, called as each seed's run ends (``earlier``: it had
        finished before and was read back), so a caller can show it at once.

    Returns
    -------
    dict
        :func:`summarize` of the runs, with ``"config"`` when ``extra`` is given.
    """
    if len(set(seeds)) != len(seeds):
        raise ValueError(
            f"seeds must be distinct, got {list(seeds)}: a repeated seed repeats a run"
        )
    if resume and out_dir is None:
        raise ValueError("resume needs the run folder (out_dir) to continue")
    out = Path(out_dir) if out_dir is not None else None
    results = []
    for seed in seeds:
        run_dir = None if out is None else (out if len(seeds) == 1 else out / f"seed{seed}")
        run_config = TrainConfig(**{**config.__dict__, "seed": seed})
        finished = finished_run(run_dir, run_config) if resume else None
        if finished is None:
            checkpoint = None if run_dir is None else run_dir / "checkpoint.npz"
            result = train_model(
                build_model(),
                dataset(seed) if callable(dataset) else dataset,
                run_config,
                out_dir=run_dir,
                resume=checkpoint if resume and checkpoint.is_file() else None,
                progress=f"seed {seed}" if progress else False,
                backend=backend,
            )
        else:
            result = finished
        results.append(result)
        if report is not None:
            report(result, finished is not None)
    summary = summarize(results)
    if extra is not None:
        summary["config"] = extra
    if out is not None:
        if len(seeds) == 1:  # one folder holds the run and its summary: keep the run's record
            summary = {**read_json(out / "summary.json"), **summary}
        write_json(out / "summary.json", summary)
    return summary


def finished_run(run_dir: Path, config: TrainConfig) -> RunResult | None:
    """The result of the run in ``run_dir`` if it finished ``config.epochs`` epochs (or
    stopped early on its loss threshold); ``None`` if it has to train (on)."""
    path = run_dir / "summary.json"
    if not path.is_file() or not (run_dir / "final.npz").is_file():
        return None
    record = read_json(path)
    fields = ("seed", "best_epoch", "val_acc", "test_acc", "epochs_run", "final_train_loss")
    if "epochs" not in record or any(k not in record for k in fields):
        raise ValueError(f"{path} is not the summary of a finished run; the run folder is damaged")
    asked, run = record["epochs"], record["epochs_run"]
    if asked > config.epochs:
        raise ValueError(
            f"{run_dir} finished {asked} epochs, more than the {config.epochs} asked for; "
            f"pass --epochs {asked} or more"
        )
    if asked < config.epochs and run == asked:  # finished the epochs asked then: train on
        return None
    values = {k: (math.nan if record[k] is None else record[k]) for k in fields}
    return RunResult(**values, params=read_npz(run_dir / "final.npz"))


def format_summary(summary: dict[str, Any], metric: str = "accuracy") -> str:
    """The per-seed table and the mean +- 95% CI line.

    Parameters
    ----------
    summary : dict
        What :func:`summarize` (or :func:`run_seeds`) returned.
    metric : str, default "accuracy"
        What ``val_acc`` and ``test_acc`` hold, named in the header and the last line
        (``"ROC-AUC"`` for multi-label data).

    Returns
    -------
    str
        One row per seed (epochs to best, validation and test metric, epochs run), then
        the test metric's mean and interval and the mean epochs to best.
    """
    # "epochs to best" counts epochs, as the summary line does: the best validation came
    # after best_epoch + 1 epochs (best_epoch is log.jsonl's 0-based "epoch" index)
    short = "acc" if metric == "accuracy" else metric
    header = (
        f"{'seed':>6} {'epochs to best':>14} {'val ' + short:>11} {'test ' + short:>12} "
        f"{'epochs':>7}"
    )
    lines = [header]
    for run in summary["runs"]:
        lines.append(
            f"{run['seed']:>6} {run['best_epoch'] + 1:>14} {run['val_acc']:>11.4f} "
            f"{run['test_acc']:>12.4f} {run['epochs_run']:>7}"
        )
    ci = summary["test_acc_ci95"]
    spread = f" +- {ci:.4f} (95% CI)" if ci is not None else " (one seed: no interval)"
    lines.append(
        f"test {metric} at best validation: {summary['test_acc_mean']:.4f}{spread}; "
        f"mean epochs to best {summary['epochs_to_best_mean']:.1f}"
    )
    return "\n".join(lines)
