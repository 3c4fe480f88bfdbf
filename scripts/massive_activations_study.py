r"""The massive-activation study's grid: each of its architectures, with and without the explicit
attention bias, over seeds, base vs trained, on one machine's cores or on a Dask cluster.

Each job is one ``scripts/massive_activations.py --study ARCH`` run (the study's configuration:
10 layers, D = 64, 8 heads, BatchNorm, no positional encoding, batch 32, Adam at 3e-4,
ReduceLROnPlateau, stop below a rate of 1e-6; that script's docstring and
docs/reproductions.md say what each architecture's configuration is), in its own folder
``OUT/<variant>_seed<k>``, where it checkpoints and resumes. The variants: ``gt``,
``gt-explicit-bias``, ``graphit``, ``graphit-explicit-bias`` and ``san`` (the explicit bias
is GT's and GraphiT-GT's; SAN has none).
When every job has finished, it writes

- ``summary.md``: per variant and stream, the largest max/median ratio over the layers and
  seeds (base and trained), the range of the gamma fit's KS statistic, the (layer, graph)
  pairs above 1000 (supplement Sec. 3.2-3.3), and the test MAE;
- ``summary.png``: per variant, each stream's largest ratio by layer, base (dashed) against
  trained (solid), beside the threshold 1000.

The full-size study on a cluster (ZINC's 10,000 training molecules as a SMILES CSV with its
split, the configurations' 1000 epochs, four seeds; a Dask scheduler and workers sharing the
file system that holds ``--out``)::

    python scripts/massive_activations_study.py --molecules ZINC.csv --splits zinc_splits.csv \
        --target score --epochs 1000 --seeds 4 --scheduler tcp://HOST:8786 --out runs/ma_study

``--workers N`` runs the jobs on N processes here instead. Rerunning the same command after an
interruption skips the finished jobs and resumes the others from their checkpoints.
``--quick``: each job a ``--quick`` run (4 layers, 3 epochs, 200 synthetic molecules).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from refimpl.cli.errors import OneLineParser, report_errors
from refimpl.cli.runs import (
    add_scheduler_option,
    add_script_run_options,
    explicit_options,
    open_script_run,
)
from refimpl.files import atomic_write
from refimpl.train.parallel import run_jobs
from refimpl.train.run_lock import lock_scope

SCRIPT = Path(__file__).resolve().with_name("massive_activations.py")
VARIANTS = ("gt", "gt-explicit-bias", "graphit", "graphit-explicit-bias", "san")
THRESHOLD = 1000.0  # supplement Sec. 3.2: a max/median ratio above it is massive
OUTPUTS = ("summary.md", "summary.png")


def run_one(job: dict) -> dict:
    """One ``massive_activations.py`` run; resumes its own folder when it holds a started run.

    The script is loaded from its path (``job["script"]``), so a Dask worker that shares the
    file system needs no ``scripts/`` on its import path."""
    spec = importlib.util.spec_from_file_location("massive_activations", job["script"])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    arch, _, bias = job["variant"].partition("-")
    argv = ["--study", arch, "--epochs", str(job["epochs"]), "--seed", str(job["seed"])]
    argv += ["--out", job["run_dir"], *(["--explicit-bias"] if bias else [])]
    argv += ["--quick"] if job["quick"] else []
    argv += ["--no-progress"]  # jobs run side by side: their bars would interleave
    if job["molecules"] is not None:
        argv += ["--molecules", job["molecules"], "--target", job["target"]]
        argv += ["--splits", job["splits"]] if job["splits"] is not None else []
    if (Path(job["run_dir"]) / "run.json").exists():
        argv.append("--resume")
    summary = script.main(argv)
    return {**job, "training": summary["training"], "layers": summary["layers"]}


def streams(result: dict) -> dict[str, list[dict]]:
    """A run's layer records grouped by stream (``h.attention``, ...), in layer order."""
    grouped: dict[str, list[dict]] = {}
    for record in result["layers"]:
        _, _, stream = record["layer"].partition(".")  # "layer3.e.attention"
        grouped.setdefault(stream, []).append(record)
    return grouped


def summary_table(results: list[dict]) -> str:
    """``summary.md``'s table: one row per (variant, stream), over layers and seeds."""
    lines = [
        "| variant | stream | KS base | KS trained | max ratio base | max ratio trained "
        "| flagged base -> trained | test MAE | seeds |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for variant in VARIANTS:
        runs = [r for r in results if r["variant"] == variant]
        if not runs:
            continue
        maes = sorted(r["training"]["test_metric"] for r in runs)
        mae = f"{maes[0]:.3f}" if len(maes) == 1 else f"{maes[0]:.3f}-{maes[-1]:.3f}"
        for stream in streams(runs[0]):
            records = [rec for r in runs for rec in streams(r)[stream]]

            def ks(model: str, records: list[dict] = records) -> str:
                values = [rec[model]["ks_statistic"] for rec in records]
                return f"{min(values):.3f}-{max(values):.3f}"

            def ratio(model: str, records: list[dict] = records) -> str:
                return f"{max(rec[model]['max_ratio'] for rec in records):.0f}"

            base = sum(rec["flagged_graphs_base"] for rec in records)
            trained = sum(rec["flagged_graphs_trained"] for rec in records)
            lines.append(
                f"| {variant} | `{stream}` | {ks('base')} | {ks('trained')} | {ratio('base')} "
                f"| {ratio('trained')} | {base} -> {trained} | {mae} | {len(runs)} |"
            )
    return "\n".join(lines)


def plot_summary(results: list[dict], path: Path, dpi: int) -> Path:
    """``summary.png``: per variant, each stream's largest ratio (over seeds) by layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    variants = [v for v in VARIANTS if any(r["variant"] == v for r in results)]
    columns = min(len(variants), 3)
    rows = -(-len(variants) // columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False, sharey=True
    )
    colours: dict[str, str] = {}  # one colour per stream, the same in every panel
    for ax, variant in zip(axes.flat, variants, strict=False):
        runs = [r for r in results if r["variant"] == variant]
        for stream, records in streams(runs[0]).items():
            colour = colours.setdefault(stream, f"C{len(colours)}")
            for model, style in (("base", "--"), ("trained", "-")):
                by_layer = [
                    max(streams(r)[stream][layer][model]["max_ratio"] for r in runs)
                    for layer in range(len(records))
                ]
                ax.plot(by_layer, style, color=colour, marker="o", markersize=3)
        ax.axhline(THRESHOLD, color="black", linewidth=0.8, linestyle=":")
        ax.set_yscale("log")
        ax.set_title(f"{variant} ({len(runs)} seed{'s' * (len(runs) > 1)})")
        ax.set_xlabel("layer")
        ax.set_ylabel("largest max/median ratio")
    for ax in list(axes.flat)[len(variants) :]:
        ax.set_visible(False)
    # one legend for the figure, below the panels: colour is the stream, style the model
    handles = [Line2D([], [], color=c, marker="o", markersize=3) for c in colours.values()]
    handles += [Line2D([], [], color="grey", linestyle=s) for s in ("--", "-", ":")]
    labels = [*colours, "base (untrained)", "trained", f"threshold {THRESHOLD:.0f}"]
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return path


def _describe(result: dict) -> str:
    training = result["training"]
    largest = max(rec["trained"]["max_ratio"] for rec in result["layers"])
    return (
        f"  {result['variant']} seed {result['seed']}: test MAE {training['test_metric']:.4f}, "
        f"{training['epochs_run']} epochs, largest trained ratio {largest:.0f}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1000, help="the configs' epochs")
    parser.add_argument("--molecules", help="a CSV of SMILES (synthetic molecules without)")
    parser.add_argument("--target", default="score", help="--molecules: the target column")
    parser.add_argument("--splits", help="--molecules: a CSV of train/val/test row numbers")
    parser.add_argument("--workers", type=int, default=1, help="processes here")
    add_scheduler_option(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/ma_study"))
    parser.add_argument("--quick", action="store_true", help="each job a --quick run")
    parser.add_argument("--dpi", type=int, default=100, help="resolution of summary.png")
    add_script_run_options(parser)
    return parser


@lock_scope()  # the run folder is released as main returns (tests call it in-process)
def main(argv: list[str] | None = None) -> list[dict]:
    """Run the grid; returns every job's result."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    args.explicit = explicit_options(build_parser, argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    # the molecules' paths as absolute: a worker may start elsewhere
    for name in ("molecules", "splits"):
        if getattr(args, name) is not None:
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    open_script_run(args, "massive_activations_study", args.out, OUTPUTS)
    jobs = [
        {
            "script": str(SCRIPT),
            "variant": variant,
            "seed": seed,
            "epochs": args.epochs,
            "molecules": args.molecules,
            "splits": args.splits,
            "target": args.target,
            "quick": args.quick,
            "run_dir": str((args.out / f"{variant}_seed{seed}").resolve()),
        }
        for variant in args.variants
        for seed in range(args.seeds)
    ]
    results = run_jobs(run_one, jobs, args.workers, _describe, args.scheduler, args.worker_timeout)
    table = summary_table(results)
    atomic_write(args.out / "summary.md", lambda stream: stream.write(f"{table}\n".encode()))
    figure = plot_summary(results, args.out / "summary.png", args.dpi)
    print()
    print(table)
    print(f"\nwrote {args.out / 'summary.md'} and {figure}")
    return json.loads(json.dumps(results))


if __name__ == "__main__":  # one line per error, as the refimpl command prints
    sys.exit(report_errors("massive_activations_study.py", main))
