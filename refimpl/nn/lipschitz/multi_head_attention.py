"""Dense attention of LipschitzNorm (Dasoulas et al. 2021), with backward and forward-mode jvp.

Layout follows the paper (Sec. 3.3): ``X`` is ``(d, n)``, one input vector per
*column*; scores ``g(X)`` are ``(m, n)``; softmax is row-wise (Eq. 3)::

    Att(X) = X softmax(g(X))^T                                    (Eq. 4), (d, m)

* :class:`Attention`: linear score ``g~(X) = Q^T X`` with ``Q (d, m)`` a parameter,
  unnormalised, or normalised by Eq. 17 (``"linear"``) or Eq. 15 (``"lipschitz"``,
  with ``L = ||Q||_*``).
* :class:`TransformerAttention`: ``X = (Q||K||V)`` stacked by rows ``(3d, n)``,
  ``Att(X) = V softmax(g)^T`` ``(d, n)`` with ``g = Q^T K / sqrt(d)`` (Eq. 7) or
  Eq. 19 (``"lipschitz"``). No parameters.
* :class:`MultiHeadAttention`: ``W_O (Att(W_1 X) || ... || Att(W_h X))`` (Eq. 5),
  heads concatenated by rows; ``W_in[k]`` is the paper's ``W_k`` (as a ``(rows, d_I)``
  map applied on the left, the transpose of the paper's ``d_I x d`` shape).

Every block has ``forward(params, x) -> (out, cache)``, ``backward(params, cache,
d_out) -> (d_x, d_params)`` (the exact adjoint) and ``jvp(params, cache, d_x) ->
d_out``: ``D Att_X (H)`` of Eq. 8 with the parameters fixed. The softmax
Jacobian ``diag(p) - p p^T`` (Eq. 30) is symmetric, so one routine serves the
backward and the jvp.

Files: :class:`Attention` lives in :mod:`refimpl.nn.lipschitz.linear_score_attention`,
:class:`TransformerAttention` in :mod:`refimpl.nn.lipschitz.transformer_score_attention`, the
normalisations in :mod:`refimpl.nn.lipschitz.score_norms`; this module holds
:class:`MultiHeadAttention` and exports all of them.

Conventions (ties, zero denominators, the rounding clip, no eps) are those of
:mod:`refimpl.nn.lipschitz.score_norms`: every max is differentiated through its first
maximiser in ``np.argmax`` order, in backward and jvp alike (so the two stay
adjoint at ties); when the denominator ``c`` is 0 (only for ``X = 0`` or
``Q = 0``; Eq. 19: ``Q = 0`` or ``K = 0`` and another factor zero) the scores are
0 and their derivative is 0, so ``D Att`` keeps only its first term
``H softmax(g)^T``. The normalised scores satisfy ``|g| <= alpha`` (Eq. 15) and
``|g| <= 1`` (Eq. 17, 19) exactly, and are invariant under ``X -> tX``, ``t > 0``
(and, for Eq. 15 and 17, under ``Q -> sQ``, ``s > 0``).

The caches expose ``scores`` (``g``), ``probabilities`` (``softmax(g)``) and
``denominator``: ``c`` with ``g = g~ / c`` (Eq. 17 and 19); for Eq. 15 the
displayed ``max{...}``, i.e. ``g = alpha g~ / denominator`` (Sec. 9.6 writes it
``alpha c(X)``); ``sqrt(d)`` for Eq. 7; ``None`` for the unnormalised linear score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.nn.attention_common import (
    check_tangent,
    check_with_params,
    glorot,
    positive_int,
)
from refimpl.nn.lipschitz.linear_score_attention import Attention, AttentionCache
from refimpl.nn.lipschitz.score_norms import inf2_norm, two_inf_norm
from refimpl.nn.lipschitz.transformer_score_attention import (
    TransformerAttention,
    TransformerAttentionCache,
)
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.validation import check_cotangent

__all__ = [
    "Attention",
    "AttentionCache",
    "MultiHeadAttention",
    "MultiHeadAttentionCache",
    "TransformerAttention",
    "TransformerAttentionCache",
    "inf2_norm",
    "two_inf_norm",
]


class MultiHeadAttentionCache(NamedTuple):
    """What :meth:`MultiHeadAttention.backward` and ``jvp`` read.

    Attributes
    ----------
    x : array, (d_I, n)
        The input.
    head_inputs : array, (h, rows, n)
        ``W_k X`` per head.
    concatenated : array, (h d, m)
        The heads' outputs stacked by rows.
    heads : tuple
        Per head, its :class:`AttentionCache` or :class:`TransformerAttentionCache`.
    """

    x: Any
    head_inputs: Any
    concatenated: Any
    heads: tuple


@dataclass(frozen=True)
class MultiHeadAttention:
    r"""Multi-head attention of LipschitzNorm (Dasoulas et al. 2021) Eq. (5), heads stacked by
    rows, each normalised separately (Sec. 5, "Implementation details").

    $$
    \operatorname{MultiHead}(\mathbf{X}) = \mathbf{W}_O \big(\operatorname{Att}(\mathbf{W}_1
    \mathbf{X}) \Vert \dots \Vert \operatorname{Att}(\mathbf{W}_h \mathbf{X})\big)
    $$

    ``kind="transformer"``: each head is ``TransformerAttention(d, normalization)`` on
    $\mathbf{W}_k \mathbf{X}$, $\mathbf{W}_k$ $(3d, d_I)$ (the query, key and value
    projections stacked), $m = n$. ``kind="linear"``: each head is ``Attention(d,
    num_outputs, normalization, alpha)`` on $\mathbf{W}_k \mathbf{X}$, $\mathbf{W}_k$
    $(d, d_I)$, with its own $\mathbf{Q}_k$. ``W_in[k]`` is the paper's $\mathbf{W}_k$ as a
    map applied on the left (the transpose of the paper's $d_I \times d$ shape).

    Parameters
    ----------
    in_dim : int
        $d_I$, the input vectors' length.
    head_dim : int
        $d$, each head's width.
    out_dim : int
        $d_O$, the output vectors' length.
    heads : int
        $h$, the number of heads.
    kind : {"transformer", "linear"}, default "transformer"
        The heads: :class:`TransformerAttention` (Eq. (7) / (19)) or :class:`Attention`
        (Eq. (4)).
    normalization : str or None, default None
        Each head's: None, ``"lipschitz"`` (both kinds) or ``"linear"`` (linear heads).
    num_outputs : int or None, default None
        $m$, for ``"linear"`` heads only (transformer heads have $m = n$).
    alpha : float, default 1.0
        Eq. (15)'s bound, for ``"linear"`` heads with ``normalization="lipschitz"`` only.

    Shapes
    ------
    - **input**: ``x`` $(d_I, n)$
    - **output**: $(d_O, m)$
    - **params**: ``W_in`` $(h, 3d \text{ or } d, d_I)$, ``Q`` $(h, d, m)$ (``"linear"``
      only), ``W_out`` $(d_O, h d)$
    - **backward**: ``d_out`` $(d_O, m)$; returns ``d_x`` $(d_I, n)$ and ``d_params``
    - **jvp**: ``d_x`` $(d_I, n)$; returns $(d_O, m)$
    """

    in_dim: int  # d_I
    head_dim: int  # d
    out_dim: int  # d_O
    heads: int  # h
    kind: str = "transformer"  # "transformer" (Eq. 7 / 19 heads) | "linear" (Eq. 4 heads)
    normalization: str | None = None  # per head; see Attention / TransformerAttention
    num_outputs: int | None = None  # m, "linear" only (transformer heads have m = n)
    alpha: float = 1.0  # Eq. 15, "linear" heads with normalization="lipschitz" only

    def __post_init__(self) -> None:
        for name in ("in_dim", "head_dim", "out_dim", "heads"):
            positive_int("MultiHeadAttention", name, getattr(self, name))
        if self.kind not in ("transformer", "linear"):
            raise ValueError(
                f"MultiHeadAttention kind must be 'transformer' or 'linear', got {self.kind!r}"
            )
        if self.kind == "linear" and self.num_outputs is None:
            raise ValueError("MultiHeadAttention kind='linear' needs num_outputs (m)")
        if self.kind == "transformer" and self.num_outputs is not None:
            raise ValueError(
                "MultiHeadAttention kind='transformer' has m = n outputs; leave num_outputs None"
            )
        _ = self.head  # builds the head block, which validates normalization and alpha

    @property
    def head(self) -> Attention | TransformerAttention:
        """The block every head applies (heads differ only in their parameters)."""
        if self.kind == "transformer":
            return TransformerAttention(self.head_dim, self.normalization)
        return Attention(self.head_dim, self.num_outputs, self.normalization, self.alpha)

    @property
    def _rows(self) -> int:
        return 3 * self.head_dim if self.kind == "transformer" else self.head_dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``W_in (h, rows, d_I)``, ``Q (h, d, m)`` (linear heads), ``W_out (d_O, h*d)``."""
        shapes = {"W_in": (self.heads, self._rows, self.in_dim)}
        if self.kind == "linear":
            shapes["Q"] = (self.heads, self.head_dim, self.num_outputs)
        shapes["W_out"] = (self.out_dim, self.heads * self.head_dim)
        return shapes

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Glorot uniform per matrix: each ``W_in[k]`` on its ``(rows, d_I)`` fans (PyTorch's
        ``MultiheadAttention`` likewise draws its stacked ``(3E, E)`` in-projection at once),
        each ``Q[k]`` on ``(d, m)``, ``W_out`` on ``(d_O, h*d)``."""
        params = {}
        for name, shape in self.param_shapes().items():
            params[name] = asarray(glorot(rng, shape, shape[-2:]), backend=backend, dtype=dtype)
        return params

    def _head_params(self, params: dict[str, Any], k: int) -> dict[str, Any]:
        return {"Q": params["Q"][k]} if self.kind == "linear" else {}

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, MultiHeadAttentionCache]:
        """``MultAtt(X)``: x (d_I, n) -> out (d_O, m) (``m = n`` for transformer heads)."""
        check_with_params(params, self.param_shapes(), "MultiHeadAttention", x, self.in_dim)
        xp = get_array_module(x)
        head = self.head
        # F1 per-head inputs W_k X: (h, rows, d_I) @ (d_I, n) -> (h, rows, n)
        head_inputs = params["W_in"] @ x
        # F2 each head (d, m)
        outputs, caches = [], []
        for k in range(self.heads):
            out_k, cache_k = head.forward_unchecked(self._head_params(params, k), head_inputs[k])
            outputs.append(out_k)
            caches.append(cache_k)
        # F3 stack by rows (h*d, m)
        concatenated = xp.concatenate(outputs, axis=0)
        # F4 out = W_O concat: (d_O, h*d) @ (h*d, m) -> (d_O, m)
        out = params["W_out"] @ concatenated
        check_overflow(out, "MultiHeadAttention.forward: its output", x.dtype)
        return out, MultiHeadAttentionCache(x, head_inputs, concatenated, tuple(caches))

    def backward(
        self, params: dict[str, Any], cache: MultiHeadAttentionCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_x (d_I, n), d_params keyed like params)``."""
        x = cache.x
        expected = (self.out_dim, cache.concatenated.shape[1])
        check_cotangent(d_out, expected, x.dtype, x, name="d_out")
        return backward_checked(
            lambda: self._backward(params, cache, d_out), "MultiHeadAttention", x.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: MultiHeadAttentionCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """B4-B1 of :meth:`backward` on a checked cotangent."""
        x = cache.x
        xp = get_array_module(d_out)
        head, d = self.head, self.head_dim
        d_params: dict[str, Any] = {}
        # B4 (of F4): (d_O, m) @ (m, h*d) -> (d_O, h*d); (h*d, d_O) @ (d_O, m) -> (h*d, m)
        d_params["W_out"] = d_out @ cache.concatenated.T
        d_concatenated = params["W_out"].T @ d_out
        # B3 (of F3) the adjoint of stacking is slicing; B2 (of F2) each head
        d_inputs, d_queries = [], []
        for k in range(self.heads):
            d_in_k, d_head = head.backward_unchecked(
                self._head_params(params, k), cache.heads[k], d_concatenated[k * d : (k + 1) * d]
            )
            d_inputs.append(d_in_k)  # (rows, n)
            d_queries.append(d_head.get("Q"))
        d_head_inputs = xp.stack(d_inputs)  # (h, rows, n)
        if self.kind == "linear":
            d_params["Q"] = xp.stack(d_queries)  # (h, d, m)
        # B1 (of F1): (h, rows, n) @ (n, d_I) -> (h, rows, d_I); sum_k W_k^T dX_k (d_I, n)
        d_params["W_in"] = d_head_inputs @ x.T
        d_x = xp.einsum("hri,hrn->in", params["W_in"], d_head_inputs)
        return d_x, {name: d_params[name] for name in params}

    def jvp(self, params: dict[str, Any], cache: MultiHeadAttentionCache, d_x: Any) -> Any:
        """``D MultAtt_X (H)`` (Eq. 24) for ``H = d_x (d_I, n)``, parameters fixed."""
        check_tangent(d_x, cache.x)
        xp = get_array_module(d_x)
        head = self.head
        # J1 (of F1): (h, rows, d_I) @ (d_I, n) -> (h, rows, n)
        d_head_inputs = params["W_in"] @ d_x
        # J2 (of F2), J3 (of F3) (h*d, m)
        d_outputs = [
            head._jvp(self._head_params(params, k), cache.heads[k], d_head_inputs[k])
            for k in range(self.heads)
        ]
        # J4 (of F4): (d_O, h*d) @ (h*d, m) -> (d_O, m)
        return params["W_out"] @ xp.concatenate(d_outputs, axis=0)
