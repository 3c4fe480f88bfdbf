"""``refimpl demo``: a GAT on a built-in graph, its gradient check, and a short training run."""

from __future__ import annotations

import argparse
import time

import numpy as np

from refimpl.testing.tolerances import GRADCHECK_RTOL

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    import networkx as nx

    from refimpl import Graph
    from refimpl.nn import GATConv
    from refimpl.testing import check_gradients

    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    graph = Graph.from_networkx(nx.karate_club_graph())
    x = rng.standard_normal((graph.num_nodes, 8))
    print("refimpl demo: graph attention on built-in synthetic data (no files needed)\n")
    print(
        f"graph    Zachary's karate club (networkx): {graph.num_nodes} nodes, "
        f"{graph.num_edges} directed edges, + {graph.num_nodes} self-loops added by the layer"
    )
    print(f"features x ~ N(0, 1), shape {x.shape}, float64, seed {args.seed}\n")

    # The layer and its gradient check run on the host (NumPy, float64) whatever the global
    # backend (REFIMPL_BACKEND): they print host arrays. The training run uses that backend.
    conv = GATConv(8, 4, heads=2, version="v2")
    params = conv.init_params(rng, backend="numpy")
    out, cache = conv.forward(params, x, graph)
    edge_index, alpha = conv.attention_weights(cache)
    into_zero = np.flatnonzero(edge_index[1] == 0)
    top = into_zero[np.argsort(-alpha[into_zero, 0])[:3]]
    d_x, d_params = conv.backward(params, cache, np.ones_like(out))
    print(f"forward  {conv}")
    print(f"         out {out.shape}; attention alpha {alpha.shape} (edges x heads)")
    print(
        f"         node 0 attends over {into_zero.size} incoming edges; head 0's largest: "
        + ", ".join(f"{edge_index[0, e]}->0: {alpha[e, 0]:.3f}" for e in top)
        + f"; sum = {alpha[into_zero, 0].sum():.15f}"
    )
    print(
        f"backward d_x {d_x.shape}; d_params "
        + ", ".join(f"{k} {v.shape}" for k, v in d_params.items())
        + "\n"
    )

    print(
        f"gradient check: hand-written backward vs central differences (eps = 1e-6, "
        f"float64, random cotangent, tolerance {GRADCHECK_RTOL:.0e})"
    )
    header = f"{'layer':<34} {'tensor':<16} {'checked':>9} {'max rel err':>12}  verdict"
    print(header)
    print("-" * len(header))
    worst = 0.0
    configurations = [
        GATConv(8, 4, heads=2, version="v1"),
        GATConv(8, 4, heads=2, version="v1", concat=False, dropout=0.5),
        GATConv(8, 4, heads=3, version="v2", share_weights=True),
        GATConv(8, 4, heads=1, version="v2", add_self_loops=False, bias=False),
    ]
    for conv in configurations:
        params = conv.init_params(rng, backend="numpy")
        kwargs = {}
        if conv.dropout:
            num_edges = conv.prepare_graph(graph).num_edges
            kwargs = {
                "training": True,
                "attn_dropout_mask": rng.random((num_edges, conv.heads)) >= conv.dropout,
            }
        report = check_gradients(
            conv, params, (x, graph), forward_kwargs=kwargs, rng=rng, max_entries=40
        )
        label = (
            f"GATConv {conv.version} H={conv.heads} "
            f"{'concat' if conv.concat else 'mean'}"
            f"{' shared' if conv.share_weights else ''}"
            f"{' dropout' if conv.dropout else ''}"
            f"{' no-loops' if not conv.add_self_loops else ''}"
        )
        for error in report.errors:
            verdict = "ok" if error.max_rel_error <= GRADCHECK_RTOL else "FAIL"
            print(
                f"{label:<34} {error.name:<16} {f'{error.num_checked}/{error.size}':>9} "
                f"{error.max_rel_error:>12.2e}  {verdict}"
            )
            label = ""
        worst = max(worst, report.max_rel_error)
    passed = worst <= GRADCHECK_RTOL
    print(
        f"\nworst relative error {worst:.2e} ({'all within' if passed else 'ABOVE'} "
        f"{GRADCHECK_RTOL:.0e})"
    )
    _train_briefly(args.seed)
    print(
        f"\ndone in {time.perf_counter() - started:.1f} s. next: `refimpl train --help`, "
        "`python -m proofs_check` for the theorem checks, `pytest` for the test suite"
    )
    return 0 if passed else 1


def _train_briefly(seed: int) -> None:
    """Train a 2-layer GATv2 on a synthetic graph for a few seconds and report it."""
    from refimpl.backend import get_backend
    from refimpl.data import contextual_sbm
    from refimpl.models import GAT
    from refimpl.train import TrainConfig, train_model

    dataset = contextual_sbm(600, 3, np.random.default_rng(seed), homophily=0.7)
    model = GAT(dataset.num_features, 8, dataset.num_classes, 2, heads=2, version="v2")
    config = TrainConfig(epochs=100, optimizer="adam", lr=0.01, seed=seed)
    print(
        f"\ntraining {model.num_layers}-layer GATv2 (2 heads x 8) on {dataset.summary()}, "
        f"backend {get_backend()}"
    )
    result = train_model(model, dataset, config)
    print(
        f"         {config.epochs} epochs of Adam (lr {config.lr}): best validation accuracy "
        f"{result.val_acc:.3f} at epoch {result.best_epoch}, test accuracy there "
        f"{result.test_acc:.3f}, final training loss {result.final_train_loss:.4f}"
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo", help="GAT forward/backward, a gradient-check table and a short training run"
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(run=run)
