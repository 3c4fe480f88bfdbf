"""Dense attention blocks (LipschitzNorm Eq. 4, 5, 7, 15, 17, 19): finite differences, jvp,
adjointness, the naive loops, ties, zero inputs, bounds, scale invariance, backends, bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from refimpl.backend import to_numpy
from refimpl.naive.attention import (
    attention_forward,
    multi_head_attention_forward,
    transformer_attention_forward,
)
from refimpl.nn.lipschitz.multi_head_attention import (
    Attention,
    MultiHeadAttention,
    MultiHeadAttentionCache,
    TransformerAttention,
)
from refimpl.nn.lipschitz.score_norms import (
    LipschitzNormCache,
    TransformerNormCache,
    linear_norm_jvp,
)
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing import strict as strict_xp
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
RTOL32 = FORWARD_RTOL[np.dtype(np.float32)]
ADJOINT_RTOL = 1e-12  # <jvp(H), C> vs <H, backward(C)>: two orders of summation, float64
KINK_GAP = 1e-4  # finite differences (eps = 1e-6) must not straddle a max closer than this


def make_setup(
    kind: str,
    normalization: str | None,
    seed: int,
    d: int = 2,
    n: int = 3,
    m: int = 2,
    alpha: float = 1.0,
    heads: int = 1,
    in_dim: int = 3,
    out_dim: int = 2,
    head_kind: str = "transformer",
) -> tuple:
    """A block, float64 parameters and an input filled from ``seed``."""
    rng = np.random.default_rng(seed)
    if kind == "attention":
        block = Attention(d, m, normalization, alpha)
        params = {"Q": rng.standard_normal((d, m))}
        x = rng.standard_normal((d, n))
    elif kind == "transformer":
        block, params = TransformerAttention(d, normalization), {}
        x = rng.standard_normal((3 * d, n))
    else:
        block = MultiHeadAttention(
            in_dim,
            d,
            out_dim,
            heads,
            head_kind,
            normalization,
            m if head_kind == "linear" else None,
            alpha,
        )
        # scaled up so unnormalised softmaxes are far from uniform
        params = {k: v * 2.0 for k, v in block.init_params(rng).items()}
        x = rng.standard_normal((in_dim, n))
    return block, params, x


@st.composite
def setups(
    draw: st.DrawFn,
    kinds: tuple = ("attention", "transformer", "multi"),
    normalised_only: bool = False,
) -> tuple:
    """A block (any kind, normalisation, sizes from 1), its parameters and an input."""
    kind = draw(st.sampled_from(kinds))
    head_kind = draw(st.sampled_from(["transformer", "linear"]))
    if kind == "transformer" or (kind == "multi" and head_kind == "transformer"):
        allowed = ["lipschitz"]
    else:
        allowed = ["linear", "lipschitz"]
    normalization = draw(st.sampled_from(allowed if normalised_only else [None, *allowed]))
    return make_setup(
        kind,
        normalization,
        draw(seeds()),
        d=draw(st.integers(1, 4)),
        n=draw(st.integers(1, 5)),
        m=draw(st.integers(1, 4)),
        alpha=draw(st.sampled_from([1.0, 0.5, 3.0])),
        heads=draw(st.integers(1, 3)),
        in_dim=draw(st.integers(1, 4)),
        out_dim=draw(st.integers(1, 3)),
        head_kind=head_kind,
    )


# Pinned: the smallest sizes (n = 1, m = 1, d = 1, one head) of every kind.
SMALLEST = [
    make_setup("attention", "linear", 0, d=1, n=1, m=1),
    make_setup("attention", "lipschitz", 1, d=2, n=1, m=1),
    make_setup("transformer", "lipschitz", 2, d=1, n=1),
    make_setup("multi", "lipschitz", 3, d=1, n=1, heads=1, in_dim=1, out_dim=1),
    make_setup("multi", "linear", 4, d=1, n=2, m=1, heads=1, head_kind="linear"),
]


def _top_gap(values: np.ndarray) -> float:
    v = np.sort(np.abs(np.ravel(values)))[::-1]
    return np.inf if v.size < 2 or v[0] == 0 else float((v[0] - v[1]) / v[0])


def kink_gap(cache: object) -> float:
    """Smallest relative gap between the winner and the runner-up of any max the scores take."""
    if isinstance(cache, MultiHeadAttentionCache):
        return min(kink_gap(head) for head in cache.heads)
    norm = cache.norm
    if norm is None:
        return np.inf
    if isinstance(norm, TransformerNormCache):
        u, v, w = (float(a) for a in norm.norms)
        return min(
            _top_gap(np.linalg.norm(norm.k, axis=0)),
            _top_gap(np.linalg.norm(norm.v, axis=0)),
            _top_gap([u * v, u * w, v * w]),
        )
    gaps = [_top_gap(np.linalg.norm(cache.x, axis=0))]
    if isinstance(norm, LipschitzNormCache):
        gaps += [_top_gap(row) for row in cache.raw]
        # for d = 1 the two arguments of Eq. 15's max are the same function: no kink
        if cache.x.shape[0] > 1:
            gaps.append(_top_gap([norm.raw_norm, norm.x_norm * norm.spectral]))
    return min(gaps)


def jvp_error(block: object, params: dict, x: np.ndarray, h: np.ndarray) -> float:
    """``jvp`` against central differences of ``forward``, with gradcheck's resolution floor."""
    eps = 1e-6
    out, cache = block.forward(params, x)
    exact = block.jvp(params, cache, h)
    numeric = (block.forward(params, x + eps * h)[0] - block.forward(params, x - eps * h)[0]) / (
        2 * eps
    )
    magnitude = max(np.max(np.abs(out)), np.max(np.abs(x)))
    resolution = 64 * np.finfo(np.float64).eps * magnitude / eps
    scale = max(np.max(np.abs(exact)), np.max(np.abs(numeric)), resolution / GRADCHECK_RTOL)
    return float(np.max(np.abs(exact - numeric)) / scale)


def adjoint_error(block: object, params: dict, x: np.ndarray, seed: int) -> float:
    """``|<jvp(H), C> - <H, backward(C)>|`` over the sum of the absolute terms of both sides."""
    rng = np.random.default_rng(seed)
    out, cache = block.forward(params, x)
    h, c = rng.standard_normal(x.shape), rng.standard_normal(out.shape)
    forward_mode = block.jvp(params, cache, h) * c
    reverse_mode = h * block.backward(params, cache, c)[0]
    magnitude = np.sum(np.abs(forward_mode)) + np.sum(np.abs(reverse_mode))
    return float(abs(np.sum(forward_mode) - np.sum(reverse_mode)) / magnitude)


# -- gradients, jvp, adjointness ------------------------------------------------------------------


@given(setup=setups())
@example(setup=SMALLEST[0])
@example(setup=SMALLEST[1])
@example(setup=SMALLEST[2])
@example(setup=SMALLEST[3])
@example(setup=SMALLEST[4])
def test_backward_matches_central_differences(setup: tuple) -> None:
    block, params, x = setup
    _, cache = block.forward(params, x)
    assume(kink_gap(cache) > KINK_GAP)
    report = check_gradients(block, params, (x,), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=setups(), seed=seeds())
@example(setup=SMALLEST[1], seed=0)
@example(setup=SMALLEST[3], seed=0)
def test_jvp_matches_central_differences(setup: tuple, seed: int) -> None:
    block, params, x = setup
    _, cache = block.forward(params, x)
    assume(kink_gap(cache) > KINK_GAP)
    h = np.random.default_rng(seed).standard_normal(x.shape)
    assert jvp_error(block, params, x, h) <= GRADCHECK_RTOL


@given(setup=setups(), seed=seeds())
def test_jvp_is_adjoint_to_backward(setup: tuple, seed: int) -> None:
    block, params, x = setup  # no kink filter: adjointness holds at ties too
    assert adjoint_error(block, params, x, seed) <= ADJOINT_RTOL


@pytest.mark.parametrize("seed", range(4))
def test_eq15_first_argument_branch_gradients(seed: int) -> None:
    # Near-orthonormal Q and X put ||Q^T X||_(2,inf) above ||X^T|| ||Q||_*: the first argument
    # of Eq. 15's max, which random draws reach less often.
    rng = np.random.default_rng(seed)
    block = Attention(3, 3, "lipschitz", alpha=2.0)
    params = {"Q": np.eye(3) + 0.1 * rng.standard_normal((3, 3))}
    x = np.concatenate([np.eye(3), 0.3 * rng.standard_normal((3, 2))], axis=1)
    x += 0.1 * rng.standard_normal(x.shape)
    _, cache = block.forward(params, x)
    assert cache.norm.branch == 0 and kink_gap(cache) > KINK_GAP
    assert check_gradients(block, params, (x,), max_entries=None).max_rel_error <= GRADCHECK_RTOL
    assert jvp_error(block, params, x, rng.standard_normal(x.shape)) <= GRADCHECK_RTOL
    assert adjoint_error(block, params, x, seed) <= ADJOINT_RTOL


def test_jvp_check_catches_a_jvp_without_the_denominator_term() -> None:
    # The check must be able to fail: a jvp that holds c fixed (drops D c) is caught.
    block, params, x = make_setup("attention", "linear", 5, d=3, n=4, m=2)

    class Broken(Attention):
        def _jvp(self, params: dict, cache: object, d_x: np.ndarray) -> np.ndarray:
            no_dc = cache._replace(norm=cache.norm._replace(x=np.zeros_like(cache.x)))
            return super()._jvp(params, no_dc, d_x)

    broken = Broken(3, 2, "linear")
    h = np.random.default_rng(0).standard_normal(x.shape)
    assert jvp_error(block, params, x, h) <= GRADCHECK_RTOL
    assert jvp_error(broken, params, x, h) > 1e-3
    # and the same jvp really differs only through d c
    _, cache = block.forward(params, x)
    assert np.any(linear_norm_jvp(cache.norm, 0 * cache.raw, h) != 0)


# -- against the naive loops ----------------------------------------------------------------------


@given(setup=setups())
@example(setup=SMALLEST[0])
@example(setup=SMALLEST[2])
def test_forward_matches_naive_loops(setup: tuple) -> None:
    block, params, x = setup
    out, cache = block.forward(params, x)
    if isinstance(block, MultiHeadAttention):
        expected = multi_head_attention_forward(block, params, x)
    else:
        if isinstance(block, Attention):
            expected, scores, probabilities = attention_forward(
                x, params["Q"], block.normalization, block.alpha
            )
        else:
            expected, scores, probabilities = transformer_attention_forward(
                x, block.dim, block.normalization
            )
        assert max_relative_error(cache.scores, scores) <= RTOL64
        assert max_relative_error(cache.probabilities, probabilities) <= RTOL64
    assert max_relative_error(out, expected) <= RTOL64


def test_multi_head_with_one_head_is_the_block_composed_by_hand() -> None:
    rng = np.random.default_rng(7)
    for head_kind, normalization in (("transformer", "lipschitz"), ("linear", "linear")):
        mha = MultiHeadAttention(
            4, 2, 3, 1, head_kind, normalization, 3 if head_kind == "linear" else None, 1.0
        )
        params = mha.init_params(rng)
        x, h = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
        head = mha.head
        head_params = {"Q": params["Q"][0]} if head_kind == "linear" else {}
        w_in, w_out = params["W_in"][0], params["W_out"]
        # forward: W_O Att(W_1 X)
        head_out, head_cache = head.forward(head_params, w_in @ x)
        out, cache = mha.forward(params, x)
        assert max_relative_error(out, w_out @ head_out) <= RTOL64
        # backward: chain rule by hand
        d_out = rng.standard_normal(out.shape)
        d_head_in, d_head_params = head.backward(head_params, head_cache, w_out.T @ d_out)
        d_x, d_params = mha.backward(params, cache, d_out)
        expected = {
            "x": w_in.T @ d_head_in,
            "W_in": (d_head_in @ x.T)[None],
            "W_out": d_out @ head_out.T,
        }
        if head_kind == "linear":
            expected["Q"] = d_head_params["Q"][None]
        errors = relative_errors({"x": d_x, **d_params}, expected)
        assert max(errors.values()) <= RTOL64, errors
        # jvp (Eq. 24): W_O D Att_{W_1 X}(W_1 H)
        expected_jvp = w_out @ head.jvp(head_params, head_cache, w_in @ h)
        assert max_relative_error(mha.jvp(params, cache, h), expected_jvp) <= RTOL64


# -- ties: one argmax, asserted exactly ----------------------------------------------------------


def test_tied_columns_jvp_is_the_one_sided_derivative_of_the_first() -> None:
    # Columns 0 and 2 of X share the largest norm (5). The jvp differentiates through column 0:
    # along H that lengthens column 0 (and keeps it the longest), it is the one-sided
    # derivative, which a forward difference confirms; along H lengthening column 2 instead,
    # the max switches column and our jvp is (by convention) the other one-sided derivative.
    x = np.array([[3.0, 1.0, 4.0], [4.0, 1.0, -3.0]])
    params = {"Q": np.array([[0.5, -1.0], [1.5, 0.2]])}
    for normalization in ("linear", "lipschitz"):
        block = Attention(2, 2, normalization)
        out, cache = block.forward(params, x)
        assert cache.norm.x_argmax == 0
        h = np.zeros_like(x)
        h[:, 0] = x[:, 0]  # lengthens column 0 only
        t = 1e-7
        one_sided = (block.forward(params, x + t * h)[0] - out) / t
        assert max_relative_error(block.jvp(params, cache, h), one_sided) <= 1e-5
        assert adjoint_error(block, params, x, 0) <= ADJOINT_RTOL


def test_tied_eq19_products_adjoint_and_first_product() -> None:
    # K and V have equal longest columns (v = w): uv = uw ties; the first (uv) is taken.
    k = np.array([[3.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
    v = k[:, ::-1].copy()
    q = np.array([[6.0, 0.0, 1.0], [1.0, 2.0, 0.0]])
    block = TransformerAttention(2, "lipschitz")
    x = np.concatenate([q, k, v], axis=0)
    _, cache = block.forward({}, x)
    u, kn, vn = cache.norm.norms
    assert kn == vn and u * kn == u * vn > kn * vn
    assert cache.norm.branch == 0
    assert adjoint_error(block, {}, x, 1) <= ADJOINT_RTOL


# -- zero input, bounds, invariance --------------------------------------------------------------


@pytest.mark.parametrize("normalization", ["linear", "lipschitz"])
def test_zero_input_gives_uniform_attention_and_first_term_only(normalization: str) -> None:
    rng = np.random.default_rng(0)
    block = Attention(3, 2, normalization)
    params = {"Q": rng.standard_normal((3, 2))}
    x = np.zeros((3, 4))
    out, cache = block.forward(params, x)
    assert cache.denominator == 0
    np.testing.assert_array_equal(cache.scores, 0.0)
    np.testing.assert_array_equal(cache.probabilities, 0.25)
    np.testing.assert_array_equal(out, 0.0)
    d_out, h = rng.standard_normal((3, 2)), rng.standard_normal((3, 4))
    d_x, d_params = block.backward(params, cache, d_out)
    np.testing.assert_allclose(d_x, d_out @ cache.probabilities, rtol=1e-15)
    np.testing.assert_array_equal(d_params["Q"], 0.0)
    np.testing.assert_allclose(block.jvp(params, cache, h), h @ cache.probabilities.T, rtol=1e-15)


def test_zero_queries_give_uniform_attention() -> None:
    block = TransformerAttention(2, "lipschitz")
    x = np.random.default_rng(1).standard_normal((6, 3))
    x[:2] = 0.0  # Q = 0: u = 0, c = vw > 0, g = 0
    _, cache = block.forward({}, x)
    assert cache.denominator > 0
    np.testing.assert_array_equal(cache.scores, 0.0)
    x[2:4] = 0.0  # and K = 0: c = 0
    _, cache = block.forward({}, x)
    assert cache.denominator == 0 and np.all(cache.probabilities == 1 / 3)


@given(setup=setups(kinds=("attention", "transformer")), scale=st.sampled_from([1e3, 1e6]))
def test_scaled_inputs_stay_finite_and_bounded(setup: tuple, scale: float) -> None:
    block, params, x = setup
    x = x * scale
    params = {k: v * scale for k, v in params.items()}
    out, cache = block.forward(params, x)
    d_x, d_params = block.backward(params, cache, np.ones_like(out))
    tangent = block.jvp(params, cache, np.ones_like(x))
    for array in (out, d_x, tangent, cache.probabilities, *d_params.values()):
        assert np.all(np.isfinite(array))
    if block.normalization == "lipschitz" and isinstance(block, Attention):
        assert np.max(np.abs(cache.scores)) <= block.alpha  # Eq. 15, Sec. 9.6
    elif block.normalization is not None:
        assert np.max(np.abs(cache.scores)) <= 1.0  # Eq. 17 (Sec. 9.7), Eq. 19 (Sec. 9.8)


@given(
    setup=setups(kinds=("attention", "transformer"), normalised_only=True),
    power=st.integers(-20, 20),
    t=st.floats(1e-3, 1e3),
)
def test_normalised_scores_are_invariant_under_input_scaling(
    setup: tuple, power: int, t: float
) -> None:
    # g(tX) = g(X) for t > 0 (Eq. 15, 17, 19: numerator and denominator are both homogeneous of
    # the same degree), so Att(tX) = t Att(X). A power of two scales every float exactly, so the
    # scores must agree bit for bit; any other t up to rounding.
    block, params, x = setup
    _, cache = block.forward(params, x)
    _, cache_2 = block.forward(params, x * 2.0**power)
    np.testing.assert_array_equal(cache_2.scores, cache.scores)
    out_t, cache_t = block.forward(params, x * t)
    assert max_relative_error(cache_t.scores, cache.scores) <= 1e-14 or np.all(cache.scores == 0)
    assert max_relative_error(out_t, t * block.forward(params, x)[0]) <= 1e-13
    if isinstance(block, Attention):  # Eq. 15 and 17 are also invariant under Q -> sQ
        _, cache_q = block.forward({"Q": params["Q"] * 2.0**power}, x)
        np.testing.assert_array_equal(cache_q.scores, cache.scores)


def test_eq19_invariance_is_joint_not_per_part() -> None:
    # Scaling the values alone changes w, and the scores once vw is the max.
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 4))
    block = TransformerAttention(2, "lipschitz")
    _, cache = block.forward({}, x)
    scaled = x.copy()
    scaled[4:] *= 100.0  # w >> u, v: c = max(uw, vw) grows with w
    _, cache_scaled = block.forward({}, scaled)
    assert cache_scaled.norm.branch != 0
    assert max_relative_error(cache_scaled.scores, cache.scores) > 0.5
    # the unnormalised Eq. 7 is not scale invariant either
    plain = TransformerAttention(2)
    assert not np.allclose(plain.forward({}, 2 * x)[1].scores, plain.forward({}, x)[1].scores)


def test_alpha_zero_gives_uniform_attention() -> None:
    block, params, x = make_setup("attention", "lipschitz", 3, alpha=0.0)
    _, cache = block.forward(params, x)
    np.testing.assert_array_equal(cache.scores, 0.0)
    assert cache.denominator > 0


# -- dtypes and backends ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setup",
    [
        make_setup("attention", None, 0, d=3, n=4, m=2),
        make_setup("attention", "linear", 1, d=3, n=4, m=2),
        make_setup("attention", "lipschitz", 2, d=3, n=4, m=2),
        make_setup("transformer", None, 3),
        make_setup("transformer", "lipschitz", 4),
        make_setup("multi", "lipschitz", 5, heads=2, head_kind="linear"),
        make_setup("multi", "lipschitz", 6, heads=2),
    ],
)
def test_float32_stays_float32_and_agrees_with_float64(setup: tuple) -> None:
    block, params, x = setup
    out, cache = block.forward(params, x)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_x, d_params = block.backward(params, cache, d_out)
    tangent = block.jvp(params, cache, np.ones_like(x))

    params32 = {k: v.astype(np.float32) for k, v in params.items()}
    x32 = x.astype(np.float32)
    out32, cache32 = block.forward(params32, x32)
    d_x32, d_params32 = block.backward(params32, cache32, d_out.astype(np.float32))
    tangent32 = block.jvp(params32, cache32, np.ones_like(x32))
    head32 = cache32.heads[0] if isinstance(block, MultiHeadAttention) else cache32
    arrays32 = (out32, d_x32, tangent32, head32.scores, head32.probabilities)
    for array in (*arrays32, *d_params32.values()):
        assert array.dtype == np.float32
    assert max_relative_error(out32, out) <= 10 * RTOL32  # widened: a softmax and norms deep
    errors = relative_errors({"x": d_x32, **d_params32}, {"x": d_x, **d_params})
    assert max(errors.values()) <= 10 * RTOL32
    assert max_relative_error(tangent32, tangent) <= 10 * RTOL32


@given(setup=setups(), seed=seeds())
def test_strict_backend_matches_numpy(setup: tuple, seed: int) -> None:
    block, params, x = setup
    rng = np.random.default_rng(seed)
    out, cache = block.forward(params, x)
    d_out, h = rng.standard_normal(out.shape), rng.standard_normal(x.shape)
    d_x, d_params = block.backward(params, cache, d_out)
    tangent = block.jvp(params, cache, h)

    to_strict = strict_xp.asarray
    strict_params = {k: to_strict(v) for k, v in params.items()}
    out_s, cache_s = block.forward(strict_params, to_strict(x))
    assert isinstance(out_s, strict_xp.StrictArray)
    d_x_s, d_params_s = block.backward(strict_params, cache_s, to_strict(d_out))
    tangent_s = block.jvp(strict_params, cache_s, to_strict(h))
    assert max_relative_error(to_numpy(out_s), out) <= RTOL64
    assert max_relative_error(to_numpy(tangent_s), tangent) <= RTOL64
    errors = relative_errors(
        {k: to_numpy(v) for k, v in {"x": d_x_s, **d_params_s}.items()}, {"x": d_x, **d_params}
    )
    assert max(errors.values()) <= RTOL64, errors


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Attention(3, 2, "lipschitzz"), ValueError, "normalization must be one of"),
        (lambda: Attention(3, 2, "lipschitz", alpha=-1.0), ValueError, "alpha must be finite"),
        (lambda: Attention(3, 2, "lipschitz", alpha=float("nan")), ValueError, "alpha"),
        (lambda: Attention(0, 2), ValueError, "dim must be a positive int"),
        (lambda: Attention(3, 2.0), ValueError, "num_outputs must be a positive int"),
        (lambda: TransformerAttention(2, "linear"), ValueError, "normalization must be one of"),
        (lambda: MultiHeadAttention(3, 2, 2, 2, kind="sparse"), ValueError, "kind must be"),
        (lambda: MultiHeadAttention(3, 2, 2, 2, kind="linear"), ValueError, "needs num_outputs"),
        (lambda: MultiHeadAttention(3, 2, 2, 2, num_outputs=3), ValueError, "leave num_outputs"),
        (lambda: MultiHeadAttention(3, 2, 2, 2, normalization="linear"), ValueError, "one of"),
        (lambda: MultiHeadAttention(3, 2, 2, 0), ValueError, "heads must be a positive int"),
    ],
)
def test_bad_configuration(make: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def _attention() -> tuple:
    block = Attention(3, 2, "linear")
    return block, block.init_params(np.random.default_rng(0)), np.ones((3, 4))


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda p, x: (p, np.ones((4, 3))), ValueError, r"must be \(3, n\).*pass x.T"),
        (lambda p, x: (p, np.ones((5, 4))), ValueError, r"x must have shape \(3, \*\)"),
        (lambda p, x: (p, np.ones(3)), ValueError, "x must have shape"),
        (lambda p, x: (p, np.ones((3, 0))), ValueError, "n >= 1"),
        (lambda p, x: (p, np.where(np.eye(3, 4) > 0, np.nan, x)), ValueError, "NaN or infinity"),
        (lambda p, x: (p, np.full((3, 4), np.inf)), ValueError, "NaN or infinity"),
        (lambda p, x: (p, x.astype(np.int64)), TypeError, "floating-point"),
        (lambda p, x: (p, x.astype(np.float32)), TypeError, "x has dtype float32 but params"),
        (lambda p, x: (p, x.tolist()), TypeError, "x must be an array"),
        (lambda p, x: ({}, x), ValueError, r"missing \['Q'\]"),
        (lambda p, x: ({"Q": p["Q"].T}, x), ValueError, r"params\['Q'\] must have shape"),
        (lambda p, x: ({"Q": p["Q"] * np.nan}, x), ValueError, "NaN or infinity"),
    ],
)
def test_bad_input_gives_a_clear_error(mutate: object, error: type, match: str) -> None:
    block, params, x = _attention()
    params, x = mutate(params, x)
    with pytest.raises(error, match=match):
        block.forward(params, x)


def test_bad_input_to_the_other_blocks() -> None:
    with pytest.raises(ValueError, match=r"x must have shape \(6, \*\)"):
        TransformerAttention(2).forward({}, np.ones((5, 3)))
    with pytest.raises(ValueError, match="NaN or infinity"):
        TransformerAttention(2).forward({}, np.full((6, 3), np.nan))
    mha = MultiHeadAttention(3, 2, 2, 2)
    params = mha.init_params(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"unexpected \['Q'\]"):
        mha.forward({**params, "Q": np.ones((2, 2, 2))}, np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"params\['W_in'\] must have shape \(2, 6, 3\)"):
        mha.forward({**params, "W_in": np.ones((2, 2, 3))}, np.ones((3, 4)))


def test_bad_cotangent_and_tangent() -> None:
    block, params, x = _attention()
    _, cache = block.forward(params, x)
    with pytest.raises(ValueError, match=r"d_out must be an array of the output's shape \(3, 2\)"):
        block.backward(params, cache, np.ones((2, 3)))
    with pytest.raises(TypeError, match="d_out has dtype float32"):
        block.backward(params, cache, np.ones((3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match=r"d_x must have shape \(3, 4\)"):
        block.jvp(params, cache, np.ones((4, 3)))
    with pytest.raises(TypeError, match="d_x has dtype float32"):
        block.jvp(params, cache, np.ones((3, 4), dtype=np.float32))
    mha = MultiHeadAttention(3, 2, 2, 2)
    mha_params = mha.init_params(np.random.default_rng(0))
    _, mha_cache = mha.forward(mha_params, x)
    with pytest.raises(ValueError, match=r"output's shape \(2, 4\)"):
        mha.backward(mha_params, mha_cache, np.ones((2, 3)))
    with pytest.raises(ValueError, match="d_x must have shape"):
        mha.jvp(mha_params, mha_cache, np.ones((3, 5)))


def test_init_params_shapes_dtype_and_replace() -> None:
    mha = MultiHeadAttention(4, 2, 3, 2, "linear", "lipschitz", num_outputs=5)
    params = mha.init_params(np.random.default_rng(0), dtype=np.float32)
    assert {k: v.shape for k, v in params.items()} == mha.param_shapes()
    assert mha.param_shapes() == {"W_in": (2, 2, 4), "Q": (2, 2, 5), "W_out": (3, 4)}
    assert all(v.dtype == np.float32 for v in params.values())
    assert replace(mha, kind="transformer", num_outputs=None).param_shapes()["W_in"] == (2, 6, 4)
    assert TransformerAttention(3).init_params(np.random.default_rng(0)) == {}


def test_init_params_are_glorot_uniform_on_each_matrix() -> None:
    # U(-b, b) with b = sqrt(6 / (fan_out + fan_in)) per matrix: every entry inside the bound
    # and some within 5 % of it (P(none of n draws) = 0.95^n < 3e-7 for the smallest matrix
    # here, n = 300; the seeds are fixed).
    mha = MultiHeadAttention(40, 10, 30, 4, "linear", num_outputs=30)
    params = mha.init_params(np.random.default_rng(0))
    matrices = [*params["W_in"], *params["Q"], params["W_out"]]  # each (fan_out, fan_in)
    for matrix in matrices:
        bound = np.sqrt(6.0 / sum(matrix.shape))
        assert 0.95 * bound <= np.abs(matrix).max() <= bound
    (q,) = Attention(6, 200).init_params(np.random.default_rng(1)).values()
    assert 0.95 * np.sqrt(6.0 / 206) <= np.abs(q).max() <= np.sqrt(6.0 / 206)
