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

On NumPy the forward never materialises the ``(E, H, C)`` messages: per head,
``A_h @ h_h`` with a ``scipy.sparse`` CSR matrix whose structure is built once
per graph. The backward needs ``d_messages`` anyway (for ``d_w``); for ``d_h``
the per-head products ``A_h^T @ d_out_h`` read strided per-head slices, which
pays off only for one head or wide heads, so otherwise it reuses
``d_messages`` (B1 as written: one segment-sum product over all ``H * C``
columns). ``scripts/bench_propagate.py`` measures both against the literal
steps (figures in the benchmark docs). Other backends run the steps literally.
"""

from __future__ import annotations

from typing import Any

from refimpl.kernels.csr import csr_matmul_per_head
from refimpl.kernels.segment import Segments, gather, segment_sum

__all__ = ["head_matrices", "propagate", "propagate_backward"]

_WIDE_HEAD = 32  # channels per head from which per-head sparse products win in the backward


def head_matrices(weights: Any, rows: Segments, columns: Segments) -> list[Any]:
    """Per head, CSR ``(R, C)`` with entry ``w_e`` at ``(rows.index[e], columns.index[e])``.

    ``rows = dst, columns = src`` gives ``A_h`` (forward); ``rows = src,
    columns = dst`` gives ``A_h^T`` directly in CSR (backward), without a
    transpose. The structure is built once per pair of segmentations; only the
    values change per call.
    """
    import scipy.sparse as sp

    edge_order, column, indptr = rows.pair_structure(columns)
    shape = (rows.num_segments, columns.num_segments)
    return [
        sp.csr_matrix((weights[edge_order, h], column, indptr), shape=shape, copy=False)
        for h in range(weights.shape[1])
    ]


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
    if src.backend == "numpy":
        matrices = head_matrices(weights, dst, src)  # A_h, (N, N) per head
        return csr_matmul_per_head(matrices, h)
    messages = gather(h, src) * weights[..., None]  # F1 (E, H, C)
    return segment_sum(messages, dst)  # F2 (N, H, C)


def propagate_backward(
    h: Any, weights: Any, d_out: Any, src: Segments, dst: Segments, h_edges: Any = None
) -> tuple[Any, Any]:
    """Adjoint of :func:`propagate`: returns ``(d_h (N, H, C), d_weights (E, H))``.

    ``h_edges``, if the caller already has it, is ``gather(h, src)`` (E, H, C).
    """
    xp = src.xp
    if h_edges is None:
        h_edges = gather(h, src)  # (E, H, C)
    d_messages = gather(d_out, dst)  # B2 (E, H, C)
    d_weights = xp.einsum("ehc,ehc->eh", d_messages, h_edges)  # B1 (E, H)
    heads, channels = d_out.shape[1:]
    if src.backend == "numpy" and (heads == 1 or channels >= _WIDE_HEAD):
        transposed = head_matrices(weights, src, dst)  # A_h^T, (N, N) per head
        d_h = csr_matmul_per_head(transposed, d_out)
    else:
        d_h = segment_sum(d_messages * weights[..., None], src)  # B1 (N, H, C)
    return d_h, d_weights
