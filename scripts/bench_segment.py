"""Benchmark: which NumPy/SciPy kernel should segment_sum and segment_max use on the CPU?

Measures, in one run and on the same data, the candidates for the two graph
reductions of :mod:`refimpl.kernels.segment` on the NumPy backend:

segment_sum  (E, F) -> (N, F)
    * ``scipy.sparse`` CSR (N, E) product, as used (``refimpl.kernels.segment.segment_sum``,
      matrix built once per graph and cached, so its build is reported apart)
    * ``numpy.add.at`` on the target index
    * ``numpy.add.reduceat`` on edges pre-sorted by target (the sort not timed:
      a graph could store its edges sorted once)
    * ``numpy.bincount`` with weights, one call per feature column

segment_max  (E, F) -> (N, F), the max only
    * ``numpy.maximum.at`` on flattened (target * F + feature) positions, as used
      (the positions are computed per call, as in ``segment_max``)
    * ``numpy.maximum.at`` on the 2-D array with the target index
    * ``numpy.maximum.reduceat`` on edges pre-sorted by target
    * and, for reference, the whole ``refimpl`` ``segment_max`` (max + argmax)

Graphs: Cora-like (N = 2708, E = 13264 = 10556 random edges + one self-loop per
node, F in {8, 64}) and a large one (N = 1e5, E = 1e6, F = 16); targets uniform
at random from a fixed seed. Every candidate's result is checked against the
chosen one before it is timed. Prints the median wall time (ms) over repeated
calls and the ratio to the chosen implementation (> 1: slower than the choice).

Uses only NumPy and SciPy (through refimpl's own NumPy path). Runs in well
under a minute::

    python scripts/bench_segment.py [--json results.json] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import scipy
import scipy.sparse  # imported here so the CSR build time excludes the import

from refimpl.kernels.segment import Segments, segment_max, segment_sum

CASES = [  # name, N, E, F
    ("cora", 2708, 13264, 8),
    ("cora", 2708, 13264, 64),
    ("large", 100_000, 1_000_000, 16),
]
TIME_PER_CANDIDATE_S = 0.4  # repeats are chosen to fill about this much time
MIN_REPEATS, MAX_REPEATS = 3, 200


@dataclass(frozen=True)
class Result:
    case: str
    num_nodes: int
    num_edges: int
    num_features: int
    op: str
    implementation: str
    chosen: bool
    median_ms: float
    ratio_to_chosen: float
    repeats: int


def median_ms(function: Callable[[], object]) -> tuple[float, int]:
    """Median wall time of ``function()`` in ms, after one warm-up call, and the repeat count."""
    start = time.perf_counter()
    function()  # warm-up (caches, page faults)
    first = time.perf_counter() - start
    repeats = int(min(MAX_REPEATS, max(MIN_REPEATS, TIME_PER_CANDIDATE_S / max(first, 1e-6))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), repeats


def make_graph(num_nodes: int, num_edges: int, rng: np.random.Generator) -> np.ndarray:
    """Target index ``dst`` (E,): uniform random edges plus one self-loop per node."""
    random_targets = rng.integers(0, num_nodes, size=num_edges - num_nodes)
    return np.concatenate([random_targets, np.arange(num_nodes)]).astype(np.int64)


# -- segment_sum candidates --------------------------------------------------------------------


def sum_add_at(values: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    out = np.zeros((num_nodes, values.shape[1]), dtype=values.dtype)
    np.add.at(out, dst, values)
    return out


def sum_reduceat(
    sorted_values: np.ndarray, starts: np.ndarray, nonempty: np.ndarray, num_nodes: int
) -> np.ndarray:
    # reduceat gives a copy of the row, not 0, for an empty range: only non-empty
    # segments are reduced and written.
    out = np.zeros((num_nodes, sorted_values.shape[1]), dtype=sorted_values.dtype)
    out[nonempty] = np.add.reduceat(sorted_values, starts, axis=0)
    return out


def sum_bincount(values: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    # bincount accumulates in float64 whatever the weights' dtype.
    columns = [
        np.bincount(dst, weights=values[:, f], minlength=num_nodes) for f in range(values.shape[1])
    ]
    return np.stack(columns, axis=1).astype(values.dtype, copy=False)


# -- segment_max candidates --------------------------------------------------------------------


def max_at_flat(values: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    num_features = values.shape[1]
    positions = dst[:, None] * num_features + np.arange(num_features)  # (E, F)
    maxima = np.full(num_nodes * num_features, -np.inf, dtype=values.dtype)
    np.maximum.at(maxima, positions.ravel(), values.ravel())
    return maxima.reshape(num_nodes, num_features)


def max_at_2d(values: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    maxima = np.full((num_nodes, values.shape[1]), -np.inf, dtype=values.dtype)
    np.maximum.at(maxima, dst, values)
    return maxima


def max_reduceat(
    sorted_values: np.ndarray, starts: np.ndarray, nonempty: np.ndarray, num_nodes: int
) -> np.ndarray:
    maxima = np.full((num_nodes, sorted_values.shape[1]), -np.inf, dtype=sorted_values.dtype)
    maxima[nonempty] = np.maximum.reduceat(sorted_values, starts, axis=0)
    return maxima


# -- one case ----------------------------------------------------------------------------------


def run_case(
    name: str, num_nodes: int, num_edges: int, num_features: int, dtype: np.dtype, seed: int
) -> tuple[list[Result], float]:
    rng = np.random.default_rng(seed)
    dst = make_graph(num_nodes, num_edges, rng)
    values = rng.standard_normal((num_edges, num_features)).astype(dtype)
    segments = Segments(dst, num_nodes)

    start = time.perf_counter()
    segments.sum_matrix(values.dtype)  # the CSR matrix, built once per graph and dtype
    csr_build_ms = 1e3 * (time.perf_counter() - start)

    # Sorted layout for reduceat (not timed: a one-off per graph).
    order = np.argsort(dst, kind="stable")
    sorted_values = values[order]
    counts = np.bincount(dst, minlength=num_nodes)
    nonempty = counts > 0
    starts = (np.cumsum(counts) - counts)[nonempty]

    reference_sum = segment_sum(values, segments)
    reference_max = max_at_flat(values, dst, num_nodes)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    sum_candidates = {
        "scipy CSR product (refimpl)": lambda: segment_sum(values, segments),
        "numpy add.at": lambda: sum_add_at(values, dst, num_nodes),
        "numpy add.reduceat, sorted": lambda: sum_reduceat(
            sorted_values, starts, nonempty, num_nodes
        ),
        "numpy bincount per column": lambda: sum_bincount(values, dst, num_nodes),
    }
    max_candidates = {
        "maximum.at, flat (refimpl)": lambda: max_at_flat(values, dst, num_nodes),
        "maximum.at, 2-D": lambda: max_at_2d(values, dst, num_nodes),
        "maximum.reduceat, sorted": lambda: max_reduceat(
            sorted_values, starts, nonempty, num_nodes
        ),
        "refimpl segment_max (+argmax)": lambda: segment_max(values, segments),
    }

    results: list[Result] = []
    for op, candidates, reference in [
        ("segment_sum", sum_candidates, reference_sum),
        ("segment_max", max_candidates, reference_max),
    ]:
        timings = {}
        for label, function in candidates.items():
            out = function()
            out = out[0] if isinstance(out, tuple) else out
            if "+argmax" in label:  # refimpl's empty segments are 0, the kernels' -inf
                out = np.where(nonempty[:, None], out, -np.inf)
            scale = float(np.max(np.abs(reference[np.isfinite(reference)]), initial=1.0))
            error = float(
                np.max(np.abs(np.where(np.isfinite(reference), out - reference, 0)), initial=0.0)
            )
            if (
                out.dtype != reference.dtype
                or error > rtol * scale
                or not np.array_equal(np.isfinite(out), np.isfinite(reference))
            ):
                raise AssertionError(f"{name} F={num_features} {op}: {label} disagrees")
            timings[label] = median_ms(function)
        chosen_label = next(iter(candidates))  # the first candidate is the one refimpl uses
        chosen_ms = timings[chosen_label][0]
        for label, (ms, repeats) in timings.items():
            results.append(
                Result(
                    name,
                    num_nodes,
                    num_edges,
                    num_features,
                    op,
                    label,
                    label == chosen_label,
                    ms,
                    ms / chosen_ms,
                    repeats,
                )
            )
    return results, csr_build_ms


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    dtype = np.dtype(args.dtype)

    meta = {
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "dtype": str(dtype),
        "seed": args.seed,
    }
    print(
        f"segment kernels, {dtype}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"{os.cpu_count()} CPUs; median ms, ratio to the chosen (refimpl) kernel\n"
    )
    header = f"{'case':<18} {'op':<12} {'implementation':<31} {'median ms':>10} {'x chosen':>9}"
    print(header)
    print("-" * len(header))
    all_results: list[Result] = []
    builds = {}
    start = time.perf_counter()
    for name, num_nodes, num_edges, num_features in CASES:
        results, build_ms = run_case(name, num_nodes, num_edges, num_features, dtype, args.seed)
        case_label = f"{name} F={num_features}"
        builds[case_label] = build_ms
        for r in results:
            mark = " *" if r.chosen else ""
            print(
                f"{case_label:<18} {r.op:<12} {r.implementation + mark:<31} "
                f"{r.median_ms:>10.3f} {r.ratio_to_chosen:>9.2f}"
            )
        print(f"{case_label:<18} {'':<12} {'(CSR build, once per graph)':<31} {build_ms:>10.3f}")
        all_results += results
    elapsed = time.perf_counter() - start
    print(
        f"\n* chosen implementation; N, E: cora {CASES[0][1]}, {CASES[0][2]}; "
        f"large {CASES[2][1]}, {CASES[2][2]}. Total {elapsed:.1f} s."
    )

    if args.json:
        payload = {
            "meta": meta | {"elapsed_s": elapsed},
            "csr_build_ms": builds,
            "results": [asdict(r) for r in all_results],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {args.json}")
    if not all(math.isfinite(r.median_ms) for r in all_results):
        raise SystemExit("a timing was not finite")


if __name__ == "__main__":
    main()
