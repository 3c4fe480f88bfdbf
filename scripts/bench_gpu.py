"""GPU benchmark: one float32 training step on CuPy against PyTorch Geometric on CUDA, same run.

Cases (issues 9 and 38):

    gat-a          2-layer GAT v1, 8 heads x 8, ELU, dropout 0.6: bench_gat.py's configuration a
    gat-a0         gat-a without dropout (bench_gat.py's a0)
    gat-c          10-layer GATv2, width 64, 1 head, shared W: bench_gat.py's configuration c
    gatv2-large    2-layer GATv2, width 64, 1 head, on a random graph, N = 1e6, E = 1e7
    nodeformer-1e6 one NodeFormerConv step (forward + backward), bench_nodeformer.py's layer
    nodeformer-1e7 and graph (d = 64, m = 30, K = 10, one head, sigmoid relational bias,
                   average degree 10), N = 1e6 and 1e7
    gat-a-layer    one GAT v1 layer forward + backward: gat-a's first (8 heads x 8, dropout 0.6)
    gat-large-layer  one GAT v1 layer, 64 channels, 1 head, on gatv2-large's graph
    gatv2-large-layer  one GATv2 layer, 64 channels, 1 head, shared W, on gatv2-large's graph

A GAT step is the training loop's own (:func:`refimpl.train.node_step.node_step` inside
:func:`refimpl.train.guards.deferred_step`: forward, cross-entropy on the training rows
selected once, backward, Adam, every finiteness check read in one sync), timed twice in the
same call, on the literal path and inside :func:`refimpl.nn.gat.fused_kernels` (the fused
kernels; CuPy only), beside PyG's step (``bench_gat.py``'s ``pyg_step``). Its masks come
from the loop's host generator, as in training (one seed gives one run on every backend):
the feature masks drawn on the device, bitwise the host's draw
(:mod:`refimpl.kernels.pcg64_draws`), the attention masks (E, H) on the host and copied;
gat-a0 shows the same step without dropout. PyG draws on the device. A layer case times the
layer's forward and backward, literal and fused, beside PyG's ``GATConv`` or ``GATv2Conv``,
with one dropout mask drawn once and given to ours. ``--check-fused`` runs the fused layers
(GATv1, GATv2 with and without shared weights) on a small graph, float32 and float64, twice:
the repeat bitwise; with ``full`` also against the literal layer (GATv1's forward bitwise;
each difference printed relative to the tensor's largest entry). CuPy's memory pool is off
there, so that ``compute-sanitizer`` sees every allocation (``scripts/device_check.sh``).

The NodeFormer projection ``omega`` (m x d, tiny) is drawn by the layer itself, on the host as
in training; its Gumbel noise on the device. Times are medians over ``--steps`` steps after 3
warm-up steps, with the device synchronised before and after each step. Goals (issue 38):
the fused gat-a and gatv2-large steps at most 0.5x PyG's; NodeFormer at N = 1e7 under 1 s.

    python scripts/bench_gpu.py [--steps 20] [--json results.json] [--cases gat-a ...]
    python scripts/bench_gpu.py --backend numpy --small     # CPU smoke run (tests)
    python scripts/bench_gpu.py --backend strict --small    # the fused wiring, through twins

``--small`` divides every size by 1000 (Cora stays Cora). PyG runs where it is installed,
on CUDA with ``--backend cupy`` and on the CPU otherwise. The strict stand-in runs the fused
kernels' NumPy twins: its times say nothing of a device.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/: shared helpers
from bench_gat import _load_cora, _time, ours_model, pyg_step
from bench_nodeformer import CHANNELS, DEGREE, nodeformer_layer

CASES = {
    "gat-a": "2-layer GAT v1, 8 heads x 8, ELU, dropout 0.6 (Cora)",
    "gat-a0": "gat-a without dropout (Cora)",
    "gat-c": "10-layer GATv2, width 64, 1 head, shared W (Cora)",
    "gatv2-large": "2-layer GATv2, width 64, N = 1e6, E = 1e7",
    "nodeformer-1e6": "NodeFormerConv step, N = 1e6",
    "nodeformer-1e7": "NodeFormerConv step, N = 1e7",
    "gat-a-layer": "GAT v1 layer fwd+bwd, 8 heads x 8, p 0.6 (Cora)",
    "gat-large-layer": "GAT v1 layer fwd+bwd, 64 x 1, N = 1e6, E = 1e7",
    "gatv2-large-layer": "GATv2 layer fwd+bwd, 64 x 1, shared W, N = 1e6, E = 1e7",
}
FUSED_GOALS = {"gat-a": 0.5, "gatv2-large": 0.5}  # issue 38: the fused step / PyG's
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


def _config(case: str) -> str:
    """bench_gat.py's configuration of a training case."""
    return {"gat-a": "a", "gat-a0": "a0"}.get(case, "c")


def run_ours_gat(case: str, backend: str, steps: int, scale: int) -> dict:
    """Milliseconds of the training loop's step (module docstring) of ``case``: ``ours_ms``
    on the literal path, ``fused_ms`` inside ``fused_kernels()`` (None on NumPy)."""
    import numpy as np

    from refimpl.backend import asarray
    from refimpl.nn.gat import fused_kernels
    from refimpl.ops.losses import SoftmaxCrossEntropy
    from refimpl.optim import Adam
    from refimpl.train.guards import deferred_step
    from refimpl.train.node_step import node_step

    x, graph, y, train = _gat_data(case, scale)
    model = ours_model(_config(case), x.shape[1], **_shape(case))
    x, y, train = (asarray(a, backend=backend) for a in (x, y, train))
    graph, times = graph.to_backend(backend), {"ours_ms": None, "fused_ms": None}
    for path in ("ours_ms", "fused_ms") if backend != "numpy" else ("ours_ms",):
        params = model.init_params(np.random.default_rng(0), backend=backend, dtype=np.float32)
        optimizer, loss = Adam(lr=0.005, weight_decay=5e-4), SoftmaxCrossEntropy()
        selection = loss.select(y, train, model.out_channels, x.dtype)  # once per dataset
        data, rng = (x, y, selection, graph), np.random.default_rng(1)  # the loop's host draws
        carried = {"params": params, "state": optimizer.init(params), "epoch": 0}

        def step(
            carried=carried, optimizer=optimizer, loss=loss, data=data, rng=rng,
            fused=path == "fused_ms",
        ) -> None:  # fmt: skip
            arguments = (model, carried["params"], carried["state"], optimizer, None, data,
                         loss, carried["epoch"], rng)  # fmt: skip
            with fused_kernels(fused):
                *_, updated = deferred_step(lambda: node_step(*arguments), rng)
            carried["params"], carried["state"] = updated
            carried["epoch"] += 1

        times[path] = _time(step, steps, lambda: _sync(backend))
    return times


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
        _config(case),
        torch.from_numpy(x).to(device),
        torch.tensor(graph.edge_index).to(device),
        torch.from_numpy(y).long().to(device),
        torch.from_numpy(train).to(device),
        **_shape(case),
    )
    return _time(step, steps, lambda: _torch_sync(device))


LAYERS = {  # case: (data, version, heads, channels, dropout)
    "gat-a-layer": ("gat-a", "v1", 8, 8, 0.6),
    "gat-large-layer": ("gatv2-large", "v1", 1, 64, 0.0),
    "gatv2-large-layer": ("gatv2-large", "v2", 1, 64, 0.0),
}


def _layer_setup(case: str, backend: str, scale: int) -> tuple:
    """``(layer, params, x, graph, keep, d_out)`` of a layer case on ``backend``: ``keep``
    (E, H) the dropout mask over the edges of the graph with the layer's self-loops (None
    without dropout), ``d_out`` (N, H C) a cotangent."""
    import numpy as np

    from refimpl.backend import asarray
    from refimpl.nn.gat.conv import GATConv

    data, version, heads, channels, p = LAYERS[case]
    x, graph, _, _ = _gat_data(data, scale)
    layer = GATConv(x.shape[1], channels, heads=heads, version=version, dropout=p)
    rng = np.random.default_rng(0)
    params = layer.init_params(rng, backend=backend, dtype=np.float32)
    graph = graph.to_backend(backend)
    keep = None
    if p:
        edges = layer.prepare_graph(graph).num_edges
        keep = asarray(rng.random((edges, heads)) >= p, backend=backend)
    d_out = rng.standard_normal((x.shape[0], heads * channels)).astype(np.float32)
    return layer, params, asarray(x, backend=backend), graph, keep, asarray(d_out, backend=backend)


def layer_step(layer, params: dict, x, graph, keep, d_out, fused: bool) -> tuple:
    """One layer's forward and backward, inside ``fused_kernels(fused)``: ``(out (N, H C),
    alpha (E, H), gradients by name, with "x")``."""
    from refimpl.nn.gat import fused_kernels

    with fused_kernels(fused):
        out, cache = layer.forward(params, x, graph, training=True, attn_dropout_mask=keep)
        d_x, grads = layer.backward(params, cache, d_out)
    return out, cache.alpha, grads | {"x": d_x}


def run_layer(case: str, backend: str, steps: int, scale: int) -> dict:
    """Milliseconds of one layer's forward + backward: the literal layer, and the fused
    kernels on a device backend (None on NumPy)."""
    layer, params, x, graph, keep, d_out = _layer_setup(case, backend, scale)
    times = {"ours_ms": None, "fused_ms": None}
    for path in ("ours_ms", "fused_ms") if backend != "numpy" else ("ours_ms",):
        fused = path == "fused_ms"
        step = partial(layer_step, layer, params, x, graph, keep, d_out, fused)
        times[path] = _time(step, steps, lambda: _sync(backend))
    return times


def run_pyg_layer(case: str, backend: str, steps: int, scale: int) -> float:
    import torch
    from torch_geometric.nn import GATConv, GATv2Conv

    device = "cuda" if backend == "cupy" else "cpu"
    torch.manual_seed(0)
    data, version, heads, channels, p = LAYERS[case]
    x, graph, _, _ = _gat_data(data, scale)
    if version == "v1":
        conv = GATConv(x.shape[1], channels, heads=heads, dropout=p)
    else:
        conv = GATv2Conv(x.shape[1], channels, heads=heads, dropout=p, share_weights=True)
    conv = conv.to(device)
    x = torch.from_numpy(x).to(device).requires_grad_(True)  # ours computes d_x too
    edge_index = torch.tensor(graph.edge_index).to(device)
    d_out = torch.randn(x.shape[0], heads * channels, device=device)

    def step() -> None:
        conv.zero_grad(set_to_none=True)
        x.grad = None
        conv(x, edge_index).backward(d_out)

    return _time(step, steps, lambda: _torch_sync(device))


def check_fused(mode: str, backend: str = "cupy") -> bool:
    """The fused layers on ``backend`` (CuPy; the strict stand-in runs the kernels' twins) on
    a small graph (isolated nodes, duplicate edges): GATv1 (4 heads, dropout 0.5) and GATv2
    with and without shared weights, float32 and float64, run twice: the repeat bitwise; with
    ``mode="full"`` also against the literal layer (GATv1's forward bitwise; every difference
    printed relative to the tensor's largest entry). ``"kernels"``: the fused layers alone,
    for compute-sanitizer. Prints one line per check; True when every PASS/FAIL check
    passed."""
    import numpy as np

    from refimpl import Graph
    from refimpl.backend import asarray, to_numpy
    from refimpl.nn.gat.conv import GATConv

    if backend == "cupy":
        import cupy

        cupy.cuda.set_allocator(None)  # every array its own allocation, for compute-sanitizer
    rng = np.random.default_rng(0)
    n = 300
    edges = rng.integers(0, n - 20, (2, 3000))  # nodes n - 20 .. n - 1: only their self-loop
    graph = Graph(np.concatenate([edges, edges[:, :50]], axis=1), n).to_backend(backend)
    same = lambda a, b: to_numpy(a).tobytes() == to_numpy(b).tobytes()  # noqa: E731
    layers = {
        "v1": dict(heads=4, dropout=0.5),
        "v2-shared": dict(heads=4, dropout=0.5, version="v2", share_weights=True),
        "v2": dict(heads=4, dropout=0.5, version="v2", share_weights=False),
    }
    passed = True
    for dtype in (np.float32, np.float64):
        for name, options in layers.items():
            layer = GATConv(16, 8, **options)
            params = layer.init_params(rng, backend=backend, dtype=dtype)
            x = asarray(rng.standard_normal((n, 16)), backend=backend, dtype=dtype)
            keep = rng.random((layer.prepare_graph(graph).num_edges, 4)) >= 0.5
            keep = asarray(keep, backend=backend)
            d_out = asarray(rng.standard_normal((n, 32)), backend=backend, dtype=dtype)
            runs = [layer_step(layer, params, x, graph, keep, d_out, True) for _ in range(2)]
            _sync(backend)
            (f_out, f_alpha, f_grads), (r_out, r_alpha, r_grads) = runs
            pairs = [(f_out, r_out), (f_alpha, r_alpha)]
            checks = {"repeat bitwise": all(same(a, b) for a, b in pairs + [
                (f_grads[k], r_grads[k]) for k in f_grads])}  # fmt: skip
            found = {}
            if mode == "full":
                out, alpha, literal = layer_step(layer, params, x, graph, keep, d_out, False)
                if name == "v1":
                    checks["forward out bitwise the literal"] = same(f_out, out)
                    checks["alpha bitwise the literal"] = same(f_alpha, alpha)
                found = {"out": (f_out, out), "alpha": (f_alpha, alpha)}
                found |= {f"d {k}": (f_grads[k], value) for k, value in literal.items()}
            label = f"{np.dtype(dtype).name} {name}"
            for what, ok in checks.items():
                print(f"{label} {what}: {'PASS' if ok else 'FAIL'}")
                passed &= ok
            for what, (fused_value, value) in found.items():
                fused_value, value = to_numpy(fused_value), to_numpy(value)
                largest = max(float(np.max(np.abs(value), initial=0.0)), 1e-300)
                error = float(np.max(np.abs(fused_value - value), initial=0.0)) / largest
                print(f"{label} {what}: largest difference / largest entry {error:.2e}")
    return passed


def _pyg_available() -> bool:
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        return False
    return True


def _cell(value: float | None, width: int, form: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{form}}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cupy", "numpy", "strict"), default="cupy")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="sizes / 1000: a smoke run")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--check-fused",
        choices=("full", "kernels"),
        help="check the fused GAT layers (on CuPy, or the strict stand-in's twins; full: also "
        "against the literal layer), exit",
    )
    args = parser.parse_args(argv)
    if args.check_fused:
        raise SystemExit(0 if check_fused(args.check_fused, args.backend) else 1)
    scale = 1000 if args.small else 1
    pyg = _pyg_available()
    rows = {}
    print(f"backend {args.backend}; float32; median of {args.steps} steps; sizes / {scale}")
    print(f"{'case':<68} {'ours ms':>9} {'PyG ms':>9} {'ratio':>6} {'fused ms':>9} {'f/PyG':>6}")
    for case in args.cases:
        fused = None
        if case.startswith("nodeformer"):
            n = (1_000_000 if case.endswith("1e6") else 10_000_000) // scale
            ours, theirs = run_ours_nodeformer(n, args.backend, args.steps), None
        elif case in LAYERS:
            times = run_layer(case, args.backend, args.steps, scale)
            ours, fused = times["ours_ms"], times["fused_ms"]
            theirs = run_pyg_layer(case, args.backend, args.steps, scale) if pyg else None
        else:
            times = run_ours_gat(case, args.backend, args.steps, scale)
            ours, fused = times["ours_ms"], times["fused_ms"]
            theirs = run_pyg_gat(case, args.backend, args.steps, scale) if pyg else None
        ratio = ours / theirs if theirs else None
        fused_ratio = fused / theirs if fused and theirs else None
        rows[case] = {"label": CASES[case], "ours_ms": ours, "pyg_ms": theirs, "ratio": ratio,
                      "fused_ms": fused, "fused_ratio": fused_ratio}  # fmt: skip
        print(
            f"{case + ': ' + CASES[case]:<68} {ours:>9.1f} {_cell(theirs, 9, '.1f')} "
            f"{_cell(ratio, 6, '.2f')} {_cell(fused, 9, '.1f')} {_cell(fused_ratio, 6, '.2f')}"
        )
    for case, row in rows.items():
        if case in FUSED_GOALS and row["fused_ratio"] is not None:
            goal, ratio = FUSED_GOALS[case], row["fused_ratio"]
            verdict = "met" if ratio <= goal else "not met"
            print(f"goal {case}: fused <= {goal} x PyG: {verdict} (ratio {ratio:.2f})")
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
