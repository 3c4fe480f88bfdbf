"""``Graph``: edge_index shapes, dtypes and ranges, node counts, on one node set and bipartite.

The reference is written out here: the edges as int64, the counts, the in-degrees by
counting, and (one node set) the self-loops PyG's way: existing loops dropped, one per
node appended.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl import Graph
from reliability_cases.arrays import Spec, spec_cases
from reliability_cases.layers import BIPARTITE, EDGES, N_DST, N
from reliability_cases.outcomes import Case


def _call(inputs: dict[str, Any]) -> dict[str, Any]:
    graph = Graph(inputs["edge_index"], inputs["num_nodes"], inputs["num_dst_nodes"])
    out = {
        "edge_index": graph.edge_index,
        "counts": np.array([graph.num_nodes, graph.num_dst_nodes, graph.num_edges]),
        "in_degree": np.asarray(graph.in_degree()),
    }
    if not graph.is_bipartite:
        out["with_loops"] = graph.remove_self_loops().add_self_loops().edge_index
    return out


def _reference(inputs: dict[str, Any]) -> dict[str, Any]:
    edges = np.array(inputs["edge_index"], dtype=np.int64).reshape(2, -1)
    n, n_dst = inputs["num_nodes"], inputs["num_dst_nodes"]
    targets = n if n_dst is None else n_dst
    out = {
        "edge_index": edges,
        "counts": np.array([n, targets, edges.shape[1]]),
        "in_degree": np.array([np.sum(edges[1] == v) for v in range(targets)]),
    }
    if n_dst is None:
        kept = edges[:, edges[0] != edges[1]]
        out["with_loops"] = np.concatenate([kept, np.tile(np.arange(n), (2, 1))], axis=1)
    return out


def cases() -> list[Case]:
    configs = {
        "one node set": (EDGES, N, None),
        "bipartite": (BIPARTITE, N, N_DST),
        "no edges": (np.zeros((2, 0), dtype=np.int64), 3, None),
    }
    specs = []
    for label, (edges, n, n_dst) in configs.items():

        def build(edges: Any = edges, n: int = n, n_dst: int | None = n_dst) -> dict[str, Any]:
            return {"edge_index": edges.copy(), "num_nodes": n, "num_dst_nodes": n_dst}

        domains = {"num_nodes": "nonneg_int", "num_dst_nodes": "nonneg_int?"}
        specs.append(Spec(f"Graph {label}", build, _call, _reference, domains=domains))
    return [case for spec in specs for case in spec_cases(spec, rtol=0.0)]
