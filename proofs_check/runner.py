"""Run the registered checks, print the table and the errata: the ``python -m proofs_check`` CLI.

Exit status: 0 when every selected check passes and every listed erratum's
counterexample still shows what it claims, 1 otherwise, 2 for a usage error
(including an ``--only`` pattern that selects nothing, so a typo cannot pass).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from proofs_check import load_checks
from proofs_check.errata import ERRATA, Erratum, Evidence
from proofs_check.registry import DEFAULT_CASES, Record, matches, select
from refimpl.backend import BACKENDS

__all__ = ["format_errata", "format_table", "main", "run"]

_STATEMENT_WIDTH = 52  # the table stays under ~150 columns


def run(
    seed: int = 0,
    cases: int = DEFAULT_CASES,
    backend: str | None = None,
    pattern: str | None = None,
) -> list[Record]:
    """Records of the checks selected by ``pattern`` (see :func:`proofs_check.select`)."""
    load_checks()
    return [one(seed=seed, cases=cases, backend=backend) for one in select(pattern)]


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(records: Sequence[Record]) -> str:
    """The records as an aligned text table, one row per check."""
    header = ("id", "paper", "statement", "bound", "measured", "margin", "cases", "verdict")
    rows = [
        (
            r.id,
            r.paper,
            _truncate(r.statement, _STATEMENT_WIDTH),
            f"{r.bound:.6g}",
            f"{r.measured:.6g}",
            f"{r.margin:+.2e}",
            str(r.n_cases),
            "pass" if r.passed else "FAIL",
        )
        for r in records
    ]
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    numeric = {3, 4, 5, 6}  # right-aligned columns

    def line(row: Sequence[str]) -> str:
        cells = (
            cell.rjust(width) if k in numeric else cell.ljust(width)
            for k, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def format_errata(errata: Sequence[tuple[Erratum, Evidence]]) -> str:
    """The errata section: what is printed, what is right, the evaluated counterexample."""
    lines = ["Errata (printed formulas that are wrong; counterexamples evaluated now)"]
    for erratum, evidence in errata:
        verdict = "demonstrated" if evidence.demonstrated else "NOT DEMONSTRATED"
        lines += [
            f"  {erratum.id}  [{verdict}]",
            f"    where:   {erratum.paper}, {erratum.location}",
            f"    printed: {erratum.printed}",
            f"    correct: {erratum.correct}",
            f"    counterexample: {erratum.counterexample}:",
            f"      {evidence.detail}",
        ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m proofs_check",
        description="Evaluate every registered theorem check and print the table and errata.",
    )
    parser.add_argument(
        "--only",
        metavar="PATTERN",
        help="run checks (and list errata) whose id contains PATTERN, "
        "or matches it as a glob when it has * ? [",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--cases",
        type=int,
        default=DEFAULT_CASES,
        help=f"random cases per check, on top of the fixed adversarial ones "
        f"(default {DEFAULT_CASES})",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="array backend (default: the global one, REFIMPL_BACKEND or numpy)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the records as a JSON list")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The CLI; returns the exit status (``__main__`` raises ``SystemExit`` with it)."""
    out = sys.stdout if out is None else out
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cases < 0:
        parser.error("--cases must be >= 0")
    records = run(seed=args.seed, cases=args.cases, backend=args.backend, pattern=args.only)
    errata = [(e, e.evaluate()) for e in ERRATA if matches(e.id, args.only)]
    if not records and not errata:
        print(f"no check or erratum id matches {args.only!r}", file=sys.stderr)
        return 2

    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([r.as_dict() for r in records], handle, indent=2)
            handle.write("\n")

    if records:
        print(format_table(records), file=out)
    if errata:
        print("\n" + format_errata(errata), file=out)
    failed = sum(not r.passed for r in records)
    undemonstrated = sum(not evidence.demonstrated for _, evidence in errata)
    summary = f"{len(records)} checks, {len(records) - failed} passed, {failed} failed"
    if undemonstrated:
        summary += f"; {undemonstrated} erratum counterexample(s) not demonstrated"
    print("\n" + summary, file=out)
    return 1 if failed or undemonstrated else 0
