"""Smoke test of ``scripts/bench_graph_transformer.py``: a tiny run's JSON (the batches and
graphs it says it measured, which timings each variant has), the size budget, the slopes and
the extrapolation, and bad options."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from refimpl.data import synthetic_molecules

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_graph_transformer.py"
LINUX_PEAK = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="Linux peak-RSS reset"
)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_graph_transformer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@LINUX_PEAK
def test_tiny_run_writes_what_it_measured(bench, tmp_path):
    path = tmp_path / "out.json"
    argv = ["--variants", "gt", "graphit-full", "--batch-sizes", "2", "--layers", "1"]
    argv += ["--repeats", "1", "--sizes", "24", "12", "--threads", "1", "--json", str(path)]
    returned = bench.main(argv)
    result = json.loads(path.read_text())
    assert result == json.loads(json.dumps(returned))
    config = result["config"]
    assert config["dtype"] == "float64"  # the default
    assert config["threads"] == config["layers"] == config["repeats"] == 1
    assert config["scaling_layers"] == 2 and (config["hidden"], config["heads"]) == (64, 8)

    # the timed step (after one warm-up batch of 2 graphs) read graphs 2 and 3 of the set
    data = synthetic_molecules(4, seed=0, **bench.MOLECULES)
    sizes, edges = np.diff(data.node_ptr)[2:], np.diff(data.edge_ptr)[2:]
    pairs = {"gt": edges.sum(), "graphit-full": (sizes * (sizes - 1)).sum()}
    training = result["training"]
    assert [(r["variant"], r["batch_graphs"]) for r in training] == [
        ("gt", 2),
        ("graphit-full", 2),
    ]
    for record in training:
        assert "error" not in record, record
        assert (record["nodes"], record["edges"]) == (sizes.sum(), edges.sum())
        assert record["pairs"] == pairs[record["variant"]]
        for key in ("s", "forward_s", "backward_s", "optimizer_s"):
            assert isinstance(record[key], float) and record[key] > 0
        assert record["cpu_s"] >= 0 and record["peak_mb"] >= 0  # CPU time counts 10 ms ticks
        assert record["stolen"] is None or 0.0 <= record["stolen"] <= 1.0
        built = (record["pairs_s"], record["kernel_s"])
        if record["variant"] == "gt":
            assert built == (None, None)  # no full graph, no kernel
        else:
            assert all(isinstance(s, float) and s > 0 for s in built)

    scaling = result["scaling"]
    assert [(r["variant"], r["n"]) for r in scaling] == [
        ("gt", 12),
        ("gt", 24),
        ("graphit-full", 12),
        ("graphit-full", 24),
    ]  # sizes sorted
    for record in scaling:
        n = record["n"]
        graph = synthetic_molecules(1, seed=0, min_atoms=n, max_atoms=n, mean_rings=n / 10)
        assert record["edges"] == graph.edge_index.shape[1]
        full = record["variant"] == "graphit-full"
        assert record["pairs"] == (n * (n - 1) if full else record["edges"])
        assert record["s"] > 0 and record["cpu_s"] >= 0 and record["peak_mb"] >= 0
        assert (record["kernel_s"] is not None) == full
    slopes = result["slopes"]
    assert set(slopes) == {"gt", "graphit-full"}
    for variant, by_key in slopes.items():
        assert set(by_key) == {"s", "peak_mb", "pairs_s", "kernel_s"}
        assert all(isinstance(by_key["s"][k], float) for k in ("fit", "last"))
        # two sizes: the fit through both is the slope between them
        assert by_key["s"]["fit"] == pytest.approx(by_key["s"]["last"])
        assert (by_key["kernel_s"]["fit"] is None) == (variant == "gt")


@LINUX_PEAK
def test_sizes_over_the_time_budget_are_skipped_with_their_estimates(bench):
    argv = ["--parts", "scaling", "--variants", "san-edges", "--sizes", "12", "24", "48"]
    result = bench.main([*argv, "--threads", "1", "--max-seconds", "1e-9"])
    first, second, third = result["scaling"]
    assert first["s"] > 0  # nothing to extrapolate from: it runs
    # from one size the estimate is quadratic; 48 is estimated from the same single size
    assert second["s"] is None and second["peak_mb"] is None
    assert second["estimate_s"] == pytest.approx(first["s"] * 4)
    assert second["estimate_mb"] == pytest.approx(first["peak_mb"] * 4)
    assert third["s"] is None and third["estimate_s"] == pytest.approx(first["s"] * 16)
    assert result["training"] == []  # --parts scaling
    assert result["slopes"]["san-edges"]["s"] == {"fit": None, "last": None}


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([], 0.0),
        ([(100, 3.0)], 48.0),  # quadratic from one size
        ([(100, 1.0), (200, 4.0)], 16.0),  # slope 2
        ([(100, 1.0), (200, 1.0)], 2.0),  # slope 0, held to 1
        ([(100, 1.0), (200, 16.0)], 128.0),  # slope 4, held to 3
        ([(50, 9.0), (100, 1.0), (200, 2.0)], 4.0),  # the two largest sizes only
    ],
)
def test_extrapolate_follows_the_two_largest_sizes(bench, points, expected):
    assert bench.extrapolate(points, 400) == pytest.approx(expected)


def test_slopes_fit_a_power_law_and_need_two_positive_values(bench):
    points = [(n, 5e-3 * n**2.5) for n in (50, 100, 200, 400)]
    fit, last = bench.slopes(points)
    assert fit == pytest.approx(2.5) and last == pytest.approx(2.5)
    bent = [(100, 1.0), (200, 2.0), (400, 16.0)]  # slopes 1 then 3
    fit, last = bench.slopes(bent)
    assert last == pytest.approx(3.0) and 1.0 < fit < 3.0
    assert bench.slopes([(100, 1.0), (200, None), (400, 0.0)]) == (None, None)


def test_a_failing_child_becomes_an_error_record(bench):
    record = bench._child("no_such_function", (), 1, "missing")
    assert set(record) == {"error"}
    assert record["error"].startswith("AttributeError") and "no_such_function" in record["error"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "1", "50"], "--sizes must be at least 2 nodes"),
        (["--batch-sizes", "0"], "--batch-sizes must be at least 1 graph"),
        (["--scaling-layers", "0"], "--scaling-layers must be at least 1"),
        (["--max-gb", "nan"], "--max-seconds and --max-gb must be positive"),
        (["--json", "/no/such/folder/out.json"], "folder /no/such/folder does not exist"),
        (["--variants", "graphit"], "invalid choice: 'graphit'"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_any_run(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as raised:
        bench.main(argv)
    assert raised.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    assert message in captured.err and "Traceback" not in captured.err
