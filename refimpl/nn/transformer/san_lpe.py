"""``LearnedLaplacianPE``: SAN's learned node Laplacian encoding (Kreuzer et al. 2021, Sec. 3.2,
Fig. 2; ``SAN_NodeLPE`` of the released code), and :func:`eigenpairs_padded`, its input.

Per node ``v``, the ``m`` pairs ``(phi_j(v), lambda_j)`` (entry of eigenvector ``j``, its
eigenvalue) form a sequence of ``m`` tokens, ``valid`` where the node's graph has an eigenpair
``j`` (the released code pads with NaN and masks where it finds NaN). With ``d = channels`` and
``H`` heads of ``d_h = d / H`` channels::

    F1  x_vj = [phi_j(v), lambda_j] if valid else [0, 0]       (N, m, 2)  PosEnc[empty_mask] = 0
    F2  x = x A^T + b_A                                        (N, m, d)  linear_A
        per encoder layer (torch.nn.TransformerEncoderLayer: post-norm, ReLU, its defaults
        dim_feedforward = 2048, dropout = 0.1, norm_first = False, eps = 1e-5):
    F3  [q | k | u] = x W_in^T + b_in                          (N, m, 3d) self_attn.in_proj
    F4  a = softmax_j'(q_j . k_j' / sqrt(d_h)) over valid j'   (N, H, m, m) src_key_padding_mask
    F5  a = Dropout(a);  o = a u, heads concatenated           (N, m, d)
    F6  o = o W_out^T + b_out;  Dropout                        (N, m, d)  self_attn.out_proj
    F7  x = LayerNorm_1(x + o)                                            norm1
    F8  f = Dropout(ReLU(x W_1^T + b_1)) W_2^T + b_2;  Dropout            linear1, linear2
    F9  x = LayerNorm_2(x + f)                                            norm2
    F10 pe_v = sum_{j valid} x_vj                              (N, d)     nansum over the tokens

The released net concatenates ``pe`` to the node embedding, ``h = [embedding_h(x) | pe]`` of
widths ``D - d`` and ``d`` (``GT_hidden_dim - LPE_dim``), before the input dropout; a model does
that with this block's output. Padded tokens are computed (they attend to the valid ones) and
dropped by F10, so they receive no gradient.

Parameters, in order (flat names ``{block}.{name}``, torch's in the guide): ``linear_A.W (d,
2)``, ``linear_A.b``, then per layer ``l``: ``layers.l.in_proj.W (3d, d)``, ``.b``,
``layers.l.out_proj.W (d, d)``, ``.b``, ``layers.l.norm1.weight``, ``.bias``,
``layers.l.linear1.W (d_ff, d)``, ``.b``, ``layers.l.linear2.W (d, d_ff)``, ``.b``,
``layers.l.norm2.weight``, ``.bias``.

Randomness: ``noise`` keys ``layers.l.attn_dropout (N, H, m, m)``, ``layers.l.dropout1``,
``layers.l.dropout (N*m, d_ff)``, ``layers.l.dropout2 (N*m, d)`` (torch's names), keep-masks
drawn from ``rng`` in that order per layer when not given (training with ``dropout > 0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module, to_numpy
from refimpl.fields import check_bool, check_positive_int, check_probability
from refimpl.graph import Graph
from refimpl.nn.attention_common import softmax_rows, softmax_rows_derivative
from refimpl.nn.norms.layernorm import LayerNorm
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.nn.stacks import block_backward, flat_param_shapes, init_flat_params, split_params
from refimpl.ops.activations import ReLU
from refimpl.ops.dropout import Dropout, recorded_dropout
from refimpl.ops.linear import Linear
from refimpl.validation import check_array, check_cotangent, check_input, check_params, check_rng

__all__ = ["LearnedLaplacianPE", "LearnedLaplacianPECache", "eigenpairs_padded"]

_ROW_EPS = 1e-12  # F.normalize(EigVecs, p=2, dim=1, eps=1e-12)


class LearnedLaplacianPECache(NamedTuple):
    """What :meth:`LearnedLaplacianPE.backward` reads.

    Attributes
    ----------
    valid : (N, m) bool array
        Which eigenpair slots are real (False: padding).
    linear_A : object
        F2's LinearCache.
    layers : tuple
        Per encoder layer: a dict of its steps' caches.
    out : (N, d) array
        The encoding.
    noise : dict
        The keep-masks used.
    """

    valid: Any
    linear_A: Any
    layers: tuple
    out: Any
    noise: dict[str, Any]


@dataclass(frozen=True)
class LearnedLaplacianPE:
    r"""SAN's node LPE: a transformer encoder over each node's eigenpairs, sum-pooled.

    ``SAN_NodeLPE.forward`` up to the concatenation (F1-F10 in the module docstring):

    $$
    \mathrm{pe}_v = \sum_{j \text{ valid}} \operatorname{Encoder}\left(
    \operatorname{linear}_A\left([\phi_j(v), \lambda_j]\right)\right)_j
    $$

    (Kreuzer et al. 2021, the node LPE; $\phi_j$, $\lambda_j$ the Laplacian's eigenpairs.)
    ``Encoder``: ``layers`` post-norm ``torch.nn.TransformerEncoderLayer``s, self-attention
    masked to the node's valid tokens.

    Parameters
    ----------
    channels : int
        ``d``, the encoding width (``LPE_dim``; 8 in the SAN repository's ZINC config).
    heads : int
        Heads of each encoder layer (``LPE_n_heads``), default 4; ``d`` divisible by it.
    layers : int
        Encoder layers (``LPE_layers``), default 2.
    ffn_channels : int
        ``dim_feedforward``, default 2048 (``torch.nn.TransformerEncoderLayer``'s default,
        which the released net keeps).
    dropout : float
        In ``[0, 1)``, default 0.1 (torch's default, kept by the released net): on the
        attention weights, after the attention, inside and after the FFN, in training only.

    Shapes
    ------
    ``eigvecs (N, m)``, ``eigvals (N, m)``, ``valid (N, m)`` bool (:func:`eigenpairs_padded`)
    -> ``pe (N, d)``; every node needs one valid eigenpair.
    """

    channels: int
    heads: int = 4
    layers: int = 2
    ffn_channels: int = 2048
    dropout: float = 0.1
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("channels", "heads", "layers", "ffn_channels"):
            check_positive_int(getattr(self, name), f"LearnedLaplacianPE {name}")
        check_probability(self.dropout, "LearnedLaplacianPE dropout")
        if self.channels % self.heads:
            raise ValueError(
                f"LearnedLaplacianPE channels ({self.channels}) must be divisible by heads "
                f"({self.heads}), as torch.nn.MultiheadAttention requires"
            )
        d = self.channels
        blocks: dict[str, Any] = {"linear_A": Linear(2, d)}
        for i in range(self.layers):
            blocks[f"layers.{i}.in_proj"] = Linear(d, 3 * d)
            blocks[f"layers.{i}.out_proj"] = Linear(d, d)
            blocks[f"layers.{i}.norm1"] = LayerNorm(d, "node")
            blocks[f"layers.{i}.linear1"] = Linear(d, self.ffn_channels)
            blocks[f"layers.{i}.linear2"] = Linear(self.ffn_channels, d)
            blocks[f"layers.{i}.norm2"] = LayerNorm(d, "node")
        object.__setattr__(self, "blocks", blocks)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names and shapes, in order (module docstring)."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Each block's own: Glorot-uniform linears with zero biases (torch draws ``in_proj``
        so, and its other linears Kaiming-uniform), LayerNorm ones and zeros."""
        return init_flat_params(self.blocks, rng, backend, dtype)

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        eigvecs: Any,
        eigvals: Any,
        valid: Any,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
    ) -> tuple[Any, LearnedLaplacianPECache]:
        """``pe (N, channels)`` for the padded eigenpairs; masks from ``noise`` or ``rng``."""
        xp = check_input(eigvecs, "eigvecs", shape=(None, None))
        check_input(eigvals, "eigvals", shape=eigvecs.shape)
        check_array(valid, "valid", shape=eigvecs.shape, floating=False)
        if valid.dtype.kind != "b" or not bool(valid.any(axis=1).all()):
            raise ValueError(
                "valid must be a bool array (N, m) with at least one True per node (a graph "
                "of n nodes has n eigenpairs); build it with eigenpairs_padded"
            )
        check_params(params, self.param_shapes(), "LearnedLaplacianPE")
        get_array_module(eigvecs, eigvals, valid, *params.values())  # one backend
        check_bool(training, "LearnedLaplacianPE training")
        check_rng(rng, "LearnedLaplacianPE rng")
        noise, used = dict(noise or {}), {}
        n, m, d = eigvecs.shape[0], eigvecs.shape[1], self.channels
        sub = lambda prefix: split_params(self.blocks, params, prefix)  # noqa: E731
        dropout = Dropout(self.dropout)

        def drop(key: str, x: Any) -> tuple[Any, Any]:
            return recorded_dropout(dropout, key, x, training, rng, noise, used)

        # F1 the tokens, zero where padded (N*m, 2)
        tokens = xp.stack([eigvecs, eigvals], axis=2) * valid[..., None]
        # F2 linear_A (N*m, d)
        x, linear_a = self.blocks["linear_A"].forward(sub("linear_A"), tokens.reshape(n * m, 2))
        caches = []
        for i in range(self.layers):
            x, cache = self._layer_forward(i, params, x, valid, drop, sub)
            caches.append(cache)
        # F10 sum over the valid tokens (N, d)
        out = (x.reshape(n, m, d) * valid[..., None]).sum(axis=1)
        check_overflow(out, "LearnedLaplacianPE.forward: its output", eigvecs.dtype)
        return out, LearnedLaplacianPECache(valid, linear_a, tuple(caches), out, used)

    def _layer_forward(
        self, i: int, params: dict, x: Any, valid: Any, drop: Any, sub: Any
    ) -> tuple[Any, dict]:
        """F3-F9 of encoder layer ``i`` on ``x (N*m, d)``."""
        xp = get_array_module(x)
        n, m = valid.shape
        heads, d_h, pre = self.heads, self.channels // self.heads, f"layers.{i}."
        c: dict[str, Any] = {"x": x}
        # F3 in-projection, split into heads (N, H, m, d_h) each
        qkv, c["in_proj"] = self.blocks[pre + "in_proj"].forward(sub(pre + "in_proj"), x)
        q, k, u = (
            part.reshape(n, m, heads, d_h).transpose(0, 2, 1, 3) for part in xp.split(qkv, 3, 1)
        )
        # F4 scaled scores, padded keys masked out, softmax over the keys (N, H, m, m)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d_h)
        scores = xp.where(valid[:, None, None, :], scores, -xp.inf)
        alpha = softmax_rows(scores.reshape(-1, m)).reshape(n, heads, m, m)
        # F5 attention dropout; weighted values, heads concatenated (N*m, d)
        alpha_d, c["attn_dropout"] = drop(pre + "attn_dropout", alpha)
        o = (alpha_d @ u).transpose(0, 2, 1, 3).reshape(n * m, self.channels)
        c.update(q=q, k=k, u=u, alpha=alpha, alpha_d=alpha_d)
        # F6 out-projection, dropout1
        o, c["out_proj"] = self.blocks[pre + "out_proj"].forward(sub(pre + "out_proj"), o)
        o, c["dropout1"] = drop(pre + "dropout1", o)
        # F7 residual, LayerNorm 1
        x, c["norm1"] = self.blocks[pre + "norm1"].forward(sub(pre + "norm1"), x + o)
        # F8 the FFN, dropout inside and after
        f, c["linear1"] = self.blocks[pre + "linear1"].forward(sub(pre + "linear1"), x)
        f, c["relu"] = ReLU().forward({}, f)
        f, c["dropout"] = drop(pre + "dropout", f)
        f, c["linear2"] = self.blocks[pre + "linear2"].forward(sub(pre + "linear2"), f)
        f, c["dropout2"] = drop(pre + "dropout2", f)
        # F9 residual, LayerNorm 2
        x, c["norm2"] = self.blocks[pre + "norm2"].forward(sub(pre + "norm2"), x + f)
        return x, c

    # -- backward ----------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: LearnedLaplacianPECache, d_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """Gradients of ``<d_out, pe>``: ``((d_eigvecs, d_eigvals) (N, m) each, d_params)``;
        zero at padded entries."""
        check_cotangent(d_out, cache.out.shape, cache.out.dtype, cache.out, name="d_out")
        return backward_checked(
            lambda: self._backward(params, cache, d_out), "LearnedLaplacianPE", d_out.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: LearnedLaplacianPECache, d_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """B10-B1 of :meth:`backward` on a checked cotangent."""
        xp = get_array_module(d_out)
        n, m = cache.valid.shape
        d_params: dict[str, Any] = {}
        # B10 (of F10) the sum over valid tokens broadcasts back (N*m, d)
        d_x = (d_out[:, None, :] * cache.valid[..., None]).reshape(n * m, self.channels)
        for i in reversed(range(self.layers)):
            d_x = self._layer_backward(i, params, cache.layers[i], d_x, d_params)
        # B2 (of F2), B1 (of F1): zero at the padded tokens
        d_tokens = block_backward(self.blocks, params, "linear_A", cache.linear_A, d_x, d_params)
        d_tokens = d_tokens.reshape(n, m, 2) * cache.valid[..., None]
        d_inputs = (xp.ascontiguousarray(d_tokens[..., 0]), xp.ascontiguousarray(d_tokens[..., 1]))
        return d_inputs, {name: d_params[name] for name in params}

    def _layer_backward(self, i: int, params: dict, c: dict, d_x: Any, d_params: dict) -> Any:
        """B9-B3 of encoder layer ``i``: ``d_x (N*m, d)`` of its input."""
        blocks, pre, dropout = self.blocks, f"layers.{i}.", Dropout(self.dropout)
        n, heads, m, d_h = c["q"].shape

        def back(name: str, d: Any) -> Any:
            return block_backward(blocks, params, pre + name, c[name], d, d_params)

        # B9 (of F9) LayerNorm 2; the residual sends its gradient to x and f
        d_x = back("norm2", d_x)
        # B8 (of F8) the FFN
        d_f, _ = dropout.backward({}, c["dropout2"], d_x)
        d_f = back("linear2", d_f)
        d_f, _ = dropout.backward({}, c["dropout"], d_f)
        d_f, _ = ReLU().backward({}, c["relu"], d_f)
        d_x = d_x + back("linear1", d_f)
        # B7 (of F7) LayerNorm 1, the residual again
        d_x = back("norm1", d_x)
        # B6 (of F6) dropout1, out-projection
        d_o, _ = dropout.backward({}, c["dropout1"], d_x)
        d_o = back("out_proj", d_o)
        # B5 (of F5) heads apart (N, H, m, d_h); o = alpha_d u
        d_o = d_o.reshape(n, m, heads, d_h).transpose(0, 2, 1, 3)
        d_alpha, _ = dropout.backward({}, c["attn_dropout"], d_o @ c["u"].transpose(0, 1, 3, 2))
        d_u = c["alpha_d"].transpose(0, 1, 3, 2) @ d_o
        # B4 (of F4) the softmax (masked keys have alpha = 0: no gradient), the scaled product
        d_scores = softmax_rows_derivative(c["alpha"].reshape(-1, m), d_alpha.reshape(-1, m))
        d_scores = d_scores.reshape(n, heads, m, m) / math.sqrt(d_h)
        d_q = d_scores @ c["k"]
        d_k = d_scores.transpose(0, 1, 3, 2) @ c["q"]
        # B3 (of F3) heads back together, the in-projection
        xp = get_array_module(d_x)
        d_qkv = xp.concatenate(
            [g.transpose(0, 2, 1, 3).reshape(n * m, heads * d_h) for g in (d_q, d_k, d_u)], axis=1
        )
        return d_x + back("in_proj", d_qkv)


def eigenpairs_padded(
    graph: Graph, m: int, node_ptr: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(eigvecs, eigvals, valid)``, each ``(N, m)``: SAN's ``laplace_decomp`` per graph.

    Per graph (block ``node_ptr[j]:node_ptr[j+1]``; None: one graph) of ``n`` nodes:
    ``L = I - D^-1/2 A D^-1/2`` (``A`` the undirected simple graph: edges symmetrised, self-loops
    dropped, duplicates merged; an isolated node's row of ``L`` is the identity's), its
    ``min(n, m)`` eigenpairs of smallest eigenvalue (the trivial one included), each node's row
    of eigenvectors scaled to unit length (``F.normalize(EigVecs, dim=1)``, as released: it
    changes the entries when ``n > m``), eigenvalues as ``|lambda|``; ``valid`` is False and
    the arrays 0 in columns ``n .. m - 1`` (the released NaN padding). Eigenvector signs are
    ``numpy.linalg.eigh``'s (arbitrary, as released). Host NumPy, float64.

    Parameters
    ----------
    graph : Graph
        On ``N`` nodes, block-diagonal for a batch.
    m : int
        Eigenpairs per node (``LPE`` token count).
    node_ptr : (G + 1,) int array, optional
        Graph ``j`` is nodes ``node_ptr[j]:node_ptr[j+1]``; None: one graph.

    Returns
    -------
    eigvecs : (N, m) float64 array
    eigvals : (N, m) float64 array
    valid : (N, m) bool array
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a refimpl.Graph, got {type(graph).__name__}")
    check_positive_int(m, "eigenpairs_padded m")
    num = graph.num_nodes
    ptr = np.array([0, num]) if node_ptr is None else np.asarray(to_numpy(node_ptr))
    if ptr.ndim != 1 or ptr.dtype.kind not in "iu" or ptr[0] != 0 or ptr[-1] != num:
        raise ValueError(f"node_ptr must be an int array (G+1,) from 0 to {num}, got {ptr!r}")
    if (np.diff(ptr) < 0).any():
        raise ValueError("node_ptr must never decrease (graph j is node_ptr[j]:node_ptr[j+1])")
    sizes = np.diff(ptr)
    block = np.repeat(np.arange(sizes.size), sizes)  # (N,)
    src, dst = to_numpy(graph.edge_index).astype(np.int64)
    if (block[src] != block[dst]).any():
        raise ValueError("an edge joins two graphs of node_ptr; pass the batch's own node_ptr")
    vecs, vals, valid = np.zeros((num, m)), np.zeros((num, m)), np.zeros((num, m), dtype=bool)
    for size in np.unique(sizes[sizes > 0]).tolist():  # one stacked eigh per distinct size
        blocks = np.flatnonzero(sizes == size)
        slot = np.full(sizes.size, -1)
        slot[blocks] = np.arange(blocks.size)
        keep = (slot[block[src]] >= 0) & (src != dst)
        start = ptr[block[src[keep]]]
        adjacency = np.zeros((blocks.size, size, size))
        index = slot[block[src[keep]]]
        adjacency[index, src[keep] - start, dst[keep] - start] = 1.0  # merged duplicates
        adjacency[index, dst[keep] - start, src[keep] - start] = 1.0  # symmetrised
        scale = np.clip(adjacency.sum(axis=2), 1.0, None) ** -0.5  # (b, s) in_degrees().clip(1)
        laplacian = np.eye(size) - scale[:, :, None] * adjacency * scale[:, None, :]
        values, vectors = np.linalg.eigh(laplacian)  # ascending
        cols = min(size, m)
        vectors = vectors[:, :, :cols]
        norms = np.linalg.norm(vectors, axis=2, keepdims=True)
        rows = ptr[blocks][:, None] + np.arange(size)  # (b, s) global node ids
        vecs[rows, :cols] = vectors / np.maximum(norms, _ROW_EPS)
        vals[rows, :cols] = np.abs(values[:, None, :cols])
        valid[rows, :cols] = True
    return vecs, vals, valid
