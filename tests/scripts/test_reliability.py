"""``scripts/reliability.py`` (docs/reliability.md): the quick sample of bad inputs finds no
crash, traceback, silent wrong result or loss on any surface; and the harness itself can
fail: a case that kills its process is a crash, a wrong value is a silent wrong result, a
one-line ValueError a refusal, a traceback on the command line a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture()
def harness(monkeypatch):
    """The harness's package (``scripts/reliability_cases/``, which the script imports by name)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import reliability_cases.outcomes
    import reliability_cases.runner

    return reliability_cases


def test_quick_run_finds_no_crash_traceback_silent_wrong_or_loss(tmp_path) -> None:
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "reliability.py"), "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    record = json.loads(figures.read_text())
    total = record["surfaces"]["total"]
    assert total["inputs"] > 500  # every surface fed, not a handful
    failures = "\n".join(
        f"{f['surface']}: {f['case']}: {f['outcome']}: {f['detail']}" for f in record["failures"]
    )
    assert [total[o] for o in ("crash", "traceback", "silent wrong", "loss")] == [0] * 4, failures
    assert done.returncode == 0, done.stdout[-2000:]


# -- the classifier ------------------------------------------------------------------------------
FAKE_SURFACE = """
import ctypes, os
import numpy as np
from reliability_cases.outcomes import Case

def _raise(error):
    raise error

def cases():
    return [
        Case("refused", lambda: _raise(ValueError("x must be finite, got NaN")), None, ("x",)),
        Case("right", lambda: np.ones(3), lambda value: None if (value == 1).all() else "wrong"),
        Case("wrong value", lambda: np.ones(3) * 2,
             lambda value: None if (value == 1).all() else "2 where 1 was due"),
        Case("aborts", lambda: os.abort()),
        Case("segfaults", lambda: ctypes.string_at(0)),
        Case("after the deaths", lambda: _raise(TypeError("x must be an array, got str")),
             None, ("x",)),
        Case("index error", lambda: [][1]),
        Case("two-line message", lambda: _raise(ValueError("x is bad\\nsee below"))),
        Case("numpy's ambiguous truth", lambda: bool(np.ones(2) > 0)),
        Case("names no argument", lambda: _raise(ValueError("invalid value")), None, ("x",)),
        Case("accepted nonsense", lambda: np.ones(3)),
    ]
"""


def _run_fake(harness, tmp_path, monkeypatch, source: str) -> dict[str, object]:
    (tmp_path / "fake_surface.py").write_text(textwrap.dedent(source))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the workers import the fake surface
    results = harness.runner.run_surface(
        "fake_surface:cases", [], source.count("Case("), report=lambda line: None
    )
    return {name: result for name, result in results}


def test_each_outcome_of_a_fake_surface_is_classified(harness, tmp_path, monkeypatch) -> None:
    results = _run_fake(harness, tmp_path, monkeypatch, FAKE_SURFACE)
    outcomes = {name: result.outcome for name, result in results.items()}
    assert outcomes == {
        "refused": "refused",
        "right": "right result",
        "wrong value": "silent wrong",
        "aborts": "crash",
        "segfaults": "crash",
        "after the deaths": "refused",  # the cases after a dead worker still run
        "index error": "crash",
        "two-line message": "crash",
        "numpy's ambiguous truth": "crash",
        "names no argument": "crash",
        "accepted nonsense": "silent wrong",
    }
    assert "SIGABRT" in results["aborts"].detail
    assert "SIGSEGV" in results["segfaults"].detail
    assert results["wrong value"].detail == "2 where 1 was due"


def test_a_death_caused_by_an_earlier_case_is_not_blamed_on_the_case(
    harness, tmp_path, monkeypatch
) -> None:
    # A CSR index out of bounds made SciPy's C code write past an array in one case; the
    # worker died cases later, in a case that was fine. Blaming the case the worker died
    # in miscounted: the harness reruns it alone, which the fake surfaces above (every
    # death its own case's) never exercised.
    source = """
    import os
    from reliability_cases.outcomes import Case
    STATE = {"corrupted": False}
    def corrupt():
        STATE["corrupted"] = True
        return 1
    def victim():
        if STATE["corrupted"]:
            os.abort()
        raise ValueError("x is negative")
    def cases():
        return [Case("corrupts", corrupt), Case("victim", victim, None, ("x",))]
    """
    results = _run_fake(harness, tmp_path, monkeypatch, source)
    assert results["corrupts"].outcome == "silent wrong"  # accepted: the real failure
    assert results["victim"].outcome == "refused"


@pytest.mark.parametrize(
    ("returncode", "stderr", "outcome"),
    [
        (2, "refimpl train: error: --epochs must be >= 1, got 0\n", "refused"),
        (1, "refimpl train: error: training diverged at epoch 3; lower --epochs\n", "refused"),
        (2, "Traceback (most recent call last):\n  File ...\nValueError: epochs\n", "traceback"),
        (
            3,
            "refimpl train: internal error: IndexError: 3; rerun with REFIMPL_DEBUG=1\n",
            "traceback",
        ),
        (2, "refimpl train: error: IndexError: index 3 is out of bounds\n", "traceback"),
        (2, "refimpl train: error: the run failed\n", "traceback"),  # names no --epochs
        (2, "", "traceback"),
        (-11, "", "crash"),
        (137, "", "crash"),
    ],
)
def test_a_commands_exit_is_classified(harness, returncode, stderr, outcome) -> None:
    result = harness.outcomes.judge_process(returncode, "", stderr, ("epochs",))
    assert result.outcome == outcome


def test_a_command_that_exits_0_is_left_to_its_case(harness) -> None:
    assert harness.outcomes.judge_process(0, "done\n", "", ("epochs",)) is None


def test_difference_judges_each_group_on_its_own_scale(harness) -> None:
    difference = harness.outcomes.difference
    out, grads = np.array([1.0, 2.0]), {"W": np.array([4.0, -8.0]), "att": np.zeros(2)}
    reference = {"out": out, "grads": grads}
    assert difference(reference, reference, 1e-12) is None
    # a gradient zero by cancellation: rounding noise judged on the largest gradient (8)
    noisy = {"out": out, "grads": {**grads, "att": np.array([1e-15, 0.0])}}
    assert difference(noisy, reference, 1e-12) is None
    off = {"out": out + np.array([0.0, 1e-9]), "grads": grads}
    assert "out.out: off by 1e-09" in difference(off, reference, 1e-12)
    assert "shape" in difference({"out": out[:1], "grads": grads}, reference, 1e-12)
    assert "non-finite" in difference({"out": out * np.nan, "grads": grads}, reference, 1.0)
    assert "returned" in difference({"out": out}, reference, 1e-12)
