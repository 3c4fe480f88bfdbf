"""NodeFormer's relational bias (Eq. 8, Alg. 1 line 9): ``sum_j f(b_rel[j-1, h]) A_j V_h``.

Per head ``h``, order ``j = 1..r`` and gate ``f`` (sigmoid or identity), added to
the attention output before the heads are joined; ``A_j`` is ``A_hat^j``
(``powers="paper"``) or the degree-normalised pattern of ``A^(2^(j-1))``
(``powers="authors"``, the code's repeated squaring). ``A_hat = D_in^(-1/2) A
D_out^(-1/2)``. The conventions and their sources are in :mod:`refimpl.nn.nodeformer.conv`;
values are ``(N, H, C)``, ``b_rel`` is ``(r, H)``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.graph import Graph
from refimpl.kernels.csr import csr_matmul
from refimpl.ops.propagate import propagate, propagation_matrix

__all__ = [
    "Operator",
    "RelationalBias",
    "apply_operator",
    "normalized_edge_weights",
    "power_graphs",
]


class Operator(NamedTuple):
    """One normalised adjacency ``A_j`` of the relational bias.

    Attributes
    ----------
    graph : Graph
        The graph of ``A_j`` (its edges carry the weights).
    weights : array, (E, 1)
        ``1 / sqrt(d_in(v) d_out(u))`` per edge ``u -> v``.
    host : tuple
        ``(A, A^T)``, SciPy CSR ``(N, N)`` on the host, built once per graph and dtype; or
        ``()``.
    """

    graph: Graph
    weights: Any
    host: tuple


@dataclass(frozen=True)
class RelationalBias:
    r"""The relational-bias terms of one layer and their backward (NodeFormer Eq. (8), Alg. 1
    line 9, in the authors' code's form).

    Per head $h$, added to the attention output $\mathbf{z}_h$ before the heads are joined:

    $$
    \mathbf{z}_h \mathrel{+}= \sum_{j=1}^{r} f(b_{j h})\, \mathbf{A}_j \mathbf{v}_h,
    \qquad
    \hat{\mathbf{A}} = \mathbf{D}_{in}^{-1/2} \mathbf{A} \mathbf{D}_{out}^{-1/2}
    $$

    Parameters
    ----------
    mode : {"sigmoid", "identity"}
        The gate $f$.
    order : int
        $r$, the number of adjacency terms.
    powers : {"paper", "authors"}
        $\mathbf{A}_j = \hat{\mathbf{A}}^j$ (``"paper"``), or the degree-normalised pattern
        of $\mathbf{A}^{2^{j-1}}$ (``"authors"``: $\mathbf{A}, \mathbf{A}^2, \mathbf{A}^4,
        \dots$).

    Shapes
    ------
    - **input**: values ``v`` and the output ``z`` $(N, H, C)$; ``b_rel`` $(r, H)$
    - **output**: ``z`` updated in place by :meth:`add_terms`
    - **backward**: :meth:`add_terms_backward` adds into ``d_v`` $(N, H, C)$ and returns
      ``d_f`` $(r, H)$; :meth:`gate_backward` turns it into ``d_b_rel`` $(r, H)$
    """

    mode: str  # "sigmoid" | "identity": the gate f
    order: int  # r, the number of adjacency terms
    powers: str  # "paper" (A_hat^j) | "authors" (patterns of A, A^2, A^4, ...)

    def gate(self, b_rel: Any) -> Any:
        """``f(b_rel)`` (r, H): the sigmoid, in the tanh form that never overflows, or b_rel."""
        if self.mode == "sigmoid":
            return 0.5 * (1.0 + get_array_module(b_rel).tanh(0.5 * b_rel))
        return b_rel

    def gate_backward(self, f: Any, d_f: Any) -> Any:
        """``d_b_rel`` (r, H) from ``d_f``: ``f (1 - f)`` for the sigmoid, 1 for the identity."""
        return d_f * f * (1.0 - f) if self.mode == "sigmoid" else d_f

    def operators(self, graph: Graph, xp: Any, dtype: Any) -> tuple[Operator, ...]:
        """The normalised operators: ``(A_hat,)`` ("paper") or ``A_1 .. A_r`` ("authors")."""
        graphs = [graph] if self.powers == "paper" else power_graphs(graph, self.order)
        return tuple(_operator(g, xp, dtype) for g in graphs)

    def add_terms(self, operators: tuple, f: Any, v: Any, z: Any) -> None:
        """``z += sum_j f_j A_j V`` in place, ``f = gate(b_rel)`` (r, H), ``v, z`` (N, H, C);
        ``A_hat^j`` by repeated products. The gate scales heads (columns) and ``A_j`` mixes
        nodes (rows), so they commute: each product is scaled in place after it is made,
        unless the next power reads it unscaled."""
        power = v
        for j in range(self.order):
            gate = f[j][None, :, None]  # (1, H, 1)
            if self.powers == "authors":
                product = apply_operator(operators[j], v)  # (N, H, C)
            else:
                product = power = apply_operator(operators[0], power)
            if self.powers == "authors" or j == self.order - 1:
                product *= gate
                z += product
            else:
                z += gate * product

    def add_terms_backward(self, operators: tuple, f: Any, d_z: Any, v: Any, d_v: Any) -> Any:
        """Adjoint of :meth:`add_terms`: ``d_v += sum_j f_j A_j^T d_z`` in place, and returns
        ``d_f`` (r, H), ``d_f[j, h] = <d_z_h, A_j v_h> = <A_j^T d_z_h, v_h>``: from the
        products the values' path makes anyway, so the forward keeps no ``A_j V``. For
        ``A_hat^j`` the products are repeated: ``A_hat^T d_z``, ``(A_hat^T)^2 d_z``, ..."""
        xp = get_array_module(d_z)
        d_f, power = [], d_z
        for j in range(self.order):
            gate = f[j][None, :, None]  # (1, H, 1)
            if self.powers == "authors":
                product = apply_operator(operators[j], d_z, transpose=True)  # (N, H, C)
            else:
                product = power = apply_operator(operators[0], power, transpose=True)
            d_f.append(xp.einsum("nhc,nhc->h", product, v))  # (H,)
            if self.powers == "authors" or j == self.order - 1:
                product *= gate
                d_v += product
            else:  # the next power reads this product unscaled
                d_v += gate * product
        return xp.stack(d_f)


def apply_operator(operator: Operator, h: Any, transpose: bool = False) -> Any:
    """``A h`` (or ``A^T h``) for (N, H, C), ``A[v, u] = sum of w_e over edges u -> v``;
    all heads at once, as one head of width ``H * C``.

    Parameters
    ----------
    operator : Operator
        The normalised adjacency ``A_j``.
    h : array, (N, H, C)
        The values (or their gradient).
    transpose : bool, default False
        Apply ``A^T`` (the adjoint, for the backward).
    """
    n, heads, c = h.shape
    if operator.host:  # the host matrices, built once: no per-call assembly from the weights
        matrix = operator.host[1 if transpose else 0]
        return csr_matmul(matrix, h.reshape(n, heads * c)).reshape(n, heads, c)
    xp = get_array_module(h)
    src, dst = operator.graph.src_segments(xp), operator.graph.dst_segments(xp)
    if transpose:  # swapping the segmentations propagates along reversed edges: A^T
        src, dst = dst, src
    # (N, 1, H*C) with weights (E, 1)
    return propagate(h.reshape(n, 1, heads * c), operator.weights, src, dst).reshape(n, heads, c)


def _operator(graph: Graph, xp: Any, dtype: Any) -> Operator:
    """``graph``'s normalised operator; on the host with its CSR matrices ``A`` and ``A^T``
    (built once per graph: assembling them from the weights is a sort over E)."""
    weights = normalized_edge_weights(graph, xp, dtype)
    if backend_name(xp) != "numpy":
        return Operator(graph, weights, ())
    by_dtype = _MATRICES.setdefault(graph, {})
    key = np.dtype(dtype).str
    if key not in by_dtype:
        src, dst = graph.src_segments(xp), graph.dst_segments(xp)
        by_dtype[key] = (
            propagation_matrix(weights, dst, src),  # A
            propagation_matrix(weights, src, dst),  # A^T, built directly in CSR
        )
    return Operator(graph, weights, by_dtype[key])


def normalized_edge_weights(graph: Graph, xp: Any, dtype: Any) -> Any:
    """``1 / sqrt(d_in(v) d_out(u))`` per edge ``u -> v`` (E, 1): ``D_in^(-1/2) A D_out^(-1/2)``,
    the code's ``add_conv_relational_bias`` (degrees count duplicate edges and self-loops).

    Computed once per graph, array module and dtype (every training step asks again).

    Parameters
    ----------
    graph : Graph
        The graph of ``A``.
    xp : module
        The array module the weights live on.
    dtype : dtype
        Their dtype.
    """
    by_kind = _WEIGHTS.setdefault(graph, {})
    key = (xp.__name__, np.dtype(dtype).str)
    if key not in by_kind:
        src, dst = graph.src_segments(xp), graph.dst_segments(xp)
        degrees = dst.counts()[dst.index] * src.counts()[src.index]  # (E,) int, >= 1 on edges
        by_kind[key] = (1.0 / xp.sqrt(degrees.astype(dtype)))[:, None]
    return by_kind[key]


# Graph -> {(array module, dtype): weights (E, 1)}; the weights hold no reference to the graph
_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Graph -> {dtype: (A, A^T)} host CSR matrices (no reference to the graph either)
_MATRICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# Graph -> [A_2, A_3, ...]; the values must not reference their key, or the entry never dies
_POWERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def power_graphs(graph: Graph, order: int) -> list[Graph]:
    """``[A, pattern(A^2), pattern(A^4), ...]`` (``order`` graphs): the code's ``adjs``.

    ``main.py`` repeats ``adj = adj_mul(adj, adj)``, the nonzero pattern of the
    product of the binarised adjacency with itself, so graph ``j`` holds the pairs
    joined by a walk of ``2^(j-1)`` edges, each once. Computed on the host with
    SciPy, once per graph (cached while the graph lives), moved to its backend.

    Parameters
    ----------
    graph : Graph
        The layer's graph ``A`` (self-loops as configured).
    order : int
        ``r``, the number of graphs returned.
    """
    import scipy.sparse as sp

    higher = _POWERS.setdefault(graph, [])
    while len(higher) + 1 < order:
        n = graph.num_nodes
        previous = to_numpy((higher[-1] if higher else graph).edge_index)
        ones = np.ones(previous.shape[1])
        a = sp.csr_matrix((ones, (previous[0], previous[1])), shape=(n, n))
        a.data[:] = 1.0  # binarise (duplicates summed above)
        square = (a @ a).tocoo()
        keep = square.data != 0
        rows, cols = square.row[keep], square.col[keep]
        sort = np.lexsort((cols, rows))  # coalesced, as torch's: by row, then column
        edge_index = np.stack([rows[sort], cols[sort]])
        backend = backend_name(get_array_module(graph.edge_index))
        higher.append(Graph(asarray(edge_index.astype(np.int64), backend=backend), n))
    return [graph, *higher[: order - 1]]
