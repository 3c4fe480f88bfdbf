"""GATv2 written in plain torch, correct (:class:`GATv2`) and with the bugs people ship in GAT code,
one small subclass per bug, each overriding the one step it gets wrong.

:class:`GATv2` follows PyG's ``GATv2Conv`` (Brody et al. 2022, Eq. 7; GAT-balance Eq. 1-2):
for an edge ``u -> v``, ``e_uv = att . LeakyReLU(W_s x_u + b_s + W_t x_v + b_t)``,
``alpha_uv`` the softmax of ``e_uv`` over the edges into ``v``, ``out_v = sum_u alpha_uv
(W_s x_u + b_s)``, heads concatenated or averaged, then ``bias``. Self-loops as in PyG:
existing ones removed, one per node added (on a bipartite graph, ``i -> i`` for the
``min(N_src, N_dst)`` nodes both sets have). Parameters under PyG's names (``lin_l``: the
sources' ``W_s``, ``lin_r``: the targets' ``W_t``), so :data:`PARAMS` says which refimpl
parameter each is. Options it has not (``share_weights``, ``edge_dim``, ``residual``) are
refused at construction.

The dropout bug: the differential test compares in evaluation mode, where ``F.dropout`` is
the identity wherever it stands, so a dropout moved before the softmax is invisible there,
and in training the masks are random draws no two implementations share (PyG's module cannot
be handed one). What is visible is the deterministic part of the misplaced step:
:class:`DropoutBeforeSoftmax` rescales the scores by dropout's ``1 / (1 - p)`` before the
softmax, as a hand-written inverted dropout does outside its ``if self.training`` guard, a
change of the softmax's temperature. It needs ``dropout > 0`` and a node with two incoming
edges of different scores to show.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Their names -> refimpl's (refimpl.nn.gat.conv's table), for refimpl's TorchModule adapter.
PARAMS = {
    "lin_l.weight": "W_s",
    "lin_l.bias": "b_s",
    "lin_r.weight": "W_t",
    "lin_r.bias": "b_t",
    "att": "att",
    "bias": "bias",
}


def segment_softmax(score: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Softmax of ``score`` (E, H) over the edges sharing ``index`` (E,), ``size`` groups."""
    groups = index[:, None].expand_as(score)
    shift = score.new_full((size, score.shape[1]), -torch.inf)
    shift = shift.scatter_reduce(0, groups, score, "amax").detach()  # cancels in the quotient
    weight = torch.exp(score - shift[index])
    total = score.new_zeros((size, score.shape[1])).index_add(0, index, weight)
    return weight / total[index]


class GATv2(torch.nn.Module):
    """GATv2 as PyG's ``GATv2Conv`` (module docstring), with PyG's constructor arguments."""

    def __init__(
        self,
        in_channels: int | list[int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        bias: bool = True,
        share_weights: bool = False,
        edge_dim: int | None = None,
        residual: bool = False,
    ) -> None:
        super().__init__()
        if share_weights or edge_dim is not None or residual:
            raise ValueError("GATv2 here has no share_weights, edge_dim or residual")
        f_src, f_dst = in_channels if isinstance(in_channels, list) else [in_channels] * 2
        self.heads, self.channels, self.concat = heads, out_channels, concat
        self.negative_slope, self.dropout, self.loops = negative_slope, dropout, add_self_loops
        self.lin_l = torch.nn.Linear(f_src, heads * out_channels, bias=bias)
        self.lin_r = torch.nn.Linear(f_dst, heads * out_channels, bias=bias)
        self.att = torch.nn.Parameter(torch.zeros(1, heads, out_channels))
        width = heads * out_channels if concat else out_channels
        self.bias = torch.nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x: torch.Tensor | tuple, edge_index: torch.Tensor) -> torch.Tensor:
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        n_src, n_dst = x_src.shape[0], x_dst.shape[0]
        src, dst = self.attended_edges(edge_index, n_src, n_dst)
        x_l, x_r = self.project(x_src, x_dst)  # (N_src, H, C), (N_dst, H, C)
        pre = x_l[src] + x_r[dst]  # (E, H, C)
        score = (self.leaky_relu(pre) * self.att).sum(-1)  # (E, H)
        alpha = self.softmax(self.before_softmax(score), src, dst, n_src, n_dst)
        alpha = F.dropout(alpha, self.dropout, self.training)
        message = alpha[..., None] * x_l[src]  # (E, H, C)
        out = x_l.new_zeros((n_dst, self.heads, self.channels)).index_add(0, dst, message)
        out = out.reshape(n_dst, self.heads * self.channels) if self.concat else out.mean(dim=1)
        return out if self.bias is None else out + self.bias

    def attended_edges(
        self, edge_index: torch.Tensor, n_src: int, n_dst: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        src, dst = edge_index
        if not self.loops:
            return src, dst
        keep = src != dst
        loops = self.loop_nodes(src[keep], dst[keep], n_src, n_dst)
        return torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])

    def loop_nodes(self, src: torch.Tensor, dst: torch.Tensor, n_src: int, n_dst: int):
        return torch.arange(min(n_src, n_dst))

    def project(self, x_src: torch.Tensor, x_dst: torch.Tensor) -> tuple:
        shape = (-1, self.heads, self.channels)
        return self.lin_l(x_src).reshape(shape), self.lin_r(x_dst).reshape(shape)

    def leaky_relu(self, pre: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(pre, self.negative_slope)

    def before_softmax(self, score: torch.Tensor) -> torch.Tensor:
        return score

    def softmax(self, score, src, dst, n_src: int, n_dst: int) -> torch.Tensor:
        return segment_softmax(score, dst, n_dst)


class SoftmaxOverSources(GATv2):
    """Normalises each source's outgoing scores instead of each target's incoming ones."""

    def softmax(self, score, src, dst, n_src: int, n_dst: int) -> torch.Tensor:
        return segment_softmax(score, src, n_src)


class NoLoopsOnIsolatedNodes(GATv2):
    """Adds a self-loop only to nodes that already have an incoming edge."""

    def loop_nodes(self, src: torch.Tensor, dst: torch.Tensor, n_src: int, n_dst: int):
        return torch.unique(dst)


class LeakyReluWrongSide(GATv2):
    """Applies the negative slope to positive inputs (and passes negative ones)."""

    def leaky_relu(self, pre: torch.Tensor) -> torch.Tensor:
        return torch.where(pre > 0, self.negative_slope * pre, pre)


class LinearsSwapped(GATv2):
    """Projects the sources with ``lin_r`` and the targets with ``lin_l``."""

    def project(self, x_src: torch.Tensor, x_dst: torch.Tensor) -> tuple:
        shape = (-1, self.heads, self.channels)
        return self.lin_r(x_src).reshape(shape), self.lin_l(x_dst).reshape(shape)


class DropoutBeforeSoftmax(GATv2):
    """Dropout's rescaling ``1 / (1 - p)`` on the scores, before the softmax (module docstring)."""

    def before_softmax(self, score: torch.Tensor) -> torch.Tensor:
        return score / (1.0 - self.dropout)


class BipartiteLoopsOnTargets(GATv2):
    """On a bipartite graph, adds a loop ``i -> i`` for every target, as on one node set
    (there are only ``N_src`` sources to take ``i`` from)."""

    def loop_nodes(self, src: torch.Tensor, dst: torch.Tensor, n_src: int, n_dst: int):
        return torch.arange(n_dst)


BUGS = (
    SoftmaxOverSources,
    NoLoopsOnIsolatedNodes,
    LeakyReluWrongSide,
    LinearsSwapped,
    DropoutBeforeSoftmax,
    BipartiteLoopsOnTargets,
)
