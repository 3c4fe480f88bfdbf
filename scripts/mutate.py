"""Mutation testing of the forward and backward code, optimisers, tolerances and theorem checks.

    python scripts/mutate.py [--modules GLOB ...] [--max-mutants N] [--jobs J]
                             [--report docs/mutation.md] [--list] [--ids ID ...]

Each mutant (one realistic bug, :mod:`mutation_operators`) is written into a
scratch copy of the repository (``--workdir``, never the working tree, where
others edit), the tests relevant to its module run there with ``python -m
pytest -x -q -p no:cacheprovider -p no:randomly --hypothesis-seed=0`` under a
time limit, and the mutant is *killed* when they fail (or crash), *survives* when
they pass. The copy comes first on ``PYTHONPATH`` and is the working directory, so
its code, not the editable install's, is imported (checked before any run).

What is mutated (:data:`TARGETS`): in the math (``refimpl/kernels``, ``refimpl/ops``,
``refimpl/nn``, ``refimpl/models``), the backward passes (functions named
``*backward*``), a seeded sample spread over the files, and the forward code (every
other function there and in ``refimpl/graph.py`` and ``refimpl/init.py``), a seeded
sample of :data:`FORWARD_SAMPLE` spread over the files and, within each, over its
lines; every line of the optimisers' updates; the tolerance table; and in
``proofs_check`` every bound and tolerance constant and every bound and verdict function
(:data:`PROOFS_CHECK_BOUNDS`), with a sample of the statistics compared with them
(:data:`PROOFS_CHECK_QUANTITIES`). What only builds an error message is never mutated
(:mod:`mutation_operators`).

Which tests run (:func:`mutation_tests.relevant_tests`): the mirrored test files
(``refimpl/nn/gat/conv.py`` -> ``tests/nn/gat/test_conv*.py``), then
:data:`mutation_tests.EXTRA_TESTS` (code a test runs where no import shows it), then every test file
whose imports reach the module, directly or through any chain of imports of the
repository's modules (read with ``ast``, nothing imported: a test that imports
``refimpl.models.gat`` reaches ``refimpl.ops.loop_fill`` through
``refimpl.nn.gat.conv``), the closest first. Most mutants die in the first file, in
seconds.

Equivalent mutants (no test can tell them apart from the original) are listed
with their reasons in ``scripts/mutation_equivalents.json`` (id -> reason); the
kill rate is over the others. Ids hash the code, not line numbers
(:mod:`mutation_operators`), so the list survives edits elsewhere in a file.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_operators import OPERATORS, TOLERANCE, Mutant, Scope, apply, mutants_of
from mutation_tests import relevant_tests

REPO = Path(__file__).resolve().parents[1]
EQUIVALENTS = REPO / "scripts" / "mutation_equivalents.json"
# Hypothesis derandomised by its seed, whatever the profile says; no test-order plugin.
PYTEST = [
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "-p",
    "no:randomly",
    "--hypothesis-seed=0",
]
SAMPLE_SEED = 0
# Forward mutants drawn: sized to keep a full run (--jobs 2) within the README's estimate.
FORWARD_SAMPLE = 250

# proofs_check, all mutated: the functions that compute a bound of a theorem, a threshold or
# a verdict, and the special cases the audit found unguarded.
PROOFS_CHECK_BOUNDS = frozenset(
    {
        "thm3_bound", "cor1_bound", "cor2_bound", "eq21_bound", "thm1_bound", "form_bound",
        "lemma1_bound", "lemma3", "_bound_check", "_law_check", "gd_drift",
        "z_threshold", "cornish_fisher", "chi2_threshold", "thm1_exponent", "thm1_log_bound",
        "eq18_log_variance", "margin_of", "Check.__call__",
    }
)  # fmt: skip
# proofs_check, sampled: the quantities compared with the bounds, rounding allowances and
# statistics (the case generators are left out: another random case is not a bug).
PROOFS_CHECK_QUANTITIES = frozenset(
    {
        "rounding_allowance", "frobenius_allowance", "two_inf_operator_norm", "eq28_ratio",
        "thm2_alpha", "lemma2_ratios", "eq10_relative_deviation", "chi2_to_uniform",
        "row_softmax", "relative_residual", "gd_drift.norm_total", "pearson",
        "slope_and_error", "_frequency_test", "eq18_variance", "lognormal_cumulants",
        "_standardised_cumulants", "_sample_variance_moments", "_mean_skewness",
        "WorstCase.add", "_scale",
    }
)  # fmt: skip
# Optimiser update lines.
OPTIM_FUNCTIONS = frozenset({"SGD.step", "Adam.step", "_lerp"})


@dataclass(frozen=True)
class Target:
    """A group of files and the part of each that is mutated; ``sample``: how many mutants
    to draw (seeded), ``None`` for all, spread as ``spread`` says: ``"files"`` round-robin
    over the files, ``"lines"`` over every line of every file, ``"files, then lines"`` over
    the files and, within each, over its lines (a file's first picks on different lines)."""

    name: str
    patterns: tuple[str, ...]
    scope: Scope
    sample: int | None = None
    spread: str = "files"


def _backward(qualname: str) -> bool:
    return any("backward" in part for part in qualname.split("."))


def _forward(qualname: str) -> bool:
    return not _backward(qualname)


# The math: kernels, differentiable primitives, layers, models.
MATH = (
    "refimpl/kernels/*.py",
    "refimpl/ops/*.py",
    "refimpl/nn/*.py",
    "refimpl/nn/*/*.py",
    "refimpl/models/*.py",
)
TARGETS = (
    Target("backward passes", MATH, Scope(_backward), sample=60),
    Target(
        "forward code",
        (*MATH, "refimpl/graph.py", "refimpl/init.py", "refimpl/draws.py"),
        Scope(_forward),
        sample=FORWARD_SAMPLE,
        spread="files, then lines",
    ),
    Target(
        "optimisers",
        ("refimpl/optim.py",),
        Scope(OPTIM_FUNCTIONS.__contains__),
        sample=40,
        spread="lines",  # every update line, two mutants or more each
    ),
    Target(
        "tolerance table",
        ("refimpl/testing/tolerances.py",),
        Scope(lambda name: False, lambda name: name.isupper()),
    ),
    Target(
        "theorem-check bounds",
        ("proofs_check/*.py", "proofs_check/*/*.py"),
        Scope(PROOFS_CHECK_BOUNDS.__contains__, lambda name: bool(TOLERANCE.search(name))),
    ),
    Target(
        "theorem-check quantities",
        ("proofs_check/*.py", "proofs_check/*/*.py"),
        Scope(PROOFS_CHECK_QUANTITIES.__contains__),
        sample=25,
    ),
)


# -- selection ----------------------------------------------------------------------------------
def _files(patterns: Sequence[str], root: Path) -> list[str]:
    found = {p.relative_to(root).as_posix() for pat in patterns for p in root.glob(pat)}
    return sorted(f for f in found if not f.endswith("__init__.py") or "proofs_check" in f)


def _spread(groups: dict[str, list], count: int) -> list:
    """``count`` items taken round-robin over ``groups`` (in key order, each in its order)."""
    return _round_robin([groups[key] for key in sorted(groups)], count)


def _round_robin(queues: Sequence[Sequence], count: int) -> list:
    chosen, queues = [], [list(queue) for queue in queues]
    while len(chosen) < count and any(queues):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen


def _over_lines(mutants: list[Mutant], rng: random.Random) -> list[Mutant]:
    """``mutants`` (already shuffled) reordered round-robin over their lines, the lines in
    random order: the first picks of a file are on different lines."""
    lines: dict[int, list[Mutant]] = {}
    for mutant in mutants:
        lines.setdefault(mutant.line, []).append(mutant)
    order = sorted(lines)
    rng.shuffle(order)
    return _round_robin([lines[line] for line in order], len(mutants))


def select(
    root: Path, modules: Sequence[str] = (), seed: int = SAMPLE_SEED
) -> list[tuple[str, Mutant]]:
    """``(target name, mutant)`` for every target (sampled where the target says), sorted by
    file and line; with ``modules`` (file globs), only those of the files they match: the
    full run's mutants there, so a run on a few modules previews the full run."""
    selection = []
    for target in TARGETS:
        groups: dict[str, list[Mutant]] = {}
        for path in _files(target.patterns, root):
            found = sorted(mutants_of(path, (root / path).read_text(), target.scope), key=_id)
            rng = random.Random(f"{seed}:{path}")  # str seeds are stable
            rng.shuffle(found)
            if target.spread == "files, then lines":
                found = _over_lines(found, rng)
            for mutant in found:
                key = f"{path}:{mutant.line:05d}" if target.spread == "lines" else path
                groups.setdefault(key, []).append(mutant)
        total = sum(map(len, groups.values()))
        count = total if target.sample is None else min(target.sample, total)
        selection += [(target.name, m) for m in _spread(groups, count)]
    if modules:
        selection = [s for s in selection if any(fnmatch.fnmatch(s[1].path, m) for m in modules)]
    return sorted(selection, key=lambda s: _order(s[1]))


def _id(mutant: Mutant) -> str:
    return mutant.id


def _order(mutant: Mutant) -> tuple[str, int, str]:
    return (mutant.path, mutant.line, mutant.id)


# -- which tests ----------------------------------------------------------------------------------
# -- running --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    target: str
    mutant: Mutant
    status: str  # killed, survived, timeout, error, equivalent
    seconds: float
    detail: str = ""


def _copy_repo(source: Path, destination: Path) -> None:
    if destination.exists():
        shutil.rmtree(destination)
    ignore = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".hypothesis", "*.pyc")
    shutil.copytree(source, destination, ignore=ignore)


def _environment(worker: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(worker)  # the copy before the editable install of the tree
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a stale .pyc of the original must never be read
    return env


def _check_imports(worker: Path) -> None:
    """The copy's packages are the ones imported, not the editable install's."""
    code = "import refimpl, proofs_check; print(refimpl.__file__); print(proofs_check.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=worker,
        env=_environment(worker),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not all(Path(p).resolve().is_relative_to(worker.resolve()) for p in out):
        raise SystemExit(f"the scratch copy is not what gets imported: {out}")


def run_tests(worker: Path, tests: Sequence[str], timeout: float) -> tuple[str, float, str]:
    """``(status, seconds, last line)`` of the tests in ``worker``: killed when they fail.

    The first file runs alone, then the rest: most mutants fail in the first, and pytest
    collects (imports) every file it is given before it runs one.
    """
    shutil.rmtree(worker / ".hypothesis", ignore_errors=True)  # no replayed examples
    start, status, last = time.monotonic(), "survived", ""
    for stage in (tests[:1], tests[1:]):
        if not stage or status != "survived":
            continue
        try:
            done = subprocess.run(
                [sys.executable, *PYTEST, "-x", *stage],
                cwd=worker,
                env=_environment(worker),
                capture_output=True,
                text=True,
                timeout=max(timeout - (time.monotonic() - start), 1.0),
            )
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - start, ""
        last = (done.stdout.strip() or done.stderr.strip() or "?").splitlines()[-1]
        # 1: a test failed; 2: collection failed (a module that no longer imports); < 0: the
        # process died of a signal (a compiled kernel reading out of bounds): all detected
        code = done.returncode
        status = (
            "killed" if code < 0 else {0: "survived", 1: "killed", 2: "killed"}.get(code, "error")
        )
    return status, time.monotonic() - start, last


def baseline(workers: Sequence[Path], tests: Sequence[str]) -> dict[str, float]:
    """Every test file on the unmutated copies, split over the workers (one run each, in
    parallel): seconds per file. Exits when one fails (every mutant would look killed)."""

    def run(k: int) -> dict[str, float]:
        report = workers[k] / "baseline.xml"
        junit = [f"--junitxml={report}", "-o", "junit_family=xunit1"]
        done = subprocess.run(
            [sys.executable, *PYTEST, *junit, *tests[k :: len(workers)]],
            cwd=workers[k],
            env=_environment(workers[k]),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"the tests fail before any mutation:\n{done.stdout[-3000:]}")
        seconds: dict[str, float] = {}
        for case in ElementTree.parse(report).iter("testcase"):
            file = case.get("file", "")
            seconds[file] = seconds.get(file, 0.0) + float(case.get("time", 0.0))
        return seconds

    seconds = dict.fromkeys(tests, 0.0)
    with ThreadPoolExecutor(len(workers)) as pool:
        for part in pool.map(run, range(min(len(workers), len(tests)))):
            seconds.update(part)
    return seconds


def run_mutant(
    worker: Path, target: str, mutant: Mutant, tests: Sequence[str], timeout: float
) -> Outcome:
    file = worker / mutant.path
    original = file.read_text()
    try:
        file.write_text(apply(original, mutant))
        status, seconds, detail = run_tests(worker, tests, timeout)
    finally:
        file.write_text(original)
    return Outcome(target, mutant, status, seconds, detail)


def run_all(
    selection: Sequence[tuple[str, Mutant]],
    equivalents: dict[str, str],
    workdir: Path,
    jobs: int,
    source: Path,
    progress: Callable[[str], None],
) -> tuple[list[Outcome], dict[str, list[str]], float]:
    """The baseline on the unmutated copy, then every non-equivalent mutant."""
    start = time.monotonic()
    workers = [workdir / f"worker-{k}" for k in range(jobs)]
    for worker in workers:
        _copy_repo(source, worker)
        _check_imports(worker)
    paths = sorted({m.path for _, m in selection})
    tests = {path: relevant_tests(workers[0], path) for path in paths}
    if not all(tests.values()):
        raise SystemExit(f"no tests found for {[p for p, files in tests.items() if not files]}")
    per_file = baseline(workers, sorted({t for files in tests.values() for t in files}))
    progress(f"baseline: {len(per_file)} test files pass, {sum(per_file.values()):.0f} s of tests")
    # Past three times the tests' own time plus two pytest start-ups: a hang, not a slow test.
    limits = {
        path: 3 * (sum(per_file[t] for t in files) + 20) + 30 for path, files in tests.items()
    }
    free, lock = list(workers), threading.Lock()

    def one(selected: tuple[str, Mutant]) -> Outcome:
        target, mutant = selected
        if mutant.id in equivalents:
            return Outcome(target, mutant, "equivalent", 0.0, equivalents[mutant.id])
        with lock:
            worker = free.pop()
        try:
            outcome = run_mutant(worker, target, mutant, tests[mutant.path], limits[mutant.path])
        finally:
            with lock:
                free.append(worker)
        progress(f"{mutant.id} {mutant.path}:{mutant.line} {outcome.status} {outcome.seconds:.1f}s")
        return outcome

    with ThreadPoolExecutor(jobs) as pool:
        outcomes = list(pool.map(one, selection))
    return outcomes, tests, time.monotonic() - start


# -- the report -----------------------------------------------------------------------------------
def _cell(text: str, width: int = 70) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return f"`{text if len(text) <= width else text[: width - 3] + '...'}`"


def _rate(outcomes: Sequence[Outcome]) -> tuple[int, int, str]:
    counted = [o for o in outcomes if o.status != "equivalent"]
    detected = sum(o.status in ("killed", "timeout") for o in counted)
    rate = f"{100 * detected / len(counted):.1f} %" if counted else "n/a"
    return detected, len(counted), rate


def report(
    outcomes: Sequence[Outcome], tests: dict[str, list[str]], seconds: float, command: str
) -> str:
    """The markdown report: how it was run, the rates, equivalents, survivors, every mutant."""
    detected, counted, rate = _rate(outcomes)
    lines = [
        "# Mutation testing",
        "",
        "Generated by `scripts/mutate.py` (its docstring says how it works); do not edit by hand.",
        "",
        f"    {command}",
        "",
        f"Runtime: {seconds / 60:.1f} min on this machine (the baseline run included), "
        f"{len(outcomes)} mutants.",
        "",
        f"**Kill rate: {detected} of {counted} non-equivalent mutants ({rate})**; time-outs "
        f"(counted as detected): {sum(o.status == 'timeout' for o in outcomes)}; errors: "
        f"{sum(o.status == 'error' for o in outcomes)}.",
        "",
        "## Operators",
        "",
        *(f"- `{name}`: {text}" for name, text in OPERATORS.items()),
        "",
        "## Kill rate per target",
        "",
        "| target | mutants | equivalent | killed | timeout | survived | kill rate |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for target in TARGETS:
        mine = [o for o in outcomes if o.target == target.name]
        if not mine:
            continue
        count = {s: sum(o.status == s for o in mine) for s in ("equivalent", "killed", "timeout")}
        lines.append(
            f"| {target.name} | {len(mine)} | {count['equivalent']} | {count['killed']} | "
            f"{count['timeout']} | {sum(o.status in ('survived', 'error') for o in mine)} | "
            f"{_rate(mine)[2]} |"
        )
    lines += ["", "## Module to tests", "", "| module | test files (in order) |", "| --- | --- |"]
    lines += [f"| `{p}` | {', '.join(f'`{t}`' for t in files)} |" for p, files in tests.items()]
    lines += ["", "## Equivalent mutants", ""]
    equivalent = [o for o in outcomes if o.status == "equivalent"]
    lines += [f"- `{o.mutant.id}` ({_where(o.mutant)}): {o.detail}" for o in equivalent] or [
        "None."
    ]
    lines += ["", "## Survivors", ""]
    survivors = [o for o in outcomes if o.status in ("survived", "error")]
    lines += [
        f"- `{o.mutant.id}` ({_where(o.mutant)}, {o.status}): "
        f"{_cell(o.mutant.original)} -> {_cell(o.mutant.mutated)}"
        for o in survivors
    ] or ["None."]
    lines += [
        "",
        "## Every mutant",
        "",
        "| id | file:line | operator | original -> mutated | outcome |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| `{o.mutant.id}` | {o.mutant.path}:{o.mutant.line} | {o.mutant.operator} | "
        f"{_cell(o.mutant.original, 50)} -> {_cell(o.mutant.mutated, 50)} | {o.status} |"
        for o in outcomes
    ]
    return "\n".join(lines) + "\n"


def _where(mutant: Mutant) -> str:
    return f"{mutant.path}:{mutant.line}, `{mutant.function}`, {mutant.operator}"


# -- the command line -----------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--modules", nargs="+", default=(), help="only the mutants in these files (globs)"
    )
    parser.add_argument("--max-mutants", type=int, help="at most this many, spread over files")
    parser.add_argument("--ids", nargs="+", default=(), help="only these mutant ids")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run in parallel")
    parser.add_argument("--report", type=Path, help="write the markdown report here")
    parser.add_argument("--list", action="store_true", help="list the mutants; run nothing")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mutation_work"))
    parser.add_argument("--source", type=Path, default=REPO, help="the tree copied to --workdir")
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    selection = select(args.source, args.modules)
    if args.ids:
        selection = [s for s in selection if s[1].id in set(args.ids)]
    if args.max_mutants is not None and args.max_mutants < len(selection):
        groups: dict[str, list[tuple[str, Mutant]]] = {}
        for selected in selection:
            groups.setdefault(selected[1].path, []).append(selected)
        selection = sorted(_spread(groups, args.max_mutants), key=lambda s: _order(s[1]))
    equivalents = json.loads(args.equivalents.read_text()) if args.equivalents.exists() else {}
    if args.list:
        for _, m in selection:
            mark = "  (equivalent)" if m.id in equivalents else ""
            print(
                f"{m.id}  {m.path}:{m.line}  {m.operator:12}  {m.original}  ->  {m.mutated}{mark}"
            )
        print(f"{len(selection)} mutants")
        return 0
    outcomes, tests, seconds = run_all(
        selection,
        equivalents,
        args.workdir,
        args.jobs,
        args.source,
        lambda line: print(line, flush=True),
    )
    command = "python scripts/mutate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(outcomes, tests, seconds, command.strip())
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    detected, counted, rate = _rate(outcomes)
    print(f"{detected} of {counted} non-equivalent mutants killed ({rate}) in {seconds:.0f} s")
    return 0 if detected == counted else 1


if __name__ == "__main__":
    sys.exit(main())
