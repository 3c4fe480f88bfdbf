"""Mini-batches of graphs: many small graphs as one block-diagonal graph (PyG's ``Batch``).

``collate(dataset, indices)`` takes graphs ``indices`` of a
:class:`~refimpl.data.graph_dataset.GraphDataset` (``G`` graphs; graph ``j`` of the
batch has ``n_j`` nodes and ``e_j`` edges) and returns a :class:`GraphBatch` on
``N = sum n_j`` nodes and ``E = sum e_j`` edges (its fields, with their shapes, are listed
in its docstring).

``graph`` holds edge ``(u, v)`` of graph ``j`` as ``(u + node_ptr[j], v + node_ptr[j])``:
block-diagonal, no edge between two graphs.

Graph ``j`` of the batch is graph ``indices[j]`` of the dataset, nodes and edges
in their stored order: the relabelling of ``networkx.disjoint_union_all`` and of
PyG's ``Batch.from_data_list``. Pooling reads ``batch_segments`` (the nodes
grouped by graph: :mod:`refimpl.ops.pooling`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refimpl.backend import asarray, backend_name, get_array_module, is_array, to_numpy
from refimpl.data.graph_dataset import GraphDataset, _cast_features
from refimpl.graph import Graph
from refimpl.kernels.segment import Segments

__all__ = ["GraphBatch", "collate", "iterate_batches"]


@dataclass(frozen=True, eq=False)
class GraphBatch:
    """``G`` graphs as one block-diagonal graph (see the module docstring for the layout).

    Build it with :func:`collate`, which makes the fields consistent; the
    constructor checks types, shapes and backends only (no data-dependent
    checks, which would synchronise a GPU). Arrays live on one backend
    (:meth:`to_backend` moves them all).

    Parameters
    ----------
    graph : Graph
        ``N`` nodes over global indices: edge ``(u, v)`` of graph ``j`` as
        ``(u + node_ptr[j], v + node_ptr[j])``, no edge between two graphs.
    x : (N, F) array
        Node features, graph 0's rows first.
    edge_attr : (E, B) array
        Edge features, in ``graph.edge_index``'s column order.
    batch : (N,) integer array
        The graph of every node, ``0 <= batch < G``, non-decreasing (int64 from
        :func:`collate`).
    node_ptr : (G + 1,) integer array
        Graph ``j`` owns nodes ``node_ptr[j]:node_ptr[j + 1]``.
    num_graphs : int
        ``G``.
    y : (G, T) array
        The graphs' targets.
    """

    graph: Graph
    x: Any
    edge_attr: Any
    batch: Any
    node_ptr: Any
    num_graphs: int
    y: Any
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.graph, Graph):
            raise TypeError(f"graph must be a refimpl.Graph, got {type(self.graph).__name__}")
        if isinstance(self.num_graphs, bool) or not isinstance(self.num_graphs, (int, np.integer)):
            raise TypeError(f"num_graphs must be an int, got {type(self.num_graphs).__name__}")
        n, e, g = self.graph.num_nodes, self.graph.num_edges, int(self.num_graphs)
        expected = {
            "x": (n, None),
            "edge_attr": (e, None),
            "batch": (n,),
            "node_ptr": (g + 1,),
            "y": (g, None),
        }
        for key, shape in expected.items():
            value = getattr(self, key)
            if not is_array(value):
                raise TypeError(f"{key} must be an array, got {type(value).__name__}")
            if value.ndim != len(shape) or any(
                s is not None and s != t for s, t in zip(shape, value.shape, strict=True)
            ):
                entries = ["*" if s is None else str(s) for s in shape]
                pretty = f"({entries[0]},)" if len(entries) == 1 else f"({', '.join(entries)})"
                raise ValueError(
                    f"{key} must have shape {pretty} for a batch of {g} graphs on {n} nodes "
                    f"and {e} edges, got {tuple(value.shape)}; build batches with collate"
                )
        for key in ("batch", "node_ptr"):
            if getattr(self, key).dtype.kind not in "iu":
                raise TypeError(f"{key} must be an integer array, got {getattr(self, key).dtype}")
        get_array_module(self.x, self.edge_attr, self.batch, self.node_ptr, self.y)

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    def batch_segments(self, xp: Any = None) -> Segments:
        """The nodes grouped by graph, ``G`` segments over ``batch`` (for pooling), on module
        ``xp`` (default: the batch's own); built once per module, then cached."""
        own = get_array_module(self.batch)
        xp = own if xp is None else xp
        key = ("batch", xp.__name__)
        if key not in self._cache:
            index = self.batch if xp is own else xp.asarray(to_numpy(self.batch))
            self._cache[key] = Segments(index, int(self.num_graphs))
        return self._cache[key]

    def to_backend(self, backend: str) -> GraphBatch:
        """The same batch with every array on ``backend`` ("numpy", "cupy", "strict")."""
        if backend_name(get_array_module(self.x)) == backend:
            return self
        return GraphBatch(
            self.graph.to_backend(backend),
            *(asarray(a, backend=backend) for a in (self.x, self.edge_attr, self.batch)),
            asarray(self.node_ptr, backend=backend),
            int(self.num_graphs),
            asarray(self.y, backend=backend),
        )

    def astype(self, dtype: Any) -> GraphBatch:
        """A copy with ``x``, ``edge_attr`` and ``y`` cast to the float ``dtype``."""
        return _cast_features(self, dtype)

    def __repr__(self) -> str:
        return (
            f"GraphBatch(num_graphs={self.num_graphs}, num_nodes={self.num_nodes}, "
            f"num_edges={self.num_edges})"
        )


def collate(dataset: GraphDataset, indices: Any) -> GraphBatch:
    """Graphs ``indices`` of ``dataset`` as one block-diagonal :class:`GraphBatch`.

    Vectorised: the node offset of every edge is ``np.repeat(node_ptr[:-1], e_j)``.

    Parameters
    ----------
    dataset : GraphDataset
        The graphs to take from.
    indices : array_like of int or bool
        Graph indices (repeats allowed: a graph taken twice appears twice) or a ``(G,)``
        boolean mask over the dataset; at least one graph.

    Returns
    -------
    GraphBatch
        On the host (NumPy), graph ``j`` of the batch being graph ``indices[j]``.
    """
    if not isinstance(dataset, GraphDataset):
        raise TypeError(f"dataset must be a GraphDataset, got {type(dataset).__name__}")
    part = dataset.subset(indices)  # the chosen graphs, flat, indices still local
    num_graphs = len(part)
    if num_graphs == 0:
        raise ValueError("collate needs at least one graph; indices selected none")
    sizes = np.diff(part.node_ptr)  # (G,) n_j
    offsets = np.repeat(part.node_ptr[:-1], np.diff(part.edge_ptr))  # (E,) first node of the graph
    edge_index = part.edge_index + offsets  # (2, E) global
    num_nodes = int(part.node_ptr[-1])
    return GraphBatch(
        graph=Graph(edge_index, num_nodes),
        x=part.x,
        edge_attr=part.edge_attr,
        batch=np.repeat(np.arange(num_graphs, dtype=np.int64), sizes),  # (N,)
        node_ptr=part.node_ptr,
        num_graphs=num_graphs,
        y=part.y,
    )


def iterate_batches(
    dataset: GraphDataset,
    batch_size: int,
    rng: np.random.Generator | int | None = None,
    shuffle: bool = True,
) -> Iterator[GraphBatch]:
    """One epoch of batches of ``batch_size`` graphs (the last may be smaller, never empty).

    Parameters
    ----------
    dataset : GraphDataset
        The graphs.
    batch_size : int
        ``>= 1``: graphs per batch.
    rng : numpy.random.Generator or int or None, default None
        Draws the order when ``shuffle`` (a Generator, or an int seed); randomness is
        explicit, so shuffling without ``rng`` is an error.
    shuffle : bool, default True
        The order is ``rng.permutation(G)``, drawn when this is called; ``False``: the
        dataset's order.

    Returns
    -------
    iterator of GraphBatch
        The batches, each made by :func:`collate` as it is reached.
    """
    if not isinstance(dataset, GraphDataset):
        raise TypeError(f"dataset must be a GraphDataset, got {type(dataset).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    num_graphs = len(dataset)
    if shuffle:
        if rng is None:
            raise ValueError(
                "shuffle=True needs rng (a numpy Generator or an int seed): nothing here reads "
                "global random state; pass rng=np.random.default_rng(seed) or shuffle=False"
            )
        generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        order = generator.permutation(num_graphs)
    else:
        order = np.arange(num_graphs)
    starts = range(0, num_graphs, int(batch_size))
    return (collate(dataset, order[start : start + batch_size]) for start in starts)
