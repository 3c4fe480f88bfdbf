"""``scripts/pyg_parity_table.py``, the README's parity table: every configuration row is
measured and passes, the empty graph is among the draws, and a broken refimpl shows as
failed draws and exit status 1."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pyg_parity_table.py"


@pytest.fixture()
def table():
    spec = importlib.util.spec_from_file_location("pyg_parity_table_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_row_is_measured_and_passes(table, tmp_path, capsys) -> None:
    assert table.main(["--draws", "3", "--json", str(tmp_path / "rows.json")]) == 0
    printed = capsys.readouterr().out
    for name in table.CONFIGURATIONS:
        assert f"| {name} | 3 |" in printed
    assert "| 0 |" in printed.splitlines()[-1]  # no failed draw


def test_the_draws_include_the_empty_graph(table) -> None:
    rng = np.random.default_rng(0)
    sizes = [table.draw_graph(rng)[0] for _ in range(64)]
    assert 0 in sizes and max(sizes) > 1


def test_a_broken_refimpl_shows_as_failed_draws(table, monkeypatch, capsys) -> None:
    from refimpl.nn import GATConv

    original = GATConv.forward_unchecked

    def off_by_a_millionth(self, *args, **kwargs):
        out, cache = original(self, *args, **kwargs)
        return out * (1 + 1e-6), cache

    monkeypatch.setattr(GATConv, "forward_unchecked", off_by_a_millionth)
    monkeypatch.setattr(table, "CONFIGURATIONS", {"GATConv": ("GATConv", {})})
    assert table.main(["--draws", "4"]) == 1
    row = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("| GATConv")
    )
    assert int(row.split("|")[-2]) > 0  # failed draws (an empty graph's output cannot fail)
