"""GPU benchmark: one float32 training step on CuPy against PyTorch Geometric on CUDA, same run.

Cases (issue 9):

    gat-a          2-layer GAT v1, 8 heads x 8, ELU, dropout 0.6: bench_gat.py's configuration a
    gat-c          10-layer GATv2, width 64, 1 head, shared W: bench_gat.py's configuration c
    gatv2-large    2-layer GATv2, width 64, 1 head, on a random graph, N = 1e6, E = 1e7
    nodeformer-1e6 one NodeFormerConv step (forward + backward), bench_nodeformer.py's layer
    nodeformer-1e7 and graph (d = 64, m = 30, K = 10, one head, sigmoid relational bias,
                   average degree 10), N = 1e6 and 1e7
    gat-a-layer    one GAT v1 layer forward + backward: gat-a's first (8 heads x 8, dropout 0.6)
    gat-large-layer  one GAT v1 layer, 64 channels, 1 head, on gatv2-large's graph

The two layer cases (issue 38) time three paths in the same call: the literal layer
(:class:`refimpl.nn.gat.conv.GATConv`), the fused kernels (:mod:`refimpl.kernels.gat_fused`:
the score halves and feature transform as the layer makes them, attention and aggregation in
one kernel, their backward in two; CuPy only) and PyG's ``GATConv``. The dropout mask is drawn
once and given to ours (PyG draws its own). ``--check-fused`` runs the fused kernels once on a
small graph against the literal layer on CuPy and repeats them (bitwise), with CuPy's memory
pool off so that ``compute-sanitizer`` sees every allocation (``scripts/device_check.sh``).

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
    "gat-a-layer": "GAT v1 layer fwd+bwd, 8 heads x 8, p 0.6 (Cora)",
    "gat-large-layer": "GAT v1 layer fwd+bwd, 64 x 1, N = 1e6, E = 1e7",
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


LAYERS = {"gat-a-layer": ("gat-a", 8, 8, 0.6), "gat-large-layer": ("gatv2-large", 1, 64, 0.0)}


def _layer_setup(case: str, backend: str, scale: int) -> tuple:
    """``(layer, params, x, graph, attended, keep, d_out)`` of a layer case on ``backend``:
    ``attended`` the graph with the layer's self-loops, ``keep`` (E, H) the dropout mask over
    its edges (None without dropout), ``d_out`` (N, H C) a cotangent."""
    import numpy as np

    from refimpl.backend import asarray
    from refimpl.nn.gat.conv import GATConv

    data, heads, channels, p = LAYERS[case]
    x, graph, _, _ = _gat_data(data, scale)
    layer = GATConv(x.shape[1], channels, heads=heads, dropout=p)
    rng = np.random.default_rng(0)
    params = layer.init_params(rng, backend=backend, dtype=np.float32)
    graph = graph.to_backend(backend)
    attended = layer.prepare_graph(graph)
    keep = None
    if p:
        keep = asarray(rng.random((attended.num_edges, heads)) >= p, backend=backend)
    d_out = rng.standard_normal((x.shape[0], heads * channels)).astype(np.float32)
    return (
        layer,
        params,
        asarray(x, backend=backend),
        graph,
        attended,
        keep,
        asarray(d_out, backend=backend),
    )


def fused_layer(layer, params: dict, x, attended, keep, d_out) -> tuple:
    """One GAT v1 layer (no LipschitzNorm, edge features or residual) forward and backward with
    the fused kernels, the per-node steps as :class:`GATConv` makes them: ``(out (N, H C),
    alpha (E, H), gradients by name, with "x")``. CuPy arrays."""
    from refimpl.backend import get_array_module
    from refimpl.kernels.gat_fused import fused_backward, fused_forward
    from refimpl.ops.heads import dot_per_head, scale_per_head, sum_per_head

    xp = get_array_module(x)
    n, heads, channels = x.shape[0], layer.heads, layer.out_channels
    src, dst = attended.src_segments(xp), attended.dst_segments(xp)
    scale, slope = 1.0 / (1.0 - layer.dropout), layer.negative_slope
    # F1-F2 the transform and the score's per-node halves (N, H, C), (N, H)
    h = (x @ params["W"].T).reshape(n, heads, channels)
    score_src, score_dst = dot_per_head(h, params["att_src"]), dot_per_head(h, params["att_dst"])
    # F3-F7 one kernel; F9 the bias
    alpha, aggregated = fused_forward(
        score_src, score_dst, h, src.index, dst.csr_structure(), keep, scale, slope
    )
    out = aggregated.reshape(n, heads * channels) + params["bias"]
    # B7-B3 two kernels; B2-B1 per node, as the layer's backward
    d_h, d_src, d_dst = fused_backward(
        d_out.reshape(n, heads, channels), h, alpha, score_src, score_dst,
        (src.index, dst.index), (dst.csr_structure(), src.csr_structure()), keep, scale, slope,
    )  # fmt: skip
    grads = {"bias": d_out.sum(axis=0)}
    grads["att_src"], grads["att_dst"] = sum_per_head(d_src, h), sum_per_head(d_dst, h)
    d_h = d_h + scale_per_head(d_src, params["att_src"]) + scale_per_head(d_dst, params["att_dst"])
    flat = d_h.reshape(n, heads * channels)  # (N, H C)
    grads["W"], grads["x"] = flat.T @ x, flat @ params["W"]
    return out, alpha, grads


def run_layer(case: str, backend: str, steps: int, scale: int) -> dict:
    """Milliseconds of one layer's forward + backward: the literal layer, and the fused
    kernels on CuPy (None elsewhere)."""
    layer, params, x, graph, attended, keep, d_out = _layer_setup(case, backend, scale)

    def literal() -> None:
        _, cache = layer.forward(params, x, graph, training=True, attn_dropout_mask=keep)
        layer.backward(params, cache, d_out)

    times = {"ours_ms": _time(literal, steps, lambda: _sync(backend)), "fused_ms": None}
    if backend == "cupy":
        fused = lambda: fused_layer(layer, params, x, attended, keep, d_out)  # noqa: E731
        times["fused_ms"] = _time(fused, steps, lambda: _sync(backend))
    return times


def run_pyg_layer(case: str, backend: str, steps: int, scale: int) -> float:
    import torch
    from torch_geometric.nn import GATConv

    device = "cuda" if backend == "cupy" else "cpu"
    torch.manual_seed(0)
    data, heads, channels, p = LAYERS[case]
    x, graph, _, _ = _gat_data(data, scale)
    conv = GATConv(x.shape[1], channels, heads=heads, dropout=p).to(device)
    x = torch.from_numpy(x).to(device).requires_grad_(True)  # ours computes d_x too
    edge_index = torch.tensor(graph.edge_index).to(device)
    d_out = torch.randn(x.shape[0], heads * channels, device=device)

    def step() -> None:
        conv.zero_grad(set_to_none=True)
        x.grad = None
        conv(x, edge_index).backward(d_out)

    return _time(step, steps, lambda: _torch_sync(device))


def check_fused(mode: str) -> bool:
    """The fused kernels on CuPy on a small graph (isolated nodes, duplicate edges), float32
    and float64, run twice: the repeat bitwise; with ``mode="full"`` also against the literal
    layer: the forward bitwise, the gradients' largest difference relative to each tensor's
    largest entry (``"kernels"``: the fused kernels alone, for compute-sanitizer). Prints one
    line per check; True when every PASS/FAIL check passed."""
    import cupy
    import numpy as np

    from refimpl import Graph
    from refimpl.backend import asarray, to_numpy
    from refimpl.nn.gat.conv import GATConv

    cupy.cuda.set_allocator(None)  # every array its own allocation, for compute-sanitizer
    rng = np.random.default_rng(0)
    n = 300
    edges = rng.integers(0, n - 20, (2, 3000))  # nodes n - 20 .. n - 1: only their self-loop
    graph = Graph(np.concatenate([edges, edges[:, :50]], axis=1), n).to_backend("cupy")
    passed = True
    for dtype in (np.float32, np.float64):
        layer = GATConv(16, 8, heads=4, dropout=0.5)
        params = layer.init_params(rng, backend="cupy", dtype=dtype)
        x = asarray(rng.standard_normal((n, 16)), backend="cupy", dtype=dtype)
        attended = layer.prepare_graph(graph)
        keep = asarray(rng.random((attended.num_edges, 4)) >= 0.5, backend="cupy")
        d_out = asarray(rng.standard_normal((n, 32)), backend="cupy", dtype=dtype)
        runs = [fused_layer(layer, params, x, attended, keep, d_out) for _ in range(2)]
        cupy.cuda.Device().synchronize()
        (f_out, f_alpha, f_grads), (r_out, r_alpha, r_grads) = runs
        same = lambda a, b: to_numpy(a).tobytes() == to_numpy(b).tobytes()  # noqa: E731
        pairs = [(f_out, r_out), (f_alpha, r_alpha)] + [(f_grads[k], r_grads[k]) for k in f_grads]
        checks = {"repeat bitwise": all(same(a, b) for a, b in pairs)}
        literal = {}
        if mode == "full":
            out, cache = layer.forward(params, x, graph, training=True, attn_dropout_mask=keep)
            d_x, literal = layer.backward(params, cache, d_out)
            literal = {name: to_numpy(value) for name, value in (literal | {"x": d_x}).items()}
            checks["forward out bitwise the literal"] = same(f_out, out)
            checks["alpha bitwise the literal"] = same(f_alpha, cache.alpha)
        for what, ok in checks.items():
            print(f"{np.dtype(dtype).name} {what}: {'PASS' if ok else 'FAIL'}")
            passed &= ok
        for name, value in literal.items():
            found = to_numpy(f_grads[name])
            error = float(np.max(np.abs(found - value)) / max(np.max(np.abs(value)), 1e-300))
            print(
                f"{np.dtype(dtype).name} d {name}: largest difference / largest entry {error:.2e}"
            )
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
    parser.add_argument("--backend", choices=("cupy", "numpy"), default="cupy")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="sizes / 1000: a smoke run")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--check-fused",
        choices=("full", "kernels"),
        help="check the fused GAT kernels on CuPy (full: also against the literal layer), exit",
    )
    args = parser.parse_args(argv)
    if args.check_fused:
        raise SystemExit(0 if check_fused(args.check_fused) else 1)
    scale = 1000 if args.small else 1
    pyg = _pyg_available()
    rows = {}
    print(f"backend {args.backend}; float32; median of {args.steps} steps; sizes / {scale}")
    print(f"{'case':<58} {'ours ms':>9} {'PyG ms':>9} {'ratio':>6} {'fused ms':>9} {'f/PyG':>6}")
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
            ours = run_ours_gat(case, args.backend, args.steps, scale)
            theirs = run_pyg_gat(case, args.backend, args.steps, scale) if pyg else None
        ratio = ours / theirs if theirs else None
        fused_ratio = fused / theirs if fused and theirs else None
        rows[case] = {"label": CASES[case], "ours_ms": ours, "pyg_ms": theirs, "ratio": ratio,
                      "fused_ms": fused, "fused_ratio": fused_ratio}  # fmt: skip
        print(
            f"{case + ': ' + CASES[case]:<58} {ours:>9.1f} {_cell(theirs, 9, '.1f')} "
            f"{_cell(ratio, 6, '.2f')} {_cell(fused, 9, '.1f')} {_cell(fused_ratio, 6, '.2f')}"
        )
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
