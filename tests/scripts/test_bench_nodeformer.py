"""Smoke test of ``scripts/bench_nodeformer.py``: a tiny sweep, the records and the goal lines."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_nodeformer.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_nodeformer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux peak-RSS reset")
def test_tiny_sweep_writes_one_record_per_n(bench, tmp_path, capsys):
    path = tmp_path / "out.json"
    returned = bench.main(["--sizes", "400", "2e2", "--threads", "1", "--json", str(path)])
    records = json.loads(path.read_text())
    assert records == returned
    assert [r["n"] for r in records] == [200, 400]  # sorted, as ints
    for record in records:
        # both are far below the 8 GB limit, so exact attention ran beside ours
        assert set(record) == {
            "n",
            "ours_s",
            "ours_cpu_s",
            "ours_peak_mb",
            "ours_stolen",
            "load",
            "exact_s",
            "exact_peak_mb",
            "torch_s",
            "torch_peak_mb",
            "floor_s",
            "floor_gemm_gflops",
        }
        if importlib.util.find_spec("torch") is None:
            assert record["torch_s"] is record["torch_peak_mb"] is None
        else:
            assert record["torch_s"] > 0 and record["torch_peak_mb"] >= 0
        assert record["ours_stolen"] is None or 0.0 <= record["ours_stolen"] <= 1.0
        assert isinstance(record["n"], int)
        assert isinstance(record["load"], float) and record["load"] >= 0
        for key in ("ours_s", "exact_s", "floor_s", "floor_gemm_gflops"):
            assert isinstance(record[key], float) and record[key] > 0
        # the process's CPU time is counted in clock ticks (10 ms): seven steps of a few ms at
        # N = 200 may add up to no tick, so 0.0 is a measurement, not a failure (the suite
        # failed on it under load)
        assert isinstance(record["ours_cpu_s"], float) and record["ours_cpu_s"] >= 0
        for key in ("ours_peak_mb", "exact_peak_mb"):
            assert isinstance(record[key], float) and record[key] >= 0
    printed = capsys.readouterr().out
    # no N in [1e4, 1e6], no N = 1e6, torch below 1e4, no floor at N >= 1e4
    assert printed.count("not measured") == 5
    for number in (1, 2, 3, 4, 5):
        assert f"goal {number} (" in printed
    assert "machine: " in printed and " at the end" in printed  # CPU model and load, issue 38


def test_exact_is_skipped_beyond_its_memory_limit(bench):
    # (3 K + 3) N^2 float32 arrays: 1e3 and 3e3 fit in 8 GB, 1e4 (13.2 GB) does not
    limit = bench.EXACT_LIMIT_BYTES
    assert bench.exact_estimate_bytes(3_000, 4) <= limit < bench.exact_estimate_bytes(10_000, 4)
    assert bench.exact_estimate_bytes(10_000, 4) == pytest.approx(1e8 * 4 * 33)


@pytest.mark.parametrize(("power", "verdict"), [(1.0, "PASS"), (1.5, "FAIL")])
def test_goal_lines_fit_the_loglog_slope(bench, power, verdict):
    sizes = [1_000, 10_000, 100_000, 1_000_000]
    records = [{"n": n, "ours_s": 3e-6 * n**power, "ours_peak_mb": 2e-3 * n**power} for n in sizes]
    slope, used = bench.loglog_slope(records, "ours_s")
    assert used == sizes[1:]  # 1e3 lies outside the fitted range
    assert slope == pytest.approx(power)
    lines = bench.goal_lines(records, "float32", 2)
    assert lines[0].startswith("goal 1") and lines[0].endswith(verdict)
    assert lines[2].startswith("goal 3") and lines[2].endswith(verdict)
    seconds = 3e-6 * 1e6**power  # 3 s (PASS) or 3000 s (FAIL)
    assert lines[1].startswith("goal 2") and f"{seconds:.2f} s: {verdict}" in lines[1]


@pytest.mark.parametrize(
    ("time_ratio", "memory_ratio", "verdict"),
    [(0.2, 0.25, "PASS"), (0.21, 0.25, "FAIL"), (0.2, 0.26, "FAIL")],
)
def test_goal_4_holds_the_torch_ratios_at_their_bounds(bench, time_ratio, memory_ratio, verdict):
    records = [
        {"n": 1_000, "ours_s": 9.0, "ours_peak_mb": 9.0, "torch_s": 1.0, "torch_peak_mb": 1.0},
        {
            "n": 10_000,
            "ours_s": time_ratio,
            "ours_peak_mb": memory_ratio,
            "torch_s": 1.0,
            "torch_peak_mb": 1.0,
        },
    ]  # N = 1e3 lies below the goal's range: its ratio 9 does not count
    line = bench.goal_lines(records, "float32", 2)[3]
    assert line.startswith("goal 4") and line.endswith(verdict), line


@pytest.mark.parametrize(("ratio", "verdict"), [(1.5, "PASS"), (1.51, "FAIL")])
def test_goal_5_holds_the_floor_ratio_at_its_bound(bench, ratio, verdict):
    # issue 38: ours as a multiple of the step's arithmetic floor, from N = 1e4
    records = [
        {"n": 1_000, "ours_s": 9.0, "ours_peak_mb": 1.0, "floor_s": 1.0},
        {"n": 10_000, "ours_s": ratio, "ours_peak_mb": 1.0, "floor_s": 1.0},
    ]  # N = 1e3 lies below the goal's range: its ratio 9 does not count
    line = bench.goal_lines(records, "float32", 2)[4]
    assert line.startswith("goal 5") and line.endswith(verdict), line


def test_goal_lines_say_when_nothing_was_measured(bench):
    record = {"n": 1_000, "ours_s": 0.1, "ours_peak_mb": 5.0, "torch_s": None}
    lines = bench.goal_lines([record], "float32", 2)
    assert all("not measured" in line for line in lines)
