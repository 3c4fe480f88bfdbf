"""GAT-balance beyond the per-neuron law: its layer sums (Cor 2.4, Eq. 6), their telescoping
over the network (Eq. 8-9), and the gradients every conservation check reads.

Eq. 3 holds per hidden neuron (:mod:`proofs_check.conservation`); summed over a layer's
neurons it is Eq. 6, ``<W^l, g>_F - <a^l, g> = <W^(l+1), g>_F`` (the gradient-flow rates of
``||W^l||_F^2 - ||a^l||^2`` and ``||W^(l+1)||_F^2``, up to the factor -2), and summed over
all layers it telescopes to Eq. 9, ``<W^1, g>_F - sum_l <a^l, g> = <W^L, g>_F``. Both are
computed here from the parameter matrices themselves, not from the per-neuron sets, for
GATv2 with shared weights and one head, without bias or residual (Thm 2.2's setting, where
the neuron sets are exactly rows and columns).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from proofs_check.conservation import RESIDUAL_TOL, gradients, random_case
from proofs_check.registry import Context, WorstCase, check
from refimpl.backend import to_numpy
from refimpl.graph import Graph
from refimpl.models import GAT
from refimpl.nn import GATConv
from refimpl.ops.activations import get_activation
from refimpl.ops.losses import SoftmaxCrossEntropy
from refimpl.testing import GRADCHECK_RTOL, check_gradients

__all__: list[str] = []  # the checks are registered, not exported


def _inner(params: dict, grads: dict, name: str) -> float:
    return float(to_numpy((params[name] * grads[name]).sum()))


def _layer_terms(ctx: Context) -> tuple[list[float], list[float]]:
    """``(<W^l, g>_F for l = 1..L, <a^l, g> for l = 1..L-1)`` of a random one-head, shared
    GATv2 without bias or residual (layers counted from 1, as the paper)."""
    model, params, x, graph, y, mask = random_case(
        ctx, version="v2", share_weights=True, heads=1, bias=False, residual=False
    )
    grads = gradients(model, params, x, graph, y, mask)
    depth = model.num_layers
    weights = [_inner(params, grads, f"layer{i}.W_s") for i in range(depth)]
    attention = [_inner(params, grads, f"layer{i}.att") for i in range(depth - 1)]
    return weights, attention


@check(
    id="gat_balance.cor2_4.eq6_layer_sums",
    paper="GAT-balance",
    statement="per hidden layer, <W^l, g>_F - <a^l, g> = <W^(l+1), g>_F (Cor 2.4, Eq. 6: the "
    "law summed over the layer's neurons), relative",
)
def eq6_layer_sums(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    for _ in range(max(ctx.cases, 1)):
        weights, attention = _layer_terms(ctx)
        for layer, a in enumerate(attention):  # hidden layers: each has a next layer
            terms = np.array([weights[layer], a, weights[layer + 1]])
            scale = max(float(np.abs(terms).max()), np.finfo(float).tiny)
            worst.add(abs(weights[layer] - a - weights[layer + 1]) / scale, RESIDUAL_TOL, 0)
        worst.n_cases += 1  # one network, however many layers
    return worst


@check(
    id="gat_balance.eq9.telescoping",
    paper="GAT-balance",
    statement="over the network, <W^1, g>_F - sum_l <a^l, g> = <W^L, g>_F (Eq. 8-9, Eq. 6 "
    "telescoped), relative",
)
def eq9_telescoping(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    for _ in range(max(ctx.cases, 1)):
        weights, attention = _layer_terms(ctx)
        terms = np.array([weights[0], *attention, weights[-1]])
        scale = max(float(np.abs(terms).max()), np.finfo(float).tiny)
        worst.add(abs(weights[0] - sum(attention) - weights[-1]) / scale, RESIDUAL_TOL)
    return worst


@check(
    id="gat_balance.gradients.central_differences",
    paper="GAT-balance",
    statement="the hand-written gradients the law checks read agree with central differences "
    "(the law itself is a rescaling identity, which a wrong derivative can satisfy)",
)
def gradients_central_differences(ctx: Context) -> WorstCase:
    # Eq. 3 follows from the loss's invariance under rescaling a neuron's weights; a backward
    # whose attention-activation derivative is wrong keeps that invariance and passes the law
    # checks, so they certify gradients only together with this check.
    worst = WorstCase("upper")
    for _ in range(max(ctx.cases // 8, 1)):
        version = str(ctx.rng.choice(["v1", "v2"]))
        sharing = bool(ctx.rng.integers(2))
        model, params, x, graph, y, mask = random_case(ctx, version=version, share_weights=sharing)
        loss = _Loss(model, y, mask)
        report = check_gradients(loss, params, (x, graph), max_entries=20, rng=ctx.rng)
        worst.add(report.max_rel_error, GRADCHECK_RTOL)
    return worst


class _Loss:
    """The law checks' loss as a block for :func:`refimpl.testing.check_gradients`: the mean
    cross-entropy of ``model`` over ``mask`` (a scalar), with the same backward as
    :func:`gradients`."""

    def __init__(self, model: GAT, y: Any, mask: Any) -> None:
        self.model, self.y, self.mask = model, y, mask

    def forward(self, params: dict, x: Any, graph: Graph) -> tuple:
        logits, cache = self.model.forward(params, x, graph)
        value, loss_cache = SoftmaxCrossEntropy().forward({}, logits, self.y, self.mask)
        return value, (cache, loss_cache)

    def backward(self, params: dict, caches: tuple, d_value: Any) -> tuple:
        cache, loss_cache = caches
        d_logits, _ = SoftmaxCrossEntropy().backward({}, loss_cache, float(d_value))
        return self.model.backward(params, cache, d_logits)


# -- Thm 6.4 as the paper writes the average: the mean over heads of phi -----------------------
ACTIVATION = "relu"  # phi: positively homogeneous, as the law needs


def mean_of_phi_network(
    rng: np.random.Generator,
) -> tuple[list[GATConv], dict[str, Any], Any, Graph, Any]:
    """A network of Thm 6.4's averaged form, ``h^l = (1/K) sum_k phi(sum_u alpha_k W_k h)``
    (heads averaged *after* phi, where :class:`refimpl.models.GAT` averages before): shared
    GATv2 layers with ``K`` concatenated heads each, no bias; the last layer one head, no
    phi. Returns ``(convs, params, x, graph, cotangent)``, ``params`` keyed ``layer{l}.*``."""
    depth, heads, width = int(rng.integers(2, 5)), int(rng.integers(2, 4)), int(rng.integers(2, 5))
    n, features, classes = int(rng.integers(2, 9)), int(rng.integers(1, 5)), int(rng.integers(2, 4))
    convs, params = [], {}
    for layer in range(depth):
        last = layer == depth - 1
        conv = GATConv(features if layer == 0 else width, classes if last else width,
                       heads=1 if last else heads, version="v2", share_weights=True,
                       bias=False)  # fmt: skip
        convs.append(conv)
        for name, value in conv.init_params(rng).items():
            params[f"layer{layer}.{name}"] = value + 0.5 * rng.standard_normal(value.shape)
    graph = Graph(rng.integers(0, n, size=(2, int(rng.integers(0, 3 * n + 1)))), n)
    x = rng.standard_normal((n, features))
    return convs, params, x, graph, rng.standard_normal((n, classes))


def mean_of_phi_gradients(
    convs: list[GATConv], params: dict, x: Any, graph: Graph, cotangent: Any, activation: str
) -> dict[str, Any]:
    """The gradient of ``<cotangent, f(x)>`` for :func:`mean_of_phi_network`'s network."""
    phi = get_activation(activation)
    caches, h = [], x
    for layer, conv in enumerate(convs):
        own = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(f"layer{layer}.")}
        z, conv_cache = conv.forward(own, h, graph)
        if layer == len(convs) - 1:
            caches.append((own, conv_cache, None))
            break
        activated, phi_cache = phi.forward({}, z)  # (N, K*C), per head
        caches.append((own, conv_cache, phi_cache))
        h = activated.reshape(len(x), conv.heads, conv.out_channels).mean(axis=1)  # (N, C)
    grads, d_h = {}, cotangent
    for layer in reversed(range(len(convs))):
        conv, (own, conv_cache, phi_cache) = convs[layer], caches[layer]
        d_z = d_h
        if phi_cache is not None:  # the mean's adjoint, then phi's
            shares = np.repeat(d_h[:, None, :] / conv.heads, conv.heads, axis=1)
            d_z, _ = phi.backward({}, phi_cache, shares.reshape(len(x), -1))
        d_h, d_own = conv.backward(own, conv_cache, d_z)
        grads |= {f"layer{layer}.{k}": v for k, v in d_own.items()}
    return grads


def mean_of_phi_residuals(convs: list[GATConv], params: dict, grads: dict) -> np.ndarray:
    """Eq. 26's relative residual per hidden neuron ``i``: ``sum_k <W_k^l[i,:], g>`` (the rows
    ``k C + i`` of ``W_s``) ``- sum_k a_k^l[i] g`` ``- <W^(l+1)[:,i], g>`` (column ``i`` of the
    next ``W_s``, every head of the next layer reads the averaged neuron)."""
    residuals = []
    for layer, conv in enumerate(convs[:-1]):
        k, c = conv.heads, conv.out_channels
        w, a = f"layer{layer}.W_s", f"layer{layer}.att"
        incoming = (params[w] * grads[w]).sum(axis=1).reshape(k, c).sum(axis=0)  # (C,)
        attention = (params[a] * grads[a]).sum(axis=0)  # (C,)
        nxt = f"layer{layer + 1}.W_s"
        outgoing = (params[nxt] * grads[nxt]).sum(axis=0)  # (C,)
        scale = np.maximum(np.maximum(abs(incoming), abs(attention)), abs(outgoing))
        delta = np.abs(incoming - attention - outgoing)
        residuals.append(np.where(scale > 0, delta / np.where(scale > 0, scale, 1.0), 0.0))
    return np.concatenate(residuals)


@check(
    id="gat_balance.thm6_4.mean_of_phi",
    paper="GAT-balance",
    statement="multi-head GATv2 averaged as the paper writes it, h = (1/K) sum_k phi(...): "
    "Eq. 26 per neuron, summed over heads (Thm 6.4), relative",
)
def thm6_4_mean_of_phi(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    for _ in range(max(ctx.cases // 2, 1)):
        convs, params, x, graph, cotangent = mean_of_phi_network(ctx.rng)
        grads = mean_of_phi_gradients(convs, params, x, graph, cotangent, ACTIVATION)
        worst.add(mean_of_phi_residuals(convs, params, grads), RESIDUAL_TOL)
    return worst
