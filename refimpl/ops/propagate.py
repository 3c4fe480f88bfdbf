"""Attention-weighted message passing: ``out[v] = sum_{(u, v) in E} w_uv * h[u]``, per head.

This is GAT-balance Eq. 1 without the activation: the sum over ``N(v)`` of
``alpha_uv * W_s h_u``. As a matrix product per head, ``out_h = A_h @ h_h`` with
``A_h[v, u] = sum of w_uvh over the edges u -> v`` (duplicates add up).

Forward and backward side by side:

    F1  messages = gather(h, src) * w[..., None]          (E, H, C)
    F2  out      = segment_sum(messages, dst)             (N, H, C)

    B2  d_messages = gather(d_out, dst)                   (E, H, C)
    B1  d_w = sum_c d_messages * gather(h, src)            (E, H)
        d_h = segment_sum(d_messages * w[..., None], src)  (N, H, C)

On NumPy neither direction forms the ``(E, H, C)`` messages' sums edge by edge:
all heads' ``A_h`` sit in one block matrix ``(N H, N H)``
(:func:`refimpl.kernels.csr.head_blocks`, structure built once per graph and head
count), so F1-F2 is one CSR product with ``h`` read as ``(N H, C)``, and ``d_h`` in
B1 one product with the block matrix of the ``A_h^T`` (built directly in CSR, no
transpose). Each output row is summed in the order of the literal B1/F2 sums.
``d_w`` needs the gathered ``d_messages`` and ``h_u`` anyway; it is their product
(in place on the gather) summed over channels by one matrix-vector product, not
``einsum`` (which does not use BLAS for it). ``scripts/bench_propagate.py`` measures
the products against the literal steps (figures in the benchmark docs). Other
backends run the steps literally.
"""

from __future__ import annotations

from typing import Any

from refimpl.kernels.csr import head_block_matmul
from refimpl.kernels.segment import Segments, gather, segment_sum
from refimpl.ops.heads import sum_channels

__all__ = ["propagate", "propagate_backward", "propagation_matrix"]


def propagation_matrix(weights: Any, rows: Segments, columns: Segments) -> Any:
    """CSR ``(R H, C H)``: every head's ``w_eh`` at ``(rows.index[e] H + h,
    columns.index[e] H + h)`` (:meth:`~refimpl.kernels.segment.Segments.head_pair_structure`),
    ``weights`` (E, H); duplicates are separate entries that the product adds.

    ``rows = dst, columns = src`` gives the ``A_h`` (forward); ``rows = src, columns = dst``
    their transposes directly in CSR (backward). For one head it is ``A`` itself.

    Parameters
    ----------
    weights : array
        ``(E, H)``, one weight per edge and head.
    rows : Segments
        The edges grouped by the side that indexes the rows (``R`` segments).
    columns : Segments
        The edges grouped by the side that indexes the columns (``C`` segments).

    Returns
    -------
    scipy.sparse.csr_matrix
        ``(R H, C H)``, on the host (the NumPy backend's path).
    """
    import scipy.sparse as sp

    heads = weights.shape[1]
    weight_index, column, indptr = rows.head_pair_structure(columns, heads)
    shape = (rows.num_segments * heads, columns.num_segments * heads)
    data = rows.xp.take(weights, weight_index)  # flat index into (E, H)
    return sp.csr_matrix((data, column, indptr), shape=shape)


def propagate(h: Any, weights: Any, src: Segments, dst: Segments) -> Any:
    """Weighted sum of source features into targets.

    Parameters
    ----------
    h : (N, H, C)
        Source-side features (``W_s h_u`` in the papers).
    weights : (E, H)
        One weight per edge and head (the attention coefficients).
    src, dst : Segments
        The edges grouped by source and by target (``Graph.src_segments`` /
        ``Graph.dst_segments``).

    Returns
    -------
    (N, H, C) array; targets with no incoming edge get zeros.
    """
    if src.backend == "numpy":  # F1-F2 as one product with the A_h's block matrix
        return head_block_matmul(propagation_matrix(weights, dst, src), h)
    messages = gather(h, src) * weights[..., None]  # F1 (E, H, C)
    return segment_sum(messages, dst)  # F2 (N, H, C)


def propagate_backward(
    h: Any, weights: Any, d_out: Any, src: Segments, dst: Segments, h_edges: Any = None
) -> tuple[Any, Any]:
    """Adjoint of :func:`propagate`.

    Parameters
    ----------
    h : (N, H, C)
        The forward's source-side features.
    weights : (E, H)
        The forward's weights.
    d_out : (N, H, C)
        The cotangent of the output.
    src, dst : Segments
        The forward's groupings of the edges.
    h_edges : (E, H, C) or None, default None
        ``gather(h, src)``, if the caller already has it; None gathers it here.

    Returns
    -------
    tuple of array
        ``(d_h, d_weights)``, ``(N, H, C)`` and ``(E, H)``.
    """
    xp = src.xp
    if h_edges is None:
        h_edges = gather(h, src)  # (E, H, C)
    d_messages = gather(d_out, dst)  # B2 (E, H, C)
    if src.backend == "numpy":  # B1 d_h by the A_h^T's block matrix, (N H, N H)
        d_h = head_block_matmul(propagation_matrix(weights, src, dst), d_out)
    else:
        d_h = segment_sum(d_messages * weights[..., None], src)  # B1 (N, H, C)
    # B1 d_w = d_messages . h_u per head (E, H): the product in place on the fresh gather,
    # which nothing reads after it
    d_weights = sum_channels(xp.multiply(d_messages, h_edges, out=d_messages))
    return d_h, d_weights
