"""The command line, run as a user runs it (``python -m refimpl ...`` in a subprocess):
``train``, ``sweep``, ``plot``, ``crosscheck`` and ``golden`` with bad option values, bad
paths and damaged ``log.jsonl`` files for ``plot``.

A bad value must exit with status 2 (or 1 where the command defines it: a diverged run) and
a line or a few on stderr naming the problem, no traceback; a valid value must exit 0.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from reliability_cases.files import in_scratch
from reliability_cases.outcomes import RIGHT, SILENT, Case, Result, judge_process
from reliability_cases.runner import child_env

COMMAND_TIMEOUT = 150  # seconds; a command still running then has hung
TRAIN = ["train", "--dataset", "karate", "--epochs", "2", "--no-progress"]
SWEEP = [
    "sweep",
    "--datasets",
    "karate",
    "--depths",
    "2",
    "--seeds",
    "0",
    "--epochs",
    "2",
    "--no-progress",
]
NODEFORMER = [*TRAIN, "--model", "nodeformer", "--random-features", "5", "--hidden", "4"]
GRAPHS = [
    "train",
    "--model",
    "graph_transformer",
    "--dataset",
    "molecules",
    "--graphs",
    "20",
    "--epochs",
    "1",
    "--hidden",
    "8",
    "--no-progress",
]
VALUES = ("nan", "inf", "-inf", "-1", "0", "1", "2.5", "1e400", "abc", "")


def refimpl(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = child_env()
    env.pop("REFIMPL_DATA", None)  # the commands must say where data is missing
    return subprocess.run(
        [sys.executable, "-m", "refimpl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )


def judge(args: list[str], mentions: tuple[str, ...], valid: bool, folder: Path) -> Result:
    """Run ``refimpl args`` in ``folder`` and classify it (exit 0 is right only if valid)."""
    try:
        done = refimpl(args, folder)
    except subprocess.TimeoutExpired:
        return Result("crash", f"hung: no exit in {COMMAND_TIMEOUT} s")
    verdict = judge_process(done.returncode, done.stdout, done.stderr, mentions)
    if verdict is not None:
        return verdict
    return Result(RIGHT) if valid else Result(SILENT, "exit 0 on a bad value")


def _valid(value: str, domain: str) -> bool:
    """Whether the text ``value`` is a valid ``domain`` value as argparse reads it."""
    try:
        number = int(value) if domain.endswith("int") else float(value)
    except ValueError:
        return False
    if not math.isfinite(number):
        return False
    return {
        "pos_int": number >= 1,
        "nonneg_int": number >= 0,
        "pos_real": number > 0,
        "nonneg_real": number >= 0,
        "prob": 0 <= number < 1,
    }[domain]


OPTIONS = {  # base command -> {option: domain}
    "train": (
        TRAIN,
        {
            "--epochs": "pos_int",
            "--layers": "pos_int",
            "--hidden": "pos_int",
            "--heads": "pos_int",
            "--lr": "pos_real",
            "--weight-decay": "nonneg_real",
            "--dropout": "prob",
            "--attn-dropout": "prob",
            "--checkpoint-every": "nonneg_int",
            "--batch-size": "pos_int",
            "--loss-threshold": "nonneg_real",
            "--seeds": "nonneg_int",
        },
    ),
    "train nodeformer": (
        NODEFORMER,
        {
            "--tau": "pos_real",
            "--random-features": "pos_int",
            "--gumbel-samples": "pos_int",
            "--rb-order": "pos_int",
            "--edge-loss-weight": "nonneg_real",
        },
    ),
    "train graph_transformer": (GRAPHS, {"--graphs": "pos_int", "--pe-dim": "nonneg_int"}),
    "sweep": (SWEEP, {"--workers": "pos_int", "--depths": "pos_int"}),
    "crosscheck": (["crosscheck", "missing.npz"], {}),
}


def option_cases() -> list[Case]:
    cases = []
    for label, (base, options) in OPTIONS.items():
        for option, domain in options.items():
            for value in VALUES:
                valid = _valid(value, domain)
                args = [*base, option, value, "--out", "run"]
                cases.append(
                    Case(
                        f"refimpl {label} {option} {value!r}",
                        lambda a=args, o=option, v=valid: in_scratch(
                            lambda folder: judge(a, (o, o.lstrip("-")), v, folder)
                        ),
                    )
                )
    return cases


def _path_cases() -> list[Case]:
    """Bad paths, names and combinations, each with what its refusal must name."""
    table = [
        ("train unknown dataset", [*TRAIN[:1], "--dataset", "koala", "--epochs", "2"], ("koala",)),
        (
            "train cora without data",
            ["train", "--dataset", "cora", "--epochs", "2"],
            ("data-root", "REFIMPL_DATA"),
        ),
        (
            "train data root missing",
            ["train", "--dataset", "cora", "--data-root", "nowhere"],
            ("nowhere",),
        ),
        (
            "train data root a file",
            ["train", "--dataset", "cora", "--data-root", "file.txt"],
            ("file.txt",),
        ),
        ("train out is a file", [*TRAIN, "--out", "file.txt"], ("file.txt",)),
        (
            "train random split sums to 1.5",
            [*TRAIN, "--random-split", "0.5", "0.5", "0.5"],
            ("random-split", "split", "fraction"),
        ),
        (
            "train random split negative",
            [*TRAIN, "--random-split", "-1", "1", "1"],
            ("random-split", "split", "fraction"),
        ),
        (
            "train random split NaN",
            [*TRAIN, "--random-split", "nan", "0.5", "0.5"],
            ("random-split", "split", "fraction"),
        ),
        ("train three heads for two layers", [*TRAIN, "--heads", "1", "2", "3"], ("heads",)),
        ("train sparse features, nodeformer", [*NODEFORMER, "--sparse-features"], ("sparse",)),
        (
            "train reference-code norm with v2",
            [*TRAIN, "--lipschitz-norm", "reference-code"],
            ("reference-code", "v1"),
        ),
        ("train duplicate seeds", [*TRAIN, "--seeds", "0", "0"], ("seed",)),
        ("train resume a missing run", ["train", "--resume", "nowhere"], ("nowhere",)),
        (
            "train resume and overwrite",
            [*TRAIN, "--resume", "run", "--overwrite"],
            ("resume", "overwrite", "run"),
        ),
        ("sweep unknown init", [*SWEEP, "--inits", "koala"], ("koala", "init")),
        ("sweep scheduler garbage", [*SWEEP, "--scheduler", "garbage"], ("scheduler",)),
        ("sweep scheduler local:0", [*SWEEP, "--scheduler", "local:0"], ("scheduler", "local")),
        (
            "sweep scheduler nothing listening",
            [*SWEEP, "--scheduler", "tcp://127.0.0.1:9"],
            ("scheduler", "127.0.0.1", "cluster", "distributed"),
        ),
        ("crosscheck missing file", ["crosscheck", "missing.npz"], ("missing.npz",)),
        ("crosscheck a folder", ["crosscheck", "."], (".",)),
        ("crosscheck rtol NaN", ["crosscheck", "file.txt", "--rtol", "nan"], ("rtol",)),
        ("crosscheck rtol -1", ["crosscheck", "file.txt", "--rtol", "-1"], ("rtol",)),
        ("golden export into a file", ["golden", "export", "file.txt"], ("file.txt",)),
        ("golden export unknown case", ["golden", "export", "out", "--case", "koala"], ("koala",)),
        ("golden verify an empty folder", ["golden", "verify", "empty"], ("empty", "manifest")),
        ("golden verify a missing folder", ["golden", "verify", "nowhere"], ("nowhere",)),
        ("golden verify a garbage manifest", ["golden", "verify", "garbage"], ("manifest",)),
        ("plot a missing folder", ["plot", "nowhere"], ("nowhere",)),
        ("plot a file", ["plot", "file.txt"], ("file.txt",)),
        ("plot an empty folder", ["plot", "empty"], ("empty", "log")),
        ("no command", [], ("command", "usage")),
        ("unknown command", ["koala"], ("koala",)),
    ]

    def prepared(folder: Path) -> Path:
        (folder / "file.txt").write_text("a user's notes\n")
        (folder / "empty").mkdir()
        (folder / "garbage").mkdir()
        (folder / "garbage" / "manifest.json").write_text("{not json")
        return folder

    return [
        Case(
            f"refimpl {label}",
            lambda a=args, m=mentions: in_scratch(
                lambda folder: judge(a, m, False, prepared(folder))
            ),
        )
        for label, args, mentions in table
    ]


@functools.cache
def _trained_run() -> Path:
    """A finished three-epoch run folder (its log.jsonl is what plot reads), made once."""
    folder = Path(tempfile.mkdtemp(prefix="reliability-run-"))
    atexit.register(shutil.rmtree, folder, True)  # when the worker ends
    done = refimpl([*TRAIN[:3], "--epochs", "3", "--no-progress", "--out", "run"], folder)
    if done.returncode:
        raise RuntimeError(f"the run for plot could not be made: {done.stderr}")
    return folder / "run"


def _log_changes() -> dict[str, tuple[Any, bool]]:
    """log.jsonl rewritten: (function of its lines, or text; whether the log stays valid)."""
    return {
        "empty log": ("", False),
        "not JSON": ("{epoch: 0\n", False),
        "a line cut short (a killed write: dropped)": (
            lambda lines: [*lines[:-1], lines[-1][:20]],
            True,
        ),
        "a key missing": (lambda lines: [_without(line, "val_acc") for line in lines], False),
        "epoch a string": (lambda lines: [_with(line, "epoch", "zero") for line in lines], False),
        "NaN loss (bare NaN)": (
            lambda lines: [
                line.replace('"train_loss": ', '"train_loss": NaN, "x": ', 1) for line in lines
            ],
            False,
        ),
        "null loss (a diverged epoch)": (
            lambda lines: [_with(line, "train_loss", None) for line in lines],
            True,
        ),
        "huge loss 1e308": (
            lambda lines: [_with(line, "train_loss", 1e308) for line in lines],
            True,
        ),
        "epochs out of order": (lambda lines: lines[::-1], False),
        "a JSON list per line": (lambda lines: ["[1, 2]" for _ in lines], False),
        "one epoch only": (lambda lines: lines[:1], True),
        "a blank line between": (lambda lines: [lines[0], "", *lines[1:]], True),
        "grad_norms a number": (
            lambda lines: [_with(line, "grad_norms", 3) for line in lines],
            False,
        ),
    }


def _with(line: str, key: str, value: Any) -> str:
    return json.dumps({**json.loads(line), key: value})


def _without(line: str, key: str) -> str:
    return json.dumps({k: v for k, v in json.loads(line).items() if k != key})


def _plot_case(change: Any, valid: bool) -> Result:
    def inside(folder: Path) -> Result:
        run = shutil.copytree(_trained_run(), folder / "run")
        lines = (run / "log.jsonl").read_text().splitlines()
        text = change if isinstance(change, str) else "\n".join(change(lines)) + "\n"
        (run / "log.jsonl").write_text(text)
        result = judge(["plot", "run"], ("log.jsonl", "log"), valid, folder)
        if result.outcome == RIGHT and not (run / "curves.png").is_file():
            return Result(SILENT, "exit 0 without curves.png")
        return result

    return in_scratch(inside)


def cases() -> list[Case]:
    plots = [
        Case(f"refimpl plot | {label}", lambda c=change, v=valid: _plot_case(c, v))
        for label, (change, valid) in _log_changes().items()
    ]
    plots.insert(0, Case("refimpl plot | valid log", lambda: _plot_case(lambda lines: lines, True)))
    return _path_cases() + plots + option_cases()
