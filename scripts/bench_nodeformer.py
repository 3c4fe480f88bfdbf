"""Benchmark: one NodeFormer layer's forward + backward, linear in N, beside exact O(N^2) attention.

Ours: one ``refimpl.nn.NodeFormerConv`` (64 in and out channels, one head,
``m = 30`` random features, ``K = 10`` Gumbel samples, ``tau = 0.25``,
relational bias ``"sigmoid"`` of order 1) in training mode (``use_gumbel``: the
projection ``omega`` and the Gumbel noise are drawn in every step, as in
training), forward and backward with ``d_x``, on standard-normal features and a
random directed graph with ``E = 10 N`` edges (sources and targets uniform, so
average degree 10; the layer adds one self-loop per node). Exact: the attention
alone (no projections, no relational bias),
``refimpl.nn.nodeformer.all_pair_softmax.AllPairSoftmax``
with the same ``tau``, ``K`` and widths (``q, k, v (N, 64)`` standard normal,
``gumbel (N, K)``), forward and backward. At its peak it holds about ``3 K + 3``
arrays of ``N x N`` (forward: ``q k^T``, then ``K`` slabs each of the scores, their
shifted exponentials and the probabilities; backward: the ``K`` probabilities, two
``(K, N, N)`` temporaries and a few single ``N x N`` ones), so it runs only where
``N^2 * itemsize * (3 K + 3)`` is at most 8 GB (``1e9`` bytes).

Torch (issue 27): the same layer written in torch from the paper's equations
(``scripts/nodeformer_torch.py``; a test holds it equal to ours in float64), forward and
backward by autograd, with ``omega`` and the Gumbel noise drawn each step as ours are, where
torch is installed. It is skipped where its peak memory, extrapolated linearly from the
largest N it ran, would exceed ``--torch-limit-gb`` (default 16); the table then shows
the estimate.

Each (N, implementation) pair runs in its own subprocess, so its peak memory is
its own, with ``--threads`` threads (default 2; ``OMP_NUM_THREADS`` and
friends). Time: the median over a few steps after one warm-up step (fewer steps
at large N). Memory: the peak resident memory above the process's resident
memory once the inputs, graph and parameters are built (Linux: the peak mark is
reset through ``/proc/self/clear_refs``), so it includes the structures the
first step builds and caches on the graph (self-loops, segments, sparse
matrices). Stolen: the share of the machine's CPU time that the hypervisor took
during our steps (``/proc/stat``; ``ours_stolen`` in the JSON, None off Linux), since
on a shared virtual machine wall times swing with it. CPU: our process's CPU time
per step (user + system over all its threads, the mean over the timed steps;
``ours_cpu_s``), which the stolen time is not part of: it moves less than the wall
time between a busy and a quiet host. Load: the machine's one-minute load average when
our steps at that N ended (``load``): above the thread count, other work shared the
cores. The CPU model and the load averages at the start and the end are printed under
the table. Prints a table and the goals (issues 6 and 27):

1. time is linear: the least-squares log-log slope of ``ours_s`` over the N run
   in ``[1e4, 1e6]`` is at most 1.1;
2. ``N = 1e6``: forward + backward in at most 5 s (on 2 cores, float32);
3. memory is linear: the same slope of ``ours_peak_mb`` is at most 1.1;
4. against torch, from ``N = 1e4``: ours at most 0.2 of its time and 0.25 of its peak memory;
5. against the machine, from ``N = 1e4``: ours at most 1.5 times the step's arithmetic floor.

The floor (issue 38) is what the step's arithmetic costs on the machine running it, measured in
the same run with the same threads: the six products of ``K m x N x d`` multiply-adds (forward
``U = K~^T V`` and ``Z``; backward ``d_kv``, ``d_mixing``, ``d_V`` and ``d_K~``) at the rate
of one timed product of that shape, ``(K m, N) @ (N, d)``, plus the exponentials (the key
features, built in the forward and again in the backward, and the query features:
``(2 K + 1) m N``) at the rate of one timed ``exp`` over ``(K m, N)``. Both rates are measured
on at most ``FLOOR_NODES`` nodes and scaled linearly to N, each the fastest of a few timed
calls (ours is a median, so the multiple errs high). Everything else the step does
(random features, relational bias, the projections, memory traffic) is above the floor: at
these widths the projections alone add 43% to the six products' multiply-adds, and all of
the step's products come to 1.51x theirs (docs/benchmarks.md).

The exit code is 0 whatever the goals give (a benchmark, not a test)::

    python scripts/bench_nodeformer.py [--sizes 1e3 1e4] [--dtype float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/: shared helpers
from bench_common import (
    cpu_jiffies,
    machine,
    machine_line,
    median_seconds,
    process_cpu_seconds,
    reset_peak_rss,
    run_child,
    status_mb,
    stolen_fraction,
)

if TYPE_CHECKING:
    from refimpl.nn.nodeformer.conv import NodeFormerConv

CHANNELS = 64  # d: in and out channels
FEATURES = 30  # m = num_random_features
SAMPLES = 10  # K = num_samples
TAU = 0.25  # NodeFormerConv's default temperature
DEGREE = 10  # average degree of the random graph: E = DEGREE * N
SIZES = (1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6)
EXACT_LIMIT_BYTES = 8e9  # exact attention is skipped when its estimate exceeds this
EXACT_ARRAYS = 3 * SAMPLES + 3  # N x N arrays held at exact attention's peak (docstring)
FIT_RANGE = (1e4, 1e6)  # the N of goals 1 and 3
SLOPE_GOAL, SECONDS_GOAL = 1.1, 5.0
TORCH_FROM, TORCH_TIME_GOAL, TORCH_MEMORY_GOAL = 10_000, 0.2, 0.25
FLOOR_FROM, FLOOR_GOAL = 10_000, 1.5
FLOOR_NODES = 100_000  # the floor's rates are timed on at most this many nodes (memory)
PRODUCTS = 6  # K m N d products in one forward + backward (module docstring)
EXPONENTIAL_PASSES = 2 + 1 / SAMPLES  # (2 K + 1) m N exponentials, in units of K m N


def repeats_for(n: int, which: str = "ours") -> int:
    """Timed steps after the warm-up: fewer at large N (exact attention: at N > 1e3)."""
    if which == "exact":
        return 5 if n <= 1_000 else 3
    return 7 if n <= 10_000 else 5 if n <= 100_000 else 3


def exact_estimate_bytes(n: int, itemsize: int) -> float:
    """Exact attention's peak memory estimate: ``N^2 * itemsize * (3 K + 3)``."""
    return float(n) * n * itemsize * EXACT_ARRAYS


def nodeformer_layer() -> NodeFormerConv:
    """The benchmarked ``NodeFormerConv`` (module docstring; also ``bench_gpu.py``'s)."""
    from refimpl.nn.nodeformer.conv import NodeFormerConv

    return NodeFormerConv(
        CHANNELS,
        CHANNELS,
        heads=1,
        num_random_features=FEATURES,
        tau=TAU,
        num_samples=SAMPLES,
        use_gumbel=True,
        relational_bias="sigmoid",
        rb_order=1,
    )


def run_ours(n: int, dtype: str, repeats: int) -> dict:
    """Time and peak memory of NodeFormerConv's forward + backward (in this process)."""
    import numpy as np

    from refimpl.graph import Graph

    rng = np.random.default_rng(0)
    layer = nodeformer_layer()
    params = layer.init_params(rng, dtype=np.dtype(dtype))
    x = rng.standard_normal((n, CHANNELS)).astype(dtype)
    graph = Graph(rng.integers(0, n, (2, DEGREE * n)), n)
    d_out = rng.standard_normal((n, CHANNELS)).astype(dtype)
    baseline = reset_peak_rss()

    def step() -> None:
        _, cache = layer.forward(params, x, graph, training=True, rng=rng)
        layer.backward(params, cache, d_out, input_grad=True)

    step()  # warm-up (builds the graph's caches), outside the CPU and steal windows
    before, cpu_before = cpu_jiffies(), process_cpu_seconds()
    seconds = median_seconds(step, repeats, warmup=0)
    cpu = (process_cpu_seconds() - cpu_before) / repeats
    stolen = stolen_fraction(before, cpu_jiffies())
    peak_mb = status_mb("VmHWM") - baseline
    return {"s": seconds, "cpu_s": cpu, "peak_mb": peak_mb, "stolen": stolen}


def _fastest_seconds(step: Callable[[], object], repeats: int) -> float:
    """The fastest of ``max(repeats, 5)`` timed calls after one warm-up: a floor is the
    machine's best rate, and on a shared host the median would carry other work's."""
    step()
    times = []
    for _ in range(max(repeats, 5)):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def run_floor(n: int, dtype: str, repeats: int) -> dict:
    """The step's arithmetic floor at N (module docstring): seconds, and the GEMM rate."""
    import numpy as np

    rng = np.random.default_rng(0)
    width = min(n, FLOOR_NODES)
    keys = rng.standard_normal((SAMPLES * FEATURES, width)).astype(dtype)  # (K m, B)
    values = rng.standard_normal((width, CHANNELS)).astype(dtype)  # (B, d)
    product_s = _fastest_seconds(lambda: keys @ values, repeats)
    exponential_s = _fastest_seconds(lambda: np.exp(keys), repeats)
    scale = n / width
    return {
        "s": (PRODUCTS * product_s + EXPONENTIAL_PASSES * exponential_s) * scale,
        "gemm_gflops": 2 * SAMPLES * FEATURES * width * CHANNELS / product_s / 1e9,
    }


def run_exact(n: int, dtype: str, repeats: int) -> dict:
    """Time and peak memory of AllPairSoftmax's forward + backward with Gumbel noise."""
    import numpy as np

    from refimpl.nn.nodeformer.all_pair_softmax import AllPairSoftmax

    rng = np.random.default_rng(0)
    q, k, v, d_z = (rng.standard_normal((n, CHANNELS)).astype(dtype) for _ in range(4))
    gumbel = -np.log(-np.log(rng.random((n, SAMPLES)))).astype(dtype)
    block = AllPairSoftmax(TAU)
    baseline = reset_peak_rss()

    def step() -> None:
        _, cache = block.forward({}, q, k, v, gumbel)
        block.backward({}, cache, d_z)

    seconds = median_seconds(step, repeats, warmup=1)
    return {"s": seconds, "peak_mb": status_mb("VmHWM") - baseline}


def run_torch(n: int, dtype: str, repeats: int) -> dict:
    """Time and peak memory of the torch peer's forward + backward (in this process)."""
    import numpy as np
    import torch
    from nodeformer_torch import normalised_adjacency, peer_layer

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    params = nodeformer_layer().init_params(rng, dtype=np.dtype(dtype))
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    x = torch.tensor(rng.standard_normal((n, CHANNELS)).astype(dtype), requires_grad=True)
    edges = rng.integers(0, n, (2, DEGREE * n))
    d_out = torch.tensor(rng.standard_normal((n, CHANNELS)).astype(dtype))
    torch_dtype = x.dtype
    adjacency = normalised_adjacency(edges, n, torch_dtype)  # once per graph, as ours caches
    baseline = reset_peak_rss()

    def step() -> None:
        omega = torch.randn(FEATURES, CHANNELS, dtype=torch_dtype)
        uniform = torch.rand(n, 1, SAMPLES, dtype=torch_dtype).clamp_min(
            torch.finfo(torch_dtype).tiny
        )
        out = peer_layer(tensors, x, adjacency, omega, -torch.log(-torch.log(uniform)), TAU)
        out.backward(d_out)
        for tensor in (x, *tensors.values()):
            tensor.grad = None

    seconds = median_seconds(step, repeats, warmup=1)
    return {"s": seconds, "peak_mb": status_mb("VmHWM") - baseline}


def _torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _child(which: str, n: int, dtype: str, threads: int) -> dict:
    """``run_<which>`` in a fresh interpreter with ``threads`` BLAS/OpenMP threads."""
    args = (n, dtype, repeats_for(n, which))
    return run_child("bench_nodeformer", f"run_{which}", args, threads, f"{which} at N = {n}")


def loglog_slope(records: list[dict], key: str) -> tuple[float | None, list[int]]:
    """Least-squares slope of ``log record[key]`` against ``log n`` over N in FIT_RANGE,
    and the N used; None with fewer than two."""
    points = [(r["n"], r[key]) for r in records if FIT_RANGE[0] <= r["n"] <= FIT_RANGE[1]]
    if len(points) < 2 or any(value <= 0 for _, value in points):
        return None, [n for n, _ in points]
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(value) for _, value in points]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((a - x_mean) * (b - y_mean) for a, b in zip(xs, ys, strict=True)) / sum(
        (a - x_mean) ** 2 for a in xs
    )
    return slope, [n for n, _ in points]


def goal_lines(records: list[dict], dtype: str, threads: int) -> list[str]:
    """The three goals with the measured values and PASS / FAIL (or not measured)."""
    lines = []
    low, high = (f"1e{math.log10(n):.0f}" for n in FIT_RANGE)
    span = f"N in [{low}, {high}]"
    for number, key, what in ((1, "ours_s", "time"), (3, "ours_peak_mb", "peak memory")):
        slope, used = loglog_slope(records, key)
        if slope is None:
            verdict = f"not measured (needs 2 or more N run in [{low}, {high}], got {len(used)})"
        else:
            status = "PASS" if slope <= SLOPE_GOAL else "FAIL"
            verdict = f"{slope:.3f} over N = {', '.join(str(n) for n in used)}: {status}"
        text = f"goal {number} ({what} linear: log-log slope over {span} <= {SLOPE_GOAL}): "
        lines.append((number, text + verdict))
    at_million = [r for r in records if r["n"] == 1_000_000]
    text = f"goal 2 (N = 1e6 forward + backward <= {SECONDS_GOAL:g} s on 2 cores in float32): "
    if not at_million:
        text += "not measured (N = 1e6 not run)"
    else:
        seconds = at_million[0]["ours_s"]
        text += f"{seconds:.2f} s: {'PASS' if seconds <= SECONDS_GOAL else 'FAIL'}"
        if dtype != "float32" or threads != 2:
            text += f" (measured with {dtype} and {threads} threads, not the goal's setting)"
    lines.append((2, text))
    compared = [r for r in records if r["n"] >= TORCH_FROM and r.get("torch_s") is not None]
    text = (
        f"goal 4 (from N = 1e4: ours <= {TORCH_TIME_GOAL} x torch's time and "
        f"<= {TORCH_MEMORY_GOAL} x its peak memory): "
    )
    if not compared:
        text += "not measured (torch not run at N >= 1e4)"
    else:
        time_ratio = max(r["ours_s"] / r["torch_s"] for r in compared)
        memory_ratio = max(r["ours_peak_mb"] / r["torch_peak_mb"] for r in compared)
        met = time_ratio <= TORCH_TIME_GOAL and memory_ratio <= TORCH_MEMORY_GOAL
        text += (
            f"worst time ratio {time_ratio:.2f}, worst memory ratio {memory_ratio:.2f} over "
            f"N = {', '.join(str(r['n']) for r in compared)}: {'PASS' if met else 'FAIL'}"
        )
    lines.append((4, text))
    against = [r for r in records if r["n"] >= FLOOR_FROM and r.get("floor_s")]
    text = f"goal 5 (from N = 1e4: ours <= {FLOOR_GOAL} x the arithmetic floor): "
    if not against:
        text += "not measured (no N >= 1e4 run)"
    else:
        worst = max(r["ours_s"] / r["floor_s"] for r in against)
        text += (
            f"worst {worst:.2f} x over N = {', '.join(str(r['n']) for r in against)}: "
            f"{'PASS' if worst <= FLOOR_GOAL else 'FAIL'}"
        )
    lines.append((5, text))
    return [text for _, text in sorted(lines)]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=SIZES, help="N values (default 1e3 ... 1e6)"
    )
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads (default 2)")
    parser.add_argument(
        "--torch-limit-gb",
        type=float,
        default=16.0,
        help="skip torch where its extrapolated peak memory exceeds this (default 16)",
    )
    parser.add_argument("--no-torch", action="store_true", help="leave the torch column out")
    parser.add_argument("--json", metavar="PATH", help="write one record per N here")
    args = parser.parse_args(argv)
    sizes = sorted({round(size) for size in args.sizes})
    if sizes[0] < 1:
        parser.error("--sizes must be positive")
    itemsize = 4 if args.dtype == "float32" else 8

    records, ran_on = [], machine()
    print(
        f"NodeFormerConv d={CHANNELS}, m={FEATURES}, K={SAMPLES}, 1 head, Gumbel training, "
        f"sigmoid relational bias (order 1), E = {DEGREE} N; {args.dtype}, {args.threads} threads"
    )
    with_torch = not args.no_torch and _torch_available()
    print(
        f"{'N':>9} {'ours s':>9} {'CPU s':>9} {'stolen':>7} {'load':>5} {'ours MB':>9} "
        f"{'exact s':>9} {'exact MB':>9} {'ratio':>7} {'torch s':>9} {'torch MB':>9} {'/torch':>7} "
        f"{'MB /t':>6} {'floor s':>9} {'x floor':>7} {'GFLOP/s':>8}"
    )
    torch_per_node_mb = None  # the largest torch run's peak per node, for the estimate
    for n in sizes:
        ours = _child("ours", n, args.dtype, args.threads)
        record = {"n": n, "ours_s": ours["s"], "ours_peak_mb": ours["peak_mb"]}
        record.update(ours_cpu_s=ours["cpu_s"], ours_stolen=ours["stolen"])
        record.update(load=os.getloadavg()[0])
        record.update(torch_s=None, torch_peak_mb=None)
        floor = _child("floor", n, args.dtype, args.threads)
        record.update(floor_s=floor["s"], floor_gemm_gflops=floor["gemm_gflops"])
        floor_text = (
            f"{floor['s']:>9.4f} {ours['s'] / floor['s']:>7.2f} {floor['gemm_gflops']:>8.1f}"
        )
        torch_text = f"{'-':>9} {'-':>9} {'':>7} {'':>6}"
        torch_estimate_mb = None if torch_per_node_mb is None else torch_per_node_mb * n
        if with_torch and (torch_estimate_mb or 0) > 1e3 * args.torch_limit_gb:
            torch_text = f"{'skipped':>9} {f'~{torch_estimate_mb / 1e3:.0f} GB':>9} {'':>7} {'':>6}"
        elif with_torch:
            peer = _child("torch", n, args.dtype, args.threads)
            record.update(torch_s=peer["s"], torch_peak_mb=peer["peak_mb"])
            torch_per_node_mb = max(peer["peak_mb"], 1.0) / n
            torch_text = (
                f"{peer['s']:>9.4f} {peer['peak_mb']:>9.0f} {ours['s'] / peer['s']:>7.2f} "
                f"{ours['peak_mb'] / max(peer['peak_mb'], 1e-9):>6.2f}"
            )
        estimate = exact_estimate_bytes(n, itemsize)
        if estimate <= EXACT_LIMIT_BYTES:
            exact = _child("exact", n, args.dtype, args.threads)
            record.update(exact_s=exact["s"], exact_peak_mb=exact["peak_mb"])
            tail = f"{exact['s']:>9.4f} {exact['peak_mb']:>9.0f} {exact['s'] / ours['s']:>7.1f}"
        else:
            tail = f"{'skipped':>9} {f'~{estimate / 1e9:.0f} GB':>9} {'':>7}"
        records.append(record)
        stolen = "?" if ours["stolen"] is None else f"{100 * ours['stolen']:.0f}%"
        print(
            f"{n:>9} {ours['s']:>9.4f} {ours['cpu_s']:>9.4f} {stolen:>7} {record['load']:>5.2f} "
            f"{ours['peak_mb']:>9.0f} {tail} {torch_text} {floor_text}",
            flush=True,
        )
    print(
        f"seconds: median of {repeats_for(1)}/{repeats_for(100_000)}/{repeats_for(10**6)} steps "
        f"(N <= 1e4 / <= 1e5 / larger; exact {repeats_for(1, 'exact')}/"
        f"{repeats_for(10**6, 'exact')} for N <= 1e3 / larger) after one warm-up; "
        "stolen: share of the machine's CPU time the hypervisor took during our steps "
        "(/proc/stat; wall times swing with it on a shared host); "
        "CPU s: our process's CPU time per step, all threads (stolen time is not in it); "
        "load: the one-minute load average as our steps ended; "
        "MB: peak RSS above the inputs; "
        f"ratio = exact / ours; exact skipped where N^2 * {itemsize} B * {EXACT_ARRAYS} > 8 GB; "
        "/torch and MB /t: ours over torch (time, peak memory), torch skipped where its "
        f"linear memory estimate exceeds {args.torch_limit_gb:g} GB; "
        f"floor s: the six K m N d products and (2 K + 1) m N exponentials at this machine's "
        f"rates, timed here on min(N, {FLOOR_NODES:,}) nodes (GFLOP/s: the product's); "
        "x floor = ours / floor"
    )
    ran_on["load_end"] = os.getloadavg()
    print(machine_line(ran_on))
    for line in goal_lines(records, args.dtype, args.threads):
        print(line)
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(records, stream, indent=2)
    return records


if __name__ == "__main__":
    main()
