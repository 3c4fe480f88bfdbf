"""Graph-level datasets: many small graphs stored flat, and their ``.npz`` file.

The graph-level tasks of the massive-activations supplement (Sec. 1: ZINC graph
regression, TOX21 multi-label classification) use thousands of small molecular
graphs with typed atoms (node features) and typed bonds (edge features).
:class:`GraphDataset` holds them as PyTorch Geometric's ``InMemoryDataset``
does: every graph's arrays concatenated, plus pointers saying where each graph
starts. Nothing is downloaded; the graph-level benchmarks are not bundled
either: convert your own copy into the file format below, or use
:func:`refimpl.data.molecules.synthetic_molecules`.

Layout (``G`` graphs, ``N`` nodes and ``E`` edges in all; graph ``i`` has
``n_i`` nodes and ``e_i`` edges)
---------------------------------------------------------------------
| field          | shape, dtype      | meaning                                                    |
| -------------- | ----------------- | ---------------------------------------------------------- |
| ``x``          | (N, F) float      | node features, graph 0's rows first, then graph 1's, ...   |
| ``edge_index`` | (2, E) int64      | row 0 source ``u``, row 1 target ``v``, local (1)          |
| ``edge_attr``  | (E, B) float      | edge features, ``edge_index``'s column order; B may be 0   |
| ``node_ptr``   | (G+1,) int64      | graph ``i``'s node rows: ``node_ptr[i]:node_ptr[i+1]`` (2) |
| ``edge_ptr``   | (G+1,) int64      | graph ``i``'s edges: ``edge_ptr[i]:edge_ptr[i+1]`` (3)     |
| ``y``          | (G, T) float      | targets, finite (0 where missing) (4)                      |
| ``name``       | str               | a label for logs: printable text, else refused (5)         |
| ``task``       | str               | ``"regression"`` or ``"multilabel"``                       |
| ``y_mask``     | (G, T) bool, None | ``True`` where graph ``i``'s label ``t`` is observed (6)   |

- (1) PyG's convention, as node indices LOCAL to their graph: ``0 <= u, v < n_i``.
- (2) ``node_ptr[0] = 0``, ``node_ptr[G] = N``, every ``n_i >= 1``.
- (3) ``edge_ptr[0] = 0``, ``edge_ptr[G] = E``, ``e_i >= 0``.
- (4) Real values (``task="regression"``) or 0/1 labels (``task="multilabel"``).
- (5) No control characters, escape sequences or line breaks.
- (6) ``None`` when every label is (multilabel only).

Missing labels (multi-label tasks only). TOX21 and the OGB molecule benchmarks leave a cell
empty where a molecule was not assayed for a task. Pass such a ``y`` with NaN in those
cells and ``task="multilabel"``: the dataset stores ``y_mask = ~isnan(y)`` and ``y`` with
0 in the missing cells, so ``y`` stays finite and 0/1 and every check above keeps its
meaning (or pass a finite ``y`` and the bool ``y_mask`` yourself). A mask with every
entry ``True`` is stored as ``None``. Training (:mod:`refimpl.train.graph_level`) reads
the mask: the loss averages over the observed (graph, task) entries only
(:class:`~refimpl.ops.losses.BCEWithLogits` with an element mask) and the ROC-AUC of
each task uses its observed graphs only (:func:`~refimpl.metrics.roc_auc`). A regression
``y`` must be complete: NaN there is refused (drop the graphs without a target).

Edges are directed as stored: an undirected bond is two columns ``(u, v)`` and
``(v, u)`` with the same ``edge_attr`` row (PyG's ZINC and MoleculeNet files,
and :func:`~refimpl.data.molecules.synthetic_molecules`, store them so). Local
indices are what PyG's ``InMemoryDataset.collate`` stores (``increment=False``);
batching adds the offsets (:func:`refimpl.data.graph_batch.collate`).

On disk: one ``.npz`` file
--------------------------
:func:`~refimpl.data.graph_dataset_file.save_graph_dataset` writes
``numpy.savez_compressed`` with exactly the keys ``x``, ``edge_index``, ``edge_attr``,
``node_ptr``, ``edge_ptr``, ``y`` (the arrays above, dtypes as in the table: float arrays of
any float dtype, the three index arrays int64), ``name`` and ``task`` (0-d unicode arrays,
``numpy.array("zinc")``) and ``format_version`` (0-d integer array, 1), plus ``y_mask``
((G, T) bool) when some label is missing. No object arrays:
:func:`~refimpl.data.graph_dataset_file.load_graph_dataset` reads with ``allow_pickle=False``
and validates everything, naming the missing or extra key, or the wrong shape or dtype, and
the fix; a ``name`` that is not printable text (a terminal escape sequence, a line break) is
refused, not printed. The write is atomic (a temporary file in the same folder, then
``os.replace``), so an interrupted save never leaves half a file.

Producing the file from your own molecules (per graph ``i``: ``xs[i]`` (n_i, F),
``edges[i]`` (2, e_i) local indices, ``bonds[i]`` (e_i, B), ``ys[i]`` (T,))::

    import numpy as np
    from refimpl.data.graph_dataset import GraphDataset
    from refimpl.data.graph_dataset_file import save_graph_dataset

    node_ptr = np.concatenate([[0], np.cumsum([len(a) for a in xs])]).astype(np.int64)
    edge_ptr = np.concatenate([[0], np.cumsum([e.shape[1] for e in edges])]).astype(np.int64)
    dataset = GraphDataset(
        name="zinc-12k-train",
        x=np.concatenate(xs).astype(np.float64),              # e.g. np.eye(28)[atom_type]
        edge_index=np.concatenate(edges, axis=1).astype(np.int64),
        edge_attr=np.concatenate(bonds).astype(np.float64),   # e.g. np.eye(4)[bond_type]
        node_ptr=node_ptr,
        edge_ptr=edge_ptr,
        y=np.asarray(ys, dtype=np.float64).reshape(len(xs), -1),
        task="regression",
    )
    save_graph_dataset("zinc-12k-train.npz", dataset)

From a PyG ``InMemoryDataset`` (``torch_geometric.datasets.ZINC``, say), the
flat arrays already exist: ``data, slices = ds._data, ds.slices``; then
``node_ptr = slices["x"].numpy()``, ``edge_ptr = slices["edge_index"].numpy()``,
``edge_index = data.edge_index.numpy()`` (local), and the features one-hot
encoded from ``data.x[:, 0]`` and ``data.edge_attr`` as above.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.data.dataset import check_name
from refimpl.data.graph_dataset_checks import (
    _check_float,
    _check_indices,
    _check_int64,
    _check_ptr,
)
from refimpl.data.pointers import _pointers, index_ranges
from refimpl.graph import Graph

__all__ = ["GraphDataset"]

TASKS = ("regression", "multilabel")


@dataclass(frozen=True, eq=False)
class GraphDataset:
    """Many small graphs stored flat (see the module docstring for the layout), validated.

    ``G = 0`` (an empty split) is allowed. The arrays are held, not copied (except a ``y``
    with NaN, filled with 0 in a copy): treat them as read-only (the methods return new
    datasets or views).

    Parameters
    ----------
    name : str
        Printable text (:func:`~refimpl.data.dataset.check_name`): ``summary()`` prints it.
    x : (N, F) float array
        Node features, graph 0's rows first.
    edge_index : (2, E) int64 array
        Row 0 the sources, row 1 the targets, node indices local to each graph.
    edge_attr : (E, B) float array
        Edge features in ``edge_index``'s column order; ``B`` may be 0.
    node_ptr, edge_ptr : (G + 1,) int64 arrays
        Graph ``i``'s node rows ``node_ptr[i]:node_ptr[i+1]`` (each graph at least one
        node) and its edges ``edge_ptr[i]:edge_ptr[i+1]``.
    y : (G, T) float array
        Targets, finite (0 where a label is missing; NaN only for a multi-label ``y``
        passed without ``y_mask``).
    task : str, default "regression"
        ``"regression"`` or ``"multilabel"`` (then ``y`` holds only 0 and 1).
    y_mask : (G, T) bool array or None, default None
        ``True`` where a label is observed; ``None`` when all are. Multi-label only; NaN
        cells of a multi-label ``y`` passed without ``y_mask`` become this mask.
    """

    name: str
    x: np.ndarray
    edge_index: np.ndarray
    edge_attr: np.ndarray
    node_ptr: np.ndarray
    edge_ptr: np.ndarray
    y: np.ndarray
    task: str = "regression"
    y_mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        for key in ("x", "edge_attr", "y"):
            _check_float(getattr(self, key), key)
        for key in ("edge_index", "node_ptr", "edge_ptr"):
            _check_int64(getattr(self, key), key)
        for key, ndim in (("x", 2), ("edge_index", 2), ("edge_attr", 2), ("y", 2)):
            value = getattr(self, key)
            if value.ndim != ndim:
                raise ValueError(
                    f"{key} must be {ndim}-D (see the layout in refimpl.data.graph_dataset), "
                    f"got shape {value.shape}"
                    + ("; for one target per graph use y.reshape(-1, 1)" if key == "y" else "")
                )
        if self.edge_index.shape[0] != 2:
            raise ValueError(
                f"edge_index must have shape (2, E) (row 0 sources, row 1 targets), got "
                f"{self.edge_index.shape}; transpose an (E, 2) edge list with edge_index.T"
            )
        num_nodes, num_edges = self.x.shape[0], self.edge_index.shape[1]
        _check_ptr(self.node_ptr, "node_ptr", num_nodes, "the number of rows of x", empty=False)
        _check_ptr(self.edge_ptr, "edge_ptr", num_edges, "the number of columns of edge_index")
        num_graphs = self.node_ptr.shape[0] - 1
        if self.edge_ptr.shape != self.node_ptr.shape:
            raise ValueError(
                f"node_ptr and edge_ptr must both have G + 1 entries, got {self.node_ptr.shape} "
                f"and {self.edge_ptr.shape}"
            )
        if self.edge_attr.shape[0] != num_edges:
            raise ValueError(
                f"edge_attr must have one row per edge, (E, B) = ({num_edges}, B), got "
                f"{self.edge_attr.shape}; for graphs without edge features use "
                "np.zeros((E, 0))"
            )
        if self.y.shape[0] != num_graphs or self.y.shape[1] < 1:
            raise ValueError(
                f"y must have shape (G, T) = ({num_graphs}, T >= 1), one row per graph, "
                f"got {self.y.shape}"
            )
        self._check_local_indices()
        self._take_missing_labels()
        for key in ("x", "edge_attr", "y"):
            value = getattr(self, key)
            if not np.isfinite(value).all():
                hint = " (NaN marks a missing label with task='multilabel' only)" * (key == "y")
                raise ValueError(
                    f"{key} contains NaN or infinity; the format holds finite values{hint}"
                )
        if self.task == "multilabel" and not np.isin(self.y, (0, 1)).all():
            raise ValueError(
                "multi-label y must hold only 0 and 1; for real-valued targets use "
                "task='regression'"
            )

    def _take_missing_labels(self) -> None:
        """Validate ``y_mask``, or build it from NaN cells of a multi-label ``y`` (filled with
        0 in a copy); store ``None`` for a mask without a missing entry."""
        mask = self.y_mask
        if mask is None and self.task == "multilabel" and np.isnan(self.y).any():
            mask = ~np.isnan(self.y)
            object.__setattr__(self, "y", np.where(mask, self.y, 0).astype(self.y.dtype))
        if mask is None:
            return
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            raise TypeError(
                f"y_mask must be a bool NumPy array (True where a label is observed), got "
                f"{getattr(mask, 'dtype', type(mask).__name__)}"
            )
        if mask.shape != self.y.shape:
            raise ValueError(f"y_mask must have y's shape {self.y.shape}, got {mask.shape}")
        if mask.all():
            object.__setattr__(self, "y_mask", None)
            return
        if self.task != "multilabel":
            raise ValueError(
                "missing labels (NaN in y, or y_mask) are supported for task='multilabel' only: "
                "the regression losses average every entry; drop the graphs without a target"
            )
        object.__setattr__(self, "y_mask", mask)

    def _check_local_indices(self) -> None:
        sizes = np.diff(self.node_ptr)  # (G,) n_i
        owner = np.repeat(np.arange(sizes.shape[0]), np.diff(self.edge_ptr))  # (E,) graph of edge
        limit = sizes[owner]  # (E,)
        outside = ((self.edge_index < 0) | (self.edge_index >= limit)).any(axis=0)  # (E,)
        if outside.any():
            e = int(np.flatnonzero(outside)[0])
            g = int(owner[e])
            raise ValueError(
                f"edge {e} (of graph {g}, which has {int(sizes[g])} nodes) joins nodes "
                f"{self.edge_index[:, e].tolist()}, outside 0..{int(sizes[g]) - 1}: edge_index "
                "holds node indices local to each graph. If yours are global (offset by "
                "node_ptr), make them local with edge_index - np.repeat(node_ptr[:-1], "
                "np.diff(edge_ptr))"
            )

    # -- sizes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.node_ptr.shape[0] - 1)

    @property
    def num_node_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_edge_features(self) -> int:
        return int(self.edge_attr.shape[1])

    @property
    def num_targets(self) -> int:
        return int(self.y.shape[1])

    # -- access ------------------------------------------------------------------------------
    def graph(self, i: int) -> tuple[Graph, np.ndarray, np.ndarray, np.ndarray]:
        """Graph ``i`` alone: ``(Graph (n_i nodes), x_i (n_i, F), edge_attr_i (e_i, B), y_i (T,))``.

        ``x_i``, ``edge_attr_i`` and ``y_i`` are views into the dataset's arrays.
        """
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"graph index must be an int, got {type(i).__name__}")
        if not 0 <= i < len(self):
            raise IndexError(f"graph index {i} out of range for {len(self)} graphs")
        n0, n1 = int(self.node_ptr[i]), int(self.node_ptr[i + 1])
        e0, e1 = int(self.edge_ptr[i]), int(self.edge_ptr[i + 1])
        graph = Graph(self.edge_index[:, e0:e1], n1 - n0)
        return graph, self.x[n0:n1], self.edge_attr[e0:e1], self.y[i]

    def subset(self, indices: Any) -> GraphDataset:
        """The graphs ``indices`` (ints in ``[0, G)``, repeats allowed, or a (G,) bool mask),
        in that order, as a new dataset (copies)."""
        chosen = _check_indices(indices, len(self))
        sizes = np.diff(self.node_ptr)[chosen]  # (g,)
        edge_counts = np.diff(self.edge_ptr)[chosen]  # (g,)
        node_rows = index_ranges(self.node_ptr[chosen], sizes)  # (n,)
        edge_cols = index_ranges(self.edge_ptr[chosen], edge_counts)  # (e,)
        return GraphDataset(
            name=self.name,
            x=self.x[node_rows],
            edge_index=self.edge_index[:, edge_cols],
            edge_attr=self.edge_attr[edge_cols],
            node_ptr=_pointers(sizes),
            edge_ptr=_pointers(edge_counts),
            y=self.y[chosen],
            task=self.task,
            y_mask=None if self.y_mask is None else self.y_mask[chosen],
        )

    def split(
        self,
        fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
        seed: int | np.random.Generator = 0,
    ) -> tuple[GraphDataset, GraphDataset, GraphDataset]:
        """A seeded random ``(train, val, test)`` split.

        A permutation of the ``G`` graphs (``numpy.random.default_rng(seed)``,
        or the given Generator) is cut into ``floor(f_train G)``,
        ``floor(f_val G)`` and the rest; each part keeps the dataset's order.
        ``fractions`` are three numbers >= 0 summing to 1.
        """
        shares = np.asarray(fractions, dtype=np.float64)
        if shares.shape != (3,) or not np.isfinite(shares).all() or (shares < 0).any():
            raise ValueError(f"fractions must be three numbers >= 0, got {fractions!r}")
        if abs(float(shares.sum()) - 1.0) > 1e-9:
            raise ValueError(f"fractions must sum to 1, got {fractions!r} (sum {shares.sum()})")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        num_graphs = len(self)
        order = rng.permutation(num_graphs)
        # + 1e-9: 0.29 * 100 = 28.999999999999996 in floating point, not 28
        num_train = int(np.floor(shares[0] * num_graphs + 1e-9))
        num_val = int(np.floor(shares[1] * num_graphs + 1e-9))
        parts = np.split(order, [num_train, num_train + num_val])
        train, val, test = (self.subset(np.sort(part)) for part in parts)
        return train, val, test

    def astype(self, dtype: Any) -> GraphDataset:
        """A copy with ``x``, ``edge_attr`` and ``y`` cast to the float ``dtype``."""
        return _cast_features(self, dtype)

    def summary(self) -> str:
        """One line: name, G, N, E (directed), F, B, T, task (and the missing labels, if any)."""
        missing = "" if self.y_mask is None else f" missing_labels={int((~self.y_mask).sum())}"
        return (
            f"{self.name}: graphs={len(self)} N={self.x.shape[0]} E={self.edge_index.shape[1]} "
            f"F={self.num_node_features} B={self.num_edge_features} T={self.num_targets} "
            f"task={self.task}{missing}"
        )

    def __repr__(self) -> str:
        return f"GraphDataset({self.summary()})"


def _cast_features(record: Any, dtype: Any) -> Any:
    """A copy of the frozen dataclass ``record`` (a :class:`GraphDataset` or a
    :class:`~refimpl.data.graph_batch.GraphBatch`) with ``x``, ``edge_attr`` and ``y``
    cast to the float ``dtype``."""
    if np.dtype(dtype).kind != "f":
        raise TypeError(f"features must stay floating point, got dtype {np.dtype(dtype)}")
    return dataclasses.replace(
        record,
        x=record.x.astype(dtype),
        edge_attr=record.edge_attr.astype(dtype),
        y=record.y.astype(dtype),
    )
