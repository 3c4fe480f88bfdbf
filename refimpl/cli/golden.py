"""``refimpl golden export DIR`` and ``refimpl golden verify DIR``: golden vectors for other
frameworks, and the check that the current code still reproduces them.

The file format is documented in :mod:`refimpl.interop.golden_format`. ``verify`` exits 0 when every
case agrees, 1 on a numerical mismatch (after printing every table), and 2 (through
:func:`refimpl.cli.main`, which prints the message) when the directory cannot be checked: no or
bad manifest, a missing or altered file, an unknown class or case.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

__all__ = ["add_parser", "run"]


def add_parser(commands: argparse._SubParsersAction) -> None:
    from refimpl.interop.golden_cases import GOLDEN_CASES

    parser = commands.add_parser(
        "golden",
        help="export golden vectors any framework can replay, or verify a directory of them",
        description="Golden vectors: float64 .npz files of inputs, parameters, noise, outputs "
        "and the gradients of L = sum(cotangent * out) for every layer and model, with a "
        "manifest.json (see refimpl.interop.golden_format for the format).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser(
        "export",
        help="write <case>.npz files and manifest.json to DIR",
        epilog="cases: " + ", ".join(GOLDEN_CASES),
    )
    export.add_argument("directory", type=Path, metavar="DIR")
    export.add_argument(
        "--force", action="store_true", help="write into DIR even if it is not empty"
    )
    verify = actions.add_parser(
        "verify", help="recompute every case of DIR and compare, tensor by tensor"
    )
    verify.add_argument("directory", type=Path, metavar="DIR")
    for sub in (export, verify):
        sub.add_argument(
            "--case",
            action="append",
            metavar="NAME",
            dest="cases",
            help="only this case (repeatable; default: all)",
        )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "export":
        return _export(args)
    return _verify(args)


def _export(args: argparse.Namespace) -> int:
    from refimpl.interop.golden import export_golden

    started = time.perf_counter()
    manifest = export_golden(args.directory, args.cases, force=args.force)
    width = max(len(entry["name"]) for entry in manifest["cases"])
    for entry in manifest["cases"]:
        size = (args.directory / entry["file"]).stat().st_size
        print(
            f"{entry['name']:<{width}}  {entry['class']:<22} {size:>7} bytes  "
            f"sha256 {entry['sha256'][:16]}"
        )
    print(
        f"\nwrote {len(manifest['cases'])} cases and manifest.json to {args.directory} in "
        f"{time.perf_counter() - started:.2f} s (refimpl {manifest['refimpl_version']}, "
        f"numpy {manifest['numpy_version']}); check with `refimpl golden verify "
        f"{args.directory}`"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    import refimpl
    from refimpl.interop.golden import GRADIENT_RTOL, OUTPUT_RTOL, verify_golden
    from refimpl.interop.golden_format import read_manifest

    started = time.perf_counter()
    manifest = read_manifest(args.directory)
    results = verify_golden(args.directory, args.cases)
    print(
        f"golden files of refimpl {manifest['refimpl_version']} (numpy "
        f"{manifest['numpy_version']}), replayed by refimpl {refimpl.__version__} (numpy "
        f"{np.__version__}); L = sum(cotangent * out); output/out judged at rtol "
        f"{OUTPUT_RTOL:g} of its largest entry, grad/* at rtol {GRADIENT_RTOL:g} of the "
        "case's largest gradient\n"
    )
    classes = {entry["name"]: entry["class"] for entry in manifest["cases"]}
    for name, comparison in results:
        print(comparison.table(f"{name} ({classes[name]})") + "\n")
    failed = [name for name, comparison in results if not comparison.passed]
    worst_output = _worst(results, output=True)
    worst_gradient = _worst(results, output=False)
    seconds = time.perf_counter() - started
    if failed:
        print(
            f"FAIL: {len(failed)} of {len(results)} cases disagree: {', '.join(failed)} "
            f"({seconds:.2f} s)"
        )
        return 1
    print(
        f"PASS: all {len(results)} cases agree (worst relative error: output "
        f"{worst_output:.1e}, gradients {worst_gradient:.1e}; {seconds:.2f} s)"
    )
    return 0


def _worst(results: list, output: bool) -> float:
    errors = [
        tensor.max_rel_error
        for _, comparison in results
        for tensor in comparison.tensors
        if tensor.name.startswith("output/") == output
    ]
    return max(errors, default=math.nan)
