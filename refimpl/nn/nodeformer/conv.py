"""``NodeFormerConv``: one NodeFormer layer (Wu et al. 2022, Alg. 1), with its backward.

The class docstring states the equations (Eq. 4-8, Alg. 1), every argument and the shapes;
this one the conventions, where the paper and the authors' code differ. The edge-level loss
(Eq. 10, 12) is :mod:`refimpl.nn.nodeformer.edge_loss`.

Conventions (paper = NodeFormer, code = github.com/qitianwu/NodeFormer ``nodeformer.py``)
------------------------------------------------------------------------------------------
* Heads are concatenated, then ``W_o (C, H C)`` (code: ``Wo(z.flatten(-2, -1))``).
  Paper App. C.1 says heads are "combined in an average manner"; the mean is the
  special case ``W_o = [I/H, ..., I/H]``.
* ``bias=True`` (default) gives ``b_q, b_k, b_v, b_o``: the code's ``nn.Linear``
  layers carry biases; the paper writes ``W_Q z`` without one and App. C is silent.
* Relational bias (Eq. 8): the code, not the paper. Eq. 8 adds ``sigma(b) sum_{v in
  N(u)} v_v`` unnormalised, and Alg. 1 line 9 adds ``sigma(b) A Z`` (to the attention
  output, not to ``V``); the code adds ``f(b) A_hat V`` per head before ``W_o``, with
  ``A_hat = D_in^(-1/2) A D_out^(-1/2)``: edge ``u -> v`` weighs
  ``1 / sqrt(d_in(v) d_out(u))`` (duplicates counted), ``b_rel (r, H)`` one scalar per
  order and head. ``f`` is the sigmoid (``relational_bias="sigmoid"``, paper Sec. 4)
  or the identity (``"identity"``, App. C.2: ``b_rel`` used as is).
* Self-loops: ``add_self_loops=True`` (default) removes existing loops and adds one per
  node (``prepare_graph``), as the code's ``main.py`` does before building ``A``. So
  ``A_hat`` is GCN's ``D^(-1/2) (A + I) D^(-1/2)`` on an undirected graph, every node
  keeps part of its own value and no degree is 0. The same graph carries the edge loss.
* Orders ``r = rb_order``: ``rb_powers="paper"`` gives ``A_j = A_hat^j`` (powers of the
  normalised matrix, as MixHop, the paper's ref. [1]); ``"authors"`` gives what the code
  feeds it: ``A_1 = A_hat`` and for ``j >= 2`` the structure of ``A^(2^(j-1))`` (the
  code squares the binarised adjacency repeatedly: ``A, A^2, A^4``; ``adj_mul`` keeps
  only the nonzero pattern), each normalised by its own degrees. Both agree at ``r = 1``.
* Noise (docs/design.md, Randomness): ``omega (m, C)``, one per layer shared by the heads,
  and Gumbel ``g (N, H, K)``, one per key node, head and sample, shared by all queries
  (as the code draws it). ``noise`` gives them explicitly; whatever it lacks is drawn
  from ``rng`` in this order: ``omega = draw_projection(rng, m, C, projection)``, then
  ``g = -log(-log(U))``, ``U = max(rng.random((N, H, K)), 2^-1074)`` (the floor
  keeps ``g`` finite at ``U = 0``, a probability ``2^-53`` event). Gumbel noise is
  drawn and used only when ``training`` and ``use_gumbel``; otherwise a given
  ``noise["gumbel"]`` is ignored (as ``Dropout`` ignores its mask in evaluation).
  ``cache.noise`` holds exactly the draws used; fed back it reproduces the output
  bit for bit. The code draws ``omega`` with a seed taken from ``sum(q)`` and the
  noise as ``-log(Exp(1))``; ``projection="orthogonal"`` (default) follows its block
  construction (see :func:`~refimpl.nn.nodeformer.random_features.draw_projection`).
* ``init_params``: Glorot-uniform weights and zero biases (as
  ``refimpl.ops.linear.Linear``; the code keeps ``nn.Linear``'s default), and
  ``b_rel = 0.1`` (sigmoid) or ``1.0`` (identity), the code's ``reset_parameters``.

Backward: walks F6..F1 in reverse; the noise gets no gradient, and the attention's
max-shifts are held (exact: they cancel in its ratios, see kernel_attention).
``input_grad=False`` skips ``d_x``. Edge semantics: ``N = 1`` and graphs without edges
are fine (the relational bias of a node with no incoming edge is 0). The attention's
stabilisation, its denominators and the ``1e-6`` the code adds to every feature (not
added here): :mod:`refimpl.nn.nodeformer.kernel_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.backend import asarray, backend_name, get_array_module
from refimpl.fields import check_bool, check_nonnegative_number, check_positive_int
from refimpl.graph import Graph, with_configured_self_loops
from refimpl.nn.attention_common import glorot, project, project_backward
from refimpl.nn.nodeformer.conv_cache import NodeFormerCache
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax
from refimpl.nn.nodeformer.random_features import (
    PROJECTION_KINDS,
    draw_gumbel,
    draw_projection,
)
from refimpl.nn.nodeformer.relational_bias import RelationalBias
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.validation import (
    check_block_inputs,
    check_cotangent,
    check_graph_rows,
    check_input,
    check_like,
    check_rng,
)

__all__ = ["NodeFormerCache", "NodeFormerConv"]

RELATIONAL_BIAS = (None, "sigmoid", "identity")
RB_POWERS = ("paper", "authors")
QK_SCALES = ("paper", "sqrt_d")
NOISE_KEYS = ("projection", "gumbel")


@dataclass(frozen=True)
class NodeFormerConv:
    r"""One NodeFormer layer (Wu et al. 2022, Alg. 1): kernelised all-pair attention, O(N).

    Per head $h$, with $\mathbf{q}_u = s(\mathbf{W}_q \mathbf{x}_u + \mathbf{b}_q)$,
    $\mathbf{k}_u$ likewise, $\mathbf{v}_u = \mathbf{W}_v \mathbf{x}_u + \mathbf{b}_v$ (each
    $C$ wide per head), $\phi$ the positive random features of NodeFormer Eq. (4) on
    $\boldsymbol{\omega}$ (shared by the heads) and Gumbel noise $g_{vht}$, in training
    (NodeFormer Eq. (7) with $K$ samples $t$, Eq. (17); Alg. 1 lines 3-8):

    $$
    \mathbf{z}_{u h} = \frac{1}{K} \sum_{t=1}^{K}
    \frac{\phi(\mathbf{q}_u / \sqrt{\tau})^\top \sum_v e^{g_{vht} / \tau}
    \phi(\mathbf{k}_v / \sqrt{\tau}) \mathbf{v}_v^\top}
    {\phi(\mathbf{q}_u / \sqrt{\tau})^\top \sum_w e^{g_{wht} / \tau}
    \phi(\mathbf{k}_w / \sqrt{\tau})}
    $$

    and without noise (evaluation, or ``use_gumbel=False``) Eq. (5): $K = 1$, $g = 0$. The
    relational bias (Eq. (8), Alg. 1 line 9, in the authors' code's form) and the output:

    $$
    \mathbf{z}_{u h} \mathrel{+}= \sum_{j=1}^{r} f(b_{j h}) \sum_{v} (\mathbf{A}_j)_{uv}
    \mathbf{v}_{v h},
    \qquad
    \mathbf{x}'_u = \mathbf{W}_o [\mathbf{z}_{u 1} \Vert \dots \Vert \mathbf{z}_{u H}]
    + \mathbf{b}_o
    $$

    $\phi(\mathbf{q}/\sqrt{\tau})^\top \phi(\mathbf{k}/\sqrt{\tau})$ estimates
    $\exp(\mathbf{q}^\top \mathbf{k} / \tau)$ (Prop. 1). The module docstring states the
    conventions (the code against the paper: heads, biases, $\mathbf{A}_j$, the draws).

    Parameters
    ----------
    in_channels : int
        $F$, the input width.
    out_channels : int
        $C$, the width of each head and of the output.
    heads : int, default 1
        $H$, the number of heads (the code's ``num_heads``).
    num_random_features : int, default 30
        $m$, the rows of $\boldsymbol{\omega}$ (the code's ``nb_random_features``).
    tau : float, default 0.25
        $\tau > 0$, the temperature (paper Sec. 4 and the code).
    num_samples : int, default 10
        $K$, Gumbel samples per head (the code's ``nb_gumbel_sample``).
    use_gumbel : bool, default True
        Gumbel noise in training (Eq. (7)); never in evaluation (Eq. (5)).
    relational_bias : {None, "sigmoid", "identity"}, default None
        $f$ of the relational bias (the code's ``rb_trans``): the sigmoid (paper Sec. 4) or
        the identity (App. C.2); None adds no relational bias.
    rb_order : int, default 1
        $r$, the orders of the relational bias (the code's ``rb_order``; 2 on Cora).
    rb_powers : {"paper", "authors"}, default "paper"
        $\mathbf{A}_j$: ``"paper"`` $\hat{\mathbf{A}}^j$, the powers of
        $\hat{\mathbf{A}} = \mathbf{D}_{in}^{-1/2} \mathbf{A} \mathbf{D}_{out}^{-1/2}$;
        ``"authors"`` the pattern of $\mathbf{A}^{2^{j-1}}$, each normalised (the code's).
    qk_scale : {"paper", "sqrt_d"}, default "paper"
        $s$: 1 (attention $\exp(\mathbf{q}^\top \mathbf{k} / \tau)$, Eq. (6)) or $C^{-1/4}$
        (the code's ``softmax_kernel_transformation``: $\exp(\mathbf{q}^\top \mathbf{k} /
        (\tau \sqrt{C}))$).
    projection : {"orthogonal", "iid"}, default "orthogonal"
        How $\boldsymbol{\omega}$ is drawn (:func:`~refimpl.nn.draw_projection`): orthogonal
        blocks (the code's ``projection_matrix_type``) or i.i.d. Gaussian (Eq. (4)).
    bias : bool, default True
        $\mathbf{b}_q, \mathbf{b}_k, \mathbf{b}_v, \mathbf{b}_o$ (the code's ``nn.Linear``).
    add_self_loops : bool, default True
        Replace the graph's self-loops by one per node before $\mathbf{A}$ is built and for
        the edge loss (the code's ``main.py``).

    Shapes
    ------
    - **input**: ``x`` $(N, F)$; ``graph`` on $N$ nodes; ``noise`` ``"projection"``
      $(m, C)$, ``"gumbel"`` $(N, H, K)$ (each optional, drawn from ``rng`` if absent)
    - **output**: $(N, C)$; ``cache.noise`` the draws used
    - **backward**: ``d_out`` $(N, C)$; returns ``d_x`` $(N, F)$ and ``d_params`` keyed as
      ``params``: ``W_q``, ``W_k``, ``W_v`` $(H C, F)$, ``b_q``, ``b_k``, ``b_v``
      $(H C,)$, ``W_o`` $(C, H C)$, ``b_o`` $(C,)$, ``b_rel`` $(r, H)$
    """

    in_channels: int
    out_channels: int  # C, per head and of the output
    heads: int = 1  # H
    num_random_features: int = 30  # m; the code's NodeFormer default
    tau: float = 0.25  # temperature; paper Sec. 4 and the code
    num_samples: int = 10  # K Gumbel samples; the code's nb_gumbel_sample
    use_gumbel: bool = True  # Gumbel noise in training (never in evaluation)
    relational_bias: str | None = None  # None | "sigmoid" (paper Sec. 4) | "identity"
    rb_order: int = 1  # r; the code's Cora setting is 2 (App. C.1)
    rb_powers: str = "paper"  # "paper": A_hat^j | "authors": normalised A, A^2, A^4
    qk_scale: str = "paper"  # "paper": exp(q.k / tau) | "sqrt_d": exp(q.k / (tau sqrt C))
    projection: str = "orthogonal"  # omega drawn "orthogonal" (the code) | "iid" (Eq. 4)
    bias: bool = True  # b_q, b_k, b_v, b_o; the code's nn.Linear default
    add_self_loops: bool = True  # the code's main.py

    def __post_init__(self) -> None:
        names = ("in_channels", "out_channels", "heads", "num_random_features", "num_samples")
        for name in (*names, "rb_order"):
            check_positive_int(getattr(self, name), f"NodeFormerConv {name}")
        check_nonnegative_number(self.tau, "NodeFormerConv tau", allow_zero=False)
        choices = {
            "relational_bias": RELATIONAL_BIAS,
            "rb_powers": RB_POWERS,
            "qk_scale": QK_SCALES,
            "projection": PROJECTION_KINDS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"NodeFormerConv {name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        for name in ("use_gumbel", "bias", "add_self_loops"):
            flag = check_bool(getattr(self, name), f"NodeFormerConv {name}")
            object.__setattr__(self, name, flag)

    # -- parameters ------------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the parameters, in order."""
        hc, c = self.heads * self.out_channels, self.out_channels
        shapes: dict[str, tuple[int, ...]] = {}
        for name in ("q", "k", "v"):
            shapes[f"W_{name}"] = (hc, self.in_channels)
            if self.bias:
                shapes[f"b_{name}"] = (hc,)
        shapes["W_o"] = (c, hc)
        if self.bias:
            shapes["b_o"] = (c,)
        if self.relational_bias is not None:
            shapes["b_rel"] = (self.rb_order, self.heads)
        return shapes

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Glorot-uniform ``W`` (``U(-a, a)``, ``a = sqrt(6 / (in + out))``), zero biases,
        ``b_rel`` constant 0.1 (sigmoid) or 1.0 (identity) as the code's ``reset_parameters``."""
        params = {}
        for name, shape in self.param_shapes().items():
            if name.startswith("W_"):
                value = glorot(rng, shape, shape)  # fan (out, in): the same draws
            elif name == "b_rel":
                value = np.full(shape, 0.1 if self.relational_bias == "sigmoid" else 1.0)
            else:
                value = np.zeros(shape)
            params[name] = asarray(value, backend=backend, dtype=dtype)
        return params

    @property
    def qk_factor(self) -> float:
        """``s``: ``q`` and ``k`` enter the attention as ``s q``, ``s k``."""
        return 1.0 if self.qk_scale == "paper" else self.out_channels**-0.25

    def prepare_graph(self, graph: Graph) -> Graph:
        """The graph of the relational bias and the edge loss (self-loops as configured)."""
        return with_configured_self_loops(graph, self.add_self_loops)

    # -- forward ---------------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        x: Any,
        graph: Graph,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
    ) -> tuple[Any, NodeFormerCache]:
        """Apply the layer: ``x (N, in_channels) -> (N, out_channels)``, and the cache.

        ``rng`` draws what ``noise`` does not give (``"projection"`` ``(m, C)``, always
        needed; ``"gumbel"`` ``(N, H, K)`` in training with ``use_gumbel``), in the order
        of the module docstring. ``cache.noise`` holds the draws used. Raises
        :class:`~refimpl.validation.NonFiniteError` where the output overflows the dtype.
        """
        check_block_inputs(params, self.param_shapes(), "NodeFormerConv", x, self.in_channels)
        check_bool(training, "NodeFormerConv training")
        check_rng(rng, "NodeFormerConv rng")
        graph = self.prepare_graph(graph)
        check_graph_rows(x, graph)
        xp = get_array_module(x)
        n, heads, c = x.shape[0], self.heads, self.out_channels
        used = self._resolve_noise(x, training, rng, noise)
        s = self.qk_factor

        # F1 projections (N, in) @ (in, H*C) -> (N, H, C), F2 the qk factor s, folded into the
        #    maps: s (x W^T + b) = x (s W)^T + s b costs no pass over the rows
        q, k, v = (y.reshape(n, heads, c) for y in project(params, "qkv", x, self.bias, (s, s)))
        # F3 per head, kernelised (Gumbel-)softmax with the shared omega (Alg. 1 lines 3-8),
        #    written into its head of z; q, k, v were made here from checked x and params:
        #    the block skips its checks
        block = KernelizedSoftmax(self.tau)
        gumbel = used.get("gumbel")
        omega = used["projection"]  # (m, C), shared by the heads
        z = xp.empty((n, heads, c), dtype=x.dtype)
        attention = []
        for h in range(heads):
            g = None if gumbel is None else gumbel[:, h, :]  # (N, K)
            attention.append(
                block.forward_unchecked(q[:, h], k[:, h], v[:, h], omega, g, out=z[:, h])[1]
            )
        # F4 relational bias: z_h += sum_j f(b_rel[j-1, h]) A_j v_h (Eq. 8, Alg. 1 line 9)
        operators = ()
        if self.relational_bias is not None:
            operators = self._relational.operators(graph, xp, x.dtype)
            self._relational.add_terms(operators, self._relational.gate(params["b_rel"]), v, z)
        # F5 concatenate heads (N, H*C), F6 output map (N, H*C) @ (H*C, C) -> (N, C)
        concat = z.reshape(n, heads * c)
        out = project(params, "o", concat, self.bias)[0]
        cache = NodeFormerCache(x, graph, q, k, v, tuple(attention), operators, concat, used)
        check_overflow(out, "NodeFormerConv.forward: its output", x.dtype)
        return out, cache

    # -- backward --------------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: NodeFormerCache, d_out: Any, input_grad: bool = True
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_x (N, in) or None, d_params keyed like params)``.

        The noise is held fixed (it gets no gradient). ``input_grad=False`` skips ``d_x``.
        Raises :class:`~refimpl.validation.NonFiniteError` where a gradient overflows the dtype.
        """
        x = cache.x
        check_cotangent(d_out, (x.shape[0], self.out_channels), x.dtype, x, name="d_out")
        check_bool(input_grad, "NodeFormerConv input_grad")
        return backward_checked(
            lambda: self._backward(params, cache, d_out, input_grad), "NodeFormerConv", x.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: NodeFormerCache, d_out: Any, input_grad: bool
    ) -> tuple[Any, dict[str, Any]]:
        """B6-B1 of :meth:`backward` on a checked cotangent."""
        x = cache.x
        n, heads, c = x.shape[0], self.heads, self.out_channels
        xp = get_array_module(d_out, x)
        d_params: dict[str, Any] = {}

        # B6 (of F6) output map, B5 (of F5) heads back apart (N, H, C)
        d_concat = project_backward(params, "o", cache.heads, [d_out], d_params, self.bias)
        d_z = d_concat.reshape(n, heads, c)
        # B3 (of F3) per head, the attention, written into its head of d_q, d_k, d_v
        block = KernelizedSoftmax(self.tau)
        d_q, d_k, d_v = (xp.empty((n, heads, c), dtype=x.dtype) for _ in range(3))
        for h in range(heads):
            block.backward_unchecked(
                cache.attention[h], d_z[:, h], out=(d_q[:, h], d_k[:, h], d_v[:, h])
            )
        # B4 (of F4) relational bias: the gates, and the values' second path (added to d_v)
        if self.relational_bias is not None:
            f = self._relational.gate(params["b_rel"])  # (r, H)
            d_f = self._relational.add_terms_backward(cache.operators, f, d_z, cache.v, d_v)
            d_params["b_rel"] = self._relational.gate_backward(f, d_f)
        del d_concat, d_z  # read by nothing below: one (N, H*C) array less at the peak, B1
        # B2 (of F2) and B1 (of F1): the projections' adjoint with the folded factor s
        s = self.qk_factor
        d_x = project_backward(
            params, "qkv", x, [d_q, d_k, d_v], d_params, self.bias, input_grad, (s, s)
        )
        return d_x, {name: d_params[name] for name in params}

    @property
    def _relational(self) -> RelationalBias:
        """The relational-bias block (F4 / B4); only used when ``relational_bias`` is set."""
        return RelationalBias(self.relational_bias, self.rb_order, self.rb_powers)

    # -- noise -----------------------------------------------------------------------------
    def _resolve_noise(self, x: Any, training: bool, rng: Any, noise: Any) -> dict[str, Any]:
        """The draws this call uses: given in ``noise``, else drawn from ``rng`` in order."""
        n, m, c = x.shape[0], self.num_random_features, self.out_channels
        shapes = {"projection": (m, c)}
        if training and self.use_gumbel:
            shapes["gumbel"] = (n, self.heads, self.num_samples)
        given = _check_noise(noise, x, shapes)
        missing = [name for name in shapes if name not in given]
        if missing and rng is None:
            wanted = " and ".join(f"{name} {shapes[name]}" for name in missing)
            raise ValueError(
                f"NodeFormerConv needs random draws ({wanted}): pass rng="
                "numpy.random.default_rng(seed) to draw them, or noise={'projection': ..., "
                "'gumbel': ...} to give them (cache.noise of an earlier call replays it)"
            )
        if missing and not isinstance(rng, np.random.Generator):
            raise TypeError(
                f"rng must be a numpy.random.Generator, got {type(rng).__name__}; "
                "use numpy.random.default_rng(seed)"
            )
        backend = backend_name(get_array_module(x))
        used = {}
        for name in shapes:  # "projection" first, then "gumbel": the documented draw order
            if name in given:
                used[name] = given[name]
            elif name == "projection":
                omega = draw_projection(rng, m, c, kind=self.projection)
                used[name] = asarray(omega, backend=backend, dtype=x.dtype)
            else:
                used[name] = asarray(draw_gumbel(rng, shapes[name], x.dtype), backend=backend)
        return used


def _check_noise(noise: Any, x: Any, shapes: dict[str, tuple]) -> dict[str, Any]:
    """The entries of ``noise`` this call uses, validated: shape, dtype, backend, finite."""
    if noise is None:
        return {}
    if not isinstance(noise, dict):
        raise TypeError(f"noise must be a dict of arrays or None, got {type(noise).__name__}")
    unknown = [key for key in noise if key not in NOISE_KEYS]
    if unknown:
        raise ValueError(f"noise has unknown keys {unknown}; allowed keys are {list(NOISE_KEYS)}")
    given = {}
    for name, shape in shapes.items():
        if name not in noise:
            continue
        value = noise[name]
        meaning = {
            "projection": "(m, C) = (num_random_features, out_channels), shared by the heads",
            "gumbel": "(N, heads, K): one value per key node, head and sample",
        }[name]
        check_input(value, f"noise[{name!r}]")
        if tuple(value.shape) != shape:
            raise ValueError(
                f"noise[{name!r}] has shape {tuple(value.shape)} but must be {shape}: {meaning}"
            )
        check_like({f"noise[{name!r}]": value}, x, "x")
        given[name] = value
    return given
