"""``Graph``: a validated ``edge_index`` in PyTorch Geometric's convention.

Row 0 of ``edge_index`` holds the source ``u`` (``src``), row 1 the target
``v`` (``dst``); a message flows ``u -> v`` and the neighbourhood of ``v`` is
``N(v) = {u : (u, v) in E}``, its *incoming* edges. Duplicate edges are kept
(each is its own term of every sum), as in PyG.

A *bipartite* graph (``num_dst_nodes`` given, PyG's ``size=(N_src, N_dst)``) has a second node
set for the targets: ``edge_index[0]`` indexes ``N_src`` source nodes, ``edge_index[1]``
``N_dst`` target nodes (PyG's message passing with ``x = (x_src, x_dst)``, as in a sampled
mini-batch whose targets are the first ``N_dst`` sources). Its self-loops are PyG's: an edge
``u -> v`` with ``u == v`` as indices, and ``add_self_loops`` appends ``(v, v)`` for the
``min(N_src, N_dst)`` nodes both sets have.

A ``Graph`` is immutable. Operations (``add_self_loops``, ...) return a new one;
derived structures (segments for aggregation, the copies on another backend)
are computed on first use and cached. Its arrays cannot be changed from outside:
the constructor copies ``edge_index`` once (the caller's array is never
aliased), and the arrays it hands out are read-only on NumPy and the strict
stand-in. CuPy arrays have no write flag, so on CuPy ``edge_index`` and
``edge_index_on`` return a fresh copy on every call and the graph's own device
array stays private (``Segments.index``, for the aggregation kernels, is a view
of it: treat it as read-only). Arrays computed on call (``in_degree()``,
``is_self_loop()``, ...) are new each time and the caller's to change.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.backend import (
    backend_name,
    get_array_module,
    is_array,
    refuse_array_subclass,
    to_numpy,
)
from refimpl.kernels.limits import check_count
from refimpl.kernels.segment import Segments

__all__ = ["Graph", "with_configured_self_loops"]

_DENSE_LIMIT = 10_000  # to_dense_adjacency refuses more nodes (10^8 entries)


class Graph:
    """A directed multigraph on ``num_nodes`` nodes, edges as a ``(2, E)`` integer array.

    Parameters
    ----------
    edge_index : integer array (2, E)
        ``edge_index[0]`` sources, ``edge_index[1]`` targets, each in
        ``[0, num_nodes)``. A NumPy or CuPy array (or a nested list of ints).
    num_nodes : int
        ``N >= 0``; nodes without edges are allowed (isolated nodes), and so is the empty
        graph (``N = 0``, as PyG: layers give empty outputs on it). For a bipartite graph,
        the number of source nodes.
    num_dst_nodes : int, optional
        Makes the graph bipartite: the number of target nodes (``>= 0``), which
        ``edge_index[1]`` indexes. None (default): the targets are the ``num_nodes`` nodes.

    Raises
    ------
    TypeError
        ``edge_index`` is not integer (a float array, say) or a NumPy subclass with arithmetic
        of its own (``numpy.ma``, ``numpy.matrix``), or ``num_nodes`` is not an int.
    ValueError
        Wrong shape, an index out of range or negative, ``num_nodes < 0``, or a node or edge
        count over 2**31 - 1, the most the kernels index
        (:data:`refimpl.kernels.limits.MAX_COUNT`).
    """

    def __init__(self, edge_index: Any, num_nodes: int, num_dst_nodes: int | None = None) -> None:
        num_nodes = _node_count(num_nodes, "num_nodes")
        num_targets = num_nodes
        if num_dst_nodes is not None:
            num_targets = _node_count(num_dst_nodes, "num_dst_nodes")
        refuse_array_subclass(edge_index, "edge_index")  # np.asarray would drop a mask
        if not is_array(edge_index):
            edge_index = np.asarray(edge_index)
            if edge_index.size == 0:  # [] or [[], []]: no edges
                edge_index = edge_index.reshape(2, 0).astype(np.int64)
        xp = get_array_module(edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            raise ValueError(
                f"edge_index must have shape (2, E) (row 0 sources, row 1 targets), got "
                f"{tuple(edge_index.shape)}; transpose an (E, 2) edge list with edge_index.T"
            )
        if edge_index.dtype.kind not in "iu":
            raise TypeError(
                f"edge_index must be an integer array, got dtype {edge_index.dtype}; "
                "convert with edge_index.astype(int) after checking the values are whole"
            )
        check_count(edge_index.shape[1], "the number of edges")
        if edge_index.shape[1]:
            low = int(edge_index.min())
            if low < 0:
                raise ValueError(
                    f"edge_index contains a negative node index ({low}); "
                    f"node indices must lie in [0, num_nodes) = [0, {num_nodes})"
                )
            bounds = ((0, num_nodes, "num_nodes"), (1, num_targets, "num_dst_nodes"))
            for row, count, name in bounds:
                high = int(edge_index[row].max())
                if high >= count:
                    which = "" if num_dst_nodes is None else (" source", " target")[row]
                    name = "num_nodes" if num_dst_nodes is None else name
                    raise ValueError(
                        f"edge_index contains{which} node index {high}, out of range for "
                        f"{name}={count}; indices must lie in [0, {count})"
                    )
        # One copy (astype copies by default), C-ordered: the caller changing its array
        # must not change this graph behind its validation and cached segments.
        self._edge_index = edge_index.astype(xp.int64, order="C")
        _freeze(self._edge_index)
        self._num_nodes = num_nodes
        self._num_dst_nodes = num_dst_nodes if num_dst_nodes is None else num_targets
        self._cache: dict[Any, Any] = {}

    # -- basic views ---------------------------------------------------------------
    @property
    def edge_index(self) -> Any:
        """``(2, E)`` int64 array, on the backend the graph was built with; read-only
        (on CuPy, which has no read-only arrays, a copy)."""
        return self._handed_out(self._edge_index)

    @property
    def num_nodes(self) -> int:
        """``N``: the nodes (of a bipartite graph, its sources)."""
        return self._num_nodes

    @property
    def num_dst_nodes(self) -> int:
        """The targets: ``num_nodes`` unless the graph is bipartite."""
        return self._num_nodes if self._num_dst_nodes is None else self._num_dst_nodes

    @property
    def is_bipartite(self) -> bool:
        """Whether the targets are a second node set (``num_dst_nodes`` was given)."""
        return self._num_dst_nodes is not None

    def _like(self, edge_index: Any, num_nodes: int | None = None) -> Graph:
        """A graph on this one's node sets with other edges."""
        return Graph(edge_index, self.num_nodes if num_nodes is None else num_nodes,
                     self._num_dst_nodes)  # fmt: skip

    @property
    def num_edges(self) -> int:
        return int(self._edge_index.shape[1])

    def __repr__(self) -> str:
        targets = f", num_dst_nodes={self.num_dst_nodes}" if self.is_bipartite else ""
        return f"Graph(num_nodes={self.num_nodes}{targets}, num_edges={self.num_edges})"

    def _cached(self, key: Any, build: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    @staticmethod
    def _handed_out(array: Any) -> Any:
        """``array`` itself where it is read-only, else (CuPy) a copy: no caller can write
        into the arrays the segments and caches were built from."""
        return array if getattr(array.flags, "writeable", True) is False else array.copy()

    def edge_index_on(self, xp: Any) -> Any:
        """``edge_index`` as an array of module ``xp`` (copied once, then cached); read-only
        (on CuPy, a copy), as :attr:`edge_index`."""
        return self._handed_out(self._edge_index_on(xp))

    def _edge_index_on(self, xp: Any) -> Any:
        own = get_array_module(self._edge_index)
        if xp is own:
            return self._edge_index

        def build() -> Any:
            copy = xp.asarray(to_numpy(self._edge_index))
            _freeze(copy)
            return copy

        return self._cached(("edge_index", xp.__name__), build)

    def src_segments(self, xp: Any) -> Segments:
        """Edges grouped by source node: for scattering to sources (``index = src``)."""
        return self._cached(
            ("src", xp.__name__), lambda: Segments(self._edge_index_on(xp)[0], self.num_nodes)
        )

    def dst_segments(self, xp: Any) -> Segments:
        """Edges grouped by target node ``v``: the neighbourhoods ``N(v)`` (``index = dst``)."""
        return self._cached(
            ("dst", xp.__name__), lambda: Segments(self._edge_index_on(xp)[1], self.num_dst_nodes)
        )

    # -- degrees ---------------------------------------------------------------------
    def in_degree(self) -> Any:
        """``|N(v)|`` per node, ``(N,)`` int: incoming edges, duplicates and self-loops counted."""
        xp = get_array_module(self._edge_index)
        return xp.bincount(self._edge_index[1], minlength=self.num_dst_nodes)

    def out_degree(self) -> Any:
        """Outgoing edges per node, ``(N,)`` int."""
        xp = get_array_module(self._edge_index)
        return xp.bincount(self._edge_index[0], minlength=self.num_nodes)

    # -- self-loops ----------------------------------------------------------------
    def is_self_loop(self) -> Any:
        """``(E,)`` bool: edges ``(v, v)``."""
        return self._edge_index[0] == self._edge_index[1]

    def remove_self_loops(self) -> Graph:
        """A graph without the edges ``(v, v)`` (PyG ``remove_self_loops``)."""
        return self._cached(
            "no_loops", lambda: self._like(self._edge_index[:, ~self.is_self_loop()])
        )

    def add_self_loops(self) -> Graph:
        """A graph with one edge ``(v, v)`` appended for every node (PyG ``add_self_loops``).

        Existing self-loops are kept, so a node that had one gets two; the
        attention layers call ``remove_self_loops().add_self_loops()`` first, as
        PyG's ``GATConv`` does, so each node gets exactly one. A bipartite graph gets
        loops for the ``min(num_nodes, num_dst_nodes)`` nodes both sets have (PyG's).
        """

        def build() -> Graph:
            xp = get_array_module(self._edge_index)
            count = min(self.num_nodes, self.num_dst_nodes)
            loops = xp.broadcast_to(xp.arange(count, dtype=xp.int64), (2, count))
            return self._like(xp.concatenate([self._edge_index, loops], axis=1))

        return self._cached("with_loops", build)

    def subgraph(self, nodes: Any) -> Graph:
        """The subgraph induced by ``nodes``: its edges with both ends in ``nodes``.

        ``nodes`` (n,) distinct ints in ``[0, N)``, on the graph's backend or the host;
        node ``nodes[i]`` becomes node ``i`` (PyG ``subgraph(..., relabel_nodes=True)``,
        edges kept in their order, duplicates and self-loops included).
        """
        self._refuse_bipartite("subgraph")
        xp = get_array_module(self._edge_index)
        nodes = xp.asarray(nodes)
        if nodes.ndim != 1 or nodes.dtype.kind not in "iu" or nodes.size == 0:
            shape = f"{nodes.dtype}{tuple(nodes.shape)}"
            raise ValueError(f"nodes must be a non-empty 1-d int array, got {shape}")
        if int(nodes.min()) < 0 or int(nodes.max()) >= self.num_nodes:
            raise ValueError(f"nodes must lie in [0, {self.num_nodes}), the graph's node range")
        position = xp.full(self.num_nodes, -1, dtype=xp.int64)  # (N,) new index or -1
        position[nodes] = xp.arange(nodes.size, dtype=xp.int64)
        if int((position >= 0).sum()) != nodes.size:
            raise ValueError("nodes must be distinct")
        src, dst = position[self._edge_index[0]], position[self._edge_index[1]]  # (E,)
        keep = (src >= 0) & (dst >= 0)
        return Graph(xp.stack([src[keep], dst[keep]]), int(nodes.size))

    # -- conversions ---------------------------------------------------------------
    @classmethod
    def from_networkx(cls, graph: Any) -> Graph:
        """From a networkx graph with nodes ``0 .. N-1`` (relabel with
        ``networkx.convert_node_labels_to_integers`` otherwise).

        An undirected graph gives both directions of every edge; a directed one
        gives its edges as they are; a multigraph keeps parallel edges.
        """
        nodes = list(graph.nodes)
        if set(nodes) != set(range(len(nodes))):  # not sorted(): mixed labels don't compare
            raise ValueError(
                "networkx graph nodes must be the integers 0..N-1; relabel with "
                "networkx.convert_node_labels_to_integers(graph) first"
            )
        edges = np.array([(u, v) for u, v, *_ in graph.edges], dtype=np.int64).reshape(-1, 2)
        if not graph.is_directed():
            # Both directions of each edge; a self-loop is its own reverse, so once.
            reverse = edges[edges[:, 0] != edges[:, 1], ::-1]
            edges = np.concatenate([edges, reverse])
        return cls(edges.T, len(nodes))

    @classmethod
    def from_scipy_sparse(cls, adjacency: Any) -> Graph:
        """From a square sparse matrix ``A`` with ``A[u, v] != 0`` for an edge ``u -> v``.

        Entries explicitly stored as zero are dropped; values are not kept (the
        graph is unweighted).
        """
        import scipy.sparse as sp

        if not sp.issparse(adjacency):
            raise TypeError(f"expected a scipy.sparse matrix, got {type(adjacency).__name__}")
        if adjacency.ndim != 2 or adjacency.shape[0] != adjacency.shape[1]:
            raise ValueError(f"adjacency must be square, got shape {adjacency.shape}")
        coo = sp.coo_matrix(adjacency)
        keep = coo.data != 0
        return cls(np.stack([coo.row[keep], coo.col[keep]]).astype(np.int64), coo.shape[0])

    def to_dense_adjacency(self) -> Any:
        """Dense ``(N, N)`` edge counts ``A[u, v] = #edges u -> v`` (small graphs only)."""
        self._refuse_bipartite("to_dense_adjacency")
        if self.num_nodes > _DENSE_LIMIT:
            raise ValueError(
                f"to_dense_adjacency is for small graphs (num_nodes <= {_DENSE_LIMIT}); "
                f"this one has {self.num_nodes} nodes"
            )
        xp = get_array_module(self._edge_index)
        counts = xp.zeros(self.num_nodes * self.num_nodes, dtype=xp.int64)
        xp.add.at(counts, self._edge_index[0] * self.num_nodes + self._edge_index[1], 1)
        return counts.reshape(self.num_nodes, self.num_nodes)

    def to_backend(self, backend: str) -> Graph:
        """The same graph with its arrays on another backend."""
        from refimpl.backend import asarray

        if backend_name(get_array_module(self._edge_index)) == backend:
            return self
        return self._like(asarray(self._edge_index, backend=backend))

    def _refuse_bipartite(self, operation: str) -> None:
        if self.is_bipartite:
            raise ValueError(f"{operation} is for graphs on one node set; this one is bipartite")


def _node_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if int(value) < 0:
        raise ValueError(f"{name} must be >= 0, got {int(value)}")
    check_count(int(value), name)
    return int(value)


def _freeze(array: Any) -> None:
    """Make ``array`` read-only where its backend can: NumPy, and the strict stand-in, whose
    arrays forward ``setflags`` to NumPy. CuPy arrays have no write flag."""
    if hasattr(array, "setflags"):
        array.setflags(write=False)


def with_configured_self_loops(graph: Any, add_self_loops: bool) -> Graph:
    """What a layer with ``add_self_loops`` attends over.

    Parameters
    ----------
    graph : Graph
        The layer's graph.
    add_self_loops : bool
        The layer's option: replace the self-loops by exactly one per node (PyG's ``GATConv``).

    Returns
    -------
    Graph
        ``graph`` with one self-loop per node (existing ones replaced) when ``add_self_loops``,
        else ``graph`` itself.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a refimpl.Graph, got {type(graph).__name__}")
    return graph.remove_self_loops().add_self_loops() if add_self_loops else graph
