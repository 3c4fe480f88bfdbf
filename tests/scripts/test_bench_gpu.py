"""Smoke test of ``scripts/bench_gpu.py`` on the CPU (``--backend numpy --small``): every case
runs, the rows and goal lines come out. The GPU numbers themselves need a CUDA machine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_cpu_run_reports_every_case(bench, tmp_path, capsys) -> None:
    path = tmp_path / "out.json"
    cases = ["gat-a", "gatv2-large", "nodeformer-1e6", "nodeformer-1e7"]
    rows = bench.main(["--backend", "numpy", "--small", "--steps", "1", "--cases", *cases,
                       "--json", str(path)])  # fmt: skip
    assert list(rows) == cases
    assert json.loads(path.read_text()) == rows
    for case, row in rows.items():
        assert row["ours_ms"] > 0
        if case.startswith("nodeformer"):
            assert row["pyg_ms"] is None and row["ratio"] is None
    printed = capsys.readouterr().out
    assert "goal nodeformer-1e7 under 1 s" in printed
    assert "sizes / 1000" in printed
