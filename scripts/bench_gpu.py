"""GPU benchmark: one float32 training step on CuPy against PyTorch Geometric on CUDA, same run.

Cases (issue 9):

    gat-a          2-layer GAT v1, 8 heads x 8, ELU, dropout 0.6: bench_gat.py's configuration a
    gat-c          10-layer GATv2, width 64, 1 head, shared W: bench_gat.py's configuration c
    gatv2-large    2-layer GATv2, width 64, 1 head, on a random graph, N = 1e6, E = 1e7
    nodeformer-1e6 one NodeFormerConv step (forward + backward), bench_nodeformer.py's layer
    nodeformer-1e7 and graph (d = 64, m = 30, K = 10, one head, sigmoid relational bias,
                   average degree 10), N = 1e6 and 1e7

A GAT step is forward, cross-entropy, backward and Adam, as in ``bench_gat.py``. Our
dropout masks and Gumbel noise are drawn on the device (``cupy.random``): a host
generator would add one transfer per draw (README, Backends). The NodeFormer projection
``omega`` (m x d, tiny) is drawn by the layer itself, on the host as in training, with
its configured kind (orthogonal by default). Times are medians over
``--steps`` steps after 3 warm-up steps, with the device synchronised before and after
each step. Goals: ours <= PyG for the GAT cases; NodeFormer at N = 1e7 under 1 s.

    python scripts/bench_gpu.py [--steps 20] [--json results.json] [--cases gat-a ...]
    python scripts/bench_gpu.py --backend numpy --small     # CPU smoke run (tests)

``--small`` divides every size by 1000 (Cora stays Cora). PyG runs where it is installed,
on CUDA with ``--backend cupy`` and on the CPU with ``--backend numpy``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/: shared helpers
from bench_gat import _load_cora, _time, ours_model, ours_step, pyg_step
from bench_nodeformer import CHANNELS, DEGREE, nodeformer_layer

CASES = {
    "gat-a": "2-layer GAT v1, 8 heads x 8, ELU, dropout 0.6 (Cora)",
    "gat-c": "10-layer GATv2, width 64, 1 head, shared W (Cora)",
    "gatv2-large": "2-layer GATv2, width 64, N = 1e6, E = 1e7",
    "nodeformer-1e6": "NodeFormerConv step, N = 1e6",
    "nodeformer-1e7": "NodeFormerConv step, N = 1e7",
}
LARGE_N, LARGE_E, FEATURES, CLASSES = 1_000_000, 10_000_000, 16, 8


def _sync(backend: str) -> None:
    if backend == "cupy":
        import cupy

        cupy.cuda.Device().synchronize()


def _torch_sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _device_rng(backend: str, seed: int):
    """A generator that draws on the backend (NumPy's on the CPU)."""
    if backend == "cupy":
        import cupy

        return cupy.random.default_rng(seed)
    import numpy as np

    return np.random.default_rng(seed)


def _large_graph(scale: int):
    """A random graph with N = 1e6 / scale nodes and E = 1e7 / scale edges, features, labels."""
    import numpy as np

    from refimpl import Graph

    rng = np.random.default_rng(0)
    n, e = LARGE_N // scale, LARGE_E // scale
    x = rng.standard_normal((n, FEATURES)).astype(np.float32)
    train = np.zeros(n, bool)
    train[: n // 10] = True
    return x, Graph(rng.integers(0, n, (2, e)), n), rng.integers(0, CLASSES, n), train


def _gat_data(case: str, scale: int) -> tuple:
    if case == "gatv2-large":
        return _large_graph(scale)
    x, graph, y, train, _ = _load_cora()
    return x, graph, y, train


def _shape(case: str) -> dict:
    """Depth and classes: on the large graph configuration c is a 2-layer GATv2."""
    return {"out_channels": CLASSES, "num_layers": 2} if case == "gatv2-large" else {}


def run_ours_gat(case: str, backend: str, steps: int, scale: int) -> float:
    import numpy as np

    from refimpl.backend import asarray

    x, graph, y, train = _gat_data(case, scale)
    model = ours_model("a" if case == "gat-a" else "c", x.shape[1], **_shape(case))
    x, y, train = (asarray(a, backend=backend) for a in (x, y, train))
    params = model.init_params(np.random.default_rng(0), backend=backend, dtype=np.float32)
    rng = _device_rng(backend, 1)
    step = ours_step(model, params, x, graph.to_backend(backend), y, train, rng)
    return _time(step, steps, lambda: _sync(backend))


def run_ours_nodeformer(n: int, backend: str, steps: int) -> float:
    import numpy as np

    from refimpl import Graph
    from refimpl.backend import asarray, get_array_module

    layer = nodeformer_layer()
    rng = np.random.default_rng(0)
    params = layer.init_params(rng, backend=backend, dtype=np.float32)
    x = asarray(rng.standard_normal((n, CHANNELS)).astype(np.float32), backend=backend)
    d_out = asarray(rng.standard_normal((n, CHANNELS)).astype(np.float32), backend=backend)
    graph = Graph(rng.integers(0, n, (2, DEGREE * n)), n).to_backend(backend)
    device = _device_rng(backend, 1)
    xp = get_array_module(x)
    tiny = np.finfo(np.float32).tiny
    gumbel_shape = (n, layer.heads, layer.num_samples)  # (N, H, K)

    def step() -> None:
        # The layer's Gumbel formula g = -log(-log(U)), drawn here on the device: float32
        # U floored at float32's smallest normal (the layer floors float64 U at 2^-1074), so
        # g stays finite. The projection omega (m, d) is not given: the layer draws it from
        # rng with its configured kind, as it does in training.
        uniform = xp.maximum(device.random(gumbel_shape, dtype=np.float32), tiny)
        noise = {"gumbel": -xp.log(-xp.log(uniform))}  # (N, H, K)
        _, cache = layer.forward(params, x, graph, training=True, rng=rng, noise=noise)
        layer.backward(params, cache, d_out)

    return _time(step, steps, lambda: _sync(backend))


def run_pyg_gat(case: str, backend: str, steps: int, scale: int) -> float:
    import torch

    device = "cuda" if backend == "cupy" else "cpu"
    torch.manual_seed(0)
    x, graph, y, train = _gat_data(case, scale)
    step = pyg_step(
        "a" if case == "gat-a" else "c",
        torch.from_numpy(x).to(device),
        torch.tensor(graph.edge_index).to(device),
        torch.from_numpy(y).long().to(device),
        torch.from_numpy(train).to(device),
        **_shape(case),
    )
    return _time(step, steps, lambda: _torch_sync(device))


def _pyg_available() -> bool:
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cupy", "numpy"), default="cupy")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="sizes / 1000: a smoke run")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    scale = 1000 if args.small else 1
    pyg = _pyg_available()
    rows = {}
    print(f"backend {args.backend}; float32; median of {args.steps} steps; sizes / {scale}")
    print(f"{'case':<58} {'ours ms':>9} {'PyG ms':>9} {'ratio':>6}")
    for case in args.cases:
        if case.startswith("nodeformer"):
            n = (1_000_000 if case.endswith("1e6") else 10_000_000) // scale
            ours, theirs = run_ours_nodeformer(n, args.backend, args.steps), None
        else:
            ours = run_ours_gat(case, args.backend, args.steps, scale)
            theirs = run_pyg_gat(case, args.backend, args.steps, scale) if pyg else None
        ratio = ours / theirs if theirs else None
        rows[case] = {"label": CASES[case], "ours_ms": ours, "pyg_ms": theirs, "ratio": ratio}
        theirs_text = f"{theirs:>9.1f}" if theirs else f"{'-':>9}"
        ratio_text = f"{ratio:>6.2f}" if ratio else f"{'-':>6}"
        print(f"{case + ': ' + CASES[case]:<58} {ours:>9.1f} {theirs_text} {ratio_text}")
    for case, row in rows.items():
        if row["ratio"] is not None:
            verdict = "met" if row["ratio"] <= 1 else "not met"
            print(f"goal {case}: ours <= PyG: {verdict} (ratio {row['ratio']:.2f})")
    if "nodeformer-1e7" in rows:
        seconds = rows["nodeformer-1e7"]["ours_ms"] / 1e3
        verdict = "met" if seconds < 1 else "not met"
        print(f"goal nodeformer-1e7 under 1 s: {verdict} ({seconds:.2f} s; sizes / {scale})")
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(rows, stream, indent=2)
    return rows


if __name__ == "__main__":
    main()
