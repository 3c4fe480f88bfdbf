"""``TransformerStream``: what the released graph transformers do around an attention output,
for one stream (the nodes, or the edges), in the released code's order.

Dwivedi & Bresson's GT (``graph_transformer_edge_layer.py``, ``GraphTransformerLayer.forward``
in the massive-activation study's code; GraphiT-GT and SAN's layers have the same skeleton)
takes the attention output ``a`` and the layer's input ``x`` of one stream (``M`` rows:
``M = N`` nodes, or ``M = E`` edges) and computes, with ``D = channels`` and
``d_ff = ffn_channels`` (default ``2 D``)::

    F1  a = Dropout(a)                          (M, D)     F.dropout(h, dropout)
    F2  a = a W_O^T + b_O                       (M, D)     O_h / O_e
    F3  r = x + a    (residual; r = a without)  (M, D)     h_in1 + h
    F4  z = Norm_1(r)                           (M, D)     layer_norm1_h, batch_norm1_h
    F5  f = ReLU(z W_1^T + b_1)                 (M, d_ff)  FFN_h_layer1, F.relu
    F6  f = Dropout(f)                          (M, d_ff)  F.dropout
    F7  f = f W_2^T + b_2                       (M, D)     FFN_h_layer2
    F8  y = z + f    (residual; y = f without)  (M, D)     h_in2 + h
    F9  out = Norm_2(y)                         (M, D)     layer_norm2_h, batch_norm2_h

Unlike the supplement's layer (:mod:`refimpl.nn.transformer.graph_transformer_layer`), the
first dropout comes before ``W_O`` and the second between the two FFN layers, as released.

``Norm`` is ``norm``: ``"batch"`` (``torch.nn.BatchNorm1d`` over the ``M`` rows, the released
default), ``"layer"`` (``torch.nn.LayerNorm`` per row), ``"none"``, or ``"layer+batch"``
(both, LayerNorm first: the released code applies ``layer_norm`` then ``batch_norm`` when both
flags are set).

Parameters, in order: ``output.W (D, D)``, ``output.b``, ``norm1.weight (D,)``,
``norm1.bias``, ``ffn1.W (d_ff, D)``, ``ffn1.b``, ``ffn2.W (D, d_ff)``, ``ffn2.b``,
``norm2.weight``, ``norm2.bias``; with ``"layer+batch"`` each norm is two blocks,
``layer_norm1.*`` then ``batch_norm1.*`` (and ``layer_norm2``, ``batch_norm2``), named as
released. State (BatchNorm's running statistics): ``norm1.running_mean (D,)``,
``norm1.running_var``, likewise ``norm2`` (``batch_norm1`` and ``batch_norm2`` with both
norms); empty without batch norm.

Randomness: ``noise`` keys ``dropout1`` ``(M, D)`` (F1) and ``dropout2`` ``(M, d_ff)`` (F6),
keep-masks drawn from ``rng`` in that order when not given and used (training with
``dropout > 0``); ``cache.noise`` holds the masks used, so ``forward(noise=cache.noise)``
replays a step exactly.

Empty streams (``M = 0``: a graph without edges, for the edge stream): the output is
``(0, D)``, every norm is the identity on no rows (torch's ``batch_norm`` on an empty batch
leaves its running statistics alone, and so does this), and the gradients are zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module
from refimpl.fields import check_bool, check_choice, check_positive_int, check_probability
from refimpl.nn.norms.batchnorm import BATCHNORM_STATE, BatchNorm
from refimpl.nn.norms.layernorm import LayerNorm
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.nn.stacks import (
    accumulate_grads,
    block_backward,
    flat_param_shapes,
    init_flat_params,
    split_params,
)
from refimpl.ops.activations import ReLU, SignCache
from refimpl.ops.dropout import Dropout, DropoutCache, recorded_dropout
from refimpl.ops.linear import Linear, LinearCache
from refimpl.validation import (
    check_block_inputs,
    check_cotangent,
    check_input,
    check_keys,
    check_like,
    check_rng,
)

__all__ = ["STREAM_NORMS", "StreamCache", "TransformerStream"]

# the choices of ``norm``, each the norm blocks of one step in the order applied
STREAM_NORMS = {
    "batch": ("batch",),
    "layer": ("layer",),
    "none": (),
    "layer+batch": ("layer", "batch"),
}
NOISE_KEYS = ("dropout1", "dropout2")


class StreamCache(NamedTuple):
    """What :meth:`TransformerStream.backward` reads, and what a model logs.

    Attributes
    ----------
    dropout1 : DropoutCache
        F1.
    output : LinearCache
        F2.
    norm1 : tuple of (str, object)
        F4: ``(prefix, cache)`` per norm block; None on no rows.
    ffn1 : LinearCache
        F5.
    relu : SignCache
        F5.
    dropout2 : DropoutCache
        F6.
    ffn2 : LinearCache
        F7.
    norm2 : tuple of (str, object)
        F9, as ``norm1``.
    out : (M, D) array
        The stream's output.
    state : dict
        The running statistics after this call (a new dict).
    noise : dict
        The keep-masks used, as forward(noise=...) takes them.
    """

    dropout1: DropoutCache
    output: LinearCache
    norm1: tuple[tuple[str, Any], ...]
    ffn1: LinearCache
    relu: SignCache
    dropout2: DropoutCache
    ffn2: LinearCache
    norm2: tuple[tuple[str, Any], ...]
    out: Any
    state: dict[str, Any]
    noise: dict[str, Any]


@dataclass(frozen=True)
class TransformerStream:
    r"""Dropout, output projection, residual, norm, FFN, residual, norm around an attention
    output, in the order of the released GT layer (the module docstring has the steps).

    On an attention output $a$ and the stream's input $x$ (the output projection, residuals,
    norms and FFN of Dwivedi & Bresson (2021) Eq. (9)-(14), in the released order, F1-F9):

    $$
    z = \operatorname{Norm}_1\left(x + \operatorname{Drop}(a) W_O^\top + b_O\right), \quad
    y = \operatorname{Norm}_2\left(z + \operatorname{Drop}\left(\operatorname{ReLU}(z W_1^\top
    + b_1)\right) W_2^\top + b_2\right)
    $$

    (without ``residual`` the $x +$ and $z +$ terms are dropped; ``norm="none"``: identities).

    Parameters
    ----------
    channels : int
        ``D``, the width of the attention output, of the residual input and of the output.
    ffn_channels : int or None
        ``d_ff``, the FFN's hidden width; None (default) is ``2 D``, as released.
    dropout : float
        Drop probability of F1 and F6, in ``[0, 1)``; default 0.
    norm : str
        ``"batch"`` (default, as released), ``"layer"``, ``"none"`` or ``"layer+batch"``.
    residual : bool
        Add the input at F3 and F4's output at F8; default True, as released.

    Shapes
    ------
    attn_out : (M, D); residual_in : (M, D); out : (M, D). ``M`` is any number of rows,
    0 included.
    """

    channels: int  # D
    ffn_channels: int | None = None  # d_ff; None: 2 D (FFN_h_layer1 is out_dim -> out_dim * 2)
    dropout: float = 0.0  # F1 and F6 (the released layer's one ``dropout``)
    norm: str = "batch"  # the released default (layer_norm=False, batch_norm=True)
    residual: bool = True  # the released default
    # the parameterised blocks by parameter prefix, in parameter order; derived
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_int(self.channels, "TransformerStream channels")
        if self.ffn_channels is not None:  # 0 would mean the default, 2 D, silently
            check_positive_int(self.ffn_channels, "TransformerStream ffn_channels")
        check_probability(self.dropout, "TransformerStream dropout")
        check_choice(self.norm, STREAM_NORMS, "TransformerStream norm")
        object.__setattr__(
            self, "residual", check_bool(self.residual, "TransformerStream residual")
        )
        d, d_ff = self.channels, self.ffn_channels or 2 * self.channels
        blocks: dict[str, Any] = {"output": Linear(d, d)}
        blocks.update(self._norm_blocks(1))
        blocks["ffn1"] = Linear(d, d_ff)
        blocks["ffn2"] = Linear(d_ff, d)
        blocks.update(self._norm_blocks(2))
        object.__setattr__(self, "blocks", blocks)

    def _norm_blocks(self, step: int) -> dict[str, Any]:
        """The norm blocks of F4 (``step`` 1) or F9 (2) by prefix, in the order applied."""
        kinds = STREAM_NORMS[self.norm]
        made = {  # torch.nn.LayerNorm(D), torch.nn.BatchNorm1d(D), torch's defaults
            "layer": lambda: LayerNorm(self.channels, "node"),
            "batch": lambda: BatchNorm(self.channels),
        }
        if len(kinds) == 1:
            return {f"norm{step}": made[kinds[0]]()}
        return {f"{kind}_norm{step}": made[kind]() for kind in kinds}

    @property
    def norm_prefixes(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The prefixes of F4's and F9's norm blocks, in the order applied."""
        names = tuple(self.blocks)
        return (
            tuple(n for n in names if n.endswith("norm1")),
            tuple(n for n in names if n.endswith("norm2")),
        )

    # -- parameters and state -----------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``{block}.{name}`` and shapes, in order (module docstring)."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Each block's own initialisation, drawn from ``rng`` in parameter order:
        Glorot-uniform linears with zero biases (the project's :class:`Linear`; the released
        code keeps ``torch.nn.Linear``'s default), norms with ones and zeros."""
        return init_flat_params(self.blocks, rng, backend, dtype)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``{block}.running_mean`` / ``.running_var`` and shapes; ``{}`` without
        batch norm."""
        return {name: tuple(value.shape) for name, value in self.init_state("numpy").items()}

    def init_state(self, backend: str | None = None, dtype: Any = np.float64) -> dict[str, Any]:
        """Fresh running statistics of every batch norm (means 0, variances 1, as torch)."""
        return {
            f"{prefix}.{name}": value
            for prefix, block in self.blocks.items()
            if isinstance(block, BatchNorm)
            for name, value in block.init_state(backend=backend, dtype=dtype).items()
        }

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        attn_out: Any,
        residual_in: Any,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> tuple[Any, StreamCache]:
        """``out (M, D)`` from the attention output ``attn_out (M, D)`` and the stream's input
        ``residual_in (M, D)`` (read only with ``residual``); masks from ``noise`` or drawn
        from ``rng``; ``state`` the running statistics (None: :meth:`init_state`'s, allowed
        in training only: evaluation with batch norm reads them). ``cache.state`` holds the
        statistics after this call. Raises :class:`~refimpl.validation.NonFiniteError` where
        the output overflows the dtype."""
        check_block_inputs(
            params, self.param_shapes(), "TransformerStream", attn_out, self.channels, "attn_out"
        )
        check_input(residual_in, "residual_in", shape=tuple(attn_out.shape))
        check_like({"residual_in": residual_in}, attn_out, "attn_out", "TransformerStream")
        check_bool(training, "TransformerStream training")
        check_rng(rng, "TransformerStream rng")
        state = self._checked_state(state, training, attn_out)
        noise = dict(noise or {})
        unknown = sorted(set(noise) - set(NOISE_KEYS))
        if unknown:
            raise ValueError(
                f"noise has unknown keys {unknown}; TransformerStream takes 'dropout1' (M, D) "
                "and 'dropout2' (M, d_ff) keep-masks"
            )
        blocks, used, new_state = self.blocks, {}, dict(state)
        sub = lambda prefix: split_params(blocks, params, prefix)  # noqa: E731
        dropout = Dropout(self.dropout)
        norm1, norm2 = self.norm_prefixes

        # F1 dropout on the attention output
        a, dropout1 = recorded_dropout(dropout, "dropout1", attn_out, training, rng, noise, used)
        # F2 output projection W_O (M, D)
        a, output = blocks["output"].forward(sub("output"), a)
        # F3 residual
        r = residual_in + a if self.residual else a
        # F4 norm(s) (M, D)
        z, norm1_caches = self._norms(norm1, params, r, training, new_state)
        # F5 FFN hidden layer and ReLU (M, d_ff)
        f, ffn1 = blocks["ffn1"].forward(sub("ffn1"), z)
        f, relu = ReLU().forward({}, f)
        # F6 dropout
        f, dropout2 = recorded_dropout(dropout, "dropout2", f, training, rng, noise, used)
        # F7 FFN output layer (M, D)
        f, ffn2 = blocks["ffn2"].forward(sub("ffn2"), f)
        # F8 residual
        y = z + f if self.residual else f
        # F9 norm(s) (M, D)
        out, norm2_caches = self._norms(norm2, params, y, training, new_state)
        check_overflow(out, "TransformerStream.forward: its output", attn_out.dtype)
        cache = StreamCache(
            dropout1, output, norm1_caches, ffn1, relu, dropout2, ffn2, norm2_caches, out,
            new_state, used,
        )  # fmt: skip
        return out, cache

    def _checked_state(self, state: Any, training: bool, like: Any) -> dict[str, Any]:
        """``state`` with exactly :meth:`state_shapes`' keys, on ``like``'s backend and dtype
        (None: fresh statistics, in training only)."""
        shapes = self.state_shapes()
        if state is None:
            if shapes and not training:
                raise ValueError(
                    "TransformerStream with batch norm in evaluation reads its running "
                    "statistics: pass state= (cache.state of a training step, or "
                    "stream.init_state() for fresh ones)"
                )
            return self.init_state(dtype=like.dtype) if shapes else {}
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict of arrays or None, got {type(state).__name__}")
        check_keys(
            state,
            list(shapes),
            "TransformerStream state does not match its norms",
            "create it with init_state",
        )
        for name, shape in shapes.items():
            check_input(state[name], f"state[{name!r}]", shape=shape)
        check_like(state, like, "attn_out", "TransformerStream")
        return state

    def _norms(
        self,
        prefixes: tuple[str, ...],
        params: dict[str, Any],
        x: Any,
        training: bool,
        new_state: dict[str, Any],
    ) -> tuple[Any, tuple[tuple[str, Any], ...]]:
        """F4 / F9: the norm blocks ``prefixes`` in order; BatchNorm's new statistics go into
        ``new_state``. On no rows each is the identity (cache None)."""
        caches = []
        for prefix in prefixes:
            block = self.blocks[prefix]
            if x.shape[0] == 0:
                caches.append((prefix, None))
                continue
            if isinstance(block, BatchNorm):
                own = {n: new_state[f"{prefix}.{n}"] for n in BATCHNORM_STATE}
                x, cache = block.forward(
                    split_params(self.blocks, params, prefix), x, training, own
                )
                new_state.update({f"{prefix}.{n}": v for n, v in cache.state.items()})
            else:
                x, cache = block.forward(split_params(self.blocks, params, prefix), x)
            caches.append((prefix, cache))
        return x, tuple(caches)

    # -- backward ----------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: StreamCache, d_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``((d_attn_out, d_residual_in), d_params)``;
        ``d_residual_in`` is zero without ``residual``. Raises
        :class:`~refimpl.validation.NonFiniteError` where a gradient overflows the dtype."""
        check_cotangent(d_out, cache.out.shape, cache.out.dtype, cache.out, name="d_out")
        return backward_checked(
            lambda: self._backward(params, cache, d_out), "TransformerStream", d_out.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: StreamCache, d_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """B9-B1 of :meth:`backward` on a checked cotangent."""
        blocks, d_params = self.blocks, {}
        dropout = Dropout(self.dropout)
        # B9 (of F9) the norm(s), in reverse
        d_y = self._norms_backward(cache.norm2, params, d_out, d_params)
        # B8 (of F8) the residual sends the same gradient to z and f
        # B7 (of F7), B6 (of F6), B5 (of F5) the FFN and its dropout
        d_f = block_backward(blocks, params, "ffn2", cache.ffn2, d_y, d_params)
        d_f, _ = dropout.backward({}, cache.dropout2, d_f)
        d_f, _ = ReLU().backward({}, cache.relu, d_f)
        d_f = block_backward(blocks, params, "ffn1", cache.ffn1, d_f, d_params)
        d_z = d_y + d_f if self.residual else d_f
        # B4 (of F4) the norm(s)
        d_r = self._norms_backward(cache.norm1, params, d_z, d_params)
        # B3 (of F3) the residual: d_residual_in = d_r (zero without the residual)
        d_residual_in = d_r if self.residual else get_array_module(d_r).zeros_like(d_r)
        # B2 (of F2), B1 (of F1) the output projection and dropout
        d_a = block_backward(blocks, params, "output", cache.output, d_r, d_params)
        d_a, _ = dropout.backward({}, cache.dropout1, d_a)
        return (d_a, d_residual_in), {name: d_params[name] for name in params}

    def _norms_backward(
        self,
        caches: tuple[tuple[str, Any], ...],
        params: dict[str, Any],
        d_x: Any,
        d_params: dict[str, Any],
    ) -> Any:
        """B4 / B9: the norm blocks in reverse; on no rows (cache None) zero gradients."""
        for prefix, cache in reversed(caches):
            if cache is None:
                own = split_params(self.blocks, params, prefix)
                zeros = {n: get_array_module(v).zeros_like(v) for n, v in own.items()}
                accumulate_grads(d_params, prefix, zeros)
                continue
            d_x = block_backward(self.blocks, params, prefix, cache, d_x, d_params)
        return d_x
