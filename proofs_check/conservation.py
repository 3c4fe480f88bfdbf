"""GAT-balance's conservation law (Thm 2.2, 6.3, 6.4, Remark 2.5, Cor 2.3, 2.4) as checks.

For hidden neuron ``i`` of layer ``l`` the law (Eq. 3, Eq. 7) says

    delta_i = <in_i, grad in_i> - <a_i, grad a_i> - <out_i, grad out_i> = 0,

with the three parameter sets of :mod:`refimpl.neurons`, written out per variant:

- GATv2, shared weights (Thm 2.2): ``in_i = W^l[i,:]``, ``a_i = a^l[i]``,
  ``out_i = W^{l+1}[:,i]``
- GATv2, unshared (Thm 6.3): ``in_i = W_s^l[i,:], W_t^l[i,:]``, ``a_i = a^l[i]``,
  ``out_i = W_s^{l+1}[:,i], W_t^{l+1}[:,i]`` (*)
- heads, concatenated (Thm 6.4): ``in_i`` the row of ``i``'s head ``k = i // C``,
  ``a_i = a_k[c]`` with ``c = i % C``, ``out_i = W^{l+1}[:,i]`` over all heads of layer ``l+1``
- heads, averaged (Thm 6.4): ``in_i = W_k^l[c,:]`` and ``a_i = a_k[c]`` for every head ``k``,
  ``out_i = W^{l+1}[:,i]`` over all heads of layer ``l+1``
- GATv1 (Remark 2.5): ``in_i = W^l[i,:]``, ``a_i = a_s[i], a_t[i]``, ``out_i = W^{l+1}[:,i]``
- GCN (Remark 2.5): ``in_i = W^l[i,:]``, no attention (``a = 0``), ``out_i = W^{l+1}[:,i]``
- bias, residual: ``in_i`` also holds ``b^l[i], R^l[i,:]``, ``out_i`` also ``R^{l+1}[:,i]``

(*) Eq. 18 as printed omits ``W_t^{l+1}[:,i]``; it is needed, because the next
layer's target transform reads ``h^l`` too (see :mod:`proofs_check.errata`).

Each check draws random graphs (self-loops, duplicate edges and isolated nodes
allowed), features, labels, a training mask and parameters (every entry
perturbed away from the initialisation, so biases, residuals and attention are
non-zero), takes the exact gradient of the mean cross-entropy from the
hand-written backward, and reports the worst ``|delta_i| / max(|three terms|)``
over all hidden neurons and cases, against ``RESIDUAL_TOL``.

``delta_i`` is the derivative of the loss along the rescaling ``(lambda in_i,
a_i / lambda, out_i / lambda)`` at ``lambda = 1`` (Lemma 6.2), so the law holds
exactly whenever that rescaling leaves the network's output unchanged: for
ReLU, LeakyReLU of any slope and the identity, not for ELU (negative control).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from proofs_check.registry import Context, WorstCase, check
from refimpl.backend import to_numpy
from refimpl.diagnostics import balancedness, conservation_residuals
from refimpl.graph import Graph
from refimpl.init import INITIALISERS, balance
from refimpl.models import GAT
from refimpl.neurons import layer_structure, neuron_sums
from refimpl.ops.losses import SoftmaxCrossEntropy

__all__ = [
    "RESIDUAL_TOL",
    "gd_drift",
    "gradients",
    "random_case",
    "relative_residual",
]

# Eq. 3 in float64: each inner product sums O(width) terms of gradients that are
# themselves exact to ~1e-15 relative; 1e-10 leaves five orders of magnitude for
# cancellation and still catches any term missing from a set (those are O(1)).
RESIDUAL_TOL = 1e-10
# Balanced initialisation: c_i is a difference of squared norms of O(1), each a
# sum of at most ~10^2 squares here, exact to ~1e-14 absolute.
BALANCED_TOL = 1e-12
# ELU's residual on these small networks is O(0.1-1); a law that held would give 1e-15.
BROKEN_AT_LEAST = 1e-3


# -- the quantities ------------------------------------------------------------------
def gradients(
    model: GAT, params: dict[str, Any], x: Any, graph: Graph, y: Any, mask: Any
) -> dict[str, Any]:
    """The exact gradient of the mean cross-entropy over ``mask`` (hand-written backward)."""
    logits, cache = model.forward(params, x, graph)
    loss = SoftmaxCrossEntropy()
    _, loss_cache = loss.forward({}, logits, y, mask)
    d_logits, _ = loss.backward({}, loss_cache, 1.0)
    _, grads = model.backward(params, cache, d_logits, input_grad=False)
    return grads


def relative_residual(params: dict[str, Any], grads: dict[str, Any]) -> np.ndarray:
    """Eq. 7's ``|delta_i| / max(|terms|)`` for every hidden neuron of every layer, flat."""
    return np.concatenate([r.relative for r in conservation_residuals(params, grads)])


def random_case(ctx: Context, **model_options: Any) -> tuple[GAT, dict, Any, Graph, Any, Any]:
    """A random model (depth 2-5, width 2-6 per head, 1-3 heads unless given), parameters,
    graph (1-10 nodes), features, labels and training mask."""
    rng = ctx.rng
    options = {
        "num_layers": int(rng.integers(2, 6)),
        "hidden_channels": int(rng.integers(2, 7)),
        "heads": int(rng.integers(1, 4)),
        "negative_slope": float(rng.choice([0.2, 0.01, 0.5])),  # the attention LeakyReLU
        **model_options,
    }
    n, features, classes = (
        int(rng.integers(1, 11)),
        int(rng.integers(1, 6)),
        int(rng.integers(2, 5)),
    )
    model = GAT(features, out_channels=classes, **options)
    params = model.init_params(rng, init="xavier")
    params = {k: v + 0.5 * rng.standard_normal(v.shape) for k, v in params.items()}
    edges = rng.integers(0, n, size=(2, int(rng.integers(0, 3 * n + 1))))
    graph = Graph(edges, n)
    x = rng.standard_normal((n, features))
    y = rng.integers(0, classes, size=n)
    mask = rng.random(n) < 0.7
    mask[rng.integers(0, n)] = True  # at least one labelled node
    params = {k: ctx.asarray(v) for k, v in params.items()}
    return model, params, ctx.asarray(x), graph, ctx.xp.asarray(y), ctx.xp.asarray(mask)


def zeroed_attention(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every attention vector zero: GATv2 as a GCN (Remark 2.5)."""
    attention = {k for layer in layer_structure(params) for k in layer.attention}
    return {k: v * 0 if k in attention else v for k, v in params.items()}


def _law_check(
    ctx: Context,
    zero_attention: bool = False,
    per_case: Callable[[np.random.Generator], dict] | None = None,
    **model_options: Any,
) -> WorstCase:
    """The law's relative residual over ``random_case`` models; ``per_case(rng)`` draws more
    model options for every case (a slope, weight sharing), ``model_options`` fix them."""
    worst = WorstCase("upper")
    for _ in range(max(ctx.cases, 1)):  # at least one case: none proves nothing
        drawn = {} if per_case is None else per_case(ctx.rng)
        model, params, x, graph, y, mask = random_case(ctx, **model_options, **drawn)
        if zero_attention:
            params = zeroed_attention(params)
            # the case must be the one it claims (GCN: no attention at all), or fail
            attention = [k for layer in layer_structure(params) for k in layer.attention]
            if not attention or any(bool(np.any(to_numpy(params[k]))) for k in attention):
                raise AssertionError("the zero-attention case has attention parameters left")
        worst.add(
            relative_residual(params, gradients(model, params, x, graph, y, mask)), RESIDUAL_TOL
        )
    return worst


def gd_drift(
    model: GAT, params: dict, x: Any, graph: Graph, y: Any, mask: Any, lr: float, steps: int
) -> tuple[np.ndarray, float]:
    """Run ``steps`` of plain gradient descent; return ``c(T) - c(0)`` (all hidden neurons)
    and the worst per-step error of the exact drift identity

        c(t+1) - c(t) = lr^2 (||g_in||^2 - ||g_a||^2 - ||g_out||^2)     (per neuron)

    which follows from ``||w - lr g||^2 = ||w||^2 - 2 lr <w, g> + lr^2 ||g||^2``
    with Eq. 3 cancelling the first-order terms (Cor 2.3 for finite steps). The
    error is ``|lhs - rhs| / (64 u S)``: in units of a rounding allowance, ``S``
    the sum of the squared norms that ``c`` subtracts (each ``c`` is exact to a
    few ``u S``, and so is the difference of two). A law with a first-order term
    left over would add ``2 lr <w, g>``, some 10^10 of these units.
    """
    layers = layer_structure(params)
    unit_roundoff = np.finfo(np.float64).eps / 2

    def norm_total(values: dict) -> np.ndarray:
        """Per neuron, the sum of the squared norms that ``c`` subtracts from each other."""
        squares = {k: v * v for k, v in values.items()}
        sums = (neuron_sums(squares, layers, j) for j in range(len(layers) - 1))
        return np.concatenate([to_numpy(i + a + o) for i, a, o in sums])

    c0, total = np.concatenate(balancedness(params)), norm_total(params)
    c, worst = c0, 0.0
    for _ in range(steps):
        grads = gradients(model, params, x, graph, y, mask)
        # The same combination of squared norms, of the gradient: lr^2 times it is the drift.
        predicted = lr**2 * np.concatenate(balancedness(grads))
        params = {k: v - lr * grads[k] for k, v in params.items()}
        c_next, total_next = np.concatenate(balancedness(params)), norm_total(params)
        allowance = 64 * unit_roundoff * np.maximum(total, total_next)
        worst = max(worst, float((np.abs((c_next - c) - predicted) / allowance).max()))
        c, total = c_next, total_next
    return c - c0, worst


# -- Thm 2.2, 6.3, 6.4, Remark 2.5 -----------------------------------------------------
@check(
    id="gat_balance.thm2_2",
    paper="GAT-balance",
    statement="GATv2, shared W, ReLU: <W^l[i,:],g> - <a^l[i],g> - <W^{l+1}[:,i],g> = 0 "
    "(Thm 2.2, Eq. 3), relative",
)
def thm2_2(ctx: Context) -> WorstCase:
    return _law_check(ctx, version="v2", share_weights=True)


@check(
    id="gat_balance.thm6_3",
    paper="GAT-balance",
    statement="GATv2, unshared: W_s and W_t rows in, a[i] and W_s, W_t columns out "
    "(Thm 6.3, Eq. 18 corrected)",
)
def thm6_3(ctx: Context) -> WorstCase:
    return _law_check(ctx, version="v2", share_weights=False)


@check(
    id="gat_balance.thm6_4.concat",
    paper="GAT-balance",
    statement="multi-head GATv2, heads concatenated: the law per neuron (Thm 6.4, Eq. 26)",
)
def thm6_4_concat(ctx: Context) -> WorstCase:
    return _law_check(ctx, False, _two_or_three_heads, concat=True)


@check(
    id="gat_balance.thm6_4.mean",
    paper="GAT-balance",
    statement="multi-head GATv2, heads averaged: sums over heads (Thm 6.4, Eq. 26)",
)
def thm6_4_mean(ctx: Context) -> WorstCase:
    return _law_check(ctx, False, _two_or_three_heads, concat=False)


def _two_or_three_heads(rng: np.random.Generator) -> dict:
    return {"heads": int(rng.integers(2, 4))}  # drawn per case


@check(
    id="gat_balance.remark2_5.gatv1",
    paper="GAT-balance",
    statement="GATv1: a_s[i] and a_t[i] both on the outgoing side (Remark 2.5)",
)
def remark2_5_gatv1(ctx: Context) -> WorstCase:
    return _law_check(ctx, version="v1")


@check(
    id="gat_balance.remark2_5.gcn",
    paper="GAT-balance",
    statement="GCN (mean aggregation: GATv2 with a = 0): <W^l[i,:],g> = <W^{l+1}[:,i],g> "
    "(Remark 2.5)",
)
def remark2_5_gcn(ctx: Context) -> WorstCase:
    return _law_check(ctx, zero_attention=True)


@check(
    id="gat_balance.law.bias_residual_leaky",
    paper="GAT-balance",
    statement="with bias b^l[i] and residual rows incoming, LeakyReLU phi (Sec. 3, Def. 2.1)",
)
def law_bias_residual(ctx: Context) -> WorstCase:
    def per_case(rng: np.random.Generator) -> dict:  # phi's slope and the sharing, every case
        return {"activation_slope": float(rng.uniform(0.0, 2.0)),
                "share_weights": bool(rng.integers(2))}  # fmt: skip

    return _law_check(ctx, False, per_case, bias=True, residual=True, activation="leaky_relu")


# -- Cor 2.3 / 2.4 -------------------------------------------------------------------
@check(
    id="gat_balance.cor2_3.balanced_init",
    paper="GAT-balance",
    statement="balanced initialisation (Procedure 2.6, Remark 2.7) gives c = 0 for every "
    "hidden neuron (Eq. 5), max |c_i| / beta",
)
def cor2_3_balanced_init(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    schemes = ["xavier_normal", "ll_orthogonal", "ll_identity", "identity", "orthogonal"]
    for case in range(max(ctx.cases, 1)):
        scheme = schemes[case % len(schemes)]
        heads = int(ctx.rng.integers(1, 3))
        # Identity hidden layers with averaged heads are (H*C, C) "eyes" whose rows
        # for heads > 0 are zero (neurons without weights, which balance() refuses),
        # and looks-linear schemes refuse averaged heads: those get concatenated heads.
        concat = scheme not in ("xavier_normal", "orthogonal") or bool(ctx.rng.integers(2))
        model = GAT(
            int(ctx.rng.integers(2, 9)),
            2 * int(ctx.rng.integers(1, 4)),
            int(ctx.rng.integers(2, 5)),
            int(ctx.rng.integers(2, 6)),
            heads=heads,
            share_weights=bool(ctx.rng.integers(2)),
            bias=True,
            residual=bool(ctx.rng.integers(2)),
            concat=concat,
        )
        base = INITIALISERS[scheme](model, ctx.rng)
        beta = float(ctx.rng.uniform(0.5, 3.0))
        order = "forward" if case % 2 else "reverse"
        c = np.concatenate(balancedness(balance(base, beta=beta, order=order)))
        worst.add(np.abs(c) / beta, BALANCED_TOL)
    return worst


@check(
    id="gat_balance.cor2_3.gd_step",
    paper="GAT-balance",
    statement="one GD step changes c_i by exactly lr^2 (||g_in||^2 - ||g_a||^2 - ||g_out||^2): "
    "O(lr^2), Eq. 3 cancels O(lr); relative error",
)
def cor2_3_gd_step(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    for _ in range(max(ctx.cases // 4, 1)):
        model, params, x, graph, y, mask = random_case(ctx)
        _, error = gd_drift(model, params, x, graph, y, mask, lr=0.05, steps=5)
        # The error is in units of the rounding allowance (see gd_drift): <= 1.
        worst.add(error, 1.0)
    return worst


@check(
    id="gat_balance.cor2_4.drift_vs_lr",
    paper="GAT-balance",
    statement="gradient flow conserves c (Cor 2.3/2.4): over time T = 0.5, GD's drift "
    "||c(T) - c(0)|| halves with lr; |ratio(lr, lr/2) - 2|",
)
def cor2_4_drift_vs_lr(ctx: Context) -> WorstCase:
    # The drift is sum_k lr^2 q(t_k) = lr * integral q dt + O(lr^2) over T / lr
    # steps, so the ratio is 2 + O(lr): at lr = 0.005 the O(lr) term, a relative
    # change of q along the path, stays below a few percent; 0.2 (10 %) is the
    # allowance, and a law with an O(lr) term left would give ratio ~1, not 2.
    worst = WorstCase("upper")
    horizon, lr = 0.5, 0.005
    for _ in range(max(ctx.cases // 8, 1)):
        model, params, x, graph, y, mask = random_case(ctx)
        coarse, _ = gd_drift(model, params, x, graph, y, mask, lr, round(horizon / lr))
        fine, _ = gd_drift(model, params, x, graph, y, mask, lr / 2, round(2 * horizon / lr))
        if not np.any(fine):  # no gradient anywhere (every unit dead): nothing drifts
            continue
        ratio = np.linalg.norm(coarse) / np.linalg.norm(fine)
        worst.add(abs(ratio - 2.0), 0.2)
    return worst


# -- negative controls -----------------------------------------------------------------
@check(
    id="gat_balance.negative_control.elu",
    paper="GAT-balance",
    statement="negative control: ELU is not positively homogeneous, so the law breaks; "
    "max relative residual per case >= 1e-3",
)
def negative_control_elu(ctx: Context) -> WorstCase:
    worst = WorstCase("lower")
    for _ in range(max(ctx.cases, 1)):  # at least one case: none proves nothing
        model, params, x, graph, y, mask = random_case(ctx, activation="elu")
        residual = relative_residual(params, gradients(model, params, x, graph, y, mask))
        worst.add(residual.max(), BROKEN_AT_LEAST)
    return worst


@check(
    id="gat_balance.negative_control.lipschitznorm",
    paper="GAT-balance",
    statement="negative control: LipschitzNorm divides the scores by ||a|| max ||x_uv||, "
    "which the rescaling (lambda w_in, a / lambda, w_out / lambda) changes, so the law "
    "breaks; largest relative residual over the cases >= 1e-3",
)
def negative_control_lipschitznorm(ctx: Context) -> WorstCase:
    """One counterexample disproves a law, so the largest residual over the cases is
    reported (ELU's check asks every case). Here the law breaks only through the scores,
    so cases where attention barely moves the loss (a node with one edge, dead ReLUs)
    have residuals down to 0; each case makes a labelled node attend over >= 2 edges."""
    largest, cases = 0.0, max(ctx.cases, 1)
    for _ in range(cases):  # at least one case: none proves nothing
        in_degree = np.zeros(1, dtype=np.int64)
        while in_degree.max() < 2:
            model, params, x, graph, y, mask = random_case(ctx, lipschitz_norm="paper")
            in_degree = np.bincount(model.layers[0].prepare_graph(graph).edge_index[1])
        mask = ctx.xp.asarray(to_numpy(mask) | (in_degree == in_degree.max()))
        residual = relative_residual(params, gradients(model, params, x, graph, y, mask))
        largest = max(largest, float(residual.max()))
    worst = WorstCase("lower")
    worst.add(largest, BROKEN_AT_LEAST, cases=cases)
    return worst


@check(
    id="gat_balance.negative_control.pairnorm",
    paper="GAT-balance",
    statement="negative control: PairNorm between layers rescales each hidden layer by a "
    "statistic of all its neurons, which scaling one neuron's incoming weights changes, so "
    "the law breaks; largest relative residual over the cases >= 1e-3",
)
def negative_control_pairnorm(ctx: Context) -> WorstCase:
    """The largest residual over the cases, as for LipschitzNorm: a one-node graph's
    PairNorm output is 0 whatever the weights (residual 0), so each case has >= 2 nodes."""
    largest, cases = 0.0, max(ctx.cases, 1)
    for _ in range(cases):  # at least one case: none proves nothing
        num_nodes = 0
        while num_nodes < 2:
            model, params, x, graph, y, mask = random_case(ctx, pairnorm="PN")
            num_nodes = graph.num_nodes
        residual = relative_residual(params, gradients(model, params, x, graph, y, mask))
        largest = max(largest, float(residual.max()))
    worst = WorstCase("lower")
    worst.add(largest, BROKEN_AT_LEAST, cases=cases)
    return worst
