"""``scripts/bench_common.py`` and its users: the median timer's warm-up and syncs, a child
process's threads, result and failure, bench_gat's PyG-missing case, and bench_gpu's NodeFormer
step drawing the projection as the layer does."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the scripts' own imports (bench_common, ...)
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def common(monkeypatch):
    return _load("bench_common", monkeypatch)


def test_median_seconds_warms_up_syncs_and_takes_the_median(common, monkeypatch) -> None:
    events, clock = [], iter([0.0, 4.0, 10.0, 11.0, 20.0, 22.0])  # spans 4, 1, 2
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(clock))
    seconds = common.median_seconds(
        lambda: events.append("step"), 3, warmup=2, sync=lambda: events.append("sync")
    )
    assert seconds == 2.0
    timed = ["sync", "step", "sync"]
    assert events == ["step", "step", "sync", *timed, *timed, *timed]


def test_median_seconds_without_sync(common, monkeypatch) -> None:
    calls, clock = [], iter([0.0, 1.0, 1.0, 4.0])  # spans 1, 3
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(clock))
    assert common.median_seconds(lambda: calls.append(1), 2) == 2.0  # median of two: the mean
    assert len(calls) == 3  # one warm-up call by default


def test_child_runs_with_the_threads_and_returns_its_json(common) -> None:
    env = common.run_child("bench_common", "thread_env", (3,), 5, "thread_env")
    # the child's own environment, as its thread_env(3) sees it: the parent set 5 threads
    assert {name: env[name] for name in common.THREAD_VARIABLES} == dict.fromkeys(
        common.THREAD_VARIABLES, "3"
    )
    assert common.thread_env(5)["MKL_NUM_THREADS"] == "5"
    # another script, several arguments
    estimate = common.run_child("bench_nodeformer", "exact_estimate_bytes", (10, 4), 1, "estimate")
    assert estimate == 10 * 10 * 4 * 33  # (3 K + 3) N x N float32 arrays, K = 10


def test_a_failing_child_raises_with_its_stderr(common) -> None:
    with pytest.raises(common.ChildFailed, match=r"^missing failed:\n") as raised:
        common.run_child("bench_common", "no_such_function", (), 1, "missing")
    assert "AttributeError" in raised.value.stderr
    assert isinstance(raised.value, RuntimeError)


def test_bench_gat_child_is_none_only_for_a_missing_pyg(monkeypatch) -> None:
    bench = _load("bench_gat", monkeypatch)
    failed = bench.ChildFailed
    stderr = "ModuleNotFoundError: No module named 'torch_geometric'"

    options = argparse.Namespace(steps=4, threads=2, features="sparse")

    def missing(module, function, args, threads, what):
        assert (module, function, args, threads) == ("bench_gat", "run_pyg", ("a", 4), 2)
        raise failed(what, stderr)

    monkeypatch.setattr(bench, "run_child", missing)
    assert bench._child("pyg", "a", options) is None

    def broken(module, function, args, threads, what):
        raise failed(what, stderr)

    monkeypatch.setattr(bench, "run_child", broken)
    with pytest.raises(RuntimeError, match="ours a failed"):
        bench._child("ours", "a", options)  # our side missing a module is an error


def test_bench_gpu_nodeformer_draws_the_projection_as_the_layer_does(monkeypatch) -> None:
    import refimpl.nn.nodeformer.conv as nodeformer

    bench = _load("bench_gpu", monkeypatch)
    kinds, draw = [], nodeformer.draw_projection

    def recorded(rng, m, d, kind="iid"):
        kinds.append((m, d, kind))
        return draw(rng, m, d, kind)

    monkeypatch.setattr(nodeformer, "draw_projection", recorded)
    assert bench.run_ours_nodeformer(50, "numpy", 2) > 0
    default = {f.name: f.default for f in dataclasses.fields(nodeformer.NodeFormerConv)}
    layer = bench.nodeformer_layer()
    expected = (layer.num_random_features, layer.out_channels, default["projection"])
    assert kinds == [expected] * (3 + 2)  # 3 warm-up steps and 2 timed ones


def test_stolen_fraction_is_the_steal_share_of_the_cpu_time(common) -> None:
    assert common.stolen_fraction((10, 100), (40, 400)) == 0.1
    assert common.stolen_fraction(None, (40, 400)) is None
    assert common.stolen_fraction((10, 100), (10, 100)) is None  # no time passed
    reading = common.cpu_jiffies()
    if reading is not None:  # Linux: steal is a part of the total
        assert 0 <= reading[0] <= reading[1]


def test_process_cpu_seconds_counts_this_process_work(common) -> None:
    before = common.process_cpu_seconds()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # busy: CPU time, not sleep
        pass
    spent = common.process_cpu_seconds() - before
    # os.times counts in ticks of 10 ms or finer: 0.05 s of work reads as 0.04 at worst, and
    # the difference of two tick counts in float seconds can sit an ulp below that
    assert 0.04 - 1e-9 <= spent < 5.0
