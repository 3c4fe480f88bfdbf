"""Benchmark: one full-batch training step (forward, loss, backward, Adam), ours vs PyG.

Configurations (float32, Cora: the shared Planetoid files when ``REFIMPL_DATA``
is set, else a random graph of Cora's size with binary features; Adam lr 5e-3,
weight decay 5e-4, cross-entropy on the training nodes):

    a   2-layer GAT v1, 8 heads x 8 hidden, ELU, dropout 0.6 (inputs and attention),
        one output head, bias (the GAT paper's Cora model)
    a0  a without dropout: the same kernels, without the cost of drawing masks
    c   10-layer GATv2, width 64, one head, shared weights, ReLU, no bias, no dropout
    d   10-layer GAT v1, width 64, one head, bias, ReLU, no dropout

Each implementation runs in its own subprocess (so peak memory is its own),
with ``--threads`` threads (default 2; ``OMP_NUM_THREADS`` and friends, ``torch.set_num_threads``).
Prints the median step time over repeated steps after warm-up, the ratio
ours / PyG (<= 1: we are at least as fast) and the peak resident memory above
the process's resident memory after loading the data and building the model
(Linux: the peak mark is reset through ``/proc/self/clear_refs``). PyG runs only where
``torch_geometric`` is installed. Each side runs ``--rounds`` times, alternating
which goes first; the table gives the medians over rounds and the median of the
per-round ratios, since on a shared machine both columns drift by +-15% between
runs while the ratio within a round moves much less.

    python scripts/bench_gat.py [--steps 30] [--rounds 3] [--configs a a0 c d] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/: shared helpers
from bench_common import (
    ChildFailed,
    machine,
    machine_line,
    median_seconds,
    reset_peak_rss,
    run_child,
    status_mb,
)  # fmt: skip

CONFIGS = {
    "a": "2-layer GAT v1, 8 heads x 8, ELU, dropout 0.6",
    "a0": "a without dropout",
    "c": "10-layer GATv2, width 64, shared W, no bias",
    "d": "10-layer GAT v1, width 64, bias",
}


def _load_cora():
    import numpy as np

    from refimpl import Graph

    root = os.environ.get("REFIMPL_DATA")
    if root:
        from refimpl.data import load_planetoid

        data = load_planetoid(root, "cora", normalize_features=True)
        return (data.x.astype(np.float32), data.graph, data.y, data.train_mask, "Cora")
    rng = np.random.default_rng(0)
    x = (rng.random((2708, 1433)) < 0.0127).astype(np.float32)
    x /= np.maximum(x.sum(1, keepdims=True), 1)
    graph = Graph(rng.integers(0, 2708, (2, 10556)), 2708)
    train = np.zeros(2708, bool)
    train[:140] = True
    return x, graph, rng.integers(0, 7, 2708), train, "random graph of Cora's size"


def _time(step, steps: int, sync=None) -> float:
    """Median milliseconds of ``step`` after 3 warm-up steps; ``sync`` waits for a device."""
    return 1e3 * median_seconds(step, steps, warmup=3, sync=sync)


def ours_model(config: str, in_channels: int, out_channels: int = 7, num_layers: int = 10):
    """Configuration a or a0 (the GAT paper's Cora model, with or without dropout), c (a deep
    GATv2, ``num_layers`` deep) or d (a deep GAT v1)."""
    from refimpl.models import GAT

    if config in ("a", "a0"):
        p = 0.6 if config == "a" else 0.0
        return GAT(in_channels, 8, out_channels, 2, heads=(8, 1), version="v1", bias=True,
                   activation="elu", dropout=p, attn_dropout=p)  # fmt: skip
    if config == "c":
        return GAT(in_channels, 64, out_channels, num_layers, heads=1, version="v2",
                   share_weights=True)  # fmt: skip
    return GAT(in_channels, 64, out_channels, num_layers, heads=1, version="v1", bias=True)


def ours_step(model, params: dict, x, graph, y, train, rng):
    """One training step (forward, cross-entropy, backward, Adam) as a closure over its state."""
    from refimpl.ops.losses import SoftmaxCrossEntropy
    from refimpl.optim import Adam

    optimizer, loss = Adam(lr=0.005, weight_decay=5e-4), SoftmaxCrossEntropy()
    state = optimizer.init(params)

    def step() -> None:
        nonlocal params, state
        logits, cache = model.forward(params, x, graph, training=True, rng=rng)
        _, loss_cache = loss.forward({}, logits, y, train)
        d_logits, _ = loss.backward({}, loss_cache, 1.0)
        _, grads = model.backward(params, cache, d_logits, input_grad=False)
        params, state = optimizer.step(params, grads, state)

    return step


def pyg_step(config: str, x, edge_index, y, train, out_channels: int = 7, num_layers: int = 10):
    """PyG's counterpart of :func:`ours_model` and :func:`ours_step`, on ``x``'s device."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv, GATv2Conv

    p = 0.6 if config == "a" else 0.0
    if config in ("a", "a0"):
        layers = [GATConv(x.shape[1], 8, heads=8, dropout=p),
                  GATConv(64, out_channels, heads=1, concat=False, dropout=p)]  # fmt: skip
    else:
        widths = [x.shape[1]] + [64] * (num_layers - 1) + [out_channels]
        if config == "c":
            layers = [GATv2Conv(widths[i], widths[i + 1], heads=1, share_weights=True, bias=False)
                      for i in range(num_layers)]  # fmt: skip
        else:
            layers = [GATConv(widths[i], widths[i + 1], heads=1) for i in range(num_layers)]
    layers = torch.nn.ModuleList(layers).to(x.device)
    optimizer = torch.optim.Adam(layers.parameters(), lr=0.005, weight_decay=5e-4)

    def step() -> None:
        optimizer.zero_grad()
        h = x
        for i, layer in enumerate(layers):
            if p:
                h = F.dropout(h, p=p, training=True)
            h = layer(h, edge_index)
            if i < len(layers) - 1:
                h = F.elu(h) if config in ("a", "a0") else F.relu(h)
        F.cross_entropy(h[train], y[train]).backward()
        optimizer.step()

    return step


def run_ours(config: str, steps: int, features: str = "sparse") -> dict:
    import numpy as np
    import scipy.sparse as sp

    x, graph, y, train, source = _load_cora()
    if features == "sparse":  # the first layer multiplies over the stored values only
        x = sp.csr_matrix(x)
    model = ours_model(config, x.shape[1])
    params = model.init_params(np.random.default_rng(0), dtype=np.float32)
    step = ours_step(model, params, x, graph, y, train, np.random.default_rng(1))
    baseline = reset_peak_rss()
    ms = _time(step, steps)
    return {"ms": ms, "peak_mb": status_mb("VmHWM") - baseline, "data": source}


def run_pyg(config: str, steps: int) -> dict:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    x, graph, y, train, source = _load_cora()
    step = pyg_step(
        config,
        torch.from_numpy(x),
        torch.tensor(graph.edge_index),
        torch.from_numpy(y).long(),
        torch.from_numpy(train),
    )
    baseline = reset_peak_rss()
    ms = _time(step, steps)
    return {"ms": ms, "peak_mb": status_mb("VmHWM") - baseline, "data": source}


def _child(which: str, config: str, args: argparse.Namespace) -> dict | None:
    """``run_<which>`` in a fresh interpreter with ``args.threads`` threads; None for PyG where
    torch or torch_geometric is not installed."""
    call = (config, args.steps, args.features) if which == "ours" else (config, args.steps)
    try:
        return run_child("bench_gat", f"run_{which}", call, args.threads, f"{which} {config}")
    except ChildFailed as err:
        if which == "pyg" and "No module named" in err.stderr:
            return None
        raise


def _rounds(config: str, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """``args.rounds`` runs of each side, alternating which goes first (ours, PyG; PyG, ours;
    ...), so that a machine that speeds up or slows down during the run favours neither."""
    ours, pyg, has_pyg = [], [], True
    for round_index in range(args.rounds):
        order = ("ours", "pyg") if round_index % 2 == 0 else ("pyg", "ours")
        for which in order:
            if which == "ours":
                ours.append(_child("ours", config, args))
            elif has_pyg:
                result = _child("pyg", config, args)
                has_pyg = result is not None
                if has_pyg:
                    pyg.append(result)
    return ours, pyg


def main(argv: list[str] | None = None) -> None:
    import statistics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of each side per configuration, alternating (default 3); the table "
        "reports the medians over rounds and the median of the per-round ratios",
    )
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument(
        "--features",
        choices=("sparse", "dense"),
        default="sparse",
        help="our input features as a CSR matrix (default) or dense; PyG's are dense",
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    rows, ran_on = {}, machine()
    print(f"{'config':<44} {'ours ms':>8} {'PyG ms':>8} {'ratio':>6} {'ours MB':>8} {'PyG MB':>7}")
    for config in args.configs:
        label = CONFIGS[config]
        ours_runs, pyg_runs = _rounds(config, args)
        ours_ms = statistics.median(run["ms"] for run in ours_runs)
        ours_mb = max(run["peak_mb"] for run in ours_runs)
        ratios = [o["ms"] / p["ms"] for o, p in zip(ours_runs, pyg_runs, strict=False)]
        pyg_ms = statistics.median(run["ms"] for run in pyg_runs) if pyg_runs else None
        pyg_mb = max(run["peak_mb"] for run in pyg_runs) if pyg_runs else None
        ratio = statistics.median(ratios) if ratios else None
        rows[config] = {
            "label": label,
            "ours_ms": ours_ms,
            "pyg_ms": pyg_ms,
            "ratio": ratio,
            "ours_peak_mb": ours_mb,
            "pyg_peak_mb": pyg_mb,
            "ours_ms_rounds": [run["ms"] for run in ours_runs],
            "pyg_ms_rounds": [run["ms"] for run in pyg_runs],
            "ratio_rounds": ratios,
            "data": ours_runs[0]["data"],
            "features": args.features,
        }
        pyg_text = f"{pyg_ms:>8.1f}" if pyg_runs else f"{'n/a':>8}"
        ratio_text = f"{ratio:>6.2f}" if ratios else f"{'n/a':>6}"
        pyg_mb_text = f"{pyg_mb:>7.0f}" if pyg_runs else f"{'n/a':>7}"
        print(
            f"{config + ' ' + label:<44} {ours_ms:>8.1f} {pyg_text} {ratio_text} "
            f"{ours_mb:>8.0f} {pyg_mb_text}"
        )
        if len(ratios) > 1:
            print(f"{'':<44} per-round ratios: " + ", ".join(f"{r:.2f}" for r in ratios))
    print(
        f"data: {rows[args.configs[0]]['data']}; our features {args.features}; float32; "
        f"{args.threads} threads; medians over "
        f"{args.rounds} rounds of {args.steps} steps each"
    )
    ran_on["load_end"] = os.getloadavg()
    print(machine_line(ran_on))
    if args.json:
        with open(args.json, "w") as stream:
            json.dump({**rows, "machine": ran_on}, stream, indent=2)


if __name__ == "__main__":
    main()
