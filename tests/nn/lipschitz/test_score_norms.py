"""Score normalisations (LipschitzNorm Eq. 15, 17, 19): norms, gradients, jvps, conventions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl.nn.lipschitz.score_norms import (
    inf2_norm,
    linear_norm,
    linear_norm_backward,
    linear_norm_jvp,
    lipschitz_norm,
    lipschitz_norm_backward,
    lipschitz_norm_jvp,
    transformer_norm,
    transformer_norm_backward,
    transformer_norm_jvp,
    two_inf_norm,
)
from refimpl.testing import check_gradients
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import GRADCHECK_RTOL

ADJOINT_RTOL = 1e-12  # <jvp(H), C> vs <H, vjp(C)>: two orders of summation, float64


# -- adapters: each normalisation as a block for check_gradients ------------------------------
# raw is an independent input here (the blocks feed Q^T X); the denominator also reads X and
# Q (Eq. 15, 17) or Q, K, V (Eq. 19).
class LinearNorm:
    def forward(self, params: dict, raw: np.ndarray, x: np.ndarray) -> tuple:
        return linear_norm(raw, x, params["Q"])

    def backward(self, params: dict, cache: object, d: np.ndarray) -> tuple:
        d_raw, d_x, d_q = linear_norm_backward(cache, d)
        return (d_raw, d_x), {"Q": d_q}

    def jvp(self, cache: object, d_raw: np.ndarray, d_x: np.ndarray) -> np.ndarray:
        return linear_norm_jvp(cache, d_raw, d_x)


class LipschitzNorm:
    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def forward(self, params: dict, raw: np.ndarray, x: np.ndarray) -> tuple:
        return lipschitz_norm(raw, x, params["Q"], self.alpha)

    def backward(self, params: dict, cache: object, d: np.ndarray) -> tuple:
        d_raw, d_x, d_q = lipschitz_norm_backward(cache, d)
        return (d_raw, d_x), {"Q": d_q}

    def jvp(self, cache: object, d_raw: np.ndarray, d_x: np.ndarray) -> np.ndarray:
        return lipschitz_norm_jvp(cache, d_raw, d_x)


class TransformerNorm:
    def forward(self, params: dict, raw: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray):
        return transformer_norm(raw, q, k, v)

    def backward(self, params: dict, cache: object, d: np.ndarray) -> tuple:
        return transformer_norm_backward(cache, d), {}

    def jvp(self, cache: object, *tangents: np.ndarray) -> np.ndarray:
        return transformer_norm_jvp(cache, *tangents)


def _top_gap(values: np.ndarray) -> float:
    """Relative gap between the largest and second largest |value| (inf if fewer than two)."""
    v = np.sort(np.abs(np.ravel(values)))[::-1]
    return np.inf if v.size < 2 or v[0] == 0 else float((v[0] - v[1]) / v[0])


# The denominators are products of norms, so the scores curve on the scale of those norms:
# a two-point difference with step 1e-6 is off by about (1e-6 / norm)^2 relative. Norms
# above 1e-2 keep that at 1e-8; a drawn 1x1 Q of -9.5e-5 gave 1.1e-4 (truncation).
MIN_NORM = 1e-2


@st.composite
def norm_setups(draw: st.DrawFn) -> tuple:
    """A normalisation adapter, its params, inputs, and the smallest relative gap of its maxes."""
    which = draw(st.sampled_from(["linear", "lipschitz", "transformer"]))
    d, n = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(seeds()))
    if which == "transformer":
        q, k, v = (rng.standard_normal((d, n)) for _ in range(3))
        # |raw| <= 0.9 c keeps the rounding clip out of the finite differences
        u, kn, vn = np.linalg.norm(q), np.linalg.norm(k, axis=0), np.linalg.norm(v, axis=0)
        assume(min(u, kn.max(), vn.max()) > MIN_NORM)
        c = max(u * kn.max(), u * vn.max(), kn.max() * vn.max())
        raw = rng.uniform(-0.9, 0.9, (n, n)) * c
        gap = min(
            _top_gap(kn), _top_gap(vn), _top_gap([u * kn.max(), u * vn.max(), kn.max() * vn.max()])
        )
        return TransformerNorm(), {}, (raw, q, k, v), gap
    m = draw(st.integers(1, 4))
    q, x = rng.standard_normal((d, m)), rng.standard_normal((d, n))
    xn = np.linalg.norm(x, axis=0)
    assume(min(np.linalg.norm(q), xn.max()) > MIN_NORM)
    gap = _top_gap(xn)
    if which == "linear":
        raw = rng.uniform(-0.9, 0.9, (m, n)) * np.linalg.norm(q) * xn.max()
        return LinearNorm(), {"Q": q}, (raw, x), gap
    # Eq. 15: a raw scale on either side of ||X^T|| ||Q||_* reaches both arguments of the max
    raw = rng.standard_normal((m, n)) * draw(st.sampled_from([0.1, 10.0])) * xn.max()
    raw_norm = np.sqrt(np.sum(np.max(np.abs(raw), axis=1) ** 2))
    gap = min(gap, *(_top_gap(row) for row in raw))
    gap = min(gap, _top_gap([raw_norm, xn.max() * np.linalg.norm(q, 2)]))
    return LipschitzNorm(draw(st.sampled_from([1.0, 0.5, 2.5]))), {"Q": q}, (raw, x), gap


def _jvp_and_adjoint_errors(block: object, params: dict, inputs: tuple, seed: int) -> tuple:
    """(jvp vs central differences, adjointness) relative errors, tangents for every input."""
    rng = np.random.default_rng(seed)
    eps = 1e-6
    out, cache = block.forward(params, *inputs)
    tangents = tuple(rng.standard_normal(a.shape) for a in inputs)
    exact = block.jvp(cache, *tangents)
    plus, _ = block.forward(params, *(a + eps * t for a, t in zip(inputs, tangents, strict=True)))
    minus, _ = block.forward(params, *(a - eps * t for a, t in zip(inputs, tangents, strict=True)))
    numeric = (plus - minus) / (2 * eps)
    resolution = 64 * np.finfo(np.float64).eps * np.max(np.abs(out)) / eps
    scale = max(np.max(np.abs(exact)), np.max(np.abs(numeric)), resolution / GRADCHECK_RTOL, 1e-300)
    jvp_error = float(np.max(np.abs(exact - numeric)) / scale)

    cotangent = rng.standard_normal(out.shape)
    grads, _ = block.backward(params, cache, cotangent)
    lhs = np.sum(exact * cotangent)
    terms = [t * g for t, g in zip(tangents, grads, strict=True)]
    rhs = sum(np.sum(term) for term in terms)
    magnitude = np.sum(np.abs(exact * cotangent)) + sum(np.sum(np.abs(t)) for t in terms)
    # Floor: the scores are homogeneous of degree 0 in their inputs, so a tangent t_i moves them
    # by ~|t_i| / |input_i|. A derivative that cancels to zero (g = sign(raw) when m = n = 1)
    # is judged against that scale, not against its own rounding noise.
    natural = sum(
        np.max(np.abs(t)) / np.max(np.abs(a))
        for t, a in zip(tangents, inputs, strict=True)
        if np.any(a)
    )
    floor = np.sum(np.abs(cotangent)) * natural * max(1.0, np.max(np.abs(out)))
    return jvp_error, float(abs(lhs - rhs) / max(magnitude, floor))


# -- the norms ---------------------------------------------------------------------------------


@given(rows=st.integers(0, 4), cols=st.integers(1, 5), seed=seeds())
def test_norms_match_their_definitions(rows: int, cols: int, seed: int) -> None:
    m = np.random.default_rng(seed).standard_normal((rows, cols))
    row_norms = [np.sqrt(sum(v * v for v in row)) for row in m]
    assert inf2_norm(m) == pytest.approx(max(row_norms, default=0.0), rel=1e-15)
    row_max = [max(abs(v) for v in row) for row in m]
    assert two_inf_norm(m) == pytest.approx(np.sqrt(sum(v * v for v in row_max)), rel=1e-15)
    # ||X^T||_(inf,2) is the longest column of X; ||M||_inf <= ||M||_(2,inf) <= sqrt(rows)||M||_inf
    assert inf2_norm(m.T) == pytest.approx(np.max(np.linalg.norm(m, axis=0)), rel=1e-15)
    if rows:
        assert (
            np.max(np.abs(m)) <= two_inf_norm(m) <= np.sqrt(rows) * np.max(np.abs(m)) * (1 + 1e-15)
        )


def test_norms_refuse_non_matrices() -> None:
    with pytest.raises(ValueError, match="2-D"):
        inf2_norm(np.ones(3))
    with pytest.raises(TypeError, match="must be an array"):
        two_inf_norm([[1.0]])


# -- gradients and jvps ------------------------------------------------------------------------


@given(setup=norm_setups())
def test_backward_matches_central_differences(setup: tuple) -> None:
    block, params, inputs, gap = setup
    assume(gap > 1e-4)  # finite differences straddle a max's kink closer than that
    report = check_gradients(block, params, inputs, max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=norm_setups(), seed=seeds())
def test_jvp_matches_central_differences_and_is_adjoint_to_backward(
    setup: tuple, seed: int
) -> None:
    block, params, inputs, gap = setup
    assume(gap > 1e-4)
    jvp_error, adjoint_error = _jvp_and_adjoint_errors(block, params, inputs, seed)
    assert jvp_error <= GRADCHECK_RTOL
    assert adjoint_error <= ADJOINT_RTOL


def test_lipschitz_norm_reaches_both_arguments_of_its_max() -> None:
    # Orthonormal queries and inputs: ||Q^T X||_(2,inf) = sqrt(2) > ||X^T|| ||Q||_* = 1.
    _, cache = lipschitz_norm(np.eye(2), np.eye(2), np.eye(2))
    assert cache.branch == 0 and cache.denominator == pytest.approx(np.sqrt(2))
    # One query (1, 1): ||Q^T X||_(2,inf) = 1 < ||X^T|| ||Q||_* = sqrt(2).
    _, cache = lipschitz_norm(np.array([[1.0, 1.0]]), np.eye(2), np.array([[1.0], [1.0]]))
    assert cache.branch == 1 and cache.denominator == pytest.approx(np.sqrt(2))


# -- ties: the first maximiser, in backward and jvp alike ---------------------------------------

# Integer entries make every tie exact: sums of squares of small integers round nowhere.
X_TIED = np.array([[3.0, 1.0, 4.0], [4.0, 1.0, -3.0]])  # columns 0 and 2 both have norm 5
Q_ONE = np.array([[1.0], [2.0]])


def test_longest_column_tie_uses_the_first_column() -> None:
    raw = Q_ONE.T @ X_TIED
    for norm, backward, jvp in (
        (linear_norm, linear_norm_backward, linear_norm_jvp),
        (lipschitz_norm, lipschitz_norm_backward, lipschitz_norm_jvp),
    ):
        scores, cache = norm(raw, X_TIED, Q_ONE)
        assert cache.x_argmax == 0
        _, d_x, _ = backward(cache, np.ones_like(scores))
        assert np.all(d_x[:, 1:] == 0) and np.all(d_x[:, 0] != 0)
        # the jvp reads the same column: a tangent on column 2 alone does not move c
        h = np.zeros_like(X_TIED)
        h[:, 2] = [1.0, -2.0]
        assert np.all(jvp(cache, np.zeros_like(raw), h) == 0)
        h = np.zeros_like(X_TIED)
        h[:, 0] = [1.0, -2.0]
        assert np.any(jvp(cache, np.zeros_like(raw), h) != 0)


def test_row_abs_max_tie_uses_the_first_column() -> None:
    raw = np.array([[2.0, -2.0, 1.0], [0.5, 3.0, -3.0]])  # ties in |.| in both rows
    x = np.eye(3) * 0.1  # ||X^T|| ||Q||_* far below ||raw||_(2,inf): the max is its first argument
    _, cache = lipschitz_norm(raw, x, np.eye(3)[:, :2] * 0.1)
    assert cache.branch == 0
    np.testing.assert_array_equal(cache.raw_columns, [0, 1])
    # d_raw = d_scores / c + (d_c times the max's gradient, at one entry per row)
    d_scores = np.ones_like(raw)
    d_raw, _, _ = lipschitz_norm_backward(cache, d_scores)
    moved = d_raw - d_scores / cache.denominator
    assert moved[0, 0] != 0 and moved[0, 1] == 0 and moved[1, 1] != 0 and moved[1, 2] == 0


def test_lipschitz_max_tie_uses_its_first_argument() -> None:
    # q = (3, 4), x_0 = q: ||Q^T X||_(2,inf) = 25 = ||X^T|| ||Q||_* = 5 * 5 exactly.
    q = np.array([[3.0], [4.0]])
    x = np.array([[3.0, 1.0], [4.0, 0.0]])
    raw = q.T @ x
    scores, cache = lipschitz_norm(raw, x, q, alpha=2.0)
    assert cache.raw_norm == cache.x_norm * cache.spectral == 25.0
    assert cache.branch == 0
    _, d_x, d_q = lipschitz_norm_backward(cache, np.array([[1.0, -1.0]]))
    assert np.all(d_x == 0) and np.all(d_q == 0)  # the second argument gets nothing
    assert np.all(lipschitz_norm_jvp(cache, np.zeros_like(raw), np.ones_like(x)) == 0)
    assert scores[0, 0] == 2.0  # the bound alpha is attained exactly


@pytest.mark.parametrize(
    ("q", "k", "v", "branch"),
    [
        # u = 5, v = 5, w = 5: all three products tie -> uv
        ([[3.0, 0.0], [4.0, 0.0]], [[3.0, 0.0], [4.0, 1.0]], [[0.0, 5.0], [0.0, 0.0]], 0),
        # v = w = 5 > u = 1: uv = uw < vw -> vw; then u = w = 5 > v: uv < uw = vw -> uw
        ([[1.0, 0.0], [0.0, 0.0]], [[3.0, 0.0], [4.0, 1.0]], [[0.0, 5.0], [0.0, 0.0]], 2),
        ([[3.0, 0.0], [4.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[0.0, 5.0], [0.0, 0.0]], 1),
        # u = v = 5 > w = 1: uv wins outright, uw = vw tie for second (irrelevant)
        ([[3.0, 0.0], [4.0, 0.0]], [[3.0, 0.0], [4.0, 1.0]], [[0.0, 1.0], [0.0, 0.0]], 0),
    ],
)
def test_eq19_product_tie_uses_the_first_product(q: list, k: list, v: list, branch: int) -> None:
    q, k, v = np.array(q), np.array(k), np.array(v)
    raw = q.T @ k
    _, cache = transformer_norm(raw, q, k, v)
    assert cache.branch == branch
    _, d_q, d_k, d_v = transformer_norm_backward(cache, np.ones_like(raw))
    used = {0: (True, True, False), 1: (True, False, True), 2: (False, True, True)}[branch]
    for grad, is_used in zip((d_q, d_k, d_v), used, strict=True):
        assert np.any(grad != 0) == is_used
    # jvp: a tangent on the unused factor's input alone does not move c
    tangents = [np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)]
    tangents[used.index(False)] = np.ones_like(q)
    assert np.all(transformer_norm_jvp(cache, np.zeros_like(raw), *tangents) == 0)


def test_adjoint_at_ties() -> None:
    # The shared tie-breaking keeps <jvp(H), C> = <H, backward(C)> exactly where maxes tie.
    rng = np.random.default_rng(3)
    q = np.array([[3.0], [4.0]])
    x = np.array([[3.0, -3.0, 4.0], [4.0, -4.0, 3.0]])  # three columns of norm 5, x_0 = q
    raw = q.T @ x
    for block, params, inputs in (
        (LinearNorm(), {"Q": q}, (raw, x)),
        (LipschitzNorm(1.0), {"Q": q}, (raw, x)),
        (TransformerNorm(), {}, (x.T @ x, x, x, x)),
    ):
        _, adjoint_error = _jvp_and_adjoint_errors(block, params, inputs, int(rng.integers(99)))
        assert adjoint_error <= ADJOINT_RTOL


# -- zero denominators -------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["linear", "lipschitz"])
@pytest.mark.parametrize("zero", ["x", "q"])
def test_zero_denominator_gives_zero_scores_and_derivatives(which: str, zero: str) -> None:
    rng = np.random.default_rng(0)
    x, q = rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    if zero == "x":
        x = np.zeros_like(x)
    else:
        q = np.zeros_like(q)
    norm, backward, jvp = {
        "linear": (linear_norm, linear_norm_backward, linear_norm_jvp),
        "lipschitz": (lipschitz_norm, lipschitz_norm_backward, lipschitz_norm_jvp),
    }[which]
    scores, cache = norm(q.T @ x, x, q)
    assert cache.denominator == 0
    assert np.all(scores == 0) and np.all(np.isfinite(scores))
    for grad in backward(cache, rng.standard_normal(scores.shape)):
        assert np.all(grad == 0)
    assert np.all(jvp(cache, rng.standard_normal(scores.shape), rng.standard_normal(x.shape)) == 0)


@pytest.mark.parametrize("zeros", [("q", "k"), ("q", "v"), ("k", "v")])
def test_eq19_zero_denominator(zeros: tuple) -> None:
    rng = np.random.default_rng(1)
    parts = {name: rng.standard_normal((2, 3)) for name in "qkv"}
    for name in zeros:
        parts[name] = np.zeros((2, 3))
    raw = parts["q"].T @ parts["k"]
    scores, cache = transformer_norm(raw, parts["q"], parts["k"], parts["v"])
    assert cache.denominator == 0 and np.all(scores == 0)
    for grad in transformer_norm_backward(cache, rng.standard_normal(raw.shape)):
        assert np.all(grad == 0)
    tangents = [rng.standard_normal(a.shape) for a in (raw, parts["q"], parts["k"], parts["v"])]
    assert np.all(transformer_norm_jvp(cache, *tangents) == 0)


# -- bounds and rounding -------------------------------------------------------------------------


@given(d=st.integers(1, 5), seed=seeds())
def test_bound_holds_exactly_when_attained(d: int, seed: int) -> None:
    # x_j parallel to q_i attains |g| = 1 (Eq. 17, 19) or alpha (Eq. 15) in exact arithmetic;
    # the rounded ratio must not overshoot (the clip) and must land within an ulp or two.
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((d, 1))
    others = rng.standard_normal((d, 2))
    others *= 0.5 * np.linalg.norm(q) / np.linalg.norm(others, axis=0)  # shorter than x_0
    x = np.concatenate([q * rng.uniform(1.0, 2.0), others], axis=1)  # x_0 parallel to q
    raw = q.T @ x
    g17, _ = linear_norm(raw, x, q)
    g15, _ = lipschitz_norm(raw, x, q, alpha=1.5)
    queries = np.zeros_like(x)
    queries[:, 0] = x[:, 0]  # u = ||x_0|| = v = w: g_00 = ||x_0||^2 / (u v) = 1
    g19, _ = transformer_norm(queries.T @ x, queries, x, x)
    for g, bound in ((g17, 1.0), (g15, 1.5), (g19, 1.0)):
        assert np.max(np.abs(g)) <= bound
        assert np.max(np.abs(g)) >= bound * (1 - 1e-14)  # a few ulps from the bound


@pytest.mark.parametrize("alpha", [-0.5, float("nan")])
def test_lipschitz_norm_refuses_a_negative_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        lipschitz_norm(np.ones((1, 2)), np.ones((2, 2)), np.ones((2, 1)), alpha)


def test_the_pair_product_backward_takes_an_int_branch_on_a_device_backend() -> None:
    # proofs_check --backend cupy stopped here: transformer_norm caches the branch as a
    # Python int, branch == pair is then a Python bool, and cupy.where calls .astype on its
    # condition. The strict stand-in's where accepted a bool (NumPy's does), so no CPU test
    # saw it; it now refuses one as CuPy does.
    from refimpl.backend import asarray, to_numpy, use_backend
    from refimpl.nn.lipschitz.score_norms import largest_pair_product_backward
    from refimpl.testing import strict
    from refimpl.testing.strict import StrictConversionError

    with use_backend("strict"):
        norms = tuple(asarray(np.array(v)) for v in (2.0, 3.0, 5.0))
        d = largest_pair_product_backward(norms, 2, asarray(np.array(1.0)))  # v w won
        assert [float(to_numpy(g)) for g in d] == [0.0, 5.0, 3.0]
        with pytest.raises(StrictConversionError, match=r"pass xp\.asarray"):
            strict.where(2 == 2, norms[0], 0)
