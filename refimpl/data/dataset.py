"""``NodeDataset``: a graph, node features, labels and a train/val/test split.

Shared helpers for the loaders: ``coalesce`` (PyG ``to_undirected`` +
``remove_self_loops`` + ``coalesce``), ``row_normalize`` (PyG
``NormalizeFeatures``), ``edge_homophily``, and ``parse_ints`` (the integer fields of a text
file, a bad one named by its line; ``RESTORE`` is the advice for a damaged data file).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.backend import is_sparse, sparse_owner, to_numpy
from refimpl.graph import Graph
from refimpl.validation import check_csr_structure

__all__ = [
    "RESTORE",
    "NodeDataset",
    "check_name",
    "coalesce",
    "edge_homophily",
    "parse_ints",
    "row_normalize",
]

RESTORE = (
    "restore the file from where you got it (the user guide's Data page, \"Getting the "
    'files", says where each set comes from)'
)


@dataclass(frozen=True, eq=False)
class NodeDataset:
    """One node-classification dataset, validated at construction (NumPy arrays).

    The arrays are held, not copied (except a ``y`` with values outside ``y_mask``): treat
    them as read-only (the methods below return new datasets).

    Parameters
    ----------
    name : str
        Printed by :meth:`summary` and the command line: printable text only (no control
        characters, escape sequences or line breaks; see :func:`check_name`).
    graph : Graph
        ``N`` nodes; ``edge_index`` (2, E) in PyG's convention (row 0 ``src``).
    x : (N, F) float array, or a SciPy CSR matrix (sparse input features, for GAT)
        Node features, finite (float64 from the loaders; ``astype`` for float32).
    y : (N,) int64 array, or (N, K) float array
        Class ids in ``[0, num_classes)``, or 0/1 labels for multi-label data
        (``K == num_classes``); 0 where a label is missing (``y_mask``).
    train_mask, val_mask, test_mask : (N,) bool arrays
        Pairwise disjoint; a node may be in none (CiteSeer's isolated test-range
        nodes, say).
    num_classes : int
        ``>= 1``: classes, or tasks of multi-label data.
    edge_attr : (E, B) float array or None, default None
        Edge features, row ``e`` for column ``e`` of ``graph.edge_index`` (ogbn-proteins' 8
        association scores). The node models do not read them; a loader may derive node
        features from them (:func:`refimpl.data.ogb_node.load_ogb_node_dataset`).
    y_mask : (N, K) bool array or None, default None
        ``True`` where node ``i``'s label for task ``k`` is observed (multi-label ``y``
        only); ``None`` when every label is. NaN cells of a multi-label ``y`` passed without
        ``y_mask`` become this mask. The loss averages over the observed entries of the
        training nodes and the ROC-AUC of each task reads its observed entries only
        (:mod:`refimpl.train.loop`). Entries outside the mask may hold anything (NaN, say):
        they are stored as 0, in a copy of ``y``, as :class:`~refimpl.data.GraphDataset`
        stores its missing labels.
    """

    name: str
    graph: Graph
    x: Any  # (N, F) np.ndarray or scipy.sparse CSR
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    edge_attr: np.ndarray | None = None
    y_mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if not isinstance(self.graph, Graph):
            raise TypeError(f"graph must be a refimpl.Graph, got {type(self.graph).__name__}")
        n = self.graph.num_nodes
        sparse = is_sparse(self.x)
        if sparse and (sparse_owner(self.x) != "numpy" or self.x.format != "csr"):
            raise TypeError("a sparse x must be a scipy.sparse CSR matrix: convert with .tocsr()")
        if not (sparse or isinstance(self.x, np.ndarray)) or self.x.dtype.kind != "f":
            raise TypeError(
                f"x must be a floating-point NumPy array or SciPy CSR matrix, got "
                f"{getattr(self.x, 'dtype', type(self.x).__name__)}; convert with .astype(float)"
            )
        if self.x.ndim != 2 or self.x.shape[0] != n:
            raise ValueError(f"x must have shape (num_nodes, F) = ({n}, F), got {self.x.shape}")
        if sparse:  # before anything reads it: row_normalize and SciPy's products trust it
            check_csr_structure(self.x, "x")
        if not np.isfinite(self.x.data if sparse else self.x).all():
            raise ValueError("x contains NaN or infinity")
        if isinstance(self.num_classes, bool) or not isinstance(
            self.num_classes, (int, np.integer)
        ):
            raise TypeError(f"num_classes must be an int, got {type(self.num_classes).__name__}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        self._check_labels(n)
        self._check_edge_attr()
        masks = {
            "train_mask": self.train_mask,
            "val_mask": self.val_mask,
            "test_mask": self.test_mask,
        }
        for key, mask in masks.items():
            if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
                raise TypeError(
                    f"{key} must be a bool NumPy array, got "
                    f"{getattr(mask, 'dtype', type(mask).__name__)}; convert with .astype(bool)"
                )
            if mask.shape != (n,):
                raise ValueError(f"{key} must have shape (num_nodes,) = ({n},), got {mask.shape}")
        keys = list(masks)
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                both = np.flatnonzero(masks[a] & masks[b])
                if both.size:
                    raise ValueError(
                        f"{a} and {b} overlap on {both.size} nodes (first: node {both[0]}); "
                        "the train/val/test masks must be disjoint"
                    )

    def _check_labels(self, n: int) -> None:
        y = self.y
        if not isinstance(y, np.ndarray):
            raise TypeError(f"y must be a NumPy array, got {type(y).__name__}")
        if y.ndim == 1:
            if self.y_mask is not None:
                raise ValueError(
                    "y_mask marks the observed entries of a multi-label y (N, K); with class "
                    "ids y (N,), leave unlabelled nodes out of the train/val/test masks instead"
                )
            if y.dtype.kind not in "iu":
                raise TypeError(f"1-D y must hold integer class ids, got dtype {y.dtype}")
            if y.shape != (n,):
                raise ValueError(f"y must have shape ({n},), got {y.shape}")
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(
                    f"class ids must lie in [0, num_classes) = [0, {self.num_classes}), "
                    f"got range [{y.min()}, {y.max()}]"
                )
        elif y.ndim == 2:
            if y.shape != (n, self.num_classes):
                raise ValueError(
                    f"multi-label y must have shape (num_nodes, num_classes) = "
                    f"({n}, {self.num_classes}), got {y.shape}"
                )
            self._take_missing_labels()
            if not np.isin(self.y, (0, 1)).all():
                raise ValueError(
                    "multi-label y must hold only 0 and 1 (NaN, or anything outside y_mask, "
                    "marks a missing label)"
                )
        else:
            raise ValueError(f"y must be (N,) class ids or (N, K) 0/1, got shape {y.shape}")

    def _take_missing_labels(self) -> None:
        """Validate ``y_mask``, or build it from NaN cells of a multi-label ``y``; store 0 in
        ``y`` outside the mask (in a copy) and ``None`` for a mask without a missing entry."""
        y, mask = self.y, self.y_mask
        if mask is None:
            if y.dtype.kind != "f" or not np.isnan(y).any():
                return
            mask = ~np.isnan(y)
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            raise TypeError(
                f"y_mask must be a bool NumPy array (True where a label is observed), got "
                f"{getattr(mask, 'dtype', type(mask).__name__)}; convert with .astype(bool)"
            )
        if mask.shape != y.shape:
            raise ValueError(f"y_mask must have y's shape {y.shape}, got {mask.shape}")
        if not (y[~mask] == 0).all():  # NaN or any value where unobserved: never read
            object.__setattr__(self, "y", np.where(mask, y, 0).astype(y.dtype))
        object.__setattr__(self, "y_mask", None if mask.all() else mask)

    def _check_edge_attr(self) -> None:
        attr = self.edge_attr
        if attr is None:
            return
        if not isinstance(attr, np.ndarray) or attr.dtype.kind != "f":
            raise TypeError(
                f"edge_attr must be a floating-point NumPy array (E, B), got "
                f"{getattr(attr, 'dtype', type(attr).__name__)}; convert with .astype(float)"
            )
        num_edges = self.graph.num_edges
        if attr.ndim != 2 or attr.shape[0] != num_edges:
            raise ValueError(
                f"edge_attr must have one row per column of graph.edge_index, (E, B) = "
                f"({num_edges}, B), got {attr.shape}; a new graph drops them: "
                "dataset.with_graph(graph)"
            )
        if not np.isfinite(attr).all():
            raise ValueError("edge_attr contains NaN or infinity")

    # -- conveniences ----------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def is_multilabel(self) -> bool:
        return self.y.ndim == 2

    def astype(self, dtype: Any) -> NodeDataset:
        """A copy with ``x`` (and ``edge_attr``) cast to the float ``dtype`` (float32 for
        training speed)."""
        if np.dtype(dtype).kind != "f":
            raise TypeError(f"features must stay floating point, got dtype {np.dtype(dtype)}")
        attr = None if self.edge_attr is None else self.edge_attr.astype(dtype, copy=False)
        return dataclasses.replace(self, x=self.x.astype(dtype), edge_attr=attr)

    def with_graph(self, graph: Graph) -> NodeDataset:
        """A copy on another graph of the same nodes (a k-NN graph, no edges); ``edge_attr``,
        which belongs to the old graph's edges, is dropped."""
        return dataclasses.replace(self, graph=graph, edge_attr=None)

    def with_masks(
        self, train_mask: np.ndarray, val_mask: np.ndarray, test_mask: np.ndarray
    ) -> NodeDataset:
        """A copy with another split (validated like the constructor)."""
        return dataclasses.replace(
            self, train_mask=train_mask, val_mask=val_mask, test_mask=test_mask
        )

    def summary(self) -> str:
        """One line: name, N, E (directed), F, B (with edge features), classes, train/val/test
        sizes (and the missing labels, if any)."""
        edges = "" if self.edge_attr is None else f" B={self.edge_attr.shape[1]}"
        missing = "" if self.y_mask is None else f" missing_labels={int((~self.y_mask).sum())}"
        return (
            f"{self.name}: N={self.num_nodes} E={self.graph.num_edges} F={self.num_features}"
            f"{edges} classes={self.num_classes} train/val/test="
            f"{int(self.train_mask.sum())}/{int(self.val_mask.sum())}/{int(self.test_mask.sum())}"
            f"{missing}"
        )

    def __repr__(self) -> str:
        return f"NodeDataset({self.summary()})"


def check_name(name: object) -> None:
    """A dataset's name must be a ``str`` a terminal prints as itself: ``TypeError`` for
    another type, ``ValueError`` for control characters, escape sequences, line breaks or
    other characters ``str.isprintable`` refuses (a name from a file reaches the terminal in
    ``summary()``; refused, it cannot rewrite the screen or forge a line of output)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name.isprintable():
        raise ValueError(
            f"name {name[:60]!r} holds characters a terminal does not print as themselves "
            "(control characters, escape sequences, line breaks); a dataset's name is printed "
            "in logs: give plain text"
        )


def parse_ints(path: Path, lines: list[int], what: str, texts: list[str]) -> np.ndarray:
    """``texts`` (``texts[i]`` read from line ``lines[i]`` of ``path``) as int64, in one
    C-level parse; a float, an exponent, a word or a number beyond int64 is a ``ValueError``
    naming the file, its line, ``what`` it should be and the text."""
    try:
        return np.array(texts, dtype=np.int64)
    except (ValueError, OverflowError):  # "1.0", "1e8", "x", or beyond int64
        at = next(i for i, text in enumerate(texts) if not _is_int64(text))
        raise ValueError(
            f"{path}, line {lines[at]}: {what} {texts[at][:40]!r} is not an integer; {RESTORE}"
        ) from None


def _is_int64(text: str) -> bool:
    try:
        np.array(text, dtype=np.int64)
    except (ValueError, OverflowError):
        return False
    return True


def coalesce(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    sort_by_row: bool = True,
) -> np.ndarray:
    """Deduplicated ``(2, E)`` int64 edge_index, sorted.

    Parameters
    ----------
    src, dst : array_like of int
        The edges' sources and targets, equal in size, in ``[0, num_nodes)``.
    num_nodes : int
        ``N``, the number of nodes.
    symmetric : bool, default True
        Add every reverse edge (PyG ``to_undirected``).
    remove_self_loops : bool, default True
        Drop ``(v, v)``.
    sort_by_row : bool, default True
        Sort by (src, dst); ``False``: by (dst, src), as PyG's
        ``coalesce(..., sort_by_row=False)`` in its Planetoid loader.

    Returns
    -------
    (2, E) int64 numpy.ndarray
        Row 0 the sources, row 1 the targets, each edge once.
    """
    src = np.asarray(src, dtype=np.int64).ravel()
    dst = np.asarray(dst, dtype=np.int64).ravel()
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    if remove_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    major, minor = (src, dst) if sort_by_row else (dst, src)
    key = np.unique(major * num_nodes + minor)  # sorted, duplicates merged
    major, minor = key // num_nodes, key % num_nodes
    return np.stack([major, minor] if sort_by_row else [minor, major])  # (2, E)


def row_normalize(x: Any) -> Any:
    """Rows scaled to sum to 1; zero rows stay zero (tkipf/gcn ``preprocess_features``).

    Parameters
    ----------
    x : (N, F) float array or SciPy CSR matrix
        Non-negative node features.

    Returns
    -------
    (N, F) array or CSR matrix
        A new one of ``x``'s kind and dtype: the same values where the row sums are exact
        (binary features), else to an ulp or two (the sums add in other orders).

    Notes
    -----
    Parity: PyG ``NormalizeFeatures``
    divides by ``sum.clamp(min=1)`` (after subtracting the global minimum, a
    no-op for these non-negative features), so it leaves rows whose sum lies in
    ``(0, 1)`` unscaled; for binary features (Cora, CiteSeer, WebKB, Actor)
    every non-zero row sums to >= 1 and the two agree. Here every non-zero row
    sums to 1, as in Kipf & Welling's code (PubMed's TF-IDF rows may differ from PyG).
    """
    if is_sparse(x):  # CSR: divide the stored values by their row's sum, as below
        sums = np.asarray(x.sum(axis=1)).ravel()  # (N,)
        safe = np.where(sums == 0, 1, sums)
        rows = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))  # (nnz,)
        data = (x.data / safe[rows]).astype(x.dtype, copy=False)
        return type(x)((data, x.indices.copy(), x.indptr.copy()), shape=x.shape)
    sums = x.sum(axis=1, keepdims=True)  # (N, 1)
    safe = np.where(sums == 0, 1, sums)
    return (x / safe).astype(x.dtype, copy=False)


def edge_homophily(graph: Graph, y: np.ndarray) -> float:
    """Fraction of edges joining same-class endpoints (Zhu et al. 2020 edge homophily).

    Parameters
    ----------
    graph : Graph
        At least one edge; self-loops and duplicate edges count like any edge.
    y : (N,) integer array
        Class ids of the nodes.

    Returns
    -------
    float
        In $[0, 1]$.
    """
    edge_index = to_numpy(graph.edge_index)
    if edge_index.shape[1] == 0:
        raise ValueError("edge homophily is undefined for a graph without edges")
    return float(np.mean(y[edge_index[0]] == y[edge_index[1]]))
