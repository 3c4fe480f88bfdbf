"""``scripts/bench_gat.py``'s bookkeeping, with the timed subprocesses replaced by stand-ins:
rounds alternate which side goes first, the table's ratio is the median of per-round ratios,
and a machine without PyG gets ours alone."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_gat.py"


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # its own imports (bench_common)
    spec = importlib.util.spec_from_file_location("bench_gat_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_gat_under_test", None)


def test_rounds_alternate_and_the_ratio_is_the_median_per_round(bench, tmp_path) -> None:
    calls, times = [], {"ours": iter([10, 30, 20]), "pyg": iter([20, 20, 80])}

    def child(which, config, args):
        calls.append(which)
        return {"ms": next(times[which]), "peak_mb": 1.0, "data": "stand-in"}

    bench._child = child
    path = tmp_path / "out.json"
    bench.CONFIGS = {"a": "stand-in"}
    bench.main(["--rounds", "3", "--json", str(path)])
    assert calls == ["ours", "pyg", "pyg", "ours", "ours", "pyg"]
    row = json.loads(path.read_text())["a"]
    assert row["ratio_rounds"] == [0.5, 1.5, 0.25]
    assert row["ratio"] == 0.5  # not median(ours) / median(pyg) = 20 / 20
    assert (row["ours_ms"], row["pyg_ms"]) == (20, 20)


def test_without_pyg_only_ours_runs_after_the_first_try(bench, tmp_path) -> None:
    calls = []

    def child(which, config, args):
        calls.append(which)
        return None if which == "pyg" else {"ms": 5.0, "peak_mb": 1.0, "data": "stand-in"}

    bench._child = child
    bench.CONFIGS = {"a": "stand-in"}
    path = tmp_path / "out.json"
    bench.main(["--rounds", "3", "--json", str(path)])
    assert calls == ["ours", "pyg", "ours", "ours"]
    row = json.loads(path.read_text())["a"]
    assert row["pyg_ms"] is None and row["ratio"] is None and row["ours_ms"] == 5.0


def test_the_table_names_the_machine_it_ran_on(bench, tmp_path, capsys) -> None:
    # Issue 38: CPU ratios against PyG differ by machine (a0 0.38 on one, 0.59 on another),
    # so every table prints the CPU model and the load beside its figures, and the JSON keeps them.
    bench._child = lambda which, config, args: {"ms": 5.0, "peak_mb": 1.0, "data": "stand-in"}
    bench.CONFIGS = {"a": "stand-in"}
    path = tmp_path / "out.json"
    bench.main(["--rounds", "1", "--json", str(path)])
    record = json.loads(path.read_text())["machine"]
    assert record["cores"] == os.cpu_count() and record["cpu"]
    assert len(record["load_start"]) == len(record["load_end"]) == 3
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"machine: {record['cpu']}, {record['cores']} cores; Python ")
    assert "at the start" in last and "at the end" in last
