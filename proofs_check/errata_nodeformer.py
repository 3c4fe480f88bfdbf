"""Errata of NodeFormer's relational bias (Eq. 8, Alg. 1), learning objective (Eq. 10 and 13)
and Gumbel-Softmax proof (App., Eq. 46), each with a counterexample evaluated now.

Listed with the rest by :mod:`proofs_check.errata`.
"""

from __future__ import annotations

import numpy as np
from scipy import integrate, special

from proofs_check.erratum import Erratum, Evidence
from refimpl.graph import Graph
from refimpl.nn.nodeformer.relational_bias import RelationalBias

__all__ = ["ERRATA"]

# A 4-node directed graph (row 0 sources u, row 1 targets v) with a node of in-degree 2.
_EDGES = np.array([[0, 1, 2, 3, 0], [1, 2, 3, 0, 2]])


def _relational_bias_operand() -> Evidence:
    # Eq. 8 adds sigma(b) sum_{v: a_uv = 1} v_v (the layer's values); Alg. 1 line 9 adds
    # sigma(b) A Z^(l+1) (the attention output). The released code adds f(b) A_hat V, the
    # values through D_in^(-1/2) A D_out^(-1/2), which refimpl's RelationalBias computes.
    rng = np.random.default_rng(8)
    graph = Graph(_EDGES, 4)
    values, attention_out = rng.standard_normal((4, 1, 3)), rng.standard_normal((4, 1, 3))
    gate = float(special.expit(0.3))  # sigma(b), b = 0.3
    adjacency = np.zeros((4, 4))
    np.add.at(adjacency, (_EDGES[1], _EDGES[0]), 1.0)  # A[v, u]: u's message reaches v
    eq8 = gate * np.einsum("vu,uhc->vhc", adjacency, values)
    alg1 = gate * np.einsum("vu,uhc->vhc", adjacency, attention_out)
    d_in, d_out = adjacency.sum(axis=1), adjacency.sum(axis=0)
    a_hat = adjacency / np.sqrt(np.outer(d_in, d_out))  # D_in^(-1/2) A D_out^(-1/2)
    code = gate * np.einsum("vu,uhc->vhc", a_hat, values)
    bias = RelationalBias(mode="sigmoid", order=1, powers="paper")
    ours = np.zeros_like(values)
    bias.add_terms(bias.operators(graph, np, np.float64), bias.gate(np.full((1, 1), 0.3)),
                   values, ours)  # fmt: skip
    return Evidence(
        printed_holds=bool(np.allclose(eq8, alg1)),
        correct_holds=bool(np.allclose(ours, code, rtol=1e-14, atol=0)),
        detail=f"4-node graph, sigma(b) = {gate:.3f}: Eq. 8 and Alg. 1 line 9 differ by "
        f"{np.abs(eq8 - alg1).max():.2f} (max entry); refimpl's term equals f(b) A_hat V "
        f"within {np.abs(ours - code).max():.1e}",
    )


def _edge_loss_is_kl_from_the_data() -> Evidence:
    # Eq. 10 per node u: -sum_v p0(v|u) log pi_uv = KL(p0(.|u) || pi_u) + H(p0(.|u)) with
    # p0 of Eq. 11; Eq. 13 calls the regulariser D(q || p0), the reverse divergence, which is
    # +infinity: q = pi (a softmax over all nodes) puts mass where p0 is 0.
    rng = np.random.default_rng(10)
    n = 4
    scores = rng.standard_normal((n, n))
    pi = special.softmax(scores, axis=1)  # pi[u, v], every entry > 0
    p0 = np.zeros((n, n))
    np.add.at(p0, (_EDGES[0], _EDGES[1]), 1.0)
    p0 /= p0.sum(axis=1, keepdims=True)  # Eq. 11: 1/d_u on u's edges
    on = p0 > 0
    eq10 = -(p0[on] * np.log(pi[on])).sum() / n  # one layer, L = 1
    kl_data = (p0[on] * np.log(p0[on] / pi[on])).sum() / n
    entropy = -(p0[on] * np.log(p0[on])).sum() / n
    with np.errstate(divide="ignore"):
        reverse = (pi * (np.log(pi) - np.log(p0))).sum() / n  # D(q || p0), Eq. 13
    return Evidence(
        printed_holds=bool(np.isfinite(reverse) and abs(reverse - eq10) <= 1e-12),
        correct_holds=bool(abs(eq10 - (kl_data + entropy)) <= 1e-12),
        detail=f"4 nodes, random scores: Eq. 10 = {eq10:.4f} = KL(p0 || pi) + H(p0) = "
        f"{kl_data:.4f} + {entropy:.4f}; D(q || p0) = {reverse}",
    )


def _expectation_in_eq46() -> Evidence:
    # With c random (an estimate with spread around E(c)), 1 - P(c + eps >= (g' - g)/tau)
    # is not P((g' - g)/tau >= E(c) + eps); the closed form Eq. 46 ends with is the latter.
    # g' - g of two standard Gumbels is logistic: P(g' - g <= s) = expit(s).
    tau, eps, log_ratio = 0.5, 0.2, 0.7  # log(alpha_v / alpha_v')
    mean_c, spread = log_ratio / tau, 1.0  # E(c) (Eq. 44), c ~ N(E(c), 1)
    closed = 1 - 1 / (1 + np.exp(-log_ratio) * np.exp(-tau * eps))  # Eq. 46's right end
    with_mean = 1 - special.expit(tau * (mean_c + eps))  # P((g'-g)/tau >= E(c) + eps)

    def density(c: float) -> float:
        return np.exp(-0.5 * ((c - mean_c) / spread) ** 2) / (spread * np.sqrt(2 * np.pi))

    with_c, _ = integrate.quad(lambda c: density(c) * special.expit(tau * (c + eps)), -np.inf,
                               np.inf)  # fmt: skip
    printed = 1 - with_c  # 1 - P(c + eps >= (g' - g)/tau), c random
    return Evidence(
        printed_holds=abs(printed - closed) <= 1e-9,
        correct_holds=abs(with_mean - closed) <= 1e-12,
        detail=f"tau = {tau}, eps = {eps}, log(alpha_v/alpha_v') = {log_ratio}, c ~ N(E(c), 1): "
        f"the closed form {closed:.6f} = 1 - P(E(c) + eps >= (g'-g)/tau) = {with_mean:.6f}; "
        f"with c as printed {printed:.6f}",
    )


ERRATA: list[Erratum] = [
    Erratum(
        id="nodeformer.eq8_alg1.relational_bias_operand",
        paper="NodeFormer",
        location="Sec. 3.3, Eq. 8 against Alg. 1 line 9",
        printed="Eq. 8: z_u += sum_(v: a_uv = 1) sigma(b) v_v (the values); Alg. 1 line 9: "
        "Z^(l+1) += sigma(b) A Z^(l+1) (the attention output)",
        correct="one operand: the released code adds f(b) A_hat V, the values through "
        "A_hat = D_in^(-1/2) A D_out^(-1/2) (refimpl's RelationalBias)",
        counterexample="a 4-node directed graph, random V and Z^(l+1), b = 0.3, seed 8",
        evaluate=_relational_bias_operand,
    ),
    Erratum(
        id="nodeformer.eq13.kl_direction",
        paper="NodeFormer",
        location="Sec. 5, Eq. 13 (and Prop. 1's reading of Eq. 10 as its KL term)",
        printed="L_e = D(q(A~|X, A) || p0(A~|X, A))",
        correct="Eq. 10 is sum_u KL(p0(.|u) || pi_u) + H(p0(.|u)) (per node, / N L): the "
        "divergence from the data p0 of Eq. 11 to the model, not D(q || p0), which is "
        "+infinity for a softmax q; the ELBO reading of Prop. 1 does not apply to the loss used",
        counterexample="4 nodes, the edges of a 4-cycle plus 0 -> 2, random scores, seed 10",
        evaluate=_edge_loss_is_kl_from_the_data,
    ),
    Erratum(
        id="nodeformer.eq46.expectation",
        paper="NodeFormer",
        location="App., proof of Thm 2, Eq. 46",
        printed="P((g_v' - g_v)/tau >= E(c) + eps) = 1 - P(c + eps >= (g_v' - g_v)/tau)",
        correct="... = 1 - P(E(c) + eps >= (g_v' - g_v)/tau) (the closed form that follows, "
        "1 - 1/(1 + alpha_v'/alpha_v e^(-tau eps)), is this one)",
        counterexample="tau = 0.5, eps = 0.2, log(alpha_v/alpha_v') = 0.7, c ~ N(E(c), 1)",
        evaluate=_expectation_in_eq46,
    ),
]
