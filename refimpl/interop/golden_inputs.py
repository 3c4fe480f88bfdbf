"""The inputs golden cases share: :class:`CaseData` (what a case stores and how it enters
``forward``) and the two canonical graphs every graph case runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BATCH", "BATCH_EDGES", "EDGES", "NUM_NODES", "CaseData", "graph_model_case"]


@dataclass(frozen=True)
class CaseData:
    """A case's inputs and how they enter ``forward``, as an input builder returns them."""

    inputs: dict[str, np.ndarray]  # stored as input/<name>
    args: tuple[str, ...]  # positional arguments after params: "graph" or an array key
    grad_inputs: tuple[str, ...]  # input names whose gradients backward returns, in its order
    kwargs: dict[str, Any] = field(default_factory=dict)  # JSON literals (training, num_graphs)
    array_kwargs: dict[str, str] = field(default_factory=dict)  # keyword -> array key
    noise: dict[str, np.ndarray] = field(default_factory=dict)  # stored as noise/<key>
    noise_kwarg: str | None = None  # keyword taking {key: noise/<key>} ("noise")
    draw_noise: bool = False  # draw the noise once from the case's rng, read from cache.noise


# Six nodes: a duplicate edge 1 -> 2, a self-loop 4 -> 4 (node 4's only incoming edge), and an
# isolated node 5 (no edge at all: zero in-degree for layers that add no self-loops).
EDGES = np.array([[0, 1, 1, 2, 2, 3, 1, 4, 4, 3], [1, 0, 2, 1, 3, 2, 2, 4, 3, 0]], np.int64)
NUM_NODES = 6
# Two graphs in one batch (nodes 0-3 and 4-6): a duplicate 1 -> 2, a self-loop 2 -> 2, node 3
# isolated within graph 0.
BATCH_EDGES = np.array([[0, 1, 1, 2, 1, 2, 4, 5, 6], [1, 0, 2, 1, 2, 2, 5, 6, 4]], np.int64)
BATCH = np.array([0, 0, 0, 0, 1, 1, 1], np.int64)


def graph_model_case(inputs: dict[str, np.ndarray]) -> CaseData:
    """A graph-level model on the two-graph batch ``inputs`` (``x``, the graph, ``edge_attr``,
    ``pe``, ``batch``): training, gradients of ``x``, ``edge_attr`` and ``pe``, the dropout
    masks drawn once and stored."""
    return CaseData(
        inputs,
        ("input/x", "graph"),
        ("x", "edge_attr", "pe"),
        kwargs={"num_graphs": 2, "training": True},
        array_kwargs={"edge_attr": "input/edge_attr", "pe": "input/pe", "batch": "input/batch"},
        noise_kwarg="noise",
        draw_noise=True,
    )
