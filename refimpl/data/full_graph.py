"""All ordered node pairs within each graph of a batch: the attention graph of full attention.

GraphiT-GT with ``full_graph`` on and SAN attend over every ordered pair ``(u, v)`` of nodes
of the same graph, with one set of parameters for the *real* pairs (an input edge ``u -> v``)
and another for the rest. The released code of the massive-activation study builds that graph
per molecule in ``make_full_graph`` (``gnn-lspe/data/molecules.py``, ``SAN/data/molecules.py``)
as ``dgl.from_networkx(nx.complete_graph(n))``, then writes the input edges' features and
``real = 1`` onto the pairs they join. :func:`full_graph` builds the same graph for a whole
batch at once, vectorised, and says where each real pair's features come from.

How it matches ``make_full_graph``, and where it goes further:

- **Pairs**: every ordered ``(u, v)``, ``u != v``, of nodes in the same graph, sorted by
  ``(u, v)`` (the order DGL gives ``nx.complete_graph``): ``P = sum_j n_j (n_j - 1)``. A
  one-node graph has no pair. ``self_pairs=True`` adds ``(v, v)`` for every node
  (``sum_j n_j^2`` pairs; GraphiT's original attention, Mialon et al. 2021, includes the
  diagonal).
- **Duplicate input edges** fall on one pair, as in the released code, whose ``complete_graph``
  has one edge per ordered pair. Which duplicate's features the released code keeps is not
  defined (a PyTorch index assignment with repeated indices); here ``edge_id`` is the
  **first** (lowest) input edge id of the pair. Merge duplicates whose features differ before
  calling this if that matters.
- **Input self-loops** ``(v, v)``: ``complete_graph`` has no such pair and the released code
  fails on them (DGL finds no edge ``(v, v)`` to write to); here they are refused with one
  line unless ``self_pairs=True``, where they make ``(v, v)`` a real pair.
- **An edge between two graphs** of the batch is refused: it joins no pair.

Cost: ``O(P)`` time and memory, ``P`` quadratic in the graph sizes (a ZINC batch of 128
molecules of about 23 nodes: about 65,000 pairs; one graph of 10,000 nodes: 10^8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.backend import get_array_module, is_array
from refimpl.graph import Graph
from refimpl.kernels.limits import check_count

__all__ = ["FullGraph", "check_batch", "full_graph"]


@dataclass(frozen=True)
class FullGraph:
    """The pairs of :func:`full_graph`.

    Attributes
    ----------
    graph : Graph
        ``P`` edges ``u -> v``, one per pair, sorted by ``(u, v)``, on ``N`` nodes: the graph
        attention runs over (a message flows from ``u`` to ``v``, as in every refimpl layer).
    real : bool array (P,)
        Whether the pair is an input edge.
    edge_id : int64 array (P,)
        For a real pair, the input edge (a column of the input ``edge_index``) whose features
        it reads: the first of its duplicates. ``-1`` for the other pairs. Pair features from
        edge features ``edge_attr (E, B)``: :meth:`pair_features`.
    """

    graph: Graph
    real: Any
    edge_id: Any

    @property
    def num_pairs(self) -> int:
        """``P``."""
        return self.graph.num_edges

    def pair_features(self, edge_attr: Any, fill: float = 0.0) -> Any:
        """``(P, B)`` pair features: row ``edge_id`` of ``edge_attr (E, B)`` on real pairs,
        ``fill`` on the others (the released code writes 0, the embedding index of "no bond",
        onto them before embedding; pass embedded features and the fill you need)."""
        xp = get_array_module(edge_attr)
        if edge_attr.ndim != 2:
            raise ValueError(f"edge_attr must be 2-D (E, B), got shape {tuple(edge_attr.shape)}")
        out = xp.full((self.num_pairs, edge_attr.shape[1]), fill, dtype=edge_attr.dtype)
        real = xp.asarray(self.real)
        out[real] = edge_attr[xp.asarray(self.edge_id)[real]]  # (P_real, B)
        return out


def full_graph(
    edge_index: Any, num_nodes: int, batch: Any = None, *, self_pairs: bool = False
) -> FullGraph:
    """All ordered pairs of nodes within each graph, which of them are input edges, and which.

    Parameters
    ----------
    edge_index : integer array (2, E)
        The input edges (global node indices, as in a :class:`~refimpl.data.GraphBatch`).
        Duplicates map to one pair; self-loops need ``self_pairs=True`` (module docstring).
    num_nodes : int
        ``N``.
    batch : integer array (N,), optional
        The graph of every node, in ``[0, G)`` (any order; a graph's nodes need not be
        contiguous). None (default): all nodes are one graph.
    self_pairs : bool
        Include ``(v, v)`` for every node. Default False, as the released code.

    Returns
    -------
    FullGraph
        ``graph`` (``P`` pair edges), ``real (P,)`` and ``edge_id (P,)``, on the backend of
        ``edge_index``.

    Raises
    ------
    TypeError, ValueError
        A malformed ``edge_index`` or ``batch``, a self-loop without ``self_pairs``, an edge
        between two graphs, or more than ``2**31 - 1`` pairs.
    """
    graph = Graph(edge_index, num_nodes)  # validates shape, dtype and range
    if not isinstance(self_pairs, (bool, np.bool_)):
        raise TypeError(f"self_pairs must be a bool, got {type(self_pairs).__name__}")
    edges = graph.edge_index  # (2, E) int64
    xp = get_array_module(edges)
    n = graph.num_nodes
    batch = check_batch(batch, n, xp)
    sizes = xp.bincount(batch, minlength=1)  # (G,) n_j
    row_length = sizes[batch]  # (N,) pairs with source u, self pair included
    total = int(row_length.sum())
    check_count(total - (0 if self_pairs else n), "the number of node pairs")
    # Row u lists the nodes of u's graph in ascending order: members sorts nodes by graph
    # (stable, so ascending within a graph) and graph j's start in it is starts[j].
    members = xp.argsort(batch, kind="stable")  # (N,)
    starts = xp.cumsum(sizes) - sizes  # (G,)
    src = xp.repeat(xp.arange(n, dtype=xp.int64), row_length)  # (total,)
    row_start = xp.cumsum(row_length) - row_length  # (N,) first slot of row u
    offset = xp.arange(total, dtype=xp.int64) - row_start[src]  # (total,) slot within the row
    dst = members[starts[batch[src]] + offset]  # (total,)
    if not self_pairs:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    keys = src * n + dst  # (P,) ascending: rows by u, each row ascending in v
    real, edge_id = _match_edges(keys, edges, n, batch, self_pairs, xp)
    return FullGraph(Graph(xp.stack([src, dst]), n), real, edge_id)


def check_batch(batch: Any, n: int, xp: Any = np) -> Any:
    """``batch`` (the graph of each of ``n`` nodes, or None: one graph) as an int64 ``(n,)``
    array of module ``xp`` (zeros when None), or one clear line saying what is wrong."""
    if batch is None:
        return xp.zeros(n, dtype=xp.int64)
    if not is_array(batch):
        batch = np.asarray(batch)
    if batch.dtype.kind not in "iu":
        raise TypeError(
            f"batch must be an integer array (the graph of every node), got {batch.dtype}"
        )
    if batch.shape != (n,):
        raise ValueError(
            f"batch must have shape ({n},), one graph index per node, got {tuple(batch.shape)}"
        )
    if n and int(batch.min()) < 0:
        raise ValueError(f"batch must hold graph indices >= 0, got {int(batch.min())}")
    return xp.asarray(batch).astype(xp.int64)


def _match_edges(keys: Any, edges: Any, n: int, batch: Any, self_pairs: bool, xp: Any) -> tuple:
    """``real (P,)`` and ``edge_id (P,)`` (first duplicate, ``-1`` if none) for sorted pair
    ``keys``; an input edge that is no pair gets one line saying why."""
    num_pairs = int(keys.shape[0])
    real = xp.zeros(num_pairs, dtype=bool)
    edge_id = xp.full(num_pairs, -1, dtype=xp.int64)
    if edges.shape[1] == 0:
        return real, edge_id
    src, dst = edges[0], edges[1]  # (E,)
    loops = src == dst
    if not self_pairs and bool(loops.any()):
        v = int(src[loops][0])
        raise ValueError(
            f"edge_index has a self-loop ({v}, {v}); the full graph has no self pairs "
            "(the released code's nx.complete_graph), so drop self-loops first "
            "(Graph.remove_self_loops) or pass self_pairs=True to keep them as real pairs"
        )
    across = batch[src] != batch[dst]
    if bool(across.any()):
        e = int(xp.argmax(across))
        u, v = int(src[e]), int(dst[e])
        raise ValueError(
            f"edge {e} ({u} -> {v}) joins graph {int(batch[u])} to graph {int(batch[v])}; "
            "edges must stay within one graph of the batch"
        )
    position = xp.searchsorted(keys, src * n + dst)  # (E,) the pair of every edge
    # The first edge of each pair: a stable sort by pair keeps edge ids ascending in a pair.
    by_pair = xp.argsort(position, kind="stable")  # (E,)
    sorted_position = position[by_pair]
    first = xp.ones(sorted_position.shape[0], dtype=bool)
    first[1:] = sorted_position[1:] != sorted_position[:-1]
    real[sorted_position] = True
    edge_id[sorted_position[first]] = by_pair[first]
    return real, edge_id
