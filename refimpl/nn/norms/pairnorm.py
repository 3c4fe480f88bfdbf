"""``PairNorm`` (Zhao & Akoglu 2020) with its hand-written backward, for ONE graph.

PairNorm keeps the total pairwise squared distance between node representations
constant from layer to layer, so that stacked graph convolutions cannot collapse
every node onto one point (oversmoothing). The LipschitzNorm paper uses it as a
baseline ("-Pn", LipschitzNorm Sec. 7, Tables 1 and 3, Fig. 5-6).

Node features ``x`` of shape ``(N, C)`` for one graph, so every mean below runs
over all ``N`` rows; there is no batch vector (PyG's ``batch=None`` path). For a
mini-batch of graphs, apply the block to each graph's rows separately.

Modes, with ``s = scale`` and the column mean ``m = (1/N) sum_i x_i`` (a row
vector of length ``C``); each is PairNorm's "Center" step followed by a "Scale"
step, as written in the paper (its equation numbers are not checked here: the
paper is not in ``papers/``):

``"PN"`` (PyG ``PairNorm(scale_individually=False)``)::

    xc_i  = x_i - m
    out_i = s * xc_i / sqrt(eps + (1/N) sum_j ||xc_j||^2)

``"PN-SI"``, scale individually (PyG ``PairNorm(scale_individually=True)``)::

    xc_i  = x_i - m
    out_i = s * xc_i / (||xc_i|| + eps)

``"PN-SCS"``, scale and centre simultaneously (not in the paper nor in PyG; from
the authors' code, github.com/LingxiaoShawn/PairNorm, whose comment says it
"works well in practice, especially for GCN and GAT")::

    out_i = s * x_i / sqrt(eps + ||x_i||^2) - m

Where ``eps`` sits: each mode follows its reference, which is not consistent
across them. PyG puts ``eps`` inside the root for "PN" (``sqrt(eps + q)``) but
outside for "PN-SI" (``||xc_i|| + eps``); the authors' code puts ``1e-6`` inside
the root in all three modes. ``eps_inside_sqrt=None`` (default) reproduces PyG
for "PN"/"PN-SI" and the authors' code for "PN-SCS"; ``True`` gives the authors'
placement everywhere (pass ``eps=1e-6`` to reproduce their code exactly).

Edge semantics. ``N = 1`` centres to zero, so "PN"/"PN-SI" output zeros and
have zero gradient. A zero denominator statistic (all rows equal for "PN", a row
equal to the mean row for "PN-SI", a zero row for "PN-SCS") gives exactly zero
output for the affected rows when the mean is computed exactly, and is finite
because ``eps > 0``. With ``eps = 0`` such input raises ``ValueError`` instead of
returning NaN. With ``eps`` outside the root, the block is differentiable even
where ``||xc_i|| = 0`` (``xc / (||xc|| + eps)`` has Jacobian ``I / eps`` there);
the backward takes the chain rule through ``sqrt`` at zero as its limit, 0, which
gives exactly that Jacobian (PyTorch's autograd does the same).

Properties (tested): "PN" output has zero column means and mean squared row
norm ``s^2 q / D^2`` (``s^2`` up to the eps effect); each "PN-SI" row has norm
``s ||xc_i|| / D_i``; rows of ``out + m`` in "PN-SCS" likewise.

Forward and backward side by side (``q`` the statistic, ``D`` the denominator,
``count`` = ``N`` for "PN" and 1 otherwise):

    F1  m = mean_i x_i (1, C);  base = x - m    ("PN-SCS": base = x)
    F2  q = (1/count) sum ||base_i||^2          (1, 1) for "PN", (N, 1) otherwise
    F3  D = sqrt(q + eps)  or  sqrt(q) + eps
    F4  out = s * base / D                      ("PN-SCS": minus m)

    B4  d_base = s d_out / D;  d_D = -s sum(d_out * base) / D^2 over D's broadcast axes
    B3  d_q = d_D / (2 D) inside;  d_D / (2 sqrt(q)) outside, 0 where q = 0
    B2  d_base += d_q * 2 base / count
    B1  d_x = d_base - mean_i d_base_i          ("PN-SCS": d_x = d_base - sum_i d_out_i / N)

The block has no parameters: ``params`` is ``{}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.fields import check_nonnegative_number, check_optional_bool
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.ops.eps_root import eps_root, eps_root_backward
from refimpl.validation import check_cotangent, check_input, check_params

__all__ = ["PAIRNORM_MODES", "PairNorm", "PairNormCache"]

PAIRNORM_MODES = ("PN", "PN-SI", "PN-SCS")


class PairNormCache(NamedTuple):
    """What :meth:`PairNorm.backward` reads.

    Attributes
    ----------
    base : array, (N, C)
        What the scaling acts on: ``x - m`` ("PN", "PN-SI") or ``x`` ("PN-SCS").
    root : array, (1, 1) for "PN", else (N, 1)
        The square root of the statistic ``q``, ``eps`` excluded.
    denominator : array, shaped as root
        ``sqrt(q + eps)`` or ``sqrt(q) + eps``.
    """

    base: Any
    root: Any
    denominator: Any


@dataclass(frozen=True)
class PairNorm:
    r"""PairNorm (Zhao & Akoglu 2020) over the nodes of one graph: its Center and Scale steps.

    With $s$ = ``scale``, the column mean $\mathbf{m} = \frac{1}{N} \sum_i \mathbf{x}_i$ and
    $\mathbf{x}^c_i = \mathbf{x}_i - \mathbf{m}$ (``eps`` placed as ``eps_inside_sqrt``
    says; the paper's equation numbers are not cited, as it is not among the project's
    papers), the modes ``"PN"``, ``"PN-SI"`` and ``"PN-SCS"`` are:

    $$
    \mathbf{x}'_i = \frac{s\,\mathbf{x}^c_i}{\sqrt{\epsilon + \frac{1}{N} \sum_j
    \lVert \mathbf{x}^c_j \rVert^2}},
    \qquad
    \mathbf{x}'_i = \frac{s\,\mathbf{x}^c_i}{\lVert \mathbf{x}^c_i \rVert + \epsilon},
    \qquad
    \mathbf{x}'_i = \frac{s\,\mathbf{x}_i}{\sqrt{\epsilon + \lVert \mathbf{x}_i
    \rVert^2}} - \mathbf{m}
    $$

    No parameters (``params`` is ``{}``); the output has ``x``'s dtype and backend. The
    module docstring gives the edge cases and the backward's steps.

    Parameters
    ----------
    mode : {"PN", "PN-SI", "PN-SCS"}, default "PN"
        ``"PN"`` and ``"PN-SI"`` are PyG's ``PairNorm(scale_individually=False / True)``;
        ``"PN-SCS"`` (scale and centre simultaneously) is the authors' code's.
    scale : float, default 1.0
        $s$, the target root-mean-square row norm (PyG's ``scale``).
    eps : float, default 1e-5
        $\epsilon$, added to the denominator (PyG's ``eps``; the authors' code: 1e-6).
    eps_inside_sqrt : bool or None, default None
        None: PyG's placement (as above; ``"PN-SCS"`` the authors'); True: inside the root
        in every mode (the authors' code); False: outside in every mode.

    Shapes
    ------
    - **input**: ``x`` $(N, C)$, the rows of one graph
    - **output**: $(N, C)$
    - **backward**: ``d_out`` $(N, C)$; returns ``(d_x (N, C), {})``
    """

    mode: str = "PN"  # "PN", "PN-SI" or "PN-SCS"; PyG default "PN"
    scale: float = 1.0  # s, the target root-mean-square row norm; PyG default
    eps: float = 1e-5  # added to the denominator; PyG default (authors' code: 1e-6)
    eps_inside_sqrt: bool | None = None  # None: PyG's placement (see module docstring)

    def __post_init__(self) -> None:
        if self.mode not in PAIRNORM_MODES:
            raise ValueError(
                f"PairNorm mode must be one of {', '.join(map(repr, PAIRNORM_MODES))}, "
                f"got {self.mode!r}"
            )
        check_nonnegative_number(self.scale, "PairNorm scale", allow_zero=False)
        check_nonnegative_number(self.eps, "PairNorm eps")
        inside = check_optional_bool(self.eps_inside_sqrt, "PairNorm eps_inside_sqrt")
        object.__setattr__(self, "eps_inside_sqrt", inside)

    @property
    def inside(self) -> bool:
        """Whether ``eps`` is added under the square root (resolves ``eps_inside_sqrt=None``)."""
        if self.eps_inside_sqrt is not None:
            return self.eps_inside_sqrt
        return self.mode != "PN-SI"  # PyG: "PN" inside, "PN-SI" outside; authors: "PN-SCS" inside

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """No parameters."""
        return {}

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """``{}``: PairNorm has no parameters (arguments accepted for the protocol)."""
        return {}

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, PairNormCache]:
        """Normalise ``x`` (N, C) over the graph's nodes; returns ``(out (N, C), cache)``."""
        check_params(params, {}, "PairNorm")
        check_input(x, "x", shape=(None, None))
        if x.shape[0] == 0:
            raise ValueError("x must have at least one row (node); got shape (0, ...)")
        # F1 column mean m (1, C), and the array the scaling acts on (N, C)
        mean = x.mean(axis=0, keepdims=True)
        base = x if self.mode == "PN-SCS" else x - mean
        # F2 the statistic q: mean squared row norm (1, 1) or each squared row norm (N, 1)
        squares = (base * base).sum(axis=1, keepdims=True)  # (N, 1)
        q = squares.mean(axis=0, keepdims=True) if self.mode == "PN" else squares
        # an infinite q from finite x would scale every row to zero, silently
        check_overflow(q, "PairNorm.forward: the squared norms of x", x.dtype)
        # F3 the denominator, eps inside or outside the root
        root, denominator = eps_root(q, self.eps, self.inside)
        if self.eps == 0 and not bool((denominator > 0).all()):
            raise ValueError(
                f"PairNorm({self.mode!r}) with eps=0 divides by zero: "
                + _ZERO_STATISTIC[self.mode]
                + "; use eps > 0"
            )
        # F4 scale (N, C); "PN-SCS" centres after scaling
        out = self.scale * base / denominator
        if self.mode == "PN-SCS":
            out = out - mean
        check_overflow(out, "PairNorm.forward: its output", x.dtype)
        return out, PairNormCache(base, root, denominator)

    def backward(
        self, params: dict[str, Any], cache: PairNormCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of a scalar loss: ``(d_x (N, C), {})``."""
        base = cache.base
        check_cotangent(d_out, base.shape, base.dtype, base, name="d_out")
        return backward_checked(lambda: self._backward(cache, d_out), "PairNorm", base.dtype)

    def _backward(self, cache: PairNormCache, d_out: Any) -> tuple[Any, dict[str, Any]]:
        """B4-B1 of :meth:`backward` on a checked cotangent."""
        base, root, denominator = cache
        num_nodes = base.shape[0]
        # B4 (of F4) out = s * base / D: base and D both receive gradient
        d_base = self.scale * d_out / denominator  # (N, C)
        # reduce over the axes D was broadcast along: all for "PN", the channels otherwise
        axis = None if self.mode == "PN" else 1
        d_denominator = -self.scale * (d_out * base).sum(axis=axis, keepdims=True)
        d_denominator = d_denominator / (denominator * denominator)
        # B3 (of F3) where q = 0, base = 0 too, so d_D = 0 (see eps_root_backward)
        d_q = eps_root_backward(root, denominator, d_denominator, self.inside)
        # B2 (of F2) q = (1/count) sum ||base_i||^2 over the rows it covers
        count = num_nodes if self.mode == "PN" else 1
        d_base = d_base + d_q * (2 / count) * base  # (N, C)
        # B1 (of F1) the centring x - m is the symmetric projection I - 11^T/N: its adjoint
        # is itself. "PN-SCS": base = x, and F4's "- m" sends d_m = -sum_i d_out_i through
        # the mean, whose adjoint broadcasts d_m / N to every node
        if self.mode == "PN-SCS":
            d_x = d_base - d_out.sum(axis=0, keepdims=True) / num_nodes
        else:
            d_x = d_base - d_base.mean(axis=0, keepdims=True)
        return d_x, {}


_ZERO_STATISTIC = {
    "PN": "all rows of x are equal (zero spread over the nodes)",
    "PN-SI": "some row of x equals the column mean (zero norm after centring)",
    "PN-SCS": "some row of x is zero",
}
