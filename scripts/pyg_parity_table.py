"""The README's parity table: refimpl against PyTorch Geometric, feature by feature.

For every PyG configuration refimpl checks (``GATConv``, ``GATv2Conv``, ``TransformerConv``
with the PyG options each takes), ``--draws`` random cases: a graph of 1-12 nodes with
isolated nodes, duplicate edges and self-loops (and, in one draw of eight, no node at all),
features (a pair ``(x_src, x_dst)`` for the bipartite rows), edge features and a cotangent
standard normal, and every parameter of the PyG module redrawn (a trained model, not PyG's
initial values). Each case goes through
:func:`refimpl.interop.check_pyg_module` (float64; the tolerances of ``refimpl crosscheck``:
outputs 1e-12, gradients 1e-10); the table gives, per configuration, the worst relative
error of the output and of all gradients over the draws, and how many draws failed.

    python scripts/pyg_parity_table.py [--draws 200] [--seed 0] [--json parity.json]

Needs torch and torch_geometric (the ``crosscheck`` extra). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

CONFIGURATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "GATConv (defaults)": ("GATConv", {}),
    "GATConv mean heads, no self-loops": ("GATConv", {"concat": False, "add_self_loops": False}),
    "GATConv residual": ("GATConv", {"residual": True}),
    "GATConv edge_dim, fill 'mean'": ("GATConv", {"edge_dim": 3}),
    "GATConv edge_dim, fill 'max'": ("GATConv", {"edge_dim": 3, "fill_value": "max"}),
    "GATConv edge_dim, fill 'min'": ("GATConv", {"edge_dim": 3, "fill_value": "min"}),
    "GATConv edge_dim, fill 0.5": ("GATConv", {"edge_dim": 3, "fill_value": 0.5}),
    "GATv2Conv (defaults: projection biases)": ("GATv2Conv", {}),
    "GATv2Conv bias=False": ("GATv2Conv", {"bias": False}),
    "GATv2Conv share_weights": ("GATv2Conv", {"share_weights": True}),
    "GATv2Conv residual, mean heads": ("GATv2Conv", {"residual": True, "concat": False}),
    "GATv2Conv edge_dim, fill 'add'": ("GATv2Conv", {"edge_dim": 3, "fill_value": "add"}),
    "GATv2Conv edge_dim, fill 'mul'": ("GATv2Conv", {"edge_dim": 3, "fill_value": "mul"}),
    "GATv2Conv edge_dim, fill tensor": ("GATv2Conv", {"edge_dim": 3, "fill_value": "tensor"}),
    "GATConv bipartite (4, 3)": ("GATConv", {"in_channels": (4, 3)}),
    "GATConv bipartite, edge_dim, fill 'max', residual": (
        "GATConv",
        {"in_channels": (4, 3), "edge_dim": 3, "fill_value": "max", "residual": True},
    ),
    "GATv2Conv bipartite (4, 3)": ("GATv2Conv", {"in_channels": (4, 3)}),
    "GATv2Conv shared, x a pair": (
        "GATv2Conv",
        {"in_channels": 4, "share_weights": True, "pair": True},
    ),
    "TransformerConv (defaults)": ("TransformerConv", {}),
    "TransformerConv edge_dim, beta": ("TransformerConv", {"edge_dim": 3, "beta": True}),
    "TransformerConv bipartite (4, 3), edge_dim, beta": (
        "TransformerConv",
        {"in_channels": (4, 3), "edge_dim": 3, "beta": True},
    ),
    "TransformerConv no root_weight, no bias": (
        "TransformerConv",
        {"root_weight": False, "bias": False},
    ),
}


def build(torch: Any, pyg_nn: Any, layer: str, kwargs: dict, rng: np.random.Generator) -> Any:
    """The PyG module, every parameter redrawn standard normal (in PyG's float32)."""
    kwargs = {k: v for k, v in kwargs.items() if k != "pair"}
    if kwargs.get("fill_value") == "tensor":
        kwargs["fill_value"] = torch.tensor(rng.standard_normal(kwargs["edge_dim"]))
    heads = int(rng.integers(1, 4))
    in_channels = kwargs.pop("in_channels", 4)
    module = getattr(pyg_nn, layer)(in_channels, 3, heads=heads, **kwargs)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.from_numpy(rng.standard_normal(tuple(parameter.shape))))
    return module


def draw_graph(rng: np.random.Generator, bipartite: bool = False) -> tuple[int, int, np.ndarray]:
    """``(N_src, N_dst, edge_index)``: isolated nodes, duplicates and self-loops as they fall;
    no node in one draw of eight. Bipartite: ``N_dst <= N_src`` targets (a sampled
    mini-batch's; PyG's loop features fail with more targets than sources)."""
    if rng.random() < 1 / 8:
        return 0, 0, np.zeros((2, 0), dtype=np.int64)
    n = int(rng.integers(1, 13))
    n_dst = int(rng.integers(1, n + 1)) if bipartite else n
    count = int(rng.integers(0, 3 * n + 1))
    edges = np.stack([rng.integers(0, n, size=count), rng.integers(0, n_dst, size=count)])
    if edges.shape[1] and rng.random() < 0.5:  # a duplicate edge
        edges = np.concatenate([edges, edges[:, :1]], axis=1)
    return n, n_dst, edges


def measure(check: Callable, torch: Any, pyg_nn: Any, draws: int, seed: int) -> list[dict]:
    rows = []
    for name, (layer, kwargs) in CONFIGURATIONS.items():
        rng = np.random.default_rng([seed, len(rows)])
        worst_out = worst_grad = 0.0
        failed = 0
        start = time.perf_counter()
        for _ in range(draws):
            module = build(torch, pyg_nn, layer, kwargs, rng)
            sizes = kwargs.get("in_channels", 4)
            pair = isinstance(sizes, tuple) or kwargs.get("pair", False)
            n, n_dst, edge_index = draw_graph(rng, pair)
            if pair:  # x = (x_src, x_dst)
                widths = sizes if isinstance(sizes, tuple) else (sizes, sizes)
                x = (rng.standard_normal((n, widths[0])), rng.standard_normal((n_dst, widths[1])))
            else:
                x = rng.standard_normal((n, 4))
            edge_dim = kwargs.get("edge_dim")
            edge_attr = None if edge_dim is None else rng.standard_normal((edge_index.shape[1],
                                                                           edge_dim))  # fmt: skip
            result, _ = check(module, x, edge_index, edge_attr, seed=int(rng.integers(2**31)))
            failed += not result.passed
            for tensor in result.tensors:
                if tensor.name == "out":
                    worst_out = max(worst_out, tensor.max_rel_error)
                else:
                    worst_grad = max(worst_grad, tensor.max_rel_error)
        rows.append(
            {
                "configuration": name,
                "draws": draws,
                "failed": failed,
                "worst_output": worst_out,
                "worst_gradient": worst_grad,
                "seconds": time.perf_counter() - start,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| PyG configuration | draws | worst output error | worst gradient error | failed |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['configuration']} | {row['draws']} | {row['worst_output']:.1e} "
            f"| {row['worst_gradient']:.1e} | {row['failed']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200, help="cases per configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    try:
        import torch
        from torch_geometric import nn as pyg_nn
    except ImportError as err:
        print(f"pyg_parity_table: needs torch and torch_geometric ({err})", file=sys.stderr)
        return 2
    import torch_geometric

    from refimpl.interop import check_pyg_module

    rows = measure(check_pyg_module, torch, pyg_nn, args.draws, args.seed)
    print(f"refimpl against PyG {torch_geometric.__version__} (torch {torch.__version__}), "
          f"float64, {args.draws} draws per row, seed {args.seed}\n")  # fmt: skip
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0 if all(row["failed"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
