"""Errata: places where a paper's printed formula is wrong, each with a counterexample.

DESIGN.md: where a printed formula is wrong, the project implements what is
mathematically right and lists it here. Every entry carries a function that
evaluates its counterexample now; ``python -m proofs_check`` prints the list
after the table and fails if a counterexample no longer shows what it claims
(the printed formula must fail on it, the correct one must hold).

To add an entry, append an :class:`Erratum` to ``ERRATA``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from proofs_check import conservation, softmax
from refimpl.diagnostics import conservation_residuals
from refimpl.graph import Graph
from refimpl.init import orthogonal
from refimpl.models import GAT

__all__ = ["ERRATA", "Erratum", "Evidence"]

# The sums below are of 2 or 3 terms in [0, 1]: exact to a few ulps, far from
# the 0.25 by which the printed identity misses.
_ATOL = 1e-12


@dataclass(frozen=True)
class Evidence:
    """What evaluating a counterexample showed."""

    printed_holds: bool  # must be False: the printed formula fails on the counterexample
    correct_holds: bool  # must be True: the corrected formula holds on it
    detail: str  # the numbers, for the report

    @property
    def demonstrated(self) -> bool:
        return not self.printed_holds and self.correct_holds


@dataclass(frozen=True)
class Erratum:
    id: str
    paper: str
    location: str
    printed: str
    correct: str
    counterexample: str  # the input, in words
    evaluate: Callable[[], Evidence]


def _row_sums_not_column_sums() -> Evidence:
    # A row-wise softmax (Eq. 3) normalises rows; its columns sum to anything.
    scores = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])  # (m, n) = (2, 3)
    probabilities = softmax.row_softmax(scores)  # (2, 3)
    column_sums = probabilities.sum(axis=0)  # sum_i S_ij, as printed: (3,)
    row_sums = probabilities.sum(axis=1)  # sum_j S_ij, as Eq. 3 gives: (2,)
    total = float(probabilities.sum())  # Eq. 32 needs m = 2; the printed sums give n = 3
    detail = (
        f"column sums sum_i S_ij = {np.array2string(column_sums, precision=3)}, "
        f"row sums sum_j S_ij = {np.array2string(row_sums, precision=3)}; "
        f"sum_ij S_ij = {total:.3f} = m (the printed identity would give n = 3)"
    )
    return Evidence(
        printed_holds=bool(np.all(np.abs(column_sums - 1.0) <= _ATOL)),
        correct_holds=bool(np.all(np.abs(row_sums - 1.0) <= _ATOL) and abs(total - 2.0) <= _ATOL),
        detail=detail,
    )


def _softmax_keeps_the_shape() -> Evidence:
    # Eq. 3 indexes softmax(M)_ij with i <= m and j <= n, and Eq. 4 multiplies
    # X (d, n) by softmax(g(X))^T, so the output must be (m, n), not (n, m).
    scores = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])  # (m, n) = (2, 3)
    m, n = scores.shape
    probabilities = softmax.row_softmax(scores)
    inputs = np.ones((4, n))  # X, (d, n) = (4, 3)
    attention = inputs @ probabilities.T  # Eq. 4: (d, n) @ (n, m) = (d, m)
    return Evidence(
        printed_holds=probabilities.shape == (n, m),
        correct_holds=probabilities.shape == (m, n) and attention.shape == (4, m),
        detail=f"softmax(M) has shape {probabilities.shape} = (m, n); Eq. 4 gives "
        f"X softmax(M)^T of shape {attention.shape} = (d, m), as Sec. 3.3 states for Att",
    )


def _thm6_3_needs_target_columns() -> Evidence:
    # An unshared GATv2: rescaling h^l[i] by lambda changes W_t^{l+1} h_v^l inside
    # the next layer's attention unless W_t^{l+1}[:, i] is rescaled by 1 / lambda too.
    rng = np.random.default_rng(63)
    model = GAT(3, 4, 2, 3, share_weights=False)
    params = {k: v + 0.5 * rng.standard_normal(v.shape) for k, v in model.init_params(rng).items()}
    graph = Graph(np.array([[0, 1, 2, 3, 0], [1, 2, 3, 0, 2]]), 4)
    x, y, mask = rng.standard_normal((4, 3)), np.array([0, 1, 1, 0]), np.ones(4, bool)
    grads = conservation.gradients(model, params, x, graph, y, mask)
    residuals = conservation_residuals(params, grads)
    printed, correct = [], []
    for layer, r in enumerate(residuals):
        w_t = f"layer{layer + 1}.W_t"  # the term Eq. 18 leaves out
        omitted = (params[w_t] * grads[w_t]).sum(axis=0)
        printed.append(np.abs(r.delta + omitted) / r.scale)
        correct.append(r.relative)
    printed_worst, correct_worst = float(np.max(printed)), float(np.max(correct))
    return Evidence(
        printed_holds=printed_worst <= conservation.RESIDUAL_TOL,
        correct_holds=correct_worst <= conservation.RESIDUAL_TOL,
        detail=f"worst relative residual over hidden neurons: printed Eq. 18 "
        f"{printed_worst:.2e}, with W_t^(l+1)[:, i] on the outgoing side {correct_worst:.2e}",
    )


def _last_layer_columns_not_two() -> Evidence:
    # W^L = [U^L, -U^L] with U^L (n_L, n_{L-1}/2): column i of W^L is +-U^L[:, i'],
    # whose squared norm is at most 1, and averages n_L / (n_{L-1} / 2).
    n_out, n_in = 7, 64  # Cora's classes, the paper's width
    u = orthogonal(np.random.default_rng(7), (n_out, n_in // 2))
    last = np.hstack([u, -u])  # (7, 64)
    column_norms = (last**2).sum(axis=0)  # (64,)
    return Evidence(
        printed_holds=bool(np.allclose(column_norms, 2.0)),
        correct_holds=bool(
            np.all(column_norms <= 1 + 1e-12)
            and abs(column_norms.mean() - n_out / (n_in // 2)) <= 1e-12
        ),
        detail=f"n_L = {n_out}, n_(L-1) = {n_in}: squared column norms of W^L range "
        f"{column_norms.min():.3f}..{column_norms.max():.3f}, mean {column_norms.mean():.4f} "
        f"= n_L / (n_(L-1)/2) = {n_out / (n_in // 2):.4f}, not 2",
    )


ERRATA: list[Erratum] = [
    Erratum(
        id="lipschitznorm.lemma2.proof.row_sums",
        paper="LipschitzNorm",
        location="App. Sec. 9.3, proof of Lemma 2 (= Lemma 5), text before Eq. 32",
        printed="sum_i softmax(M)_ij = 1 for all i",
        correct="sum_j softmax(M)_ij = 1 for every row i (softmax normalises rows, Eq. 3)",
        counterexample="M = [[0, 1, 2], [2, 1, 0]], m = 2, n = 3",
        evaluate=_row_sums_not_column_sums,
    ),
    Erratum(
        id="lipschitznorm.sec3_3.softmax_codomain",
        paper="LipschitzNorm",
        location="Sec. 3.3 (General Case), the signature before Eq. 3",
        printed="softmax: R^{m x n} -> R^{n x m}",
        correct="softmax: R^{m x n} -> R^{m x n} (row-wise, Eq. 3; Eq. 4 transposes it)",
        counterexample="M = [[0, 1, 2], [2, 1, 0]], m = 2, n = 3, X = ones((4, 3))",
        evaluate=_softmax_keeps_the_shape,
    ),
    Erratum(
        id="gat_balance.thm6_3.outgoing_set",
        paper="GAT-balance",
        location="App. 6, Thm 6.3 (Eq. 18) and its proof's theta_2",
        printed="<W_s^l[i,:],g> + <W_t^l[i,:],g> - <a^l[i],g> = <W_s^(l+1)[:,i],g>",
        correct="... = <W_s^(l+1)[:,i],g> + <W_t^(l+1)[:,i],g> (the next layer's target "
        "transform W_t^(l+1) h_v^l reads neuron i too, inside its attention)",
        counterexample="unshared GATv2, 3 layers, width 4, a 4-node graph, seed 63",
        evaluate=_thm6_3_needs_target_columns,
    ),
    Erratum(
        id="gat_balance.sec2.ll_orthogonal_last_columns",
        paper="GAT-balance",
        location="Sec. 2, Balanced Orthogonal Initialization (the sentence setting beta = 2)",
        printed="Since U^L is an orthonormal matrix, ||W^L[:,i]||^2 = 2 by definition",
        correct="||W^L[:,i]||^2 = ||U^L[:,i']||^2 <= 1, mean n_L / (n_(L-1)/2); beta = 2 comes "
        "from the hidden layers [[U, -U], [-U, U]], and balancing rescales W^L's columns",
        counterexample="n_L = 7, n_(L-1) = 64 (Cora, width 64), U^L a random 7 x 32 orthonormal",
        evaluate=_last_layer_columns_not_two,
    ),
]
