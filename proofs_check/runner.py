"""Run the registered checks, print the table and the errata: the ``python -m proofs_check`` CLI.

Exit status: 0 when every selected check passes and every listed erratum's
counterexample still shows what it claims; 1 otherwise (a check that raises is a failed
check); 2 for bad input: a usage error, an ``--only`` pattern that selects nothing (so a typo
cannot pass), a ``--json`` path that cannot be written (checked before any check runs), a
backend that cannot be loaded, not enough memory; 130 when interrupted (Ctrl-C). Every
error is one line on stderr; ``REFIMPL_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import TextIO

from proofs_check import load_checks
from proofs_check.errata import ERRATA
from proofs_check.erratum import Erratum, Evidence
from proofs_check.registry import DEFAULT_CASES, Record, matches, select
from refimpl.backend import BACKENDS, array_module
from refimpl.cli.errors import OneLineParser, one_line
from refimpl.cli.types import non_negative_int
from refimpl.files import atomic_write, check_output_file

__all__ = ["LAW_NOTE", "WIDTH", "errata_records", "format_errata", "format_table", "main", "run"]

WIDTH = 100  # the report fits a 100-column terminal
LAW_NOTE = (
    "Note: the GAT-balance conservation checks test a rescaling identity, which a backward "
    "with a wrong activation derivative can still satisfy: they are not a gradient check. "
    "gat_balance.gradients.central_differences checks the gradients themselves."
)
_PROG = "python -m proofs_check"


def run(
    seed: int = 0,
    cases: int = DEFAULT_CASES,
    backend: str | None = None,
    pattern: str | None = None,
) -> list[Record]:
    """Records of the checks selected by ``pattern`` (see :func:`proofs_check.select`)."""
    load_checks()
    return [one(seed=seed, cases=cases, backend=backend) for one in select(pattern)]


def format_table(records: Sequence[Record]) -> str:
    """The records as an aligned table under :data:`WIDTH` columns: per check a row with the
    worst case's ``measured``, the relation that must hold (``<=`` or ``>=``) and the
    ``bound``, then the paper and statement on their own wrapped lines."""
    header = ("id", "measured", "", "bound", "margin", "cases", "verdict")
    rows = [
        (
            r.id,
            f"{r.measured:.5g}",
            r.relation,
            f"{r.bound:.5g}",
            f"{r.margin:+.2e}",
            str(r.n_cases),
            "pass" if r.passed else "FAIL",
        )
        for r in records
    ]
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    numeric = {1, 3, 4, 5}  # right-aligned columns

    def line(row: Sequence[str]) -> str:
        cells = (
            cell.rjust(width) if k in numeric else cell.ljust(width)
            for k, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        return "  ".join(cells).rstrip()

    lines = [line(header), "  ".join("-" * width for width in widths)]
    for record, row in zip(records, rows, strict=True):
        lines.append(line(row))
        lines += _wrapped(f"{record.paper}: {record.statement}", "    ")
    return "\n".join(lines)


def _wrapped(text: str, indent: str, first: str | None = None) -> list[str]:
    """``text`` wrapped to :data:`WIDTH` columns (``first`` opens the first line)."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=True,
        break_on_hyphens=False,
    )


def format_errata(errata: Sequence[tuple[Erratum, Evidence]]) -> str:
    """The errata section: what is printed, what is right, the evaluated counterexample."""
    lines = ["Errata (printed formulas that are wrong; counterexamples evaluated now)"]
    for erratum, evidence in errata:
        verdict = "demonstrated" if evidence.demonstrated else "NOT DEMONSTRATED"
        lines += _wrapped(f"{erratum.id}  [{verdict}]", "    ", "  ")
        for label, text in (
            ("where:   ", f"{erratum.paper}, {erratum.location}"),
            ("printed: ", erratum.printed),
            ("correct: ", erratum.correct),
            ("counterexample: ", f"{erratum.counterexample}:"),
        ):
            lines += _wrapped(text, "      ", "    " + label)
        lines += _wrapped(evidence.detail, "      ")
    return "\n".join(lines)


def errata_records(errata: Sequence[tuple[Erratum, Evidence]]) -> list[dict]:
    """The errata as ``--json`` writes them: ``id``, ``paper``, ``where``, ``printed``,
    ``correct``, ``counterexample``, ``detail`` (the evaluated numbers), ``demonstrated``."""
    return [
        {
            "id": erratum.id,
            "paper": erratum.paper,
            "where": erratum.location,
            "printed": erratum.printed,
            "correct": erratum.correct,
            "counterexample": erratum.counterexample,
            "detail": evidence.detail,
            "demonstrated": bool(evidence.demonstrated),
        }
        for erratum, evidence in errata
    ]


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=_PROG,
        description="Evaluate every registered theorem check and print the table and errata.",
    )
    parser.add_argument(
        "--only",
        metavar="PATTERN",
        help="run checks (and list errata) whose id contains PATTERN, "
        "or matches it as a glob when it has * ? [",
    )
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="random seed, >= 0 (default 0)"
    )
    parser.add_argument(
        "--cases",
        type=non_negative_int,
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
    parser.add_argument(
        "--json",
        metavar="PATH",
        help='also write {"checks": [...], "errata": [...]} as JSON (its folder must exist)',
    )
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The CLI; returns the exit status (``__main__`` raises ``SystemExit`` with it)."""
    out = sys.stdout if out is None else out
    args = _parser().parse_args(argv)
    try:
        return _main(args, out)
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError, MemoryError) as err:  # bad input, environment
        if os.environ.get("REFIMPL_DEBUG"):
            raise
        print(f"{_PROG}: error: {one_line(err)}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, out: TextIO) -> int:
    # before minutes of checks: a --json path that cannot be written, a missing backend
    json_path = None if args.json is None else check_output_file(args.json, "--json file")
    array_module(args.backend)
    try:
        records = run(seed=args.seed, cases=args.cases, backend=args.backend, pattern=args.only)
        errata = [(e, e.evaluate()) for e in ERRATA if matches(e.id, args.only)]
    except MemoryError:  # too many --cases for this machine: bad input, not a failed check
        raise
    except Exception as err:  # a check that raises has failed, whatever it raised
        if os.environ.get("REFIMPL_DEBUG"):
            raise
        print(
            f"{_PROG}: error: a check raised {one_line(err)} (a failed check; rerun with "
            "REFIMPL_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
    if not records and not errata:
        print(f"{_PROG}: error: no check or erratum id matches {args.only!r}", file=sys.stderr)
        return 2

    if json_path is not None:
        report = {"checks": [r.as_dict() for r in records], "errata": errata_records(errata)}
        text = json.dumps(report, indent=2) + "\n"
        atomic_write(json_path, lambda stream: stream.write(text.encode()))

    if records:
        print(format_table(records), file=out)
        if any(r.id.startswith("gat_balance.") for r in records):
            print("\n" + "\n".join(_wrapped(LAW_NOTE, "")), file=out)
    if errata:
        print("\n" + format_errata(errata), file=out)
    failed = sum(not r.passed for r in records)
    undemonstrated = sum(not evidence.demonstrated for _, evidence in errata)
    summary = f"{len(records)} checks, {len(records) - failed} passed, {failed} failed"
    if undemonstrated:
        summary += f"; {undemonstrated} erratum counterexample(s) not demonstrated"
    print("\n" + summary, file=out)
    return 1 if failed or undemonstrated else 0
