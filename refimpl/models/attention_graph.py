"""The attention graph of :class:`~refimpl.models.graph_transformer.GraphTransformer`: the graph
every layer attends over, built once per input graph and batch vector, and the learned
initial state of its global nodes.

The attention graph (Eq. 7's mask, attended by every layer) is the input graph
with its self-loops replaced by one per node (Eq. 7's ``i = j``), and with
``global_node`` an edge from every node to its graph's global node and back, and
a self-loop on each global node (Eq. 14: the global node attends to its graph,
and every node to it). Edge order: the input's non-loop edges, the node loops,
node -> global, global -> node, the global loops. Each attention edge carries
the input's ``edge_attr`` (zeros on added edges) followed by one-hot type
columns ``[self-loop, to global, from global]`` (the last two with
``global_node``), embedded by the model's F4 and read by every layer's ``W^E``
(Eq. 12-13). Without ``edge_dim`` and ``global_node`` there are no edge features and no F4.

:func:`attention_graph` builds it from the input graph and the batch vector (the graph of
every node, checked by ``_check_batch``) and caches it per input graph, so a training loop
that feeds the same batch again builds nothing; :class:`AttentionGraph` keeps the copies it
makes on an array backend, so no step transfers it again. ``_GlobalEmbedding`` is the
parameter block ``global.embedding (D,)``, the state every global node starts from (zero
at init).
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, refuse_array_subclass, to_numpy
from refimpl.fields import check_positive_int
from refimpl.graph import Graph
from refimpl.kernels.segment import Segments

__all__ = ["AttentionGraph", "attention_graph"]


class AttentionGraph(NamedTuple):
    """The graph every layer attends over, and how its edges relate to the input's.

    Attributes
    ----------
    graph : Graph
        The attention graph, on ``N' = N (+ G)`` nodes.
    kept : numpy.ndarray, (E,)
        bool: the input edges that are not self-loops.
    edge_types : numpy.ndarray, (E', T)
        float 0/1: the one-hot type columns of every edge.
    num_nodes : int
        ``N``, the real nodes (rows ``0..N-1``).
    row_graph : numpy.ndarray, (N',)
        int64: the graph of every node of the attention graph.
    num_graphs : int
        ``G`` (a graph may have no node).
    device : dict
        Copies on an array backend, made once (see :meth:`on`): no transfer per step.
    """

    graph: Graph
    kept: Any
    edge_types: Any
    num_nodes: int
    row_graph: Any
    num_graphs: int
    device: dict

    def on(self, name: str, xp: Any, dtype: Any = None) -> Any:
        """``kept``, ``edge_types`` or ``batch`` (the real nodes grouped by graph, a
        ``Segments``) on the array module ``xp``, copied once and then reused."""
        key = (name, xp.__name__, None if dtype is None else np.dtype(dtype).name)
        if key not in self.device:
            if name == "batch":
                batch = xp.asarray(self.row_graph[: self.num_nodes])
                self.device[key] = Segments(batch, self.num_graphs)
            else:
                self.device[key] = xp.asarray(getattr(self, name), dtype=dtype)
        return self.device[key]


class _GlobalEmbedding:
    """The learned initial state of the global nodes, ``embedding (D,)``, zero at init."""

    def __init__(self, channels: int) -> None:
        self.channels = channels

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"embedding": (self.channels,)}

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        return {"embedding": asarray(np.zeros(self.channels), backend=backend, dtype=dtype)}


# input graph -> {(global_node, batch digest): AttentionGraph}; rebuilt only for new graphs
_ATTENTION_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attention_graph(
    graph: Graph, batch: np.ndarray, num_graphs: int, global_node: bool
) -> AttentionGraph:
    """The graph the layers attend over (see the module docstring), cached per input graph.

    Parameters
    ----------
    graph : Graph
        The input graph, ``N`` nodes.
    batch : numpy.ndarray, (N,)
        int64: the graph of every node (checked by the caller).
    num_graphs : int
        ``G``, the graphs of the batch.
    global_node : bool
        Add one global node per graph, joined to each of its nodes both ways.

    Returns
    -------
    AttentionGraph
        The same object for the same input graph, batch and ``global_node``.
    """
    key = (global_node, num_graphs, hashlib.sha1(batch.tobytes()).hexdigest())
    built = _ATTENTION_GRAPHS.setdefault(graph, {})
    if key not in built:
        built[key] = _build_attention_graph(graph, batch, num_graphs, global_node)
    return built[key]


def _build_attention_graph(
    graph: Graph, batch: np.ndarray, num_graphs: int, global_node: bool
) -> AttentionGraph:
    edge_index = to_numpy(graph.edge_index)  # (2, E)
    n = graph.num_nodes
    kept = edge_index[0] != edge_index[1]  # (E,)
    nodes = np.arange(n, dtype=np.int64)
    # blocks of edges, in order: (sources, targets, type column or None for input edges)
    parts = [(edge_index[0, kept], edge_index[1, kept], None), (nodes, nodes, 0)]
    num_nodes, num_types = n, 1
    if global_node:
        centres = n + batch  # (N,) each node's global node
        own = np.arange(n, n + num_graphs, dtype=np.int64)  # (G,)
        parts += [(nodes, centres, 1), (centres, nodes, 2), (own, own, 0)]
        num_nodes, num_types = n + num_graphs, 3
    types = []
    for sources, _, column in parts:
        block = np.zeros((sources.size, num_types))  # (E_block, T)
        if column is not None:
            block[:, column] = 1.0
        types.append(block)
    edges = np.stack(
        [np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])]
    )  # (2, E')
    row_graph = np.concatenate([batch, np.arange(num_graphs)]) if global_node else batch
    return AttentionGraph(
        Graph(edges, num_nodes),
        kept,
        np.concatenate(types),
        n,
        row_graph.astype(np.int64),
        num_graphs,
        {},
    )


def _check_batch(
    batch: Any, num_graphs: int | None, n: int, edge_index: Any = None
) -> tuple[np.ndarray, int]:
    """Host ``batch (N,)`` int64 and ``G``; a single graph when ``batch`` is None. With
    ``edge_index (2, E)``, every edge joins two nodes of one graph (block diagonal)."""
    if num_graphs is not None:  # a positive int, at most 2**31 - 1 as every count
        check_positive_int(num_graphs, "num_graphs")
    refuse_array_subclass(batch, "batch")  # to_numpy would drop a mask
    if batch is None:
        if num_graphs not in (None, 1):
            raise ValueError(
                f"num_graphs={num_graphs} needs a batch vector saying each node's graph"
            )
        return np.zeros(n, dtype=np.int64), 1
    batch = to_numpy(batch)
    if batch.shape != (n,) or batch.dtype.kind not in "iu":
        raise ValueError(
            f"batch must be an int array of shape (N,) = ({n},), the graph of every node; got "
            f"{batch.dtype}{tuple(batch.shape)}"
        )
    low = int(batch.min()) if n else 0
    high = int(batch.max()) + 1 if n else 0
    num_graphs = high if num_graphs is None else num_graphs
    if low < 0 or high > num_graphs:
        raise ValueError(f"batch values must lie in [0, num_graphs) = [0, {num_graphs})")
    batch = batch.astype(np.int64)
    if edge_index is not None:  # an edge between graphs mixes them, and each is pooled alone
        src, dst = to_numpy(edge_index)
        crossing = np.flatnonzero(batch[src] != batch[dst])
        if crossing.size:
            e = int(crossing[0])
            raise ValueError(
                f"edge {e} ({int(src[e])} -> {int(dst[e])}) joins graph {int(batch[src[e]])} "
                f"to graph {int(batch[dst[e]])}: the graphs of a batch share no edge (collate "
                "them with refimpl.data.collate)"
            )
    return batch, int(num_graphs)
