"""GraphiT's graph kernels (Mialon et al. 2021), per graph of a batch, read on node pairs.

GraphiT re-weights attention by a positive-definite kernel on the graph's nodes (GraphiT
Sec. 4.1, "relative position encoding"), built from a Laplacian ``L``:

- the **diffusion** kernel ``K = exp(-beta L)`` (Kondor & Lafferty 2002), and
- the **p-step random-walk** kernel ``K = (I - gamma L)^p`` (Smola & Kondor 2003),

``(I - gamma L)^p`` being what the massive-activation study computes as ``k_RW`` (``p_steps =
16``, ``gamma = 0.25`` in every GraphiT config of ``gnn-lspe/configs``), in ``make_full_graph``
(``gnn-lspe/data/molecules.py``, ``ogb_mol.py``)::

    A = g.adjacency_matrix(scipy_fmt="csr")          # A[u, v] = #edges u -> v (DGL 0.9)
    N = diag(in_degrees.clip(1) ** -0.5)
    L = I - N A N
    k_RW = (I - gamma L) ** p_steps                  # p_steps - 1 sparse products
    k_RW_e_ij = k_RW[u, v] for every pair (u, v) of the full graph

``normalization="sym"`` (default) is that ``L``: ``L[u, v] = [u == v] - A[u, v] /
sqrt(d_u d_v)``, ``d`` the in-degree counting duplicates and self-loops, clipped at 1 (an
isolated node keeps ``L[v, v] = 1``). ``normalization="none"`` is ``L = D - A`` with the
same ``d`` (Mialon et al.'s own code calls PyG's ``get_laplacian``, which counts out-degrees
and drops self-loops: the same matrices on undirected graphs without self-loops, the graphs
GraphiT was run on). Neither released code rescales the kernel matrix; the only
renormalisation is of the attention rows, which the attention block does.

On an undirected graph ``L`` is symmetric with eigenvalues ``lambda`` in ``[0, 2]`` (``"sym"``),
so the diffusion kernel is symmetric positive definite, and the random-walk kernel, with
eigenvalues ``(1 - gamma lambda)^p``, is positive definite for ``0 <= gamma < 1/2`` (and
positive semi-definite for every ``gamma`` when ``p`` is even). On a directed graph neither
kernel need be symmetric; pair ``(u, v)`` reads ``K[u, v]``, as the released code does.

Cost: dense, per graph: ``O(n^2)`` memory and ``O(n^3)`` time (``log2 p`` matrix products
for the random walk, a Pade approximant with scaling and squaring for ``expm``). Graphs of
equal size are computed together as one stacked array, so a batch costs one call per
distinct size. Fine for molecules (tens of nodes); a graph of 10,000 nodes needs 800 MB per
matrix and minutes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.data.full_graph import check_batch
from refimpl.fields import check_choice, check_nonnegative_number, check_positive_int
from refimpl.graph import Graph

__all__ = ["diffusion_kernel", "laplacian", "random_walk_kernel"]

NORMALIZATIONS = ("sym", "none")


def laplacian(edge_index: Any, num_nodes: int, normalization: str = "sym") -> np.ndarray:
    """The dense ``(N, N)`` Laplacian of one graph, as the module docstring defines it.

    Parameters
    ----------
    edge_index : integer array (2, E)
        Edges ``u -> v``; duplicates count, self-loops count once.
    num_nodes : int
        ``N``.
    normalization : {"sym", "none"}
        ``"sym"`` (default): ``I - D^{-1/2} A D^{-1/2}``, the released code's; ``"none"``:
        ``D - A``.

    Returns
    -------
    numpy.ndarray (N, N), float64, on the host.
    """
    check_choice(normalization, NORMALIZATIONS, "normalization")
    graph = Graph(edge_index, num_nodes)
    src, dst = to_numpy(graph.edge_index)
    adjacency = np.zeros((1, graph.num_nodes, graph.num_nodes))
    np.add.at(adjacency, (0, src, dst), 1.0)
    return _laplacians(adjacency, normalization)[0]


def random_walk_kernel(
    pairs: Any,
    edge_index: Any,
    num_nodes: int,
    batch: Any = None,
    *,
    p: int = 16,
    gamma: float = 0.25,
    normalization: str = "sym",
) -> Any:
    """``(I - gamma L)^p`` of each graph, read on ``pairs``: GraphiT's p-step random-walk
    kernel, the study's ``k_RW`` (``p = 16``, ``gamma = 0.25``).

    Parameters
    ----------
    pairs : Graph or integer array (2, P)
        The pairs to read (``FullGraph.graph`` of :func:`refimpl.data.full_graph.full_graph`,
        or any pairs within graphs): pair ``(u, v)`` gets ``K[u, v]``.
    edge_index : integer array (2, E)
        The input edges, which define ``L``.
    num_nodes : int
        ``N``.
    batch : integer array (N,), optional
        The graph of every node (default: one graph).
    p : int
        The number of steps, ``>= 1``. Default 16 (the study's ``p_steps``).
    gamma : float
        The step size, ``>= 0``. Default 0.25 (the study's).
    normalization : {"sym", "none"}
        Which Laplacian (:func:`laplacian`). Default ``"sym"``.

    Returns
    -------
    array (P,), float64, on the backend of ``pairs``.
    """
    check_positive_int(p, "p")
    check_nonnegative_number(gamma, "gamma")
    return _on_pairs(
        pairs,
        edge_index,
        num_nodes,
        batch,
        normalization,
        lambda lap: np.linalg.matrix_power(np.eye(lap.shape[-1]) - gamma * lap, int(p)),
    )


def diffusion_kernel(
    pairs: Any,
    edge_index: Any,
    num_nodes: int,
    batch: Any = None,
    *,
    beta: float = 1.0,
    normalization: str = "sym",
) -> Any:
    """``exp(-beta L)`` of each graph (``scipy.linalg.expm``), read on ``pairs``: GraphiT's
    diffusion kernel.

    Parameters
    ----------
    pairs, edge_index, num_nodes, batch, normalization
        As :func:`random_walk_kernel`.
    beta : float
        The diffusion time, ``>= 0``. Default 1.0 (``DiffusionEncoding``'s default in
        Mialon et al.'s code).

    Returns
    -------
    array (P,), float64, on the backend of ``pairs``.
    """
    check_nonnegative_number(beta, "beta")
    return _on_pairs(
        pairs,
        edge_index,
        num_nodes,
        batch,
        normalization,
        lambda lap: scipy.linalg.expm(-beta * lap),
    )


def _laplacians(adjacency: np.ndarray, normalization: str) -> np.ndarray:
    """``(B, n, n)`` Laplacians of stacked adjacency counts ``A[b, u, v]``."""
    degree = adjacency.sum(axis=1)  # (B, n) in-degree: column sums
    if normalization == "none":
        return degree[:, :, None] * np.eye(adjacency.shape[-1]) - adjacency
    scale = np.maximum(degree, 1.0) ** -0.5  # (B, n) the released code's clip(1) ** -0.5
    return np.eye(adjacency.shape[-1]) - scale[:, :, None] * adjacency * scale[:, None, :]


def _on_pairs(
    pairs: Any, edge_index: Any, num_nodes: int, batch: Any, normalization: str, kernel: Any
) -> Any:
    """``kernel(L)`` per graph, read on ``pairs``; graphs of one size go through ``kernel``
    together as a stack (a loop over distinct sizes, not over graphs or nodes)."""
    check_choice(normalization, NORMALIZATIONS, "normalization")
    graph = Graph(edge_index, num_nodes)
    pair_graph = pairs if isinstance(pairs, Graph) else Graph(pairs, num_nodes)
    if pair_graph.num_nodes != graph.num_nodes:
        raise ValueError(
            f"pairs are on {pair_graph.num_nodes} nodes but the graph has {graph.num_nodes}; "
            "build the pairs from the same batch"
        )
    src, dst = to_numpy(graph.edge_index)  # (E,)
    pair_src, pair_dst = to_numpy(pair_graph.edge_index)  # (P,)
    batch = check_batch(batch if batch is None else to_numpy(batch), graph.num_nodes)
    for name, (u, v) in (("edge_index", (src, dst)), ("pairs", (pair_src, pair_dst))):
        across = batch[u] != batch[v]
        if across.any():
            e = int(np.argmax(across))
            raise ValueError(
                f"{name} column {e} ({u[e]} -> {v[e]}) joins graph {batch[u[e]]} to graph "
                f"{batch[v[e]]}; a kernel is per graph"
            )
    sizes = np.bincount(batch, minlength=1)  # (G,)
    members = np.argsort(batch, kind="stable")  # (N,) nodes by graph, ascending within one
    local = np.empty(graph.num_nodes, dtype=np.int64)  # (N,) index of a node in its graph
    local[members] = np.arange(graph.num_nodes) - (np.cumsum(sizes) - sizes)[batch[members]]
    out = np.empty(pair_src.shape[0])  # (P,)
    for size in np.unique(sizes[sizes > 0]):
        chosen = np.flatnonzero(sizes == size)  # (G_s,) graphs of this size
        slot = np.full(sizes.shape[0], -1)
        slot[chosen] = np.arange(chosen.shape[0])  # (G,) position in the stack, or -1
        adjacency = np.zeros((chosen.shape[0], size, size))  # (G_s, s, s)
        mine = slot[batch[src]] >= 0
        np.add.at(adjacency, (slot[batch[src[mine]]], local[src[mine]], local[dst[mine]]), 1.0)
        stacked = kernel(_laplacians(adjacency, normalization))  # (G_s, s, s)
        mine = slot[batch[pair_src]] >= 0
        out[mine] = stacked[
            slot[batch[pair_src[mine]]], local[pair_src[mine]], local[pair_dst[mine]]
        ]
    xp = get_array_module(pair_graph.edge_index)
    return asarray(out, backend=backend_name(xp))
