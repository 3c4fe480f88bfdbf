"""Errata: places where a paper's printed formula is wrong, each with a counterexample.

docs/design.md: where a printed formula is wrong, the project implements what is
mathematically right and lists it here. Every entry carries a function that
evaluates its counterexample now; ``python -m proofs_check`` prints the list
after the table and fails if a counterexample no longer shows what it claims
(the printed formula must fail on it, the correct one must hold).

To add an entry, append an :class:`Erratum` to ``ERRATA``.
"""

from __future__ import annotations

import numpy as np

from proofs_check import (
    conservation,
    errata_gat_balance,
    errata_massive_activations,
    errata_nodeformer,
    lipschitz,
    prf,
    softmax,
)
from proofs_check.erratum import Erratum, Evidence
from refimpl.diagnostics import conservation_residuals
from refimpl.graph import Graph
from refimpl.init import orthogonal
from refimpl.models import GAT
from refimpl.nn.lipschitz.multi_head_attention import MultiHeadAttention

__all__ = ["ERRATA"]

# The sums below are of 2 or 3 terms in [0, 1]: exact to a few ulps, far from
# the 0.25 by which the printed identity misses.
_ATOL = 1e-12


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


def _lipschitz_norms_swapped() -> Evidence:
    # f = identity from X = (R^2, ||.||_2) to Y = (R^2, ||.||_inf). Eq. 1 and the operator
    # norm of Sec. 3.1 give L_{X,Y}(f) = max_x ||x||_inf / ||x||_2 = 1 (at x = e_1).
    rng = np.random.default_rng(32)
    points = np.vstack([np.eye(2), rng.standard_normal((1000, 2))])  # (1002, 2)
    in_x = np.sqrt((points**2).sum(axis=1))  # ||x||_X, (1002,)
    in_y = np.abs(points).max(axis=1)  # ||x||_Y, (1002,)
    constant = float(np.max(in_y / in_x))  # ||Df||_{X,Y}, 1 exactly (at e_1)
    z = np.array([1.0, 1.0])  # f(x) - f(y) = x - y = z
    printed = float(np.sqrt((z**2).sum())) <= constant * float(np.abs(z).max())  # in X <= L in Y
    correct = np.all(in_y <= constant * in_x * (1 + 1e-15))  # in Y <= L in X
    return Evidence(
        printed_holds=bool(printed),
        correct_holds=bool(correct) and abs(constant - 1.0) <= 1e-15,
        detail=f"f = id, ||.||_X = ||.||_2, ||.||_Y = ||.||_inf: L_X,Y(f) = {constant:g}; at "
        f"x - y = (1, 1) the printed ||f(x)-f(y)||_X = {np.sqrt(2):.4f} > L ||x-y||_Y = 1, the "
        "swapped ||f(x)-f(y)||_Y = 1 <= L ||x-y||_X holds (and on 1000 random points)",
    )


def _lemma1_proof_convex_hull_factor() -> Evidence:
    # A = [1, -1] (d = 1, n = 2): c = p_1 A_1 + p_2 A_2 lies in the hull [-1, 1], but
    # ||A_1 - c||^2 reaches (1 + |c|)^2, up to 4 max_k ||A_k||^2, not 2.
    a = np.array([[1.0, -1.0]])  # (d, n) = (1, 2)
    p = np.array([0.05, 0.95])  # a softmax row
    c = a @ p  # (1,)
    far = float(((a[:, 0] - c) ** 2).sum())  # ||A_1 - c||^2 = 3.61
    bound = 2.0 * float((a**2).sum(axis=0).max())  # the printed 2 max_k ||A_k||^2 = 2
    variance = float((p * ((a - c[:, None]) ** 2).sum(axis=0)).sum())  # sum_k p_k ||A_k - c||^2
    # Eq. 28 with the constant 1: attained at p = (1/2, 1/2), B = (1, -1), never exceeded.
    rng = np.random.default_rng(28)
    attained = lipschitz.eq28_ratio(a, np.zeros((1, 2)), np.array([[1.0, -1.0]]))
    ratios = [
        lipschitz.eq28_ratio(
            rng.standard_normal((3, 4)),
            3 * rng.standard_normal((2, 4)),
            rng.standard_normal((2, 4)),
        )
        for _ in range(200)
    ]
    tolerance = 64 * np.finfo(np.float64).eps
    return Evidence(
        printed_holds=far <= bound,
        correct_holds=variance <= 1.0
        and max(ratios) <= 1 + tolerance
        and abs(attained - 1) <= tolerance,
        detail=f"A = [1, -1], S_j = (0.05, 0.95): ||A_1 - c_j||^2 = {far:.2f} > 2 max ||A_k||^2 "
        f"= {bound:g}; the variance sum_k S_jk ||A_k - c_j||^2 = {variance:.2f} <= max ||A_k||^2 "
        "= 1; "
        f"Eq. 28's ratio with constant 1: {attained:.15f} at S = (1/2, 1/2), B = (1, -1), "
        f"at most {max(ratios):.3f} on 200 random (A, M, B)",
    )


def _head_projections_map_d_i_to_d() -> Evidence:
    # Eq. 5 applies Att to W_k X with X the (d_I, n) input: W_k must be (d, d_I).
    d_in, d, n = 5, 3, 4
    x = np.ones((d_in, n))
    printed = np.ones((d_in, d))  # W_k in R^{d_I x d}, as printed
    correct = np.ones((d, d_in))
    block = MultiHeadAttention(d_in, d, 2, 1, kind="linear", num_outputs=2)
    projection_shape = block.param_shapes()["W_in"][1:]  # (rows, d_I) per head
    return Evidence(
        printed_holds=printed.shape[1] == x.shape[0],  # can W_k X be formed at all?
        correct_holds=(correct @ x).shape == (d, n) and projection_shape == (d, d_in),
        detail=f"d_I = {d_in}, d = {d}: a ({d_in}, {d}) W_k cannot multiply X ({d_in}, {n}); a "
        f"({d}, {d_in}) W_k gives W_k X of shape {(correct @ x).shape} = (d, n), the input of a "
        f"d-dimensional head (MultiHeadAttention's W_in[k] is {projection_shape})",
    )


def _input_vectors_are_columns() -> Evidence:
    # X in R^{d x n} holding n vectors of R^d: they are its columns, and Sec. 5's
    # "||X^T||_(inf,2) is the maximum of the norm of input vectors" reads them so.
    x = np.array([[3.0, 0.0, 1.0], [4.0, 0.0, 1.0]])  # (d, n) = (2, 3)
    d, n = 2, 3
    longest = lipschitz.inf2_norm(x.T)  # ||X^T||_(inf,2)
    column_max = float(np.sqrt((x**2).sum(axis=0)).max())  # longest column
    row_max = float(np.sqrt((x**2).sum(axis=1)).max())  # longest row
    return Evidence(
        printed_holds=x.shape[0] == n and x.shape[1] == d,  # n rows, each in R^d?
        correct_holds=x.shape == (d, n) and longest == column_max,
        detail=f"X of shape (d, n) = {x.shape} has {x.shape[0]} rows in R^{x.shape[1]}, not "
        f"{n} rows in R^{d}; ||X^T||_(inf,2) = {longest:g} is the longest column ({column_max:g}), "
        f"not the longest row ({row_max:.4f})",
    )


def _centre_is_softmax_of_x() -> Evidence:
    # The directional derivative of the row softmax at X along B: D_jk = S_jk (B_jk -
    # sum_l S_jl B_jl), S = softmax(X). So (A D^T)_ij = sum_k S_jk B_jk (A_ik - (A S^T)_ij):
    # the centre is the average of A's columns under softmax(X), as printed under softmax(B).
    rng = np.random.default_rng(92)
    a, x, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    s, s_b = softmax.row_softmax(x), softmax.row_softmax(b)  # (m, n) each
    derivative = s * (b - (s * b).sum(axis=1, keepdims=True))  # D_X softmax(B), (m, n)
    exact = a @ derivative.T  # (d, m)

    def expansion(centre_rows: np.ndarray) -> np.ndarray:
        centre = a @ centre_rows.T  # (A softmax(.)^T)_ij, (d, m)
        return np.einsum("jk,ik->ij", s * b, a) - centre * (s * b).sum(axis=1)[None, :]

    printed, correct = expansion(s_b), expansion(s)
    return Evidence(
        printed_holds=bool(np.allclose(printed, exact, rtol=1e-12, atol=0)),
        correct_holds=bool(np.allclose(correct, exact, rtol=1e-12, atol=1e-15)),
        detail=f"A, X, B random 2 x 3 (seed 92): |printed - A D_X softmax(B)^T| = "
        f"{np.abs(printed - exact).max():.3f}, with softmax(X): "
        f"{np.abs(correct - exact).max():.1e}",
    )


ERRATA += [
    Erratum(
        id="lipschitznorm.lemma1.proof.centre_softmax_of_x",
        paper="LipschitzNorm",
        location="App. Sec. 9.2, proof of Lemma 1 (= Lemma 4), the expansion of "
        "(A D_X softmax(B)^T)_ij",
        printed="... = sum_k softmax(X)_jk B_jk (A_ik - (A softmax(B)^T)_ij)",
        correct="... = sum_k softmax(X)_jk B_jk (A_ik - (A softmax(X)^T)_ij) (the derivative "
        "is taken at X; B is only the direction)",
        counterexample="A, X, B random 2 x 3, seed 92",
        evaluate=_centre_is_softmax_of_x,
    ),
    Erratum(
        id="lipschitznorm.sec3_2.lipschitz_norms_swapped",
        paper="LipschitzNorm",
        location="Sec. 3.2, the definition of Lipschitz continuity",
        printed="||f(x) - f(y)||_X <= L ||x - y||_Y for f: X -> Y",
        correct="||f(x) - f(y)||_Y <= L ||x - y||_X (outputs in Y's norm; as Eq. 1 and the "
        "operator norm of Sec. 3.1 define L_X,Y)",
        counterexample="f = identity, X = (R^2, ||.||_2), Y = (R^2, ||.||_inf), x - y = (1, 1)",
        evaluate=_lipschitz_norms_swapped,
    ),
    Erratum(
        id="lipschitznorm.lemma1.proof.convex_hull_factor",
        paper="LipschitzNorm",
        location="App. Sec. 9.2, proof of Lemma 1 (= Lemma 4), the step after Jensen's inequality",
        printed="||A_k^T - (A softmax(B)^T)_j^T||_2^2 <= 2 max_k ||A_k^T||_2^2 (a point of the "
        "convex hull is within sqrt2 max_k ||A_k|| of every A_k)",
        correct="only sum_k S_jk ||A_k - c_j||^2 <= max_k ||A_k||^2 (a variance); it gives Eq. 28, "
        "hence Lemma 1 and Thm 2, with the constant 1 in place of sqrt2: Eq. 9 and 14 hold as "
        "printed, and also with sqrt8 -> 2 (checked by lipschitz.eq28)",
        counterexample="A = [1, -1] (d = 1, n = 2), softmax row S_j = (0.05, 0.95)",
        evaluate=_lemma1_proof_convex_hull_factor,
    ),
    Erratum(
        id="lipschitznorm.sec3_3.head_projection_shape",
        paper="LipschitzNorm",
        location="Sec. 3.3, Multi-Head Attention, before Eq. 5",
        printed="W_1, ..., W_h in R^{d_I x d}",
        correct="W_1, ..., W_h in R^{d x d_I} (Att(W_k X) needs W_k X in R^{d x n} for X in "
        "R^{d_I x n})",
        counterexample="d_I = 5, d = 3, n = 4",
        evaluate=_head_projections_map_d_i_to_d,
    ),
    Erratum(
        id="lipschitznorm.sec3_3.input_vectors_are_columns",
        paper="LipschitzNorm",
        location="Sec. 3.3, General Case, the sentence defining X",
        printed="X in R^{d x n} is an input matrix whose rows are the input vectors "
        "x_1, ..., x_n in R^d",
        correct="... whose columns are the input vectors (as ||X^T||_(inf,2), 'the maximum of the "
        "norm of input vectors' in Sec. 5, and Eq. 4's X softmax(g(X))^T read them)",
        counterexample="X = [[3, 0, 1], [4, 0, 1]], d = 2, n = 3",
        evaluate=_input_vectors_are_columns,
    ),
]

ERRATA += prf.errata()

ERRATA += errata_gat_balance.ERRATA + errata_nodeformer.ERRATA
ERRATA += errata_massive_activations.ERRATA
