"""``AttentionStreamLayer``: an attention block on the nodes, then one node
:class:`~refimpl.nn.transformer.stream.TransformerStream`: the skeleton GraphiT-GT's
(``GraphiT_GT_Layer`` of ``gnn-lspe/layers/graphit_gt_layer.py``) and SAN's layers
(``SAN_GT_Layer`` of ``gnn-lspe/layers/san_gt_layer.py``) share, written once::

    F1  a = Attention(h, pairs, e, ...)   (N, D)  attention_h (malog_h['attention'])
    F2  out = TransformerStream(a, h)     (N, D)  dropout, O_h, residual, norm, FFN, ..., norm

The edge features pass through unchanged (the released layers return ``e``, or None): every
layer reads the same embedded ``e``. Parameters: ``attention.*`` then ``stream.*``; state
(BatchNorm's running statistics): ``stream.*``; noise keys: the stream's ``dropout1``,
``dropout2``. :class:`~refimpl.nn.transformer.graphit_layer.GraphiTLayer` and
:class:`~refimpl.nn.transformer.san_layer.SANLayer` are this with their attention and their
``forward`` signature.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np

from refimpl.nn.stacks import block_backward, flat_param_shapes, init_flat_params, split_params
from refimpl.nn.transformer.stream import StreamCache
from refimpl.validation import check_cotangent

__all__ = ["AttentionStreamCache", "AttentionStreamLayer"]


class AttentionStreamCache(NamedTuple):
    """What :meth:`AttentionStreamLayer.backward` reads, and what the diagnostics log.

    Attributes
    ----------
    attention : object
        F1, the attention's cache; its ``scores`` are the study's ``malog_e['attention']``.
    attention_out : (N, D) array
        The attention's output, the study's ``malog_h['attention']``.
    stream : StreamCache
        F2.
    out : (N, D) array
        The layer's output.
    state : dict
        The running statistics after this call, keys ``stream.*``.
    noise : dict
        The keep-masks used, as ``forward(noise=...)`` takes them.
    """

    attention: Any
    attention_out: Any
    stream: StreamCache
    out: Any
    state: dict[str, Any]
    noise: dict[str, Any]

    @property
    def scores(self) -> Any:
        """``(P, H, d)`` the attention's per-pair scores (the study's ``malog_e``)."""
        return self.attention.scores


class AttentionStreamLayer:
    """The shared body of :class:`GraphiTLayer` and :class:`SANLayer`: ``out =
    TransformerStream(Attention(h, ...), h)`` (module docstring). A subclass sets ``blocks``
    (``"attention"``, ``"stream"``) and ``SCORES_OUTPUT``, and its ``forward`` calls
    :meth:`_forward_layer` with the attention's inputs after ``h``."""

    # whether the attention returns (out, scores) and takes (d_out, d_scores) (GraphiT) or
    # returns out alone (SAN)
    SCORES_OUTPUT: ClassVar[bool] = False
    blocks: dict[str, Any]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``attention.*`` then ``stream.*``, in order."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Each block's own initialisation, drawn from ``rng`` in parameter order."""
        return init_flat_params(self.blocks, rng, backend, dtype)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """The stream's running statistics, ``stream.*``."""
        return {f"stream.{k}": v for k, v in self.blocks["stream"].state_shapes().items()}

    def init_state(self, backend: str | None = None, dtype: Any = np.float64) -> dict[str, Any]:
        """The stream's initial running statistics, ``stream.*``."""
        state = self.blocks["stream"].init_state(backend=backend, dtype=dtype)
        return {f"stream.{k}": v for k, v in state.items()}

    def _forward_layer(
        self,
        params: dict[str, Any],
        h: Any,
        attention_inputs: tuple[Any, ...],
        training: bool,
        rng: np.random.Generator | None,
        noise: dict[str, Any] | None,
        state: dict[str, Any] | None,
    ) -> tuple[Any, AttentionStreamCache]:
        """F1-F2 for ``h (N, D)`` and the attention's further inputs ``attention_inputs``;
        ``state`` keyed ``stream.*`` (None: the initial statistics, training only)."""
        stream_state = None
        if state is not None:
            stream_state = {k.removeprefix("stream."): v for k, v in state.items()}
        # F1 the attention (N, D)
        a, attention = self.blocks["attention"].forward(
            split_params(self.blocks, params, "attention"), h, *attention_inputs
        )
        if self.SCORES_OUTPUT:
            a = a[0]
        # F2 the node stream (N, D)
        out, stream = self.blocks["stream"].forward(
            split_params(self.blocks, params, "stream"),
            a,
            h,
            training=training,
            rng=rng,
            noise=noise,
            state=stream_state,
        )
        new_state = {f"stream.{k}": v for k, v in stream.state.items()}
        return out, AttentionStreamCache(attention, a, stream, out, new_state, stream.noise)

    def backward(
        self, params: dict[str, Any], cache: AttentionStreamCache, d_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``((d_h (N, D), d_e (P, D)), d_params)``."""
        check_cotangent(d_out, cache.out.shape, cache.out.dtype, cache.out, name="d_out")
        d_params: dict[str, Any] = {}
        # B2 (of F2) the stream: to the attention output and to the residual input h
        d_a, d_residual = block_backward(
            self.blocks, params, "stream", cache.stream, d_out, d_params
        )
        # B1 (of F1) the attention (its scores unused); h also fed the residual
        d_attention = (d_a, None) if self.SCORES_OUTPUT else d_a
        d_h, d_e = block_backward(
            self.blocks, params, "attention", cache.attention, d_attention, d_params
        )
        return (d_h + d_residual, d_e), {name: d_params[name] for name in params}
