"""Literal twin of :func:`refimpl.ops.propagate.propagate`: weighted message passing per head.

GAT-balance Eq. 1 without the activation (and the supplement's Eq. 8, ``head = A V``,
read per edge): for each edge ``e = (u -> v)`` and head ``h``::

    F1  message_e = w_e h_u                          (E, H, C)
    F2  out_v = sum_{e into v} message_e             (N, H, C)

and walked back::

    B2 (of F2)  d_message_e = d_out_v                (E, H, C)
    B1 (of F1)  d_w_e = d_message_e . h_u            (E, H)
                d_h_u = sum_{e out of u} w_e d_message_e   (N, H, C)

A Python loop over the edges, in edge order, NumPy on the host; it shares no code
with :mod:`refimpl.ops.propagate` (which never forms the messages on NumPy, and
multiplies per-head CSR matrices). Duplicate edges each send their own message;
a target with no incoming edge stays zero; a self-loop ``u = v`` is an edge like
any other.
"""

from __future__ import annotations

import numpy as np

__all__ = ["propagate_backward", "propagate_forward"]


def propagate_forward(
    h: np.ndarray, weights: np.ndarray, edge_index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(out (N, H, C), messages (E, H, C))`` for ``h`` (N, H, C), ``weights`` (E, H) and
    ``edge_index`` (2, E) (row 0 the source ``u``, row 1 the target ``v``)."""
    src, dst = np.asarray(edge_index, dtype=np.int64).reshape(2, -1)
    messages = np.zeros((len(src), *h.shape[1:]), dtype=h.dtype)
    out = np.zeros_like(h)
    for e in range(len(src)):
        # F1 message_e = w_e h_u, per head (H, C)
        messages[e] = weights[e][:, None] * h[src[e]]
        # F2 add it into its target (H, C)
        out[dst[e]] += messages[e]
    return out, messages


def propagate_backward(
    h: np.ndarray, weights: np.ndarray, d_out: np.ndarray, edge_index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of ``<d_out, out>``: ``(d_h (N, H, C), d_weights (E, H))``."""
    src, dst = np.asarray(edge_index, dtype=np.int64).reshape(2, -1)
    d_h = np.zeros_like(h)
    d_weights = np.zeros(weights.shape, dtype=d_out.dtype)
    for e in range(len(src)):
        # B2 (of F2) the message's gradient is its target's (H, C)
        d_message = d_out[dst[e]]
        # B1 (of F1) per head: d_w_e = d_message . h_u (H,); h_u receives w_e d_message
        d_weights[e] = np.einsum("hc,hc->h", d_message, h[src[e]])
        d_h[src[e]] += weights[e][:, None] * d_message
    return d_h, d_weights
