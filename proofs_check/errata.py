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

from proofs_check import softmax

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
]
