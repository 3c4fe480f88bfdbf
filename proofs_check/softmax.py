"""Softmax facts: rows sum to one, LipschitzNorm Eq. 10 and Lemma 2 (Eq. 11).

Matrices use :func:`row_softmax` (LipschitzNorm Eq. 3, the row-wise softmax of
an ``m x n`` score matrix); graph neighbourhoods use the library's own
:func:`refimpl.kernels.segment.segment_softmax`. Both are looked up when a check
runs, so a test can swap in a broken one and watch the checks fail.

Rounding allowances
-------------------
The bounds below are the papers' exact bounds moved outwards by a rounding
allowance. With ``u = eps / 2`` the unit roundoff and Higham's
``gamma_k ~ k u`` for a ``k``-term sum of non-negative terms (Accuracy and
Stability of Numerical Algorithms, Sec. 3.1), a computed softmax entry
``p = fl(e / fl(D))`` carries a relative error below ``(n + 1) u`` from the
``n``-term denominator ``D >= 1`` and the division, plus an absolute error
below ``(1 + 1/e) u`` from the exponential (``fl(s - max)`` errs by
``|s - max| u``, which moves ``e^x`` by at most ``max |x| e^x u = u / e``).
Each allowance is about twice the first-order estimate it quotes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from proofs_check.registry import Context, WorstCase, check
from refimpl.backend import get_array_module, to_numpy
from refimpl.graph import Graph
from refimpl.kernels.segment import segment_softmax

__all__ = [
    "chi2_to_uniform",
    "eq10_relative_deviation",
    "frobenius_allowance",
    "frobenius_norm",
    "lemma2_ratios",
    "row_softmax",
    "score_graphs",
    "score_matrices",
]

_EXTREME = 1e3  # docs/style.md's extreme score: exp(+-1e3) overflows without the max shift


# -- the quantities --------------------------------------------------------------------
def row_softmax(scores: Any) -> Any:
    """Row-wise softmax, LipschitzNorm Eq. 3: ``S_ij = exp(M_ij) / sum_k exp(M_ik)``.

    ``scores`` is ``(m, n)``; the result is ``(m, n)`` (not ``(n, m)`` as the
    paper's Sec. 3.3 writes the codomain, see :mod:`proofs_check.errata`). The row
    maximum is subtracted first: the ratio is unchanged, every exponent is <= 0
    and the denominator >= 1.
    """
    xp = get_array_module(scores)
    shifted = scores - xp.max(scores, axis=1, keepdims=True)  # (m, n), <= 0
    exponentials = xp.exp(shifted)  # (m, n), in (0, 1], 1 at the argmax
    return exponentials / xp.sum(exponentials, axis=1, keepdims=True)


def frobenius_norm(matrix: Any) -> Any:
    """``||A||_F = sqrt(sum_ij A_ij^2)`` as a 0-d array of the input's backend."""
    xp = get_array_module(matrix)
    return xp.sqrt(xp.sum(matrix * matrix))


def chi2_to_uniform(probabilities: Any) -> Any:
    """``d_chi2(S_i, U_n) = sum_j q_j (p_j / q_j - 1)^2`` with ``q = U_n = 1/n``, per row, ``(m,)``.

    LipschitzNorm Sec. 4, the divergence in Eq. 10, written as printed (not
    simplified to ``n ||p||^2 - 1``, which would make Eq. 10 hold by algebra).
    """
    xp = get_array_module(probabilities)
    n = probabilities.shape[1]
    q = 1.0 / n
    return xp.sum(q * (probabilities / q - 1.0) ** 2, axis=1)


def frobenius_allowance(m: int, n: int) -> float:
    """Relative rounding allowance for ``||softmax(M)||_F`` and Eq. 10's right side, float64.

    ``||S||_F``: entries err by ``(n + 2) u`` relative, squaring doubles it, the
    ``mn``-term sum adds ``gamma_{mn}``, the square root halves the total: about
    ``(mn/2 + n + 4) u``. Eq. 10's right side: ``n p - 1`` errs by ``(n + 3) u``
    absolutely, so the chi^2 sum by ``4(n + 3) u`` per row against ``m + sum
    d >= m``, plus ``(m + n) u`` of summation: about ``(5n + m + 12) u``. The
    allowance ``(mn + 8(m + n) + 16) eps`` is more than twice the sum of both.
    """
    return (m * n + 8 * (m + n) + 16) * float(np.finfo(np.float64).eps)


def lemma2_ratios(scores: Any) -> tuple[float, float, float]:
    """``(||S||_F / sqrt(m/n), ||S||_F / sqrt(m), allowance)`` for ``S = softmax(M)``, Eq. 11.

    Lemma 2 says the first ratio is >= 1 and the second <= 1; dividing by the
    bound puts every shape on one scale, so the worst case over shapes is a max.
    """
    m, n = scores.shape
    norm = float(frobenius_norm(row_softmax(scores)))
    return norm / np.sqrt(m / n), norm / np.sqrt(m), frobenius_allowance(m, n)


def eq10_relative_deviation(scores: Any) -> tuple[float, float]:
    """``(|lhs - rhs| / rhs, allowance)`` for LipschitzNorm Eq. 10 on ``S = softmax(M)``.

    ``lhs = ||S||_F`` and ``rhs = sqrt((m + sum_i d_chi2(S_i, U_n)) / n)``.
    """
    xp = get_array_module(scores)
    m, n = scores.shape
    probabilities = row_softmax(scores)
    lhs = float(frobenius_norm(probabilities))
    rhs = float(xp.sqrt((m + xp.sum(chi2_to_uniform(probabilities))) / n))
    return abs(lhs - rhs) / rhs, frobenius_allowance(m, n)


# -- the cases ---------------------------------------------------------------------------
def score_matrices(ctx: Context) -> Iterator[Any]:
    """Adversarial score matrices, then ``ctx.cases`` random ones, on ``ctx``'s backend.

    The fixed cases come first so every run covers them, whatever ``--cases``.
    Widths 7 and 13 make ``1/n`` inexact, so uniform rows round.
    """
    rng = ctx.rng
    yield ctx.asarray(np.zeros((5, 7)))  # uniform rows: Lemma 2's lower bound with equality
    yield ctx.asarray(np.full((3, 13), _EXTREME))  # uniform, and exp(1e3) would overflow
    yield ctx.asarray(rng.normal(size=(6, 1)) * 10)  # one column: both bounds are sqrt(m)
    yield ctx.asarray(rng.normal(size=(1, 9)))  # one row
    yield ctx.asarray(rng.choice([-_EXTREME, _EXTREME], size=(4, 9)))  # extreme, with ties
    one_hot = np.full((7, 11), -_EXTREME)  # exactly one-hot in float64: the upper bound
    one_hot[np.arange(7), rng.integers(0, 11, 7)] = _EXTREME
    yield ctx.asarray(one_hot)
    for gap in (5.0, 20.0, 40.0):  # near one-hot: approaches sqrt(m) from below
        near = np.zeros((4, 6))
        near[:, 0] = gap
        yield ctx.asarray(near)
    mixed = np.zeros((6, 7))  # half uniform rows, half one-hot rows
    mixed[::2, 3] = _EXTREME
    yield ctx.asarray(mixed)
    for _ in range(ctx.cases):
        m, n = (int(k) for k in rng.integers(1, 17, size=2))
        scale = 10.0 ** rng.uniform(-3, 3)  # from near-uniform to near-one-hot rows
        yield ctx.asarray(scale * rng.standard_normal((m, n)))


def _random_graph(rng: np.random.Generator, num_nodes: int, num_edges: int) -> Graph:
    # Targets avoid the last node, which so has no incoming edge (zero in-degree);
    # one duplicated edge and one self-loop are appended whenever there are edges.
    sources = rng.integers(0, num_nodes, num_edges)
    targets = rng.integers(0, max(num_nodes - 1, 1), num_edges)
    edges = np.stack([sources, targets])  # (2, E)
    if num_edges:
        loop = np.array([[targets[0]], [targets[0]]])
        edges = np.concatenate([edges, edges[:, :1], loop], axis=1)  # (2, E + 2)
    return Graph(edges, num_nodes)


def score_graphs(ctx: Context) -> Iterator[tuple[Graph, Any]]:
    """``(graph, scores (E, H))`` pairs: adversarial graphs, then ``ctx.cases`` random ones."""
    rng = ctx.rng
    yield Graph([[], []], 3), ctx.asarray(np.zeros((0, 2)))  # no edges: no softmax output
    yield Graph([[1], [1]], 2), ctx.asarray([[3.0]])  # a lone self-loop; node 0 isolated
    yield Graph([[0, 0, 0], [1, 1, 1]], 2), ctx.asarray(rng.normal(size=(3, 2)))  # duplicates
    star = np.stack([rng.integers(0, 60, 60), np.zeros(60, dtype=np.int64)])  # one long segment
    yield Graph(star, 60), ctx.asarray(rng.choice([-_EXTREME, _EXTREME], size=(60, 3)))
    graph = _random_graph(rng, 8, 20)
    yield graph, ctx.asarray(np.full((graph.num_edges, 2), _EXTREME))  # all scores equal
    for _ in range(ctx.cases):
        graph = _random_graph(rng, int(rng.integers(1, 13)), int(rng.integers(0, 31)))
        heads = int(rng.integers(1, 4))
        scale = 10.0 ** rng.uniform(-3, 3)
        yield graph, ctx.asarray(scale * rng.standard_normal((graph.num_edges, heads)))


# -- the checks ------------------------------------------------------------------------
@check(
    id="softmax.rows_sum_to_one",
    paper="LipschitzNorm",
    statement="softmax rows and neighbourhoods sum to 1 (Eq. 3)",
)
def rows_sum_to_one(ctx: Context) -> WorstCase:
    """Every softmax row and non-empty neighbourhood sums to one (LipschitzNorm Eq. 3).

    ``measured`` is ``|sum - 1|`` for the worst row, neighbourhood or head; the
    bound is ``2 n eps`` with ``n`` that row's length or node's in-degree. The
    computed sum errs by at most ``(n - 1) u`` (denominator) ``+ u`` (division)
    ``+ (n - 1) u`` (final sum) ``+ (1 + n/e) u`` (exponentials) ``~ 2.4 n u``,
    and ``2 n eps = 4 n u``. Neighbourhood sums are taken on the host with
    ``numpy.add.at``, independently of the library's ``segment_sum``.
    """
    eps = float(np.finfo(ctx.dtype).eps)
    worst = WorstCase("upper")
    xp = ctx.xp
    for scores in score_matrices(ctx):
        row_sums = xp.sum(row_softmax(scores), axis=1)  # (m,)
        worst.add(xp.abs(row_sums - 1.0), 2 * scores.shape[1] * eps)
    for graph, scores in score_graphs(ctx):
        alpha = to_numpy(segment_softmax(scores, graph.dst_segments(xp)))  # (E, H)
        dst = to_numpy(graph.edge_index)[1]  # (E,)
        sums = np.zeros((graph.num_nodes, alpha.shape[1]))  # (N, H)
        np.add.at(sums, dst, alpha)
        degree = np.bincount(dst, minlength=graph.num_nodes)  # (N,)
        has_edges = degree > 0  # zero in-degree: no output, nothing to normalise
        worst.add(np.abs(sums[has_edges] - 1.0), 2 * degree[has_edges, None] * eps)
    return worst


@check(
    id="lipschitznorm.lemma2.lower",
    paper="LipschitzNorm",
    statement="||softmax(M)||_F >= sqrt(m/n) (Lemma 2, Eq. 11)",
)
def lemma2_lower(ctx: Context) -> WorstCase:
    """LipschitzNorm Lemma 2 (Eq. 11), left: ``sqrt(m/n) <= ||softmax(M)||_F``.

    Attained exactly by uniform rows, so the bound is ``1 - allowance``
    (:func:`frobenius_allowance`) on the ratio ``||S||_F / sqrt(m/n)``.
    """
    worst = WorstCase("lower")
    for scores in score_matrices(ctx):
        ratio, _, allowance = lemma2_ratios(scores)
        worst.add(ratio, 1.0 - allowance)
    return worst


@check(
    id="lipschitznorm.lemma2.upper",
    paper="LipschitzNorm",
    statement="||softmax(M)||_F <= sqrt(m) (Lemma 2, Eq. 11)",
)
def lemma2_upper(ctx: Context) -> WorstCase:
    """LipschitzNorm Lemma 2 (Eq. 11), right: ``||softmax(M)||_F <= sqrt(m)``.

    Attained by one-hot rows (scores +-1e3 make them exactly one-hot in
    float64) and by a single column, so the bound is ``1 + allowance`` on the
    ratio ``||S||_F / sqrt(m)``.
    """
    worst = WorstCase("upper")
    for scores in score_matrices(ctx):
        _, ratio, allowance = lemma2_ratios(scores)
        worst.add(ratio, 1.0 + allowance)
    return worst


@check(
    id="lipschitznorm.eq10",
    paper="LipschitzNorm",
    statement="||S||_F = sqrt((m + sum_i chi2(S_i,U_n))/n) (Eq. 10)",
)
def eq10(ctx: Context) -> WorstCase:
    """LipschitzNorm Eq. 10: ``||softmax(M)||_F^2 = (m + sum_i d_chi2(S_i, U_n)) / n``.

    Holds because ``d_chi2(p, U_n) = n ||p||^2 - 2 sum_j p_j + 1`` and rows sum
    to one. ``measured`` is the relative deviation of the two sides; the bound
    is :func:`frobenius_allowance`, at most about ``1e-13`` for these shapes.
    """
    worst = WorstCase("upper")
    for scores in score_matrices(ctx):
        deviation, allowance = eq10_relative_deviation(scores)
        worst.add(deviation, allowance)
    return worst


@check(
    id="softmax.dense_matches_segment",
    paper="LipschitzNorm",
    statement="dense row softmax = library segment_softmax (Eq. 3)",
)
def dense_matches_segment(ctx: Context) -> WorstCase:
    """The dense row softmax used above equals the library's ``segment_softmax``.

    Row ``i`` of ``M`` becomes the scores of the ``n`` edges into node ``i`` of
    the complete bipartite graph from ``n`` sources to ``m`` targets; the two
    routes differ only in summation order, so ``|S_dense - S_segment| <= 2 n
    eps`` entrywise (entries are <= 1). This ties the Lemma 2 and Eq. 10
    checks, which use the dense softmax, to the library's code.
    """
    eps = float(np.finfo(ctx.dtype).eps)
    worst = WorstCase("upper")
    xp = ctx.xp
    for scores in score_matrices(ctx):
        m, n = scores.shape
        # Edge i*n + j runs from source node m + j to target node i: row-major order.
        targets = np.repeat(np.arange(m), n)  # (m n,)
        sources = m + np.tile(np.arange(n), m)  # (m n,)
        graph = Graph(np.stack([sources, targets]), m + n)
        alpha = segment_softmax(scores.reshape(m * n), graph.dst_segments(xp))  # (m n,)
        worst.add(xp.abs(alpha.reshape(m, n) - row_softmax(scores)), 2 * n * eps)
    return worst
