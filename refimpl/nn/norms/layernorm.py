"""``LayerNorm`` over a node's features or over a whole graph, with its hand-written backward.

Layer normalisation (Ba, Kiros & Hinton 2016) standardises a group of entries by
their own mean and (biased) standard deviation, then applies a per-feature
affine map. The LipschitzNorm paper uses it as a baseline ("-Ln", LipschitzNorm
Sec. 7.3, Fig. 6); the graph transformer of the massive-activations supplement
applies it after every sub-layer (supplement Eq. 11, per node).

Node features ``x`` of shape ``(N, C)`` for ONE graph; there is no batch vector
(PyG's ``batch=None`` path). ``G`` is the group an entry is normalised with::

    mu    = mean over G of x                      (biased statistics:
    var   = mean over G of (x - mu)^2               divide by |G|, not |G| - 1)
    xhat  = (x - mu) / D,   D = sqrt(var + eps)   (eps inside the root)
                       or   D = sqrt(var) + eps   (eps outside the root)
    out   = xhat * weight + bias                  (weight, bias: (C,), one per feature)

``mode="node"``: ``G`` is the node's own ``C`` features, ``|G| = C``; this is
``torch.nn.LayerNorm(C)`` / ``torch.nn.functional.layer_norm`` and PyG
``LayerNorm(mode="node")`` (eps inside the root).

``mode="graph"``: ``G`` is all ``N * C`` entries of the graph, one mean and one
variance; this is PyG ``LayerNorm(mode="graph")``. PyG is not consistent about
``eps`` here: without a batch vector it computes ``x / (x.std(unbiased=False) +
eps)`` (eps outside), with a batch vector ``x / sqrt(var + eps)`` (eps inside).
``eps_inside_sqrt=None`` (default) follows PyG without a batch vector: inside for
"node", outside for "graph"; pass ``True`` to match PyG called with a batch
vector (e.g. a ``DataLoader`` batch holding this one graph).

Edge semantics. ``C = 1`` in "node" mode (or a constant row) centres to zero:
the output is ``bias`` and ``d_x`` is zero. Zero variance gives ``xhat = 0``
exactly when the mean is computed exactly, and stays finite because ``eps > 0``;
with ``eps = 0`` such input raises ``ValueError`` instead of returning NaN. With
``eps`` outside the root, the block is differentiable even at zero variance
(Jacobian ``weight / eps`` times the centring projection); the backward takes
the chain rule through ``sqrt`` at zero as its limit, 0, which gives exactly
that Jacobian (PyTorch's autograd does the same).

Parameters (``affine=True``, PyG and torch names and initialisation): ``weight``
``(C,)`` ones and ``bias`` ``(C,)`` zeros; ``{}`` when ``affine=False``.

Forward and backward side by side (sums and means over ``G``: axis 1 for "node",
everything for "graph"; ``|G|`` = ``C`` or ``N * C``):

    F1  xc = x - mean_G x
    F2  var = mean_G xc^2                       (N, 1) or (1, 1)
    F3  D = sqrt(var + eps)  or  sqrt(var) + eps;  xhat = xc / D
    F4  out = xhat * weight + bias

    B4  d_weight = sum_nodes d_out * xhat;  d_bias = sum_nodes d_out;  d_xhat = d_out * weight
    B3  d_xc = d_xhat / D;  d_D = -sum_G(d_xhat * xhat) / D
    B2  d_var = d_D / (2 D) inside, d_D / (2 sqrt(var)) outside (0 where var = 0);
        d_xc += d_var * 2 xc / |G|
    B1  d_x = d_xc - mean_G d_xc
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.fields import (
    check_bool,
    check_nonnegative_number,
    check_optional_bool,
    check_positive_int,
)
from refimpl.nn.norms.affine import affine_init, affine_shapes
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.ops.eps_root import eps_root, eps_root_backward
from refimpl.validation import check_block_inputs, check_cotangent

__all__ = ["LAYERNORM_MODES", "LayerNorm", "LayerNormCache"]

LAYERNORM_MODES = ("node", "graph")


class LayerNormCache(NamedTuple):
    """What :meth:`LayerNorm.backward` reads (statistics are ``(N, 1)`` per node, ``(1, 1)``
    per graph).

    Attributes
    ----------
    xhat : array, (N, C)
        The standardised input, before the affine map.
    root : array, (N, 1) or (1, 1)
        ``sqrt(var)``, ``eps`` excluded.
    denominator : array, shaped as root
        ``sqrt(var + eps)`` or ``sqrt(var) + eps``.
    """

    xhat: Any
    root: Any
    denominator: Any


@dataclass(frozen=True)
class LayerNorm:
    r"""Layer normalisation (Ba, Kiros & Hinton 2016) per node or per graph.

    Over the group $G$ of each entry (a node's $C$ features, or all $N C$ entries of the
    graph), with biased statistics and $\epsilon$ placed as ``eps_inside_sqrt`` says (as
    the massive-activations supplement's Eq. (11) applies it, per node):

    $$
    \mathbf{x}' = \frac{\mathbf{x} - \mu_G}{\sqrt{\sigma_G^2 + \epsilon}} \odot
    \mathbf{w} + \mathbf{b}
    \quad \text{or} \quad
    \mathbf{x}' = \frac{\mathbf{x} - \mu_G}{\sigma_G + \epsilon} \odot \mathbf{w} +
    \mathbf{b}
    $$

    with $\mathbf{w}$ (``weight``, ones) and $\mathbf{b}$ (``bias``, zeros) per feature
    when ``affine``. The module docstring gives the edge cases and the backward's steps.

    Parameters
    ----------
    channels : int
        $C$, the features per node.
    mode : {"node", "graph"}
        ``"node"``: ``torch.nn.LayerNorm(C)`` and PyG's ``LayerNorm(mode="node")``;
        ``"graph"``: PyG's default. No default on purpose: a silent choice would surprise
        the users of one or the other.
    affine : bool, default True
        Learn the per-feature ``weight`` and ``bias`` (PyG's and torch's default).
    eps : float, default 1e-5
        $\epsilon \ge 0$, added to the denominator (PyG's and torch's default).
    eps_inside_sqrt : bool or None, default None
        None: as PyG without a batch vector, inside the root for ``"node"``, outside for
        ``"graph"``; True: inside (PyG with a batch vector); False: outside.

    Shapes
    ------
    - **input**: ``x`` $(N, C)$, the rows of one graph
    - **output**: $(N, C)$
    - **backward**: ``d_out`` $(N, C)$; returns ``d_x`` $(N, C)$ and ``d_params``
      (``weight``, ``bias`` $(C,)$ with ``affine``)
    """

    channels: int  # C, the number of features per node
    mode: str  # "node" (torch.nn.LayerNorm) or "graph" (PyG's default)
    affine: bool = True  # learnable per-feature weight and bias; PyG and torch default
    eps: float = 1e-5  # added to the denominator; PyG and torch default
    eps_inside_sqrt: bool | None = None  # None: as PyG without a batch vector (see docstring)

    def __post_init__(self) -> None:
        check_positive_int(self.channels, "LayerNorm channels")  # at most 2**31 - 1
        if self.mode not in LAYERNORM_MODES:
            raise ValueError(f"LayerNorm mode must be 'node' or 'graph', got {self.mode!r}")
        check_nonnegative_number(self.eps, "LayerNorm eps")
        object.__setattr__(self, "affine", check_bool(self.affine, "LayerNorm affine"))
        inside = check_optional_bool(self.eps_inside_sqrt, "LayerNorm eps_inside_sqrt")
        object.__setattr__(self, "eps_inside_sqrt", inside)

    @property
    def inside(self) -> bool:
        """Whether ``eps`` is added under the square root (resolves ``eps_inside_sqrt=None``)."""
        if self.eps_inside_sqrt is not None:
            return self.eps_inside_sqrt
        return self.mode == "node"

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the parameters, in order."""
        return affine_shapes(self.channels, self.affine)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """``weight`` ones and ``bias`` zeros, as PyG and torch (``rng`` is not used)."""
        return affine_init(self.channels, self.affine, backend, dtype)

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, LayerNormCache]:
        """Normalise ``x`` (N, channels); returns ``(out (N, channels), cache)``."""
        check_block_inputs(params, self.param_shapes(), "LayerNorm", x, self.channels)
        if x.shape[0] == 0:
            raise ValueError("x must have at least one row (node); got shape (0, ...)")
        axis = 1 if self.mode == "node" else None  # the group G: a row, or everything
        # F1 centre over G: (N, 1) or (1, 1) mean
        centred = x - x.mean(axis=axis, keepdims=True)  # (N, C)
        # F2 biased variance over G
        var = (centred * centred).mean(axis=axis, keepdims=True)
        # an infinite variance from finite x would give a zero xhat, and out = bias, silently
        check_overflow(var, "LayerNorm.forward: the variance of x", x.dtype)
        # F3 standardise, eps inside or outside the root
        root, denominator = eps_root(var, self.eps, self.inside)
        if self.eps == 0 and not bool((denominator > 0).all()):
            where = "some row of x is constant" if axis == 1 else "all entries of x are equal"
            raise ValueError(
                f"LayerNorm(mode={self.mode!r}) with eps=0 divides by zero: {where}; use eps > 0"
            )
        xhat = centred / denominator  # (N, C)
        # F4 per-feature affine map, broadcast over nodes
        out = xhat * params["weight"] + params["bias"] if self.affine else xhat
        check_overflow(out, "LayerNorm.forward: its output", x.dtype)
        return out, LayerNormCache(xhat, root, denominator)

    def backward(
        self, params: dict[str, Any], cache: LayerNormCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of a scalar loss: ``(d_x (N, C), {"weight": (C,), "bias": (C,)})``."""
        xhat = cache.xhat
        check_cotangent(d_out, xhat.shape, xhat.dtype, xhat, name="d_out")
        return backward_checked(
            lambda: self._backward(params, cache, d_out), "LayerNorm", xhat.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: LayerNormCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """B4-B1 of :meth:`backward` on a checked cotangent."""
        xhat, root, denominator = cache
        axis = 1 if self.mode == "node" else None
        group_size = xhat.shape[1] if self.mode == "node" else xhat.size
        d_params: dict[str, Any] = {}
        # B4 (of F4) the affine map; broadcasting over nodes is adjoint to summing over them
        if self.affine:
            d_params["weight"] = (d_out * xhat).sum(axis=0)  # (C,)
            d_params["bias"] = d_out.sum(axis=0)  # (C,)
            d_xhat = d_out * params["weight"]  # (N, C)
        else:
            d_xhat = d_out
        # B3 (of F3) xhat = centred / D: both receive gradient; d_D sums over G
        d_centred = d_xhat / denominator  # (N, C)
        d_denominator = -(d_xhat * xhat).sum(axis=axis, keepdims=True) / denominator
        # where var = 0, xhat = 0 too, so d_D = 0 (see eps_root_backward)
        d_var = eps_root_backward(root, denominator, d_denominator, self.inside)
        # B2 (of F2) var = mean over G of centred^2, and centred = xhat * D
        d_centred = d_centred + d_var * (2 / group_size) * (xhat * denominator)
        # B1 (of F1) the centring is the symmetric projection I - 11^T/|G|: its own adjoint
        d_x = d_centred - d_centred.mean(axis=axis, keepdims=True)
        return d_x, {name: d_params[name] for name in params}
