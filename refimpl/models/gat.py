"""``GAT``: a deep graph attention network of ``GATConv`` layers, with hand-written backward.

The class docstring states the network (GAT-balance Def. 2.1), its arguments and shapes. The
forward's steps per layer: F1 input dropout, F2 ``GATConv``, F3 the skip, F4 PairNorm, F5 phi.

Randomness (docs/design.md): with ``rng`` the masks are drawn in this fixed order,
each only when its probability is > 0: layer 0 input mask ``(N, n_0)``, layer 0
attention mask ``(E, H_0)`` (over ``layers[0].prepare_graph(graph)``'s edges),
layer 1 input mask, layer 1 attention mask, ...; each as ``rng.random(shape) >= p``.
With ``noise``, the masks come from ``{"layer{l}.input_mask": ..., "layer{l}.attn_mask":
...}`` (bool, True = keep, on ``x``'s backend); ``cache.noise`` returns those used.

PairNorm breaks GAT-balance's conservation law (the rescaling a layer's norm undoes is not
matched by the next layer): balanced initialisation still runs, but its Thm 2.2 no longer
holds. The residual acts on the dropped input ``d`` (the tensor the attention sees), as PyG's
``GATConv(residual=True)`` and DGL's ``GATConv`` do; its weight is zero under every
initialisation scheme, so a balanced network stays balanced. Inside
:func:`refimpl.nn.gat.fused_kernels` a device backend runs the layers' fused kernels and ELU's.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refimpl.backend import asarray
from refimpl.fields import (
    check_bool,
    check_choice,
    check_nonnegative_number,
    check_positive_int,
    check_probability,
)
from refimpl.graph import Graph
from refimpl.init import INITIALISERS
from refimpl.models.gat_cache import GATLayerCache, GATModelCache
from refimpl.nn.gat.conv import GATConv
from refimpl.nn.gat.fused_path import FusedELU, fused_kernels_on
from refimpl.nn.norms.pairnorm import PAIRNORM_MODES, PairNorm
from refimpl.nn.overflow import check_overflow
from refimpl.ops.activations import ACTIVATIONS, get_activation
from refimpl.ops.dropout import Dropout
from refimpl.ops.linear import Linear
from refimpl.validation import (
    NonFiniteError,
    check_block_inputs,
    check_cotangent,
    check_graph_rows,
    check_keys,
    check_params,
    check_rng,
)

__all__ = ["GAT", "GATLayerCache", "GATModelCache"]


@dataclass(frozen=True)
class GAT:
    r"""A deep GAT: ``num_layers`` :class:`~refimpl.nn.GATConv` layers with dropout, activation
    and optional residuals and PairNorm (the network of GAT-balance Def. 2.1).

    Layer $l = 1, \dots, L$ maps $\mathbf{h}^{l-1}$ (width $n_{l-1}$, $\mathbf{h}^0 =
    \mathbf{x}$) to $\mathbf{h}^l$ (width $n_l$) by GAT-balance (Mustafa et al. 2023) Eq. (1):

    $$
    \mathbf{h}^l = \phi\big(\operatorname{PN}(\operatorname{GATConv}_l(\mathbf{d}^l)
    + \mathbf{d}^l \mathbf{W}_{res}^{l\top})\big),
    \qquad
    \mathbf{d}^l = \operatorname{Dropout}(\mathbf{h}^{l-1})
    $$

    with the skip only with ``residual`` and PairNorm (Zhao & Akoglu 2020; the GAT-Pn
    baseline of LipschitzNorm Table 1) only with ``pairnorm``. Hidden layers concatenate their
    $H_l$ heads ($n_l = H_l C$), or average them ($n_l = C$, GAT-balance Thm 6.4); the last
    averages its heads and has no PN or $\phi$ (as PyG's ``GAT``): its output is logits.

    Parameters
    ----------
    in_channels : int
        $n_0$, the input features.
    hidden_channels : int
        $C$, the width per head of the hidden layers.
    out_channels : int
        $n_L$, the logits.
    num_layers : int
        $L \ge 1$; 1 is a single layer from input to logits.
    heads : int or sequence of int, default 1
        $H_l$: one count for every layer, or one per layer.
    version : {"v1", "v2"}, default "v2"
        Every layer's score; GAT-balance's GAT is GATv2 (its footnote 1).
    share_weights : bool, default True
        $\mathbf{W}_s = \mathbf{W}_t$ (v2), as GAT-balance Def. 2.1.
    bias : bool, default False
        Every layer's output bias (Def. 2.1 has none).
    activation : {"relu", "leaky_relu", "elu", "identity"}, default "relu"
        $\phi$, between layers.
    activation_slope : float, default 0.01
        $\phi$'s negative slope for ``"leaky_relu"`` (PyTorch's default).
    dropout : float, default 0.0
        Dropout probability in $[0, 1)$ on every layer's input (the GAT paper: 0.6).
    attn_dropout : float, default 0.0
        Dropout probability on the attention coefficients (GATConv's ``dropout``; 0.6).
    residual : bool, default False
        The skip $\mathbf{d}^l \mathbf{W}_{res}^{l\top}$ (``layer{l}.res_W``), zero at init.
    negative_slope : float, default 0.2
        The attention's LeakyReLU slope (the GAT paper; PyG's default).
    add_self_loops : bool, default True
        Every layer replaces the self-loops by one per node (PyG's default).
    concat : bool, default True
        Hidden layers concatenate their heads; False averages them.
    lipschitz_norm : {None, "paper", "reference-code"}, default None
        Every layer's scores normalised by LipschitzNorm (:class:`~refimpl.nn.GATConv`).
    pairnorm : {None, "PN", "PN-SI", "PN-SCS"}, default None
        :class:`~refimpl.nn.PairNorm` (PyG's defaults) on hidden layers, before $\phi$.

    Shapes
    ------
    - **input**: ``x`` $(N, n_0)$; ``graph`` with $E$ edges on $N$ nodes
    - **output**: logits $(N, n_L)$
    - **backward**: ``d_logits`` $(N, n_L)$; returns ``d_x`` $(N, n_0)$ and ``d_params``
    - **params**: one flat dict ``layer{l}.{name}`` ($l$ from 0, ``name`` as
      ``GATConv.param_shapes``), then ``layer{l}.res_W`` $(n_l, n_{l-1})$ with ``residual``
    """

    in_channels: int  # n_0, input features
    hidden_channels: int  # C per head in hidden layers
    out_channels: int  # n_L, logits
    num_layers: int  # L >= 1; 1 is a single layer in -> out
    heads: int | Sequence[int] = 1  # H for every layer, or one per layer
    version: str = "v2"  # GAT-balance's GAT is GATv2 (its footnote 1)
    share_weights: bool = True  # W_s = W_t, GAT-balance Def. 2.1
    bias: bool = False  # Def. 2.1 has none
    activation: str = "relu"  # phi, by get_activation name
    activation_slope: float = 0.01  # phi's negative slope for "leaky_relu" (PyTorch default)
    dropout: float = 0.0  # on every layer's input; GAT paper: 0.6
    attn_dropout: float = 0.0  # on the attention coefficients; GAT paper: 0.6
    residual: bool = False  # linear skip d W_res^T, zero-initialised
    negative_slope: float = 0.2  # the attention's LeakyReLU; GAT paper, PyG default
    add_self_loops: bool = True  # PyG default
    concat: bool = True  # hidden layers concatenate heads; False averages them (Thm 6.4)
    lipschitz_norm: str | None = None  # every layer's scores: None | "paper" | "reference-code"
    pairnorm: str | None = None  # hidden layers' outputs before phi: None | PairNorm mode
    layers: tuple[GATConv, ...] = field(init=False, repr=False, compare=False)  # derived

    def __post_init__(self) -> None:
        for name in ("in_channels", "hidden_channels", "out_channels", "num_layers"):
            check_positive_int(getattr(self, name), f"GAT {name}")  # at most 2**31 - 1
        for name in ("dropout", "attn_dropout"):
            check_probability(getattr(self, name), f"GAT {name}")
        check_nonnegative_number(self.negative_slope, "GAT negative_slope")  # NaN, inf fail
        for name in ("share_weights", "bias", "residual", "add_self_loops", "concat"):
            object.__setattr__(self, name, check_bool(getattr(self, name), f"GAT {name}"))
        check_choice(self.activation, ACTIVATIONS, "GAT activation")
        # checked whatever the activation: a slope that means nothing is no setting to keep
        check_nonnegative_number(self.activation_slope, "GAT activation_slope")
        if self.pairnorm is not None and self.pairnorm not in PAIRNORM_MODES:
            raise ValueError(
                f"GAT pairnorm must be None or a PairNorm mode "
                f"({', '.join(map(repr, PAIRNORM_MODES))}), got {self.pairnorm!r}"
            )
        heads = self._heads_per_layer()
        if not isinstance(self.heads, int):
            object.__setattr__(self, "heads", heads)
        layers, width = [], self.in_channels
        for i, layer_heads in enumerate(heads):
            last = i == self.num_layers - 1
            conv = GATConv(
                in_channels=width,
                out_channels=self.out_channels if last else self.hidden_channels,
                heads=layer_heads,
                concat=self.concat and not last,
                version=self.version,
                share_weights=self.share_weights,
                negative_slope=self.negative_slope,
                add_self_loops=self.add_self_loops,
                bias=self.bias,
                dropout=self.attn_dropout,
                lipschitz_norm=self.lipschitz_norm,
            )
            layers.append(conv)
            width = _out_width(conv)
        object.__setattr__(self, "layers", tuple(layers))

    def _heads_per_layer(self) -> tuple[int, ...]:
        heads = self.heads
        if isinstance(heads, numbers.Integral) and not isinstance(heads, bool):
            heads = (heads,) * self.num_layers
        if (
            isinstance(heads, str)
            or not isinstance(heads, Sequence)
            or len(heads) != self.num_layers
        ):
            raise ValueError(
                f"GAT heads must be an int or a sequence of num_layers={self.num_layers} ints "
                f"(one head count per layer), got {heads!r}"
            )
        if any(isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in heads):
            raise ValueError(f"GAT heads must be positive ints, got {heads!r}")
        for h in heads:
            check_positive_int(h, "GAT heads")  # at most 2**31 - 1
        return tuple(int(h) for h in heads)

    @property
    def deterministic_training(self) -> bool:
        """Whether a training forward is a function of the parameters alone (no dropout drawn)."""
        return self.dropout == 0 and self.attn_dropout == 0

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``layer{l}.{name}`` and shapes, in order (layer by layer)."""
        shapes = {}
        for i, conv in enumerate(self.layers):
            for name, shape in conv.param_shapes().items():
                shapes[f"layer{i}.{name}"] = shape
            if self.residual:
                shapes[f"layer{i}.res_W"] = (_out_width(conv), conv.in_channels)
        return shapes

    def layer_params(self, params: dict[str, Any], i: int) -> dict[str, Any]:
        """Layer ``i``'s ``GATConv`` parameters under their ``GATConv`` names (no ``res_W``)."""
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer {i} out of range for a GAT with {self.num_layers} layers")
        return {name: params[f"layer{i}.{name}"] for name in self.layers[i].param_shapes()}

    def init_params(
        self,
        rng: np.random.Generator,
        init: str = "xavier",
        backend: str | None = None,
        dtype: Any = np.float64,
    ) -> dict[str, Any]:
        """Parameters from the scheme ``INITIALISERS[init]``, moved to ``backend`` in ``dtype``.

        Drawn on the host in float64 (so every backend and dtype gets the same
        numbers for one seed). Schemes: :data:`refimpl.init.INITIALISERS`.
        """
        if not isinstance(init, str) or init not in INITIALISERS:  # a list is unhashable
            raise ValueError(
                f"unknown init {init!r}; valid schemes are {', '.join(sorted(INITIALISERS))}"
            )
        host = INITIALISERS[init](self, rng)
        check_params(host, self.param_shapes(), f"GAT init {init!r}")
        return {name: asarray(host[name], backend=backend, dtype=dtype) for name in host}

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        x: Any,
        graph: Graph,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
    ) -> tuple[Any, GATModelCache]:
        """Logits ``(N, out_channels)`` for features ``x`` ``(N, in_channels)`` on ``graph``.

        ``training=False``: no dropout; ``rng`` and ``noise`` are ignored.
        ``training=True``: masks from ``noise`` if given (it must hold exactly the
        masks needed, see the module docstring), else drawn from ``rng``.
        Returns ``(logits, cache)``; ``cache.noise`` holds the masks used.
        """
        self._check_inputs(params, x, graph)
        check_bool(training, "GAT training")
        check_rng(rng, "GAT rng")
        noise = self._check_noise(rng, noise) if training else {}
        phi = self._phi()
        h, layer_caches = x, []
        for i, conv in enumerate(self.layers):
            try:
                h, layer_cache = self._layer_forward(
                    i, conv, params, h, graph, training, rng, noise, phi
                )
            except NonFiniteError as err:  # finite params and input: an overflow in layer i
                raise NonFiniteError(f"in layer{i}: {err}") from err
            layer_caches.append(layer_cache)
        return h, GATModelCache(tuple(layer_caches))

    def _layer_forward(
        self,
        i: int,
        conv: GATConv,
        params: dict[str, Any],
        h: Any,
        graph: Graph,
        training: bool,
        rng: Any,
        noise: dict[str, Any],
        phi: Any,
    ) -> tuple[Any, GATLayerCache]:
        """Steps F1-F5 of :meth:`forward` for layer ``i``: ``(h_next, cache)``."""
        # F1 input dropout (N, n_{l-1}); h is x, checked in forward, or the previous layer's
        # output, checked for overflow there: not checked again
        h_in, dropout_cache = Dropout(self.dropout).forward_unchecked(
            {}, h, training=training, rng=rng, mask=noise.get(f"layer{i}.input_mask")
        )
        # F2 attention and aggregation, GAT-balance Eq. 1-2 before phi (N, n_l)
        attn_mask = noise.get(f"layer{i}.attn_mask")  # (E, H_l) or None: draw from rng
        layer_params = self.layer_params(params, i)
        # parameters, x and the graph were checked once in forward; what is left to catch
        # is an overflow inside the layer, checked on its output (N, n_l)
        z, conv_cache = conv.forward_unchecked(
            layer_params, h_in, conv.prepare_graph(graph), training, rng, attn_mask
        )
        check_overflow(z, "GATConv.forward: its output", z.dtype)
        # F3 linear skip from the same (dropped) input (N, n_l)
        residual_cache = None
        if self.residual:
            skip, residual_cache = _skip(conv).forward({"W": params[f"layer{i}.res_W"]}, h_in)
            z = z + skip
        norm_cache = activation_cache = None
        if i < self.num_layers - 1:
            # F4 PairNorm over the nodes (N, n_l)
            if self.pairnorm is not None:
                z, norm_cache = PairNorm(self.pairnorm).forward({}, z)
            # F5 phi of Eq. 1 on hidden layers; the last layer's z are the logits
            z, activation_cache = phi.forward({}, z)
        return z, GATLayerCache(
            dropout_cache, conv_cache, residual_cache, norm_cache, activation_cache
        )

    # -- backward ----------------------------------------------------------------------
    def backward(
        self,
        params: dict[str, Any],
        cache: GATModelCache,
        d_logits: Any,
        input_grad: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of a scalar loss: ``(d_x (N, in_channels), d_params keyed like params)``.

        ``input_grad=False`` skips the gradient for the input features (``d_x`` is
        ``None``), which training never needs.
        """
        h_in = cache.layers[0].conv.x  # (N, n_0): x's rows, dtype and backend
        shape = (h_in.shape[0], self.out_channels)
        check_cotangent(d_logits, shape, h_in.dtype, h_in, name="d_logits")
        check_bool(input_grad, "GAT input_grad")
        phi = self._phi()
        d_params: dict[str, Any] = {}
        d_h = d_logits
        for i in reversed(range(self.num_layers)):
            conv, layer_cache = self.layers[i], cache.layers[i]
            # B5 (of F5)
            if layer_cache.activation is not None:
                d_h, _ = phi.backward({}, layer_cache.activation, d_h)
            # B4 (of F4)
            if layer_cache.norm is not None:
                d_h, _ = PairNorm(self.pairnorm).backward({}, layer_cache.norm, d_h)
            # B3 (of F3) the skip's gradient into the dropped input, accumulated below
            d_skip = None
            if self.residual:
                d_skip, d_res = _skip(conv).backward(
                    {"W": params[f"layer{i}.res_W"]}, layer_cache.residual, d_h
                )
                d_params[f"layer{i}.res_W"] = d_res["W"]
            # B2 (of F2)
            needed = input_grad or i > 0
            d_h_in, d_conv = conv.backward(
                self.layer_params(params, i), layer_cache.conv, d_h, input_grad=needed
            )
            for name, grad in d_conv.items():
                d_params[f"layer{i}.{name}"] = grad
            if not needed:
                d_h = None
                break
            if d_skip is not None:
                d_h_in = d_h_in + d_skip
            # B1 (of F1)
            d_h, _ = Dropout(self.dropout).backward({}, layer_cache.input_dropout, d_h_in)
        return d_h, {name: d_params[name] for name in params}

    # -- helpers -----------------------------------------------------------------------
    def _phi(self) -> Any:
        """The activation between layers (Eq. 1's ``phi``)."""
        if self.activation == "leaky_relu":
            return get_activation("leaky_relu", negative_slope=self.activation_slope)
        if self.activation == "elu" and fused_kernels_on():  # one kernel each way, on a device
            return FusedELU()
        return get_activation(self.activation)

    def _check_noise(self, rng: Any, noise: dict[str, Any] | None) -> dict[str, Any]:
        """The masks to replay in training (``{}``: draw from ``rng``); keys in draw order."""
        needed = [
            f"layer{i}.{key}"
            for i in range(self.num_layers)
            for key, p in (("input_mask", self.dropout), ("attn_mask", self.attn_dropout))
            if p > 0
        ]
        if needed and rng is None and noise is None:
            raise ValueError(
                f"GAT(dropout={self.dropout}, attn_dropout={self.attn_dropout}) in training "
                "mode needs randomness: pass rng=numpy.random.default_rng(seed) or noise= "
                "(a dict of keep-masks, e.g. a previous cache.noise), or training=False"
            )
        if not needed or noise is None:
            return {}
        check_keys(
            noise,
            needed,
            "noise does not match the masks this forward draws",
            "pass exactly these keep-masks",
        )
        return noise

    def _check_inputs(self, params: dict[str, Any], x: Any, graph: Graph) -> None:
        check_block_inputs(params, self.param_shapes(), "GAT", x, self.in_channels, sparse=True)
        check_graph_rows(x, graph)


def _out_width(conv: GATConv) -> int:
    """``n_l``: the layer's output width (heads concatenated or averaged)."""
    return conv.heads * conv.out_channels if conv.concat else conv.out_channels


def _skip(conv: GATConv) -> Linear:
    """The residual block of a layer: ``d W_res^T``, ``(N, n_{l-1}) -> (N, n_l)``."""
    return Linear(conv.in_channels, _out_width(conv), bias=False)
