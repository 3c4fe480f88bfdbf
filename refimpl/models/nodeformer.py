"""``NodeFormer``: the node classifier of Wu et al. (2022), App. C, with hand-written backward.

The model of the authors' ``NodeFormer`` class (github.com/qitianwu/NodeFormer,
``nodeformer.py``, without its ``use_jk`` option); the class docstring states it, its
arguments and shapes. Forward steps: F1-F4 the input MLP (ELU: App. C.1, "only used for
input MLP"), F5-F9 each layer (conv, residual, LayerNorm, ELU, dropout), F10 the output map.
The edge loss (the code: ``loss -= lamda * sum(link_loss_) / len(link_loss_)``) reads each
layer's input and ``W_q, b_q, W_k, b_k``: :meth:`NodeFormer.backward` returns the gradient of
``<d_logits, logits> + lambda L_e``, the objective once ``d_logits`` is that of ``L_s``.

Randomness (docs/design.md). Keys of ``noise`` and ``cache.noise``, drawn from ``rng`` in
this order when not given: ``input.dropout`` ``(N, D)`` keep-mask; then per layer
``layer{l}.projection`` ``(m, D)`` and ``layer{l}.gumbel`` ``(N, heads, K)`` (the
conv's own order and shapes) and ``layer{l}.dropout`` ``(N, D)``. Each only when
used: masks when ``training`` and ``dropout > 0``, Gumbel noise when ``training``
and ``use_gumbel``; projections always. In evaluation without ``rng`` or a given
projection, layer ``l`` uses ``draw_projection(default_rng([eval_seed, l]), ...)``,
the same every call: evaluation (and model selection on it) is deterministic.
The code instead redraws ``omega`` at every call from a seed taken from ``sum(q)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refimpl.backend import asarray, backend_name, get_array_module
from refimpl.fields import (
    check_bool,
    check_nonnegative_int,
    check_nonnegative_number,
    check_positive_int,
    check_probability,
)
from refimpl.graph import Graph
from refimpl.models.nodeformer_cache import NodeFormerLayerCache, NodeFormerModelCache
from refimpl.nn.nodeformer.conv import NodeFormerConv
from refimpl.nn.nodeformer.edge_loss import EDGE_LOSS_CONVENTIONS, NodeFormerEdgeLoss
from refimpl.nn.nodeformer.random_features import draw_projection
from refimpl.nn.norms.layernorm import LayerNorm
from refimpl.nn.stacks import (
    accumulate_grads,
    block_backward,
    flat_param_shapes,
    init_flat_params,
    split_params,
)
from refimpl.ops.activations import ELU
from refimpl.ops.dropout import Dropout, DropoutCache, recorded_dropout
from refimpl.ops.linear import Linear
from refimpl.validation import NonFiniteError, check_block_inputs, check_cotangent, check_rng

__all__ = ["NodeFormer", "NodeFormerLayerCache", "NodeFormerModelCache"]


@dataclass(frozen=True)
class NodeFormer:
    r"""NodeFormer (Wu et al. 2022): input MLP, ``num_layers`` :class:`~refimpl.nn.NodeFormerConv`
    layers, output MLP, and the edge-level loss.

    With $D$ = ``hidden_channels``, LN a LayerNorm, and layers $l = 0, \dots, L - 1$ (App. C;
    the layer is NodeFormer Alg. 1, Eq. (7)-(8)):

    $$
    \begin{gathered}
    \mathbf{h}^0 = \operatorname{Dropout}(\operatorname{ELU}(\operatorname{LN}(
    \mathbf{W}_{in} \mathbf{x} + \mathbf{b}_{in}))) \\
    \mathbf{h}^{l+1} = \operatorname{Dropout}(\operatorname{ELU}(\operatorname{LN}_l(
    \operatorname{NodeFormerConv}_l(\mathbf{h}^l) + \mathbf{h}^l)))
    \end{gathered}
    $$

    (residual, LN and ELU each as configured) and logits $\mathbf{W}_{out} \mathbf{h}^L +
    \mathbf{b}_{out}$. The training objective is $\mathcal{L}_s + \lambda \mathcal{L}_e$
    (Sec. 3.4, Eq. (9)-(10)), $\mathcal{L}_e = \frac{1}{L} \sum_l \mathcal{L}_e^{(l)}$ the
    mean of each layer's Eq. (10) (:class:`~refimpl.nn.NodeFormerEdgeLoss`): ``cache.edge_loss``
    holds $\mathcal{L}_e$, :meth:`auxiliary_loss` $\lambda \mathcal{L}_e$. The defaults are
    the authors' Cora run (``run.sh``).

    Parameters
    ----------
    in_channels : int
        $F$, the input features.
    hidden_channels : int, default 32
        $D$, the width of every layer (and of each head).
    out_channels : int, default 2
        The classes (logits).
    num_layers : int, default 2
        $L$, the conv layers.
    heads : int, default 4
        Heads per conv layer.
    num_random_features : int, default 30
        $m$ of every conv layer.
    tau : float, default 0.25
        The temperature $\tau > 0$.
    num_samples : int, default 10
        $K$, Gumbel samples per head.
    use_gumbel : bool, default True
        Gumbel noise in training (never in evaluation).
    relational_bias : {None, "sigmoid", "identity"}, default "sigmoid"
        The conv layers' relational bias (:class:`~refimpl.nn.NodeFormerConv`).
    rb_order : int, default 2
        $r$, its orders.
    rb_powers : {"paper", "authors"}, default "paper"
        Its matrices $\mathbf{A}_j$ (:class:`~refimpl.nn.NodeFormerConv`).
    qk_scale : {"paper", "sqrt_d"}, default "paper"
        The factor on queries and keys (:class:`~refimpl.nn.NodeFormerConv`).
    projection : {"orthogonal", "iid"}, default "orthogonal"
        How each layer's $\boldsymbol{\omega}$ is drawn.
    residual : bool, default True
        Add the layer's input to its output (the code's ``use_residual``).
    layer_norm : bool, default True
        LayerNorm after each conv layer (the code's ``use_bn``).
    activation : bool, default False
        ELU after each conv layer (the code's ``use_act``; App. C.1 off, C.2 on).
    dropout : float, default 0.0
        Dropout probability in $[0, 1)$ after the input MLP and after every layer.
    edge_loss_weight : float, default 1.0
        $\lambda \ge 0$ (Sec. 3.4); 0 switches the edge loss off.
    edge_loss_convention : {"paper", "authors"}, default "paper"
        How $\mathcal{L}_e^{(l)}$ is computed (:class:`~refimpl.nn.NodeFormerEdgeLoss`).
    eval_seed : int, default 0
        Seeds the fixed projections of an evaluation without ``rng`` (module docstring).

    Shapes
    ------
    - **input**: ``x`` $(N, F)$; ``graph`` on $N$ nodes; ``noise`` as ``cache.noise``
    - **output**: logits $(N, \text{out\_channels})$; ``cache.noise`` the draws used
    - **backward**: ``d_logits`` as the logits; returns ``d_x`` $(N, F)$ and ``d_params``
    - **params**, in order: ``input.W`` $(D, F)$, ``input.b``, ``input_norm.weight``,
      ``input_norm.bias``, per layer ``layer{l}.`` and the conv's names, then
      ``layer{l}.norm.weight``, ``.bias`` (``layer_norm``); ``output.W``
      $(\text{out\_channels}, D)$, ``output.b``
    """

    in_channels: int
    hidden_channels: int = 32  # D
    out_channels: int = 2  # classes
    num_layers: int = 2  # L conv layers
    heads: int = 4
    num_random_features: int = 30  # m
    tau: float = 0.25
    num_samples: int = 10  # K
    use_gumbel: bool = True
    relational_bias: str | None = "sigmoid"  # None | "sigmoid" | "identity"
    rb_order: int = 2
    rb_powers: str = "paper"  # see NodeFormerConv
    qk_scale: str = "paper"  # see NodeFormerConv
    projection: str = "orthogonal"
    residual: bool = True
    layer_norm: bool = True
    activation: bool = False  # ELU after each conv (App. C.1: off; App. C.2: on)
    dropout: float = 0.0  # after the input MLP and after every conv
    edge_loss_weight: float = 1.0  # lambda of Sec. 3.4; 0 switches the edge loss off
    edge_loss_convention: str = "paper"  # see NodeFormerEdgeLoss
    eval_seed: int = 0  # seeds the fixed evaluation projections
    convs: tuple[NodeFormerConv, ...] = field(init=False, repr=False, compare=False)  # derived
    # the parameterised blocks by parameter prefix, in parameter order; derived
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("in_channels", "hidden_channels", "out_channels", "num_layers"):
            check_positive_int(getattr(self, name), f"NodeFormer {name}")
        check_probability(self.dropout, "NodeFormer dropout")
        check_nonnegative_number(self.edge_loss_weight, "NodeFormer edge_loss_weight")
        if self.edge_loss_convention not in EDGE_LOSS_CONVENTIONS:
            raise ValueError(
                f"NodeFormer edge_loss_convention must be one of {EDGE_LOSS_CONVENTIONS}, "
                f"got {self.edge_loss_convention!r}"
            )
        for name in ("use_gumbel", "residual", "layer_norm", "activation"):
            object.__setattr__(self, name, check_bool(getattr(self, name), f"NodeFormer {name}"))
        # seeds default_rng([eval_seed, l]): a string or NaN would fail there in NumPy's words
        check_nonnegative_int(self.eval_seed, "NodeFormer eval_seed")
        conv = NodeFormerConv(  # raises on bad heads, m, tau, K, bias options
            self.hidden_channels,
            self.hidden_channels,
            heads=self.heads,
            num_random_features=self.num_random_features,
            tau=self.tau,
            num_samples=self.num_samples,
            use_gumbel=self.use_gumbel,
            relational_bias=self.relational_bias,
            rb_order=self.rb_order,
            rb_powers=self.rb_powers,
            qk_scale=self.qk_scale,
            projection=self.projection,
        )
        object.__setattr__(self, "convs", (conv,) * self.num_layers)
        d = self.hidden_channels
        blocks: dict[str, Any] = {
            "input": Linear(self.in_channels, d),
            "input_norm": LayerNorm(d, "node"),
        }
        for i in range(self.num_layers):
            blocks[f"layer{i}"] = conv
            if self.layer_norm:
                blocks[f"layer{i}.norm"] = LayerNorm(d, "node")
        blocks["output"] = Linear(d, self.out_channels)
        object.__setattr__(self, "blocks", blocks)

    @property
    def deterministic_training(self) -> bool:
        """False: a training forward draws new projections (and Gumbel noise) every call."""
        return False

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``{block}.{name}`` and shapes, in order (the class docstring's Shapes)."""
        return flat_param_shapes(self.blocks)

    def _sub(self, params: dict[str, Any], prefix: str) -> dict[str, Any]:
        """The parameters of block ``prefix`` under the block's own names."""
        return split_params(self.blocks, params, prefix)

    def init_params(
        self,
        rng: np.random.Generator,
        init: str = "xavier",
        backend: str | None = None,
        dtype: Any = np.float64,
    ) -> dict[str, Any]:
        """Each block's own initialisation (Glorot-uniform weights, zero biases, LayerNorm ones
        and zeros, the conv's ``b_rel``), drawn from ``rng`` in parameter order."""
        if init != "xavier":
            raise ValueError(
                f"NodeFormer supports init='xavier' only (Glorot-uniform weights, as the "
                f"authors' code), got {init!r}"
            )
        return init_flat_params(self.blocks, rng, backend, dtype)

    def auxiliary_loss(self, cache: NodeFormerModelCache) -> float:
        """``lambda L_e`` of the forward that returned ``cache`` (0 where not computed)."""
        parts = self.auxiliary_loss_parts(cache)
        return 0.0 if parts is None else parts[0] * float(parts[1])

    def auxiliary_loss_parts(self, cache: NodeFormerModelCache) -> tuple[float, Any] | None:
        """``(lambda, L_e)``, ``L_e`` 0-d on the model's backend, unread (None if not computed)."""
        return None if cache.edge_loss is None else (self.edge_loss_weight, cache.edge_loss)

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        x: Any,
        graph: Graph,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
    ) -> tuple[Any, NodeFormerModelCache]:
        """Logits ``(N, out_channels)`` for ``x`` ``(N, in_channels)``, and the cache.

        ``noise`` gives draws by the keys of the module docstring; the rest come from
        ``rng`` (evaluation projections: from ``eval_seed`` when ``rng`` is None).
        """
        check_block_inputs(params, self.param_shapes(), "NodeFormer", x, self.in_channels)
        check_bool(training, "NodeFormer training")
        check_rng(rng, "NodeFormer rng")
        noise = dict(noise or {})
        unknown = sorted(set(noise) - set(self._noise_keys(training)))
        if unknown:
            raise ValueError(
                f"noise has keys {unknown} this forward does not use; it uses "
                f"{self._noise_keys(training)} (training={training})"
            )
        missing = [key for key in self._noise_keys(training, rng is None) if key not in noise]
        if missing and rng is None:
            raise ValueError(
                f"NodeFormer(training={training}) needs random draws {missing}: pass "
                "rng=numpy.random.default_rng(seed), or noise= with these keys (the "
                "cache.noise of an earlier call replays it)"
            )
        blocks, used = self.blocks, {}
        dropout = Dropout(self.dropout)

        def drop(key: str, h: Any) -> tuple[Any, DropoutCache]:
            return recorded_dropout(dropout, key, h, training, rng, noise, used)

        # F1-F4 input MLP (N, in) -> (N, D)
        h, input_linear = blocks["input"].forward(self._sub(params, "input"), x)
        h, input_norm = blocks["input_norm"].forward(self._sub(params, "input_norm"), h)
        h, input_activation = ELU().forward({}, h)
        h, input_dropout = drop("input.dropout", h)
        layers, edge_losses = [], []
        for i, conv in enumerate(self.convs):
            conv_params = self._sub(params, f"layer{i}")
            conv_noise = self._conv_noise(i, noise, training, rng, x)
            # F5 all-pair message passing with relational bias (N, D)
            try:
                z, conv_cache = conv.forward(conv_params, h, graph, training, rng, conv_noise)
            except NonFiniteError as err:  # finite params and input: an overflow in the layer
                raise NonFiniteError(f"in layer{i}: {err}") from err
            used.update({f"layer{i}.{key}": value for key, value in conv_cache.noise.items()})
            edge_cache = None
            if training and self.edge_loss_weight > 0:  # L_e^(l) of Eq. 10
                loss, edge_cache = self._edge_loss(conv).forward(conv_params, conv_cache)
                edge_losses.append(loss)
            # F6 residual
            if self.residual:
                z = z + h
            # F7 LayerNorm
            norm_cache = None
            if self.layer_norm:
                z, norm_cache = blocks[f"layer{i}.norm"].forward(
                    self._sub(params, f"layer{i}.norm"), z
                )
            # F8 ELU
            activation_cache = None
            if self.activation:
                z, activation_cache = ELU().forward({}, z)
            # F9 dropout
            h, dropout_cache = drop(f"layer{i}.dropout", z)
            layer = NodeFormerLayerCache(
                conv_cache, edge_cache, norm_cache, activation_cache, dropout_cache
            )
            layers.append(layer)
        # F10 output MLP (N, D) -> (N, out)
        logits, output_cache = blocks["output"].forward(self._sub(params, "output"), h)
        edge_loss = sum(edge_losses) / len(edge_losses) if edge_losses else None
        cache = NodeFormerModelCache(
            input_linear,
            input_norm,
            input_activation,
            input_dropout,
            tuple(layers),
            output_cache,
            edge_loss,
            {key: used[key] for key in self._noise_keys(training) if key in used},
        )
        return logits, cache

    def _noise_keys(self, training: bool, required: bool = False) -> list[str]:
        """The keys a forward in this mode may use, in draw order; ``required``: only those
        that must come from ``noise`` or ``rng`` (evaluation projections need neither)."""
        keys = ["input.dropout"] if training and self.dropout > 0 else []
        for i in range(self.num_layers):
            if training or not required:
                keys.append(f"layer{i}.projection")
            if training and self.use_gumbel:
                keys.append(f"layer{i}.gumbel")
            if training and self.dropout > 0:
                keys.append(f"layer{i}.dropout")
        return keys

    def _conv_noise(self, i: int, noise: dict, training: bool, rng: Any, x: Any) -> dict:
        """Layer ``i``'s given draws under the conv's keys; in evaluation without ``rng``,
        the fixed projection of ``eval_seed``."""
        given = {
            key: noise[f"layer{i}.{key}"]
            for key in ("projection", "gumbel")
            if f"layer{i}.{key}" in noise
        }
        if not training and rng is None and "projection" not in given:
            omega = _evaluation_projection(
                self.eval_seed, i, self.num_random_features, self.hidden_channels, self.projection
            )
            backend = backend_name(get_array_module(x))
            given["projection"] = asarray(omega, backend=backend, dtype=x.dtype)
        return given

    def _edge_loss(self, conv: NodeFormerConv) -> NodeFormerEdgeLoss:
        return NodeFormerEdgeLoss(conv, self.edge_loss_convention)

    # -- backward ----------------------------------------------------------------------
    def backward(
        self,
        params: dict[str, Any],
        cache: NodeFormerModelCache,
        d_logits: Any,
        input_grad: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_logits, logits> + lambda L_e`` (``L_e`` as computed in the forward;
        none in evaluation): ``(d_x (N, in) or None, d_params keyed like params)``."""
        x = cache.input_linear.x
        check_cotangent(d_logits, (x.shape[0], self.out_channels), x.dtype, x, name="d_logits")
        check_bool(input_grad, "NodeFormer input_grad")
        blocks, d_params = self.blocks, {}
        dropout = Dropout(self.dropout)

        # B10 (of F10) output MLP
        d_h = block_backward(blocks, params, "output", cache.output, d_logits, d_params)
        edge_scale = self.edge_loss_weight / self.num_layers  # d (lambda L_e) / d L_e^(l)
        for i in reversed(range(self.num_layers)):
            conv, layer = self.convs[i], cache.layers[i]
            # B9 (of F9) dropout
            d_z, _ = dropout.backward({}, layer.dropout, d_h)
            # B8 (of F8) ELU
            if layer.activation is not None:
                d_z, _ = ELU().backward({}, layer.activation, d_z)
            # B7 (of F7) LayerNorm
            if layer.norm is not None:
                d_z = block_backward(blocks, params, f"layer{i}.norm", layer.norm, d_z, d_params)
            # B6 (of F6) the residual's identity path, added to d h^l below
            d_skip = d_z if self.residual else None
            # B5 (of F5) the conv
            d_h = block_backward(blocks, params, f"layer{i}", layer.conv, d_z, d_params)
            if d_skip is not None:
                d_h = d_h + d_skip
            # the edge loss of this layer reads its input and W_q, b_q, W_k, b_k
            if layer.edge_loss is not None:
                d_edge_x, grads = self._edge_loss(conv).backward(
                    self._sub(params, f"layer{i}"), layer.edge_loss, edge_scale
                )
                d_h = d_h + d_edge_x
                accumulate_grads(d_params, f"layer{i}", grads)  # after the conv's own
        # B4-B1 (of F4-F1) input MLP
        d_h, _ = dropout.backward({}, cache.input_dropout, d_h)
        d_h, _ = ELU().backward({}, cache.input_activation, d_h)
        d_h = block_backward(blocks, params, "input_norm", cache.input_norm, d_h, d_params)
        d_x = block_backward(
            blocks, params, "input", cache.input_linear, d_h, d_params, input_grad=input_grad
        )
        return d_x, {name: d_params[name] for name in params}


@functools.lru_cache(maxsize=64)
def _evaluation_projection(seed: int, layer: int, m: int, c: int, kind: str) -> np.ndarray:
    """Layer ``layer``'s fixed evaluation ``omega (m, c)``, drawn once per configuration (the QR
    of the orthogonal draw would otherwise run at every evaluation); read-only."""
    omega = draw_projection(np.random.default_rng([seed, layer]), m, c, kind=kind)
    omega.setflags(write=False)
    return omega
