"""Benchmark: the graph transformers of the massive-activation study, a training step on ZINC-sized
batches and a forward + backward on one graph of growing size.

Variants, each a ``refimpl.models.GraphTransformer`` with hidden width 64, 8 heads, the
molecules' 3 bond types as edge features, sum readout, one regression target, no positional
encoding and no dropout (the study's archs with batch norm, their default):

    transformer-conv  arch="transformer-conv", the existing model (layer norm)
    gt                arch="gt", GT with its edge stream
    graphit-edges     arch="graphit", full_graph=False: attention over the input edges, no
                      kernel (what the study's GraphiT configs ran)
    graphit-full      arch="graphit", full_graph=True: every ordered pair of a graph's nodes,
                      re-weighted by the dense random-walk kernel (p = 16, gamma = 0.25)
    san-edges         arch="san", full_graph=False
    san-full          arch="san", full_graph=True: every ordered pair (the study's SAN)

1. Training step (``--layers``, default 10, the study's depth): batches of ``--batch-sizes``
   (default 32 and 128) synthetic molecules sized like ZINC: ``synthetic_molecules`` with
   ``min_atoms=14, max_atoms=32, mean_rings=3`` (about 23 nodes, 50 directed edges and 550
   ordered node pairs per graph; ZINC has 23.2 nodes and 49.8 directed edges, the
   function's defaults give 16 and 34). One step: the forward in training mode
   (BatchNorm's running statistics carried from step to step), the L1 loss, the backward
   (no input gradient) and an Adam step (lr 1e-3), as ``refimpl.train.graph_level`` makes
   one without its finiteness guards. Every step reads a fresh batch, collated beforehand
   (collating is not timed), so each meets a new graph and builds that graph's cached
   structures (segments, sparse matrices, the full graph's pairs and kernel), as in an
   epoch. ``--repeats`` timed steps (default 3) after one warm-up step. Reported: the
   median step, the medians of its phases (forward with the loss; backward; Adam), the
   process's CPU time per step, the share of the machine's CPU time stolen by the
   hypervisor meanwhile (``/proc/stat``), and the peak resident memory above the
   process's once the batches, parameters and optimiser state exist. For the full-graph
   variants, the seconds to build one batch's pairs (``refimpl.data.full_graph``) and
   GraphiT's kernel (``refimpl.data.graph_kernels.random_walk_kernel``), which every
   forward does, timed alone (median of ``--repeats`` after one warm-up).
2. Scaling (``--sizes``, default N = 50 ... 800): one molecule-like graph of N nodes,
   ``synthetic_molecules(1, min_atoms=N, max_atoms=N, mean_rings=N / 10)`` (average degree
   2.0-2.2, ZINC's 2.15), a 2-layer model (``--scaling-layers``), the forward in
   training mode and the backward. Time: the median of 3 steps after a warm-up step, or
   one step where the warm-up took 1 s or more; the CPU time per timed step; peak memory
   as above; the pairs and the kernel timed alone. A size is skipped where the time or
   peak memory extrapolated from the two largest sizes run (their log-log slope, held to
   [1, 3]; from one size, quadratic) exceeds ``--max-seconds`` per step or ``--max-gb``.
   Printed: the least-squares log-log slopes over the sizes run and the slope between
   the two largest.

Each (variant, batch size) and (variant, N) runs in its own subprocess with ``--threads``
threads (default 2), so its peak memory is its own. The JSON (``--json``) holds the
configuration, the machine, ``training`` and ``scaling`` records (a skipped size with its
estimates, a failed child with its error) and ``slopes``. Exit code 0 whatever the numbers::

    python scripts/bench_graph_transformer.py [--dtype float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/: shared helpers
from bench_common import (
    ChildFailed,
    cpu_jiffies,
    machine,
    median_seconds,
    process_cpu_seconds,
    reset_peak_rss,
    run_child,
    status_mb,
    stolen_fraction,
)

if TYPE_CHECKING:
    from refimpl.models import GraphTransformer

VARIANTS = {  # name: (arch, full_graph; None where the arch has no such choice)
    "transformer-conv": ("transformer-conv", None),
    "gt": ("gt", None),
    "graphit-edges": ("graphit", False),
    "graphit-full": ("graphit", True),
    "san-edges": ("san", False),
    "san-full": ("san", True),
}
HIDDEN, HEADS = 64, 8  # the study's D and heads
MOLECULES = {"min_atoms": 14, "max_atoms": 32, "mean_rings": 3.0}  # ZINC-sized (docstring)
RINGS_PER_NODE = 0.1  # ring closures of the scaling graph: average degree 2.0-2.2
LR = 1e-3  # Adam; GraphTrainConfig's default
SIZES = (50, 100, 200, 400, 800)
SLOW_STEP_S = 1.0  # a scaling size whose warm-up step took this long is timed once, not 3 times
SLOPE_RANGE = (1.0, 3.0)  # the extrapolation's slope is held here


def make_model(variant: str, layers: int, in_channels: int, edge_dim: int) -> GraphTransformer:
    """The benchmarked model of ``variant`` (module docstring)."""
    from refimpl.models import GraphTransformer

    arch, full = VARIANTS[variant]
    extra = {} if full is None else {"full_graph": full}
    return GraphTransformer(
        in_channels, 1, hidden_channels=HIDDEN, num_layers=layers, heads=HEADS,
        edge_dim=edge_dim, pool="sum", arch=arch, **extra,
    )  # fmt: skip


def build_seconds(
    variant: str, model: GraphTransformer, graph: Any, batch: Any, repeats: int
) -> tuple[float | None, float | None]:
    """Seconds to build the full graph's pairs and GraphiT's kernel of ``graph`` (what each
    forward of a full-graph variant does first); None where the variant builds neither."""
    from refimpl.data.full_graph import full_graph
    from refimpl.data.graph_kernels import random_walk_kernel

    if not VARIANTS[variant][1]:
        return None, None
    edges, n = graph.edge_index, graph.num_nodes
    pairs_s = median_seconds(lambda: full_graph(edges, n, batch), repeats)
    if model.arch != "graphit":
        return pairs_s, None
    pairs = full_graph(edges, n, batch).graph
    options = {"p": model.kernel_steps, "gamma": model.kernel_gamma}
    kernel_s = median_seconds(
        lambda: random_walk_kernel(pairs, edges, n, batch, **options), repeats
    )
    return pairs_s, kernel_s


def attended(variant: str, sizes: Any, edges: Any) -> int:
    """``|A|``, the pairs attention runs over: all ordered pairs, or the input edges."""
    return int(sum(n * (n - 1) for n in sizes)) if VARIANTS[variant][1] else int(sum(edges))


def run_training(variant: str, batch_graphs: int, layers: int, repeats: int, dtype: str) -> dict:
    """Time and peak memory of training steps on fresh ZINC-sized batches (in this process)."""
    import numpy as np

    from refimpl.data import collate, synthetic_molecules
    from refimpl.ops.losses import L1Loss
    from refimpl.optim import make_optimizer

    steps = repeats + 1  # one warm-up
    data = synthetic_molecules(batch_graphs * steps, seed=0, **MOLECULES)
    model = make_model(variant, layers, data.x.shape[1], data.edge_attr.shape[1])
    ranges = [np.arange(i * batch_graphs, (i + 1) * batch_graphs) for i in range(steps)]
    sizes, edges = np.diff(data.node_ptr), np.diff(data.edge_ptr)
    first = collate(data, ranges[0])  # a batch of its own for the build timing
    pairs_s, kernel_s = build_seconds(variant, model, first.graph, first.batch, repeats)
    batches = [collate(data, r) for r in ranges]
    queue = [  # consumed one per step, so a used graph and its caches are freed
        (
            b.x.astype(dtype),
            b.graph,
            b.edge_attr.astype(dtype),
            b.batch,
            b.num_graphs,
            b.y.astype(dtype),
        )
        for b in batches
    ]
    del batches, first
    rng = np.random.default_rng(0)
    params = model.init_params(rng, dtype=np.dtype(dtype))
    optimizer, loss = make_optimizer("adam", lr=LR), L1Loss()
    state = model.init_state(dtype=np.dtype(dtype))  # BatchNorm's; {} for transformer-conv
    carried = {"params": params, "opt": optimizer.init(params), "state": state}
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    baseline = reset_peak_rss()

    def step() -> None:
        x, graph, edge_attr, batch, num_graphs, y = queue.pop(0)
        params = carried["params"]
        start = time.perf_counter()
        out, cache = model.forward(
            params, x, graph, edge_attr, None, batch, num_graphs, training=True, rng=rng,
            state=carried["state"] or None,
        )  # fmt: skip
        _, loss_cache = loss.forward({}, out, y)
        d_out, _ = loss.backward({}, loss_cache, 1.0)
        forward_end = time.perf_counter()
        _, grads = model.backward(params, cache, d_out, input_grad=False)
        backward_end = time.perf_counter()
        carried["params"], carried["opt"] = optimizer.step(params, grads, carried["opt"])
        carried["state"] = cache.state if carried["state"] else {}
        phases["forward"].append(forward_end - start)
        phases["backward"].append(backward_end - forward_end)
        phases["optimizer"].append(time.perf_counter() - backward_end)

    step()  # warm-up, outside the CPU and steal windows
    before, cpu_before = cpu_jiffies(), process_cpu_seconds()
    seconds = median_seconds(step, repeats, warmup=0)
    cpu = (process_cpu_seconds() - cpu_before) / repeats
    stolen = stolen_fraction(before, cpu_jiffies())
    timed = slice(sizes.size - batch_graphs * repeats, None)  # the timed steps' graphs
    record = {
        "s": seconds,
        **{f"{k}_s": statistics.median(v[1:]) for k, v in phases.items()},
        "cpu_s": cpu,
        "stolen": stolen,
        "peak_mb": status_mb("VmHWM") - baseline,
        "nodes": float(sizes[timed].mean() * batch_graphs),
        "edges": float(edges[timed].mean() * batch_graphs),
        "pairs": attended(variant, sizes[timed], edges[timed]) / repeats,
    }
    return {**record, "pairs_s": pairs_s, "kernel_s": kernel_s}


def run_scaling(variant: str, n: int, layers: int, dtype: str) -> dict:
    """Time and peak memory of a forward + backward on one graph of ``n`` nodes."""
    import numpy as np

    from refimpl.data import synthetic_molecules
    from refimpl.graph import Graph

    data = synthetic_molecules(1, seed=0, min_atoms=n, max_atoms=n, mean_rings=RINGS_PER_NODE * n)
    model = make_model(variant, layers, data.x.shape[1], data.edge_attr.shape[1])
    graph = Graph(data.edge_index, n)
    one_graph = np.zeros(n, dtype=np.int64)  # the batch vector the forward makes of None
    pairs_s, kernel_s = build_seconds(variant, model, graph, one_graph, 3)
    x, edge_attr = data.x.astype(dtype), data.edge_attr.astype(dtype)
    rng = np.random.default_rng(0)
    params = model.init_params(rng, dtype=np.dtype(dtype))
    state = model.init_state(dtype=np.dtype(dtype)) or None
    d_out = np.ones((1, 1), dtype=dtype)
    baseline = reset_peak_rss()

    def step() -> None:
        _, cache = model.forward(params, x, graph, edge_attr, training=True, rng=rng, state=state)
        model.backward(params, cache, d_out, input_grad=False)

    start = time.perf_counter()
    step()  # warm-up: first-touch page faults and the graph's caches, as the training's
    repeats = 3 if time.perf_counter() - start < SLOW_STEP_S else 1
    cpu_start = process_cpu_seconds()
    seconds = median_seconds(step, repeats, warmup=0)
    cpu = (process_cpu_seconds() - cpu_start) / repeats
    edges = data.edge_index.shape[1]
    return {
        "s": seconds,
        "cpu_s": cpu,
        "peak_mb": status_mb("VmHWM") - baseline,
        "edges": edges,
        "pairs": attended(variant, [n], [edges]),
        "pairs_s": pairs_s,
        "kernel_s": kernel_s,
    }


def extrapolate(points: list[tuple[int, float]], n: int) -> float:
    """A value at ``n`` from ``(size, value)`` points, ascending: the two largest sizes'
    log-log slope (held to SLOPE_RANGE), or quadratic from one point; 0 from none."""
    if not points:
        return 0.0
    size, value = points[-1]
    slope = 2.0
    if len(points) > 1 and points[-2][1] > 0 and value > 0:
        previous, earlier = points[-2]
        slope = math.log(value / earlier) / math.log(size / previous)
        slope = min(max(slope, SLOPE_RANGE[0]), SLOPE_RANGE[1])
    return value * (n / size) ** slope


def slopes(points: list[tuple[int, float]]) -> tuple[float | None, float | None]:
    """The least-squares log-log slope over ``points`` and the slope between the two
    largest sizes; None with fewer than two positive values."""
    points = [(n, v) for n, v in points if v is not None and v > 0]
    if len(points) < 2:
        return None, None
    xs, ys = [math.log(n) for n, _ in points], [math.log(v) for _, v in points]
    x_mean, y_mean = statistics.fmean(xs), statistics.fmean(ys)
    fit = sum((a - x_mean) * (b - y_mean) for a, b in zip(xs, ys, strict=True)) / sum(
        (a - x_mean) ** 2 for a in xs
    )
    return fit, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])


def _child(function: str, args: tuple, threads: int, what: str) -> dict:
    """``function(*args)`` in a fresh interpreter; ``{"error": its last stderr line}`` if it
    failed (an out-of-memory kill, say), so that the other measurements still run."""
    try:
        return run_child("bench_graph_transformer", function, args, threads, what)
    except ChildFailed as failed:
        lines = failed.stderr.strip().splitlines() or ["no message (killed?)"]
        return {"error": lines[-1]}


def _number(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def training_part(args: argparse.Namespace) -> list[dict]:
    print(f"1. training step, {args.layers} layers, D={HIDDEN}, {HEADS} heads, Adam")
    print(
        f"{'variant':<17} {'B':>4} {'nodes':>6} {'edges':>6} {'|A|':>7} {'step s':>8} "
        f"{'fwd s':>7} {'bwd s':>7} {'adam s':>7} {'CPU s':>7} {'stolen':>6} {'MB':>6} "
        f"{'pairs s':>8} {'kernel s':>8}"
    )
    records = []
    for variant in args.variants:
        for graphs in args.batch_sizes:
            what = f"{variant} training at B = {graphs}"
            result = _child(
                "run_training", (variant, graphs, args.layers, args.repeats, args.dtype),
                args.threads, what,
            )  # fmt: skip
            records.append({"variant": variant, "batch_graphs": graphs, **result})
            if "error" in result:
                print(f"{variant:<17} {graphs:>4} failed: {result['error']}", flush=True)
                continue
            stolen = "?" if result["stolen"] is None else f"{100 * result['stolen']:.0f}%"
            print(
                f"{variant:<17} {graphs:>4} {result['nodes']:>6.0f} {result['edges']:>6.0f} "
                f"{result['pairs']:>7.0f} {result['s']:>8.3f} {result['forward_s']:>7.3f} "
                f"{result['backward_s']:>7.3f} {result['optimizer_s']:>7.3f} "
                f"{result['cpu_s']:>7.2f} {stolen:>6} {result['peak_mb']:>6.0f} "
                f"{_number(result['pairs_s'], 8, 4)} {_number(result['kernel_s'], 8, 4)}",
                flush=True,
            )
    return records


def scaling_part(args: argparse.Namespace) -> tuple[list[dict], dict]:
    print(f"2. one graph of N nodes, {args.scaling_layers} layers, forward + backward")
    print(
        f"{'variant':<17} {'N':>6} {'edges':>6} {'|A|':>8} {'s':>9} {'CPU s':>9} {'MB':>7} "
        f"{'pairs s':>8} {'kernel s':>8}"
    )
    records, fitted = [], {}
    for variant in args.variants:
        ran: list[dict] = []
        for n in args.sizes:
            estimate_s = extrapolate([(r["n"], r["s"]) for r in ran], n)
            estimate_mb = extrapolate([(r["n"], r["peak_mb"]) for r in ran], n)
            record: dict[str, Any] = {"variant": variant, "n": n}
            if estimate_s > args.max_seconds or estimate_mb > 1e3 * args.max_gb:
                record.update(s=None, peak_mb=None, estimate_s=estimate_s, estimate_mb=estimate_mb)
                print(
                    f"{variant:<17} {n:>6} skipped: about {estimate_s:.3g} s, "
                    f"{estimate_mb:.0f} MB (--max-seconds {args.max_seconds:g}, "
                    f"--max-gb {args.max_gb:g})",
                    flush=True,
                )
            else:
                what = f"{variant} at N = {n}"
                args_ = (variant, n, args.scaling_layers, args.dtype)
                record.update(_child("run_scaling", args_, args.threads, what))
                if "error" in record:
                    print(f"{variant:<17} {n:>6} failed: {record['error']}", flush=True)
                else:
                    ran.append(record)
                    print(
                        f"{variant:<17} {n:>6} {record['edges']:>6} {record['pairs']:>8} "
                        f"{record['s']:>9.4f} {record['cpu_s']:>9.4f} {record['peak_mb']:>7.0f} "
                        f"{_number(record['pairs_s'], 8, 4)} {_number(record['kernel_s'], 8, 4)}",
                        flush=True,
                    )
            records.append(record)
        fitted[variant] = {
            key: dict(zip(("fit", "last"), slopes([(r["n"], r[key]) for r in ran]), strict=True))
            for key in ("s", "peak_mb", "pairs_s", "kernel_s")
        }
    print("log-log slopes (least squares over the N run / between the two largest):")
    print(f"{'variant':<17} {'time':>13} {'memory':>13} {'pairs':>13} {'kernel':>13}")
    for variant, by_key in fitted.items():
        cells = [
            "-" if s["fit"] is None else f"{s['fit']:.2f} / {s['last']:.2f}"
            for s in by_key.values()
        ]
        print(f"{variant:<17} " + " ".join(f"{cell:>13}" for cell in cells))
    return records, fitted


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument(
        "--parts", nargs="+", choices=("training", "scaling"), default=["training", "scaling"]
    )
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads (default 2)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--layers", type=int, default=10, help="training step's layers")
    parser.add_argument("--repeats", type=int, default=3, help="timed training steps")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="scaling N")
    parser.add_argument("--scaling-layers", type=int, default=2)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=30.0,
        help="skip a scaling size whose step would take longer (default 30)",
    )
    parser.add_argument(
        "--max-gb",
        type=float,
        default=8.0,
        help="skip a scaling size whose peak memory would exceed this (default 8)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the records here")
    args = parser.parse_args(argv)
    for name in ("threads", "layers", "repeats", "scaling_layers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.batch_sizes) < 1:
        parser.error("--batch-sizes must be at least 1 graph")
    if min(args.sizes) < 2:
        parser.error("--sizes must be at least 2 nodes")
    if not (args.max_seconds > 0 and args.max_gb > 0):  # NaN fails too
        parser.error("--max-seconds and --max-gb must be positive")
    folder = os.path.dirname(os.path.abspath(args.json)) if args.json else None
    if folder is not None and not os.path.isdir(folder):
        parser.error(f"--json: folder {folder} does not exist; create it first")
    args.sizes = sorted(set(args.sizes))
    args.variants = list(dict.fromkeys(args.variants))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    result: dict[str, Any] = {
        "config": {
            "dtype": args.dtype, "threads": args.threads, "layers": args.layers,
            "scaling_layers": args.scaling_layers, "repeats": args.repeats,
            "hidden": HIDDEN, "heads": HEADS, "molecules": MOLECULES,
        },
        "machine": machine(),
        "training": [],
        "scaling": [],
        "slopes": {},
    }  # fmt: skip
    print(f"{args.dtype}, {args.threads} threads, {result['machine']['cpu']}")
    if "training" in args.parts:
        result["training"] = training_part(args)
    if "scaling" in args.parts:
        result["scaling"], result["slopes"] = scaling_part(args)
    result["machine"]["load_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(result, stream, indent=2)
    return result


if __name__ == "__main__":
    main()
