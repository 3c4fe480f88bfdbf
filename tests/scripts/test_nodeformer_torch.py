"""The torch peer of the NodeFormer benchmark computes refimpl's layer: float64, same noise, a
graph with duplicate edges, existing self-loops and an isolated node."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from refimpl import Graph
from refimpl.testing import relative_errors

torch = pytest.importorskip("torch")
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    sys.path.insert(0, str(SCRIPTS))  # the scripts import their neighbours
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 1])
def test_peer_equals_refimpl_layer(seed: int) -> None:
    bench, peer = _load("bench_nodeformer"), _load("nodeformer_torch")
    rng = np.random.default_rng(seed)
    n = 40
    edges = rng.integers(0, n - 1, (2, 200))  # node n - 1 has no edge
    edges[:, :5] = [[3] * 5, [3] * 5]  # an existing self-loop, duplicated
    graph = Graph(edges, n)
    layer = bench.nodeformer_layer()
    params = layer.init_params(rng)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}  # biases too
    x = rng.standard_normal((n, bench.CHANNELS))
    noise = {
        "projection": rng.standard_normal((bench.FEATURES, bench.CHANNELS)),
        "gumbel": -np.log(-np.log(rng.random((n, 1, bench.SAMPLES)))),
    }
    out, cache = layer.forward(params, x, graph, training=True, noise=noise)
    d_out = rng.standard_normal(out.shape)
    d_x, d_params = layer.backward(params, cache, d_out, input_grad=True)

    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    t_x = torch.tensor(x, requires_grad=True)
    adjacency = peer.normalised_adjacency(edges, n, torch.float64)
    omega, gumbel = torch.tensor(noise["projection"]), torch.tensor(noise["gumbel"])

    def peer_out(weights: dict) -> Any:
        return peer.peer_layer(weights, t_x, adjacency, omega, gumbel, bench.TAU)

    t_out = peer_out(tensors)
    t_out.backward(torch.tensor(d_out))
    ours = {"out": out, "x": d_x, **d_params}
    theirs = {"out": t_out.detach().numpy(), "x": t_x.grad.numpy()}
    theirs.update({k: t.grad.numpy() for k, t in tensors.items()})
    errors = relative_errors(ours, theirs)
    assert max(errors.values()) <= 1e-10, errors
    # the comparison can fail: the peer without its relational bias is far off
    off = peer_out({**tensors, "b_rel": torch.tensor([[-50.0]])})
    assert relative_errors({"out": out}, {"out": off.detach().numpy()})["out"] > 1e-3
