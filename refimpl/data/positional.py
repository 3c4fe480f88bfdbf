"""Laplacian positional encodings (Dwivedi & Bresson's LapPE) and their random sign flip;
random-walk positional encodings (RWPE, :func:`random_walk_pe`).

The encoding ``P`` of the massive-activations supplement (Sec. 2, Eq. 2: ``H^(0)
= X W_in + b_in + P``, with ``P`` projected from these ``k`` columns by the
model) is, per graph, the ``k`` eigenvectors of the symmetric normalised
Laplacian

    L = I - D^{-1/2} A D^{-1/2}

with the smallest eigenvalues, the first (trivial) one skipped.

Conventions
-----------
- ``A`` is the adjacency of the *undirected simple* graph: every edge is
  symmetrised, self-loops are dropped and duplicates merged (``A`` is 0/1).
- An isolated node has degree 0; its entry of ``D^{-1/2}`` is defined as 0, so
  its row of ``L`` is the identity row and ``e_i`` is an eigenvector with
  eigenvalue 1 (PyTorch Geometric's ``get_laplacian(normalization="sym")``
  does the same; networkx's ``normalized_laplacian_matrix`` puts 0 there instead).
- Per block: with ``node_ptr`` the graph is a batch of blocks (graph ``j`` on
  nodes ``node_ptr[j]:node_ptr[j+1]``, no edge between blocks), and each block
  gets its own eigenvectors; without it the whole graph is one block.
- The eigenvalues ``0 = lambda_1 <= lambda_2 <= ... <= lambda_n`` of a block
  are sorted ascending and columns ``1 .. k`` of the result are the
  eigenvectors of ``lambda_2 .. lambda_{k+1}``: exactly one is skipped, as in
  Dwivedi & Bresson's code (``EigVec[:, 1:k+1]``). A disconnected block has a
  0 eigenvalue per component, and all but the first stay in the encoding.
- A block with ``n <= k`` nodes has only ``n - 1`` such eigenvectors: columns
  ``n .. k`` are zero (a one-node block's row is all zeros). PyG's
  ``AddLaplacianEigenvectorPE`` requires ``n > k`` instead.
- Sign: an eigenvector ``v`` and ``-v`` are equally valid. Each column is
  multiplied by the sign that makes its largest-magnitude entry positive;
  entries within ``1e-9`` of that magnitude count as ties, and the first
  (lowest node index) wins, so mirror-symmetric graphs (where ``|v_i| = |v_j|``
  up to rounding) get the same sign on every platform.
- Repeated eigenvalues: the eigenvectors of a repeated eigenvalue are not
  unique (any orthonormal basis of the eigenspace is valid), so for graphs
  with symmetries the columns depend on the LAPACK/ARPACK in use. What is
  fixed: each column is a unit eigenvector, the columns are orthonormal within
  a block, their eigenvalues are ``lambda_2 .. lambda_{k+1}`` in order.

Method: blocks with at most ``DENSE_LIMIT`` nodes are grouped by size and each
group solved by one stacked ``numpy.linalg.eigh`` (a loop over the distinct
sizes, not over graphs). Larger blocks use ``scipy.sparse.linalg.eigsh`` in
shift-invert mode around ``sigma = -0.01`` (``L - sigma I`` is positive definite,
so its LU factorisation exists although ``L`` is singular; the eigenvalues
nearest sigma are the smallest of ``L``, found in a few iterations even when
they are clustered), from a fixed start vector so that the result is
reproducible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.backend import get_array_module, is_array, to_numpy
from refimpl.data.dataset import coalesce
from refimpl.graph import Graph

__all__ = ["DENSE_LIMIT", "laplacian_pe", "random_sign_flip", "random_walk_pe"]

DENSE_LIMIT = 200  # blocks up to this many nodes: dense eigh; larger: sparse eigsh
_SIGN_TIE = 1e-9  # magnitudes this close to a column's largest count as ties (first wins)
_SHIFT = -1e-2  # eigsh's shift-invert sigma: below the spectrum [0, 2] of L


def laplacian_pe(graph: Graph, k: int, node_ptr: Any = None) -> np.ndarray:
    """``(N, k)`` float64 Laplacian eigenvector encodings, per block (see the module docstring).

    Parameters
    ----------
    graph : Graph
        ``N`` nodes, on any backend (computed on the host).
    k : int
        ``>= 1``: the number of eigenvectors per node.
    node_ptr : (G + 1,) int array, optional
        Block boundaries (``GraphBatch.node_ptr``, ``GraphDataset.node_ptr`` with
        the collated graph): ``node_ptr[0] = 0``, ``node_ptr[G] = N``, non-decreasing.
        No edge may join two blocks. ``None``: one block.

    Returns
    -------
    (N, k) float64 numpy.ndarray
        Row ``v`` holds node ``v``'s entries of its block's eigenvectors ``2 .. k+1``; zero
        columns where the block is too small.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a refimpl.Graph, got {type(graph).__name__}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1 (eigenvectors per node), got {k!r}")
    k = int(k)
    num_nodes = graph.num_nodes
    ptr = _check_node_ptr(node_ptr, num_nodes)
    sizes = np.diff(ptr)  # (G,)
    block_of = np.repeat(np.arange(sizes.shape[0]), sizes)  # (N,)
    edge_index = to_numpy(graph.edge_index)
    crossing = block_of[edge_index[0]] != block_of[edge_index[1]]  # (E,)
    if crossing.any():
        e = int(np.flatnonzero(crossing)[0])
        u, v = edge_index[:, e].tolist()
        raise ValueError(
            f"edge {e} ({u} -> {v}) joins block {block_of[u]} to block {block_of[v]}; node_ptr "
            "must separate graphs that share no edge (the node_ptr of the collated batch)"
        )

    # The undirected simple graph and its normalised weights D^-1/2 A D^-1/2 (E',)
    src, dst = coalesce(edge_index[0], edge_index[1], num_nodes)  # symmetric, no loops, unique
    degree = np.bincount(src, minlength=num_nodes).astype(np.float64)  # (N,)
    inv_sqrt = np.zeros(num_nodes)
    inv_sqrt[degree > 0] = degree[degree > 0] ** -0.5  # isolated nodes: 0 (module docstring)
    weight = inv_sqrt[src] * inv_sqrt[dst]  # (E',) the off-diagonal entries of L are -weight
    edge_block = block_of[src]  # (E',)

    pe = np.zeros((num_nodes, k))
    small = (sizes >= 2) & (sizes <= DENSE_LIMIT)
    for size in np.unique(sizes[small]).tolist():  # one stacked eigh per distinct block size
        blocks = np.flatnonzero(sizes == size)  # (b,)
        slot = np.full(sizes.shape[0], -1)
        slot[blocks] = np.arange(blocks.size)  # block -> position in the stack
        inside = slot[edge_block] >= 0  # (E',) edges of these blocks
        start = ptr[edge_block[inside]]  # (e,) first node of each edge's block
        laplacian = np.zeros((blocks.size, size, size))
        laplacian[:, np.arange(size), np.arange(size)] = 1.0  # I (every node, isolated too)
        laplacian[slot[edge_block[inside]], src[inside] - start, dst[inside] - start] = -weight[
            inside
        ]
        _, vectors = np.linalg.eigh(laplacian)  # (b, s, s), columns by ascending eigenvalue
        columns = min(k, size - 1)
        rows = ptr[blocks][:, None] + np.arange(size)  # (b, s) global node ids
        pe[rows, :columns] = _fix_signs(vectors[:, :, 1 : 1 + columns])  # (b, s, columns)
    for block in np.flatnonzero(sizes > DENSE_LIMIT).tolist():
        first, size = int(ptr[block]), int(sizes[block])
        inside = edge_block == block
        columns = min(k, size - 1)
        vectors = _sparse_eigenvectors(
            src[inside] - first, dst[inside] - first, weight[inside], size, columns
        )
        pe[first : first + size, :columns] = _fix_signs(vectors[None])[0]
    return pe


def _check_node_ptr(node_ptr: Any, num_nodes: int) -> np.ndarray:
    if node_ptr is None:
        return np.array([0, num_nodes], dtype=np.int64)
    ptr = to_numpy(node_ptr) if is_array(node_ptr) else np.asarray(node_ptr)
    if ptr.ndim != 1 or ptr.shape[0] < 1 or ptr.dtype.kind not in "iu":
        raise ValueError(f"node_ptr must be a 1-D integer array (G+1,), got {ptr.dtype}{ptr.shape}")
    if ptr[0] != 0 or ptr[-1] != num_nodes or (np.diff(ptr) < 0).any():
        raise ValueError(
            f"node_ptr must start at 0, end at the number of nodes ({num_nodes}) and never "
            f"decrease, got {ptr[:5].tolist()}{' ...' if ptr.shape[0] > 5 else ''} ending at "
            f"{int(ptr[-1])}"
        )
    return ptr.astype(np.int64, copy=False)


def _fix_signs(vectors: np.ndarray) -> np.ndarray:
    """Flip each column of ``vectors`` (b, s, c) so that its first (near-)largest-|.| entry is
    positive; columns are unit vectors, so the tie tolerance is absolute."""
    magnitude = np.abs(vectors)  # (b, s, c)
    ties = magnitude >= magnitude.max(axis=1, keepdims=True) - _SIGN_TIE  # (b, s, c)
    first = ties.argmax(axis=1)  # (b, c) the lowest node index among the ties
    pivot = np.take_along_axis(vectors, first[:, None, :], axis=1)  # (b, 1, c)
    return vectors * np.where(pivot < 0, -1.0, 1.0)


def _sparse_eigenvectors(
    src: np.ndarray, dst: np.ndarray, weight: np.ndarray, size: int, columns: int
) -> np.ndarray:
    """Eigenvectors 2 .. columns+1 (ascending) of ``L = I - W`` for one large block, (s, c)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import eigsh

    laplacian = sp.identity(size, format="csr") - sp.csr_matrix(
        (weight, (src, dst)), shape=(size, size)
    )
    wanted = columns + 1
    if wanted >= size - 1:  # ARPACK needs fewer eigenpairs than rows; dense is cheap then
        _, vectors = np.linalg.eigh(laplacian.toarray())
        return vectors[:, 1:wanted]
    start = np.random.default_rng(size).standard_normal(size)  # fixed: reproducible results
    values, vectors = eigsh(laplacian.tocsc(), k=wanted, sigma=_SHIFT, which="LM", v0=start)
    order = np.argsort(values, kind="stable")
    return vectors[:, order[1:wanted]]  # (s, c)


def random_sign_flip(pe: Any, rng: np.random.Generator) -> tuple[Any, Any]:
    r"""``(pe * s, s)`` with one random sign ``s_j in {-1, +1}`` per column (k,).

    The usual training-time augmentation for Laplacian encodings (Dwivedi &
    Bresson: the eigenvectors' signs are arbitrary, so the model should not
    rely on them): one sign per column for the whole batch, each ``+1`` or
    ``-1`` with probability 1/2, drawn from ``rng`` (``k`` draws of
    ``rng.integers(0, 2)``). ``s`` is returned, in ``pe``'s dtype and on its
    backend, so that a step can be replayed. ``pe`` is not modified.

    Parameters
    ----------
    pe : (N, k) float array, NumPy or CuPy
        Positional encodings, one column per eigenvector.
    rng : numpy.random.Generator
        Draws the ``k`` signs.

    Returns
    -------
    flipped : (N, k) array
        ``pe * s``, a new array.
    s : (k,) array
        The signs, $\pm 1$.
    """
    if not is_array(pe) or pe.ndim != 2 or pe.dtype.kind != "f":
        shape = f"{pe.dtype}{tuple(pe.shape)}" if is_array(pe) else type(pe).__name__
        raise ValueError(f"pe must be a 2-D float array (N, k), got {shape}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator, got {type(rng).__name__}; "
            "use np.random.default_rng(seed)"
        )
    xp = get_array_module(pe)
    signs = 1.0 - 2.0 * rng.integers(0, 2, size=pe.shape[1])  # (k,) host, +-1
    signs = xp.asarray(signs.astype(pe.dtype))
    return pe * signs, signs


def random_walk_pe(graph: Graph, k: int, batch: Any = None) -> np.ndarray:
    """``(N, k)`` float64 random-walk encodings: column ``j - 1`` is ``diag((D^-1 A)^j)``.

    RWPE (Dwivedi et al. 2022, "Graph neural networks with learnable structural and
    positional representations", Sec. 3: ``p_v = [RW_vv, RW^2_vv, ..., RW^k_vv]`` with
    ``RW = A D^-1``), as the massive-activations study's code computes it (gnn-lspe
    ``data/molecules.py``, ``init_positional_encoding`` with ``'rand_walk'``: ``A * Dinv``
    with ``Dinv`` the inverse in-degrees clipped at 1, then the diagonals of its powers
    ``1 .. k``). Row ``v`` is the probability that a walk from ``v`` is back at
    ``v`` after ``j = 1 .. k`` steps.

    Conventions (the study's, for any graph):

    - ``A[v, u]`` counts the edges ``u -> v`` (PyG's direction: ``N(v)`` are the sources
      of ``v``'s incoming edges); a duplicate edge counts twice (DGL's adjacency keeps
      duplicates as separate ones, which SciPy sums), a self-loop ``v -> v`` once.
    - ``D`` is the in-degree (duplicates and self-loops counted as in ``A``) clipped at 1:
      ``D^-1 A`` steps from ``v`` to the source of one of its incoming edges, chosen
      uniformly. For an undirected graph (every edge both ways) this is the usual random
      walk; for a directed one it walks edges backwards. PyG's ``AddRandomWalkPE``
      divides by the out-degree instead and walks forwards: the two agree on undirected
      graphs only. (The study's ``A * Dinv`` is ``(D^-1 A)`` transposed and conjugated by
      ``D``, and ``diag(D M D^-1) = diag(M^T) = diag(M)``, so the orientation of DGL's
      ``adjacency_matrix`` does not change the result.)
    - A node with no incoming edge (isolated, or a source only) has a zero row: its walk
      stops, every column is 0. A node with only a self-loop returns with probability 1.
    - Batches: a walk never leaves its connected component, so a block-diagonal batch
      (:func:`~refimpl.data.graph_batch.collate`) gets each graph's own encoding with no
      per-graph loop; ``batch`` (N,), the graph of every node (``GraphBatch.batch``), is
      optional and, when given, checked: an edge joining two graphs is refused.
    - float64 (the study casts to float32 afterwards).

    Method: ``P = D^-1 A`` as a SciPy CSR matrix and ``k - 1`` sparse products
    ``P^j = P^(j-1) P``; ``P^j`` has at most as many entries per row as the walk reaches,
    so the cost is bounded by the squares of the graphs' (components') sizes, not of N.

    Parameters
    ----------
    graph : Graph
        On N nodes, one node set (not bipartite), on any backend (computed on the host).
    k : int
        Walk lengths ``1 .. k``, >= 1.
    batch : int array (N,), optional
        The graph of every node; used only to refuse an edge between two graphs.

    Returns
    -------
    NumPy float64 array (N, k), entries in ``[0, 1]``.
    """
    import scipy.sparse as sp

    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a refimpl.Graph, got {type(graph).__name__}")
    if graph.is_bipartite:
        raise ValueError("random_walk_pe needs a graph on one node set; this one is bipartite")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1 (walk lengths 1 .. k), got {k!r}")
    num_nodes = graph.num_nodes
    src, dst = to_numpy(graph.edge_index)  # (E,) each
    if batch is not None:
        _check_batch_vector(batch, src, dst, num_nodes)
    in_degree = np.bincount(dst, minlength=num_nodes).astype(np.float64)  # (N,)
    weight = 1.0 / np.maximum(in_degree, 1.0)[dst]  # (E,) the study's clip(1) ** -1
    # P[v, u] = (edges u -> v) / in(v); duplicates are summed by the CSR conversion
    step = sp.csr_matrix((weight, (dst, src)), shape=(num_nodes, num_nodes))
    pe = np.empty((num_nodes, int(k)))
    power = step
    pe[:, 0] = power.diagonal()
    for j in range(1, int(k)):  # a loop over walk lengths, not nodes
        power = power @ step
        pe[:, j] = power.diagonal()
    return pe


def _check_batch_vector(batch: Any, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> None:
    graph_of = to_numpy(batch) if is_array(batch) else np.asarray(batch)
    if graph_of.shape != (num_nodes,) or graph_of.dtype.kind not in "iu":
        raise ValueError(
            f"batch must be a 1-D integer array with one graph id per node ({num_nodes},), got "
            f"{graph_of.dtype}{graph_of.shape}; pass GraphBatch.batch"
        )
    crossing = graph_of[src] != graph_of[dst]  # (E,)
    if crossing.any():
        e = int(np.flatnonzero(crossing)[0])
        u, v = int(src[e]), int(dst[e])
        raise ValueError(
            f"edge {e} ({u} -> {v}) joins graph {graph_of[u]} to graph {graph_of[v]}; a random "
            "walk would cross between them: batch must be the collated batch's graph ids"
        )
