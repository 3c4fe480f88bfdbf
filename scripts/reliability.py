"""Reliability harness: bad inputs fed to every public surface of refimpl, every outcome
classified and counted (issue 33, item 9; the figures are in docs/reliability.md).

    python scripts/reliability.py                 # every surface, the full set (minutes)
    python scripts/reliability.py --quick         # a fixed sample, about a minute
    python scripts/reliability.py --surface layers --show-failures
    python scripts/reliability.py --surface layers --case "GATConv v1 | x | NaN"
    python scripts/reliability.py --json figures.json

Each surface's cases are made from fixed seeds (the same inputs every run) and run in a
child process, so a case that kills its process counts as a crash and the rest still run
(``reliability_cases.runner``). Outcomes: refused, right result, crash, traceback, silent wrong,
loss (``reliability_cases.outcomes``). Exit status 1 when any crash, traceback, silent wrong
result or loss is found, else 0.

The modules live in ``scripts/reliability_cases/``, a package that this file (run as a script,
never imported) imports by that name.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the reliability package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this tree's refimpl

from reliability_cases import SURFACES, surface_cases
from reliability_cases.outcomes import FAILURES, OUTCOMES, Result
from reliability_cases.runner import run_surface, run_worker

COLUMNS = ("inputs", *OUTCOMES)
# A library call that takes longer than this on inputs this small has hung (a loop over a
# count of 2**62, say); commands and run folders have their own time limits.
CASE_SECONDS = dict.fromkeys(
    ("layers", "models", "graph", "config", "data", "checkpoints", "crosscheck"), 20.0
)
HEADERS = (
    "inputs tried",
    "refused",
    "right result",
    "crashes",
    "tracebacks",
    "silent wrong",
    "losses",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fixed sample of each surface")
    parser.add_argument(
        "--surface",
        choices=sorted(SURFACES),
        action="append",
        help="only this surface (may be repeated)",
    )
    parser.add_argument("--case", metavar="TEXT", help="only the cases whose name holds TEXT")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures here")
    parser.add_argument(
        "--show-failures",
        action="store_true",
        help="each failure's input, outcome and the command that reruns it",
    )
    parser.add_argument("--jobs", type=int, default=2, help="surfaces run at once (default 2)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    return args


def counts(results: list[tuple[str, Result]]) -> dict[str, int]:
    row = dict.fromkeys(COLUMNS, 0)
    row["inputs"] = len(results)
    for _, result in results:
        row[result.outcome] += 1
    return row


def table(rows: dict[str, dict[str, int]]) -> str:
    width = max(len("surface"), *map(len, rows))
    lines = ["  ".join([f"{'surface':<{width}}", *HEADERS])]
    for name, row in rows.items():
        cells = [f"{row[key]:>{len(header)}}" for key, header in zip(COLUMNS, HEADERS, strict=True)]
        lines.append("  ".join([f"{name:<{width}}", *cells]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = (["--quick"] if args.quick else []) + (["--case", args.case] if args.case else [])
    if args.worker:
        cases = surface_cases(args.worker, args.quick, args.case)
        limit = CASE_SECONDS.get(args.worker)
        run_worker(cases, args.start, args.count, args.results, limit)
        return 0
    names = args.surface or list(SURFACES)
    started = time.monotonic()

    def one(name: str) -> list[tuple[str, Result]]:
        total = len(surface_cases(name, args.quick, args.case))
        results = run_surface(name, options, total, report=lambda line: print(line, flush=True))
        print(f"  {name}: {total} inputs ({time.monotonic() - started:.0f} s)", flush=True)
        return results

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        by_surface = dict(zip(names, pool.map(one, names), strict=True))
    rows = {name: counts(results) for name, results in by_surface.items()}
    rows["total"] = {key: sum(row[key] for row in rows.values()) for key in COLUMNS}
    print(table(rows))
    failures = [
        (name, case, result)
        for name, results in by_surface.items()
        for case, result in results
        if result.outcome in FAILURES
    ]
    if args.show_failures:
        for name, case, result in failures:
            print(f"\n[{result.outcome}] {name}: {case}\n  {result.detail}")
            print(
                f"  rerun: python scripts/reliability.py --surface {name} --case {case!r} "
                "--show-failures"
            )
    elif failures:
        print(f"{len(failures)} failures; --show-failures lists them")
    if args.json:
        record = {
            "command": " ".join(["python scripts/reliability.py", *(argv or sys.argv[1:])]),
            "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, {platform.system()}",
            "seconds": round(time.monotonic() - started),
            "surfaces": rows,
            "failures": [
                {"surface": n, "case": c, "outcome": r.outcome, "detail": r.detail}
                for n, c, r in failures
            ],
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
