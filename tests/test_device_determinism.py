"""A device run repeats bit for bit (issue 27): segment sums are CSR products, not atomic adds.

On a GPU, ``add.at`` sums each segment in the order its atomic additions land, which
changes from run to run (measured on an H200 before this path: 5 runs of one float32
segment sum differed by up to 7.6e-6, and 20 Adam steps of a GATv2 ended 0.023 apart in
a parameter). The CSR product sums every row in one fixed order. On the CPU the strict
stand-in checks the logic: no floating-point ``ufunc.at`` is reached on the device path.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from refimpl import Graph
from refimpl.backend import array_module, asarray, to_numpy
from refimpl.kernels.segment import segment_max, segment_softmax, segment_sum
from refimpl.models import GAT
from refimpl.nn.transformer.transformer_conv import TransformerConv
from refimpl.testing import strict
from tests.backends import DEVICE_BACKENDS


class _IntegerOnlyAt:
    """A strict ufunc whose ``at`` refuses floating-point targets (atomics on a GPU)."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self._strict = strict._StrictUfunc(ufunc)

    def __call__(self, *args, **kwargs):
        return self._strict(*args, **kwargs)

    def at(self, target, *args, **kwargs):
        if target.dtype.kind == "f":
            raise AssertionError(f"{self._strict.__name__}.at on {target.dtype} on the device path")
        return self._strict.at(target, *args, **kwargs)


@pytest.fixture
def integer_only_at(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("add", "maximum", "minimum"):
        monkeypatch.setattr(strict, name, _IntegerOnlyAt(getattr(np, name)), raising=False)


def test_the_guard_sees_a_floating_point_scatter(integer_only_at: None) -> None:
    target = strict.zeros(3)
    with pytest.raises(AssertionError, match=r"add\.at on float64"):
        strict.add.at(target, strict.asarray([0, 0]), strict.asarray([1.0, 2.0]))


def test_device_path_reaches_no_floating_point_scatter(integer_only_at: None) -> None:
    """Segment sum, max and softmax, a GATv2 layer stack and TransformerConv with
    LipschitzNorm, forward and backward, on the strict stand-in, under the guard."""
    rng = np.random.default_rng(0)
    host_graph = Graph(rng.integers(0, 9, (2, 40)), 9)
    graph = host_graph.to_backend("strict")
    targets = graph.dst_segments(array_module("strict"))
    values = rng.standard_normal((40, 2, 3))
    values[:3] = 7.0  # a tie in the first edges' segments
    for dtype in (np.float32, np.float64):
        typed = asarray(values.astype(dtype), backend="strict")
        assert segment_sum(typed, targets).dtype == dtype
        maxima, argmax = segment_max(typed, targets)
        expected = segment_max(values.astype(dtype), host_graph.dst_segments(np))
        np.testing.assert_array_equal(to_numpy(maxima), expected[0])
        np.testing.assert_array_equal(to_numpy(argmax), expected[1])
        segment_softmax(typed, targets)
    x = asarray(rng.standard_normal((9, 4)), backend="strict")
    model = GAT(4, 3, 2, num_layers=2, heads=2, version="v2")
    params = model.init_params(rng, backend="strict")
    out, cache = model.forward(params, x, graph)
    model.backward(params, cache, out)
    conv = TransformerConv(4, 3, heads=2, edge_dim=2, lipschitz_norm="paper")
    conv_params = conv.init_params(rng, backend="strict")
    edge_attr = asarray(rng.standard_normal((40, 2)), backend="strict")
    out, cache = conv.forward(conv_params, x, graph, edge_attr)
    conv.backward(conv_params, cache, out)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_a_segment_sum_repeats_bit_for_bit(backend: str) -> None:
    """Many items per segment in float32, where the order of the additions shows."""
    rng = np.random.default_rng(1)
    graph = Graph(rng.integers(0, 50, (2, 200_000)), 50).to_backend(backend)
    targets = graph.dst_segments(array_module(backend))
    values = asarray(rng.standard_normal((200_000, 8)).astype(np.float32), backend=backend)
    runs = [to_numpy(segment_sum(values, targets)) for _ in range(3)]
    for run in runs[1:]:
        np.testing.assert_array_equal(run, runs[0])
    host = np.zeros((50, 8))
    np.add.at(host, to_numpy(graph.edge_index)[1], to_numpy(values).astype(np.float64))
    # float32 sums of ~4000 terms of size ~1: within 4000 * eps32 of the float64 sum, per row
    assert np.max(np.abs(runs[0] - host)) <= 4000 * np.finfo(np.float32).eps * 4


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_training_repeats_bit_for_bit(backend: str, tmp_path) -> None:
    """Two float32 runs of the same seed: equal log lines and final parameters, bit for bit."""
    from refimpl.data import contextual_sbm
    from refimpl.train import TrainConfig, train_model

    model = GAT(16, 8, 3, num_layers=2, heads=4, version="v2", dropout=0.3, attn_dropout=0.3)
    config = TrainConfig(epochs=5, lr=0.01, seed=3)
    runs = []
    for name in ("first", "second"):
        dataset = contextual_sbm(400, 3, np.random.default_rng(0))
        dataset = dataclasses.replace(dataset, x=dataset.x.astype(np.float32))  # sets the dtype
        result = train_model(model, dataset, config, out_dir=tmp_path / name, backend=backend)
        lines = (tmp_path / name / "log.jsonl").read_text().splitlines()
        runs.append(([json.loads(line) for line in lines], result.params))
    (log, params), (log_again, params_again) = runs
    assert [{k: v for k, v in line.items() if k != "seconds"} for line in log] == [
        {k: v for k, v in line.items() if k != "seconds"} for line in log_again
    ]
    for name, value in params.items():
        np.testing.assert_array_equal(to_numpy(params_again[name]), to_numpy(value))
