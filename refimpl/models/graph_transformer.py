"""``GraphTransformer``: the graph transformer of the massive-activations supplement (Sec. 2),
for graph-level (pooled) or node-level outputs, with hand-written backward.

With ``D = hidden_channels`` and a batch of ``G`` graphs on ``N`` nodes (one graph
when ``batch`` is None)::

    F1  h    = x W_in^T + b_in                      (N, D)  Eq. 1, input embedding
    F2  h   += pe W_pe^T + b_pe                     (N, D)  Eq. 2, P from Laplacian
                                                            eigenvectors (pe_dim > 0)
    F3  h    = [h ; g_1 .. g_G]                     (N+G, D) global_node: one node per
                                                            graph, embedding ``global.embedding``
    F4  e    = [edge_attr | types] W_e^T + b_e      (E', D) edge embedding (see below)
        for l = 0 .. L-1:
    F5  h    = GraphTransformerLayer_l(h, e)        (N', D) Eq. 3-13
    F6  h    = h[:N]                                (N, D)  drop the global nodes
    F7  p    = Pool(h)                              (G, D)  mean or sum per graph
    F8  out  = ReLU(p W_1^T + b_1) W_2^T + b_2      (G, out) y = MLP(Pool(H)), Sec. 2
        node-level (pool=None) instead:
    F7' out  = h W_out^T + b_out                    (N, out)

The layers attend over the attention graph of :mod:`refimpl.models.attention_graph`
(Eq. 7's mask; with ``global_node``, Eq. 14's global nodes). F4 embeds its edge features,
the input's ``edge_attr`` (zeros on added edges) and one-hot edge types, read by every
layer's ``W^E`` (Eq. 12-13); without ``edge_dim`` and ``global_node`` there is no F4.

Pooling runs over the real nodes; the global nodes only mix information during the layers.
Positional encodings are an input (``refimpl.data.positional``): random sign flips belong to the
training loop, so the model is a deterministic function of its inputs and its ``noise``.

Parameters, in order: ``input.W (D, in)``, ``input.b``, ``pe.W (D, pe_dim)``, ``pe.b``
(pe_dim > 0), ``edge.W (D, edge_dim + types)``, ``edge.b`` (edge features),
``global.embedding (D,)`` (global_node), per layer ``layer{l}.{GraphTransformerLayer names}``,
then ``head1.W (D, D)``, ``head1.b``, ``head2.W (out, D)``, ``head2.b`` (graph level) or
``head.W (out, D)``, ``head.b`` (node level). ``init_params``: each block's own (Glorot-uniform
linears with zero biases, attention as PyG's ``TransformerConv``, LayerNorm ones and zeros, a
zero global embedding).

Randomness: ``noise`` keys ``layer{l}.attn_dropout``, ``layer{l}.dropout1``,
``layer{l}.dropout2`` (the layer's keys), drawn from ``rng`` in layer order when not given and
used; ``cache.noise`` replays a step.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from refimpl.fields import check_bool, check_positive_int
from refimpl.graph import Graph
from refimpl.models.arch_options import STUDY_ARCHS, check_arch_fields, check_study_pe
from refimpl.models.attention_graph import (
    _check_batch,
)
from refimpl.models.study_archs import (
    StudyCache,
    study_activations,
    study_backward,
    study_blocks,
    study_forward,
)
from refimpl.models.transformer_conv_arch import (
    GraphTransformerCache,
    conv_activations,
    conv_backward,
    conv_blocks,
    conv_forward,
)
from refimpl.nn.stacks import (
    flat_param_shapes,
    flat_state_shapes,
    init_flat_params,
    init_flat_state,
)
from refimpl.validation import (
    check_block_inputs,
    check_cotangent,
    check_graph_rows,
    check_optional_input,
    check_rng,
)

__all__ = ["GraphTransformer", "GraphTransformerCache"]

POOLS = ("mean", "sum", "max", None)


@dataclass(frozen=True)
class GraphTransformer:
    r"""A graph transformer: input embeddings, ``num_layers`` attention layers and a readout.

    ``arch="transformer-conv"`` (the default) is the massive-activations supplement's model
    (Sec. 2, Eq. 1-14; F1-F8 of the module docstring). On $N$ nodes with features $X$, optional
    positional encodings $P$ and $D$ = ``hidden_channels``:

    $$
    H^{(0)} = X W_{in}^\top + b_{in} + P W_{pe}^\top + b_{pe}
    \qquad \text{(Eq. 1-2)}
    $$

    then per layer, with $h$ heads of $d_k = D / h$ channels, the attention masked to the edges
    and self-loops (Eq. 6-7) and edge embeddings $e_{ij}$ (Eq. 12-13)
    (:class:`~refimpl.nn.GraphTransformerLayer`):

    $$
    A_i = \operatorname{softmax}\left(\frac{Q_i K_i^\top + f(e)}{\sqrt{d_k}} + M\right), \quad
    H' = \operatorname{Concat}_i(A_i V_i) W^O \qquad \text{(Eq. 3-9)}
    $$

    $$
    \begin{aligned}
    Z &= \operatorname{LayerNorm}(H^{(l)} + H') \\
    H^{(l+1)} &= \operatorname{LayerNorm}(Z + \operatorname{FFN}(Z)) \qquad \text{(Eq. 10-11)}
    \end{aligned}
    $$

    and the head (Sec. 2's $y = \operatorname{MLP}(\operatorname{Pool}(H))$; per node, with
    ``pool=None``, $y = H^{(L)} W_{out}^\top + b_{out}$):

    $$
    y = \operatorname{ReLU}\left(\operatorname{Pool}(H^{(L)}) W_1^\top + b_1\right) W_2^\top + b_2
    $$

    The study's architectures (the module
    :mod:`refimpl.models.study_archs`) share, per head and attention pair $u \to v$, the released
    Dwivedi & Bresson (2021) attention (their Eq. 10-12 as released: a channel-wise score,
    clamped, no softmax):

    $$
    \begin{aligned}
    s_{uv} &= \frac{K h_u \odot Q h_v}{\sqrt{d_k}} \odot E e_{uv} \\
    w_{uv} &= c_{uv} \exp\Big(\operatorname{clamp}\big(\textstyle\sum_c s_{uv,c}, -5, 5\big)\Big)
    \\
    \hat h_v &= \frac{\sum_u w_{uv} V h_u}{\sum_u w_{uv} + 10^{-6}}
    \end{aligned}
    $$

    with $c_{uv} = 1$ for ``"gt"`` (GT, whose edge stream carries $s_{uv}$ on); for
    ``"graphit"`` (GraphiT-GT) with ``full_graph``, the kernel entry $\kappa_{uv}$ of
    $(I - \gamma L)^p$ or $\exp(-\beta L)$ (1 without); for ``"san"`` (SAN), $1 / (\gamma + 1)$
    on edges and $\gamma / (\gamma + 1)$ on other pairs (GraphiT and SAN over all pairs with
    ``full_graph``, non-edges with their own $Q_2, K_2, E_2$). Each then runs the released
    stream (dropout, $W^O$, residual, norm, FFN, residual, norm) and ends with
    $y = \operatorname{MLPReadout}(\operatorname{Pool}(h))$.

    Parameters
    ----------
    in_channels : int
        Node features in.
    out_channels : int, default 1
        Targets (regression) or labels per graph (or per node).
    hidden_channels : int, default 64
        ``D``, the width of every layer; divisible by ``heads``.
    num_layers : int, default 4
        ``L``, attention layers.
    heads : int, default 4
        ``H``, attention heads, ``d_k = D / H`` channels each.
    ffn_channels : int or None, default None
        The FFN's hidden width; None: ``2 D``. Read by transformer-conv and gt only (graphit
        and san always use ``2 D``; a value set there is refused).
    edge_dim : int or None, default None
        Columns of the input's ``edge_attr``; None: no edge features.
    pe_dim : int, default 0
        Columns of the positional encodings ``pe`` (Laplacian or random-walk), added after a
        linear map (Eq. 2); 0: none.
    global_node : bool, default False
        One global node per graph attending to and from its nodes (Eq. 14).
        transformer-conv only.
    pool : {"mean", "sum", "max", None}, default "mean"
        The graph readout; None: node-level outputs.
    dropout : float in [0, 1), default 0.0
        Dropout inside every layer.
    attn_dropout : float in [0, 1), default 0.0
        Dropout on the attention coefficients (PyG's ``TransformerConv.dropout``).
        transformer-conv only.
    layer_norm : bool, default True
        Eq. 11's LayerNorms; False: the residuals alone. transformer-conv only.
    lipschitz_norm : {None, "paper"}, default None
        "paper": LipschitzNorm (Dasoulas et al. 2021) Eq. (19) per head in place of
        $1 / \sqrt{d_k}$. transformer-conv only.
    arch : {"transformer-conv", "gt", "graphit", "san"}, default "transformer-conv"
        The layers (above). A field an architecture does not read must keep its default
        (refused otherwise).
    norm : {None, "batch", "layer", "layer+batch", "none"}, default None
        The streams' norms (gt, graphit, san); None means "batch", the released configs'.
    explicit_bias : bool, default False
        The study's key, value and edge bias vectors (gt, graphit).
    full_graph : bool, default True
        Attend over every ordered pair of a graph's nodes (graphit, san).
    gamma : float, default 0.1
        SAN's weight of the non-edge pairs, $\gamma / (\gamma + 1)$ (san).
    kernel : {"random-walk", "diffusion"}, default "random-walk"
        GraphiT's kernel with ``full_graph``: $(I - \gamma L)^p$ or $\exp(-\beta L)$ (graphit).
    kernel_steps : int, default 16
        $p$ of the random-walk kernel (graphit).
    kernel_gamma : float, default 0.25
        $\gamma$ of the random-walk kernel (graphit).
    kernel_beta : float, default 1.0
        $\beta$ of the diffusion kernel (graphit).
    lpe_eigenpairs : int, default 0
        ``m``, eigenpairs of SAN's learned Laplacian encoding
        (:class:`~refimpl.nn.LearnedLaplacianPE`); 0: none; excludes ``pe_dim`` (gt, graphit,
        san).
    lpe_channels : int, default 16
        The learned encoding's width, the last ``lpe_channels`` of ``D``.

    Shapes
    ------
    - **forward** ``x (N, in_channels)``, ``edge_attr (E, edge_dim)``, ``pe (N, pe_dim)`` (or
      ``(N, m, 3)`` with ``lpe_eigenpairs``), ``batch (N,)`` -> ``(G, out_channels)`` (graph
      level) or ``(N, out_channels)`` (``pool=None``).
    - **backward** ``d_out`` shaped as the output -> ``d_x (N, in_channels)`` (with
      ``edge_dim`` or ``pe``, the tuple ``(d_x[, d_edge_attr][, d_pe])``), ``d_params``.
    - N nodes, E edges, G graphs in the batch, H heads, D = ``hidden_channels``.
    """

    in_channels: int
    out_channels: int = 1  # targets (regression) or labels
    hidden_channels: int = 64  # D
    num_layers: int = 4  # L
    heads: int = 4  # H
    ffn_channels: int | None = None  # d_ff; None: 2 D
    edge_dim: int | None = None  # columns of the input's edge_attr; None: none
    pe_dim: int = 0  # columns of the positional encodings; 0: none (Eq. 2 off)
    global_node: bool = False  # Eq. 14
    pool: str | None = "mean"  # "mean" | "sum" | "max" (graph level) | None (node level)
    dropout: float = 0.0  # inside every layer (F3, F7 of the layer)
    attn_dropout: float = 0.0
    layer_norm: bool = True  # Eq. 11
    lipschitz_norm: str | None = None  # None | "paper" (LipschitzNorm Eq. 19 per head)
    # the massive-activation study's architectures (refimpl.models.study_archs, its fields)
    arch: str = "transformer-conv"  # | "gt" | "graphit" | "san"
    norm: str | None = None  # study archs: "batch" (None) | "layer" | "layer+batch" | "none"
    explicit_bias: bool = False  # GT, GraphiT: the released k_bias, e_bias, v_bias
    full_graph: bool = True  # GraphiT, SAN: attend over every pair of a graph's nodes
    gamma: float = 0.1  # SAN: the non-edge pairs' share
    kernel: str = "random-walk"  # GraphiT with full_graph: | "diffusion"
    kernel_steps: int = 16  # p of (I - gamma L)^p
    kernel_gamma: float = 0.25
    kernel_beta: float = 1.0  # exp(-beta L)
    lpe_eigenpairs: int = 0  # m of SAN's learned Laplacian encoding; 0: none
    lpe_channels: int = 16  # its width, out of D
    # the parameterised blocks by parameter prefix, in parameter order; derived
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("in_channels", "out_channels", "hidden_channels", "num_layers"):
            check_positive_int(getattr(self, name), f"GraphTransformer {name}")
        if self.edge_dim is not None:  # None: no edge features
            check_positive_int(self.edge_dim, "GraphTransformer edge_dim")
        if isinstance(self.pe_dim, bool) or not isinstance(self.pe_dim, int) or self.pe_dim < 0:
            raise ValueError(f"GraphTransformer pe_dim must be an int >= 0, got {self.pe_dim!r}")
        if self.pe_dim:  # at most 2**31 - 1, as every size
            check_positive_int(self.pe_dim, "GraphTransformer pe_dim")
        if self.pool not in POOLS:
            raise ValueError(f"GraphTransformer pool must be one of {POOLS}, got {self.pool!r}")
        for name in ("global_node", "layer_norm"):  # "False" would read as true
            object.__setattr__(
                self, name, check_bool(getattr(self, name), f"GraphTransformer {name}")
            )
        if self.ffn_channels is not None:  # 0 would mean the default, 2 D, silently
            check_positive_int(self.ffn_channels, "GraphTransformer ffn_channels")
        check_arch_fields(self)  # sets norm's default for the study's architectures
        if self.arch in STUDY_ARCHS:
            object.__setattr__(self, "blocks", study_blocks(self))
            return
        object.__setattr__(self, "blocks", conv_blocks(self))

    def __repr__(self) -> str:
        """The fields that differ from their defaults (and the sizes), not all 27."""
        shown = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.init
            and (f.default is MISSING or getattr(self, f.name) != f.default or f.name == "arch")
        ]
        return f"GraphTransformer({', '.join(shown)})"

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the state beside the parameters: BatchNorm's running statistics
        ``layer{l}.{stream}.norm{1,2}.running_{mean,var}`` (empty without batch norm)."""
        return flat_state_shapes(self.blocks)

    def init_state(self, backend: str | None = None, dtype: Any = np.float64) -> dict[str, Any]:
        """The initial state (``state_shapes``): running means 0, variances 1."""
        return init_flat_state(self.blocks, backend, dtype)

    @property
    def deterministic_training(self) -> bool:
        """Whether a training forward draws nothing (no dropout)."""
        return self.dropout == 0 and self.attn_dropout == 0

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``{block}.{name}`` and shapes, in order (module docstring)."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self,
        rng: np.random.Generator,
        init: str = "xavier",
        backend: str | None = None,
        dtype: Any = np.float64,
    ) -> dict[str, Any]:
        """Each block's own initialisation, drawn from ``rng`` in parameter order."""
        if init != "xavier":
            raise ValueError(
                f"GraphTransformer supports init='xavier' only (each block's default), got {init!r}"
            )
        return init_flat_params(self.blocks, rng, backend, dtype)

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        x: Any,
        graph: Graph,
        edge_attr: Any = None,
        pe: Any = None,
        batch: Any = None,
        num_graphs: int | None = None,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> tuple[Any, GraphTransformerCache | StudyCache]:
        """Outputs ``(G, out)`` (graph level) or ``(N, out)`` (node level), and the cache.

        Parameters
        ----------
        x : (N, in_channels) float array
        graph : Graph on N nodes (block-diagonal for a batch, ``refimpl.data.collate``)
        edge_attr : (E, edge_dim) float array, with ``edge_dim`` only
        pe : (N, pe_dim) float array, with ``pe_dim`` only (``refimpl.data.laplacian_pe``,
            ``random_walk_pe``); with ``lpe_eigenpairs`` the padded eigenpairs ``(N, m, 3)``:
            eigenvector entries, eigenvalues, and 1.0 where valid (``eigenpairs_padded``)
        batch : (N,) int array, optional
            The graph of every node, ``0 <= batch < num_graphs``; None: one graph. No edge
            may join two graphs (a block-diagonal batch, as ``refimpl.data.collate`` makes).
        num_graphs : int, optional
            ``G``; default ``batch.max() + 1``.
        training, rng, noise
            Dropout: masks from ``noise`` (keys in the module docstring) or ``rng``.
        state : dict, optional
            BatchNorm's running statistics (``init_state``; the study's architectures with
            ``norm`` "batch"); None in training: fresh ones. ``cache.state`` holds them
            after this forward.
        """
        check_block_inputs(params, self.param_shapes(), "GraphTransformer", x, self.in_channels)
        check_graph_rows(x, graph)
        check_bool(training, "GraphTransformer training")
        check_rng(rng, "GraphTransformer rng")
        n = x.shape[0]
        batch_host, num_graphs = _check_batch(batch, num_graphs, n, graph.edge_index)
        check_optional_input(
            edge_attr, "edge_attr", "edge_dim", self.edge_dim, graph.num_edges, x,
            "GraphTransformer",
        )  # fmt: skip
        noise = dict(noise or {})
        if self.arch in STUDY_ARCHS:
            check_study_pe(self, pe, n, x)
            return study_forward(
                self, params, x, graph, edge_attr, pe, batch_host, num_graphs, training, rng,
                noise, state,
            )  # fmt: skip
        if state:
            raise ValueError(f"GraphTransformer arch {self.arch!r} has no state; pass none")
        return conv_forward(
            self, params, x, graph, edge_attr, pe, batch_host, num_graphs, training, rng, noise
        )

    # -- backward ----------------------------------------------------------------------
    def backward(
        self,
        params: dict[str, Any],
        cache: GraphTransformerCache | StudyCache,
        d_out: Any,
        input_grad: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_inputs, d_params)`` with ``d_inputs`` = ``d_x``,
        or the tuple ``(d_x[, d_edge_attr][, d_pe])`` when the model takes those inputs
        (``d_x`` is None with ``input_grad=False``)."""
        x = cache.input.x
        rows = x.shape[0] if self.pool is None else cache.batch.num_segments
        check_cotangent(d_out, (rows, self.out_channels), x.dtype, x, name="d_out")
        check_bool(input_grad, "GraphTransformer input_grad")
        if self.arch in STUDY_ARCHS:
            return study_backward(self, params, cache, d_out, input_grad)
        return conv_backward(self, params, cache, d_out, input_grad)

    # -- inspection ----------------------------------------------------------------------
    def activations(self, cache: GraphTransformerCache | StudyCache) -> dict[str, tuple]:
        """Per layer, the tensors the massive-activation analysis reads, each with the graph of
        every row: ``layer{l}.scores`` ``((E', H*d_k), (E',))`` the per-edge score vectors
        before the sum over a head's channels (``TransformerConv.score_vectors``), and
        ``layer{l}.output`` ``((N', D), (N',))`` the layer's node outputs (global nodes
        included); for the study's architectures, the streams it logs
        (:func:`~refimpl.models.study_archs.study_activations`). Graph ids are host int64."""
        if self.arch in STUDY_ARCHS:
            return study_activations(self, cache)
        return conv_activations(self, cache)
