"""Positive random features (NodeFormer Eq. 4) and the projection draw: finite differences of
exactly the function each backward differentiates, what the stabiliser cancels, the orthogonal
draw (orthogonality, chi_d lengths, isotropy, replay), backends, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from scipy import stats

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.nn.nodeformer.random_features import (
    PositiveRandomFeatures,
    draw_projection,
    feature_exponent,
    feature_exponent_backward,
    positive_random_features,
)
from refimpl.testing import check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from tests.backends import DEVICE_BACKENDS

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
RTOL32 = FORWARD_RTOL[np.dtype(np.float32)]
KINK_GAP = 1e-4  # central differences (eps = 1e-6) must not straddle a max closer than this
KS_ALPHA = 1e-3  # significance of the distribution tests (fixed seeds: deterministic verdicts)


def make_setup(seed: int, n: int, d: int, m: int, kind: str, scale: float) -> tuple:
    """``x (N, d)`` with entries of size ``scale`` and a drawn ``omega (m, d)``."""
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal((n, d)), draw_projection(rng, m, d, kind)


@st.composite
def setups(draw: st.DrawFn) -> tuple:
    return make_setup(
        draw(seeds()),
        draw(st.integers(1, 6)),
        draw(st.integers(1, 4)),
        draw(st.integers(1, 8)),
        draw(st.sampled_from(["iid", "orthogonal"])),
        draw(st.sampled_from([0.3, 1.0, 2.0])),
    )


def top_gap(values: np.ndarray) -> float:
    """Gap between the largest and second-largest entry (inf for a single entry)."""
    v = np.sort(np.ravel(values))[::-1]
    return np.inf if v.size < 2 else float(v[0] - v[1])


def kink_gap(x: np.ndarray, omega: np.ndarray, stabilizer: str | None) -> float:
    exponent = x @ omega.T - 0.5 * np.sum(x * x, axis=1, keepdims=True)
    if stabilizer == "row":
        return min(top_gap(row) for row in exponent)
    if stabilizer == "global":
        return top_gap(exponent)
    return np.inf


class HeldShift:
    """``x -> positive_random_features(x, omega, shift)`` with the shift frozen at ``x0``'s.

    Its backward is ``PositiveRandomFeatures(stabilizer, hold_shift=True).backward`` on the
    cache of the real forward, so central differences of this forward test exactly the
    function that backward claims to differentiate.
    """

    def __init__(self, stabilizer: str, x0: np.ndarray, omega: np.ndarray) -> None:
        self.block = PositiveRandomFeatures(stabilizer, hold_shift=True)
        self.omega = omega
        self.shift = self.block.forward({}, x0, omega)[1].shift

    def forward(self, params: dict, x: np.ndarray) -> tuple:
        return positive_random_features(x, self.omega, self.shift), self.block.forward(
            {}, x, self.omega
        )[1]

    def backward(self, params: dict, cache: object, d_phi: np.ndarray) -> tuple:
        return self.block.backward(params, cache, d_phi)


# -- gradients ------------------------------------------------------------------------------------


@given(setup=setups(), stabilizer=st.sampled_from([None, "row", "global"]))
@example(setup=make_setup(0, 1, 1, 1, "iid", 1.0), stabilizer="global")
@example(setup=make_setup(1, 6, 4, 8, "orthogonal", 2.0), stabilizer="row")
def test_backward_is_the_derivative_of_phi_as_returned(
    setup: tuple, stabilizer: str | None
) -> None:
    # hold_shift=False: the shift is a max, differentiated through its maximiser.
    x, omega = setup
    assume(kink_gap(x, omega, stabilizer) > KINK_GAP)
    block = PositiveRandomFeatures(stabilizer)
    report = check_gradients(block, {}, (x, omega), wrt_inputs=(0,), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=setups(), stabilizer=st.sampled_from(["row", "global"]))
@example(setup=make_setup(2, 1, 1, 1, "iid", 1.0), stabilizer="row")
def test_held_shift_backward_is_the_derivative_of_the_held_function(
    setup: tuple, stabilizer: str
) -> None:
    x, omega = setup
    report = check_gradients(HeldShift(stabilizer, x, omega), {}, (x,), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("stabilizer", ["row", "global"])
def test_held_shift_backward_is_not_the_derivative_of_phi(stabilizer: str) -> None:
    # The check can fail: phi as returned depends on the shift, so the held backward is wrong
    # for phi itself (it is right only for consumers in which the shift cancels).
    x, omega = make_setup(3, 4, 3, 5, "iid", 1.0)
    assert kink_gap(x, omega, stabilizer) > KINK_GAP
    held = PositiveRandomFeatures(stabilizer, hold_shift=True)
    report = check_gradients(held, {}, (x, omega), wrt_inputs=(0,), max_entries=None)
    assert report.max_rel_error > 1e-2


class QueryRatio:
    """``R_u = phi(x_u)^T b / phi(x_u)^T c``: invariant to a per-row factor on phi(x_u)."""

    def __init__(self, omega: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        self.omega, self.b, self.c = omega, b, c
        self.block = PositiveRandomFeatures("row", hold_shift=True)

    def forward(self, params: dict, x: np.ndarray) -> tuple:
        phi, cache = self.block.forward({}, x, self.omega)  # shift recomputed at every x
        return (phi @ self.b) / (phi @ self.c), (phi, cache)

    def backward(self, params: dict, cache: tuple, d_r: np.ndarray) -> tuple:
        phi, phi_cache = cache
        num, den = phi @ self.b, phi @ self.c  # (N,)
        d_phi = (d_r / den)[:, None] * self.b - (d_r * num / den**2)[:, None] * self.c
        return self.block.backward({}, phi_cache, d_phi)


class KeyRatio(QueryRatio):
    """``R = sum_v phi(x_v)^T b / sum_v phi(x_v)^T c``: invariant to one factor on all rows."""

    def __init__(self, omega: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        super().__init__(omega, b, c)
        self.block = PositiveRandomFeatures("global", hold_shift=True)

    def forward(self, params: dict, x: np.ndarray) -> tuple:
        phi, cache = self.block.forward({}, x, self.omega)
        return np.array([np.sum(phi @ self.b) / np.sum(phi @ self.c)]), (phi, cache)

    def backward(self, params: dict, cache: tuple, d_r: np.ndarray) -> tuple:
        phi, phi_cache = cache
        num, den = np.sum(phi @ self.b), np.sum(phi @ self.c)
        d_row = d_r[0] / den * self.b - d_r[0] * num / den**2 * self.c  # (m,), same for all rows
        d_phi = np.ones((phi.shape[0], 1)) * d_row
        return self.block.backward({}, phi_cache, d_phi)


@given(setup=setups(), seed=seeds(), ratio=st.sampled_from([QueryRatio, KeyRatio]))
def test_held_shift_is_exact_for_a_ratio_in_which_the_shift_cancels(
    setup: tuple, seed: int, ratio: type
) -> None:
    # Eq. 5's structure: the forward recomputes the shift at every perturbed x, and the held
    # backward is still the exact derivative (no kink filter needed: the ratio has no kink).
    x, omega = setup
    rng = np.random.default_rng(seed)
    b, c = rng.standard_normal(omega.shape[0]), rng.uniform(0.5, 1.5, omega.shape[0])
    report = check_gradients(ratio(omega, b, c), {}, (x,), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


# -- the stabiliser: what it does, what cancels ---------------------------------------------------


@given(setup=setups())
def test_shifts_are_one_factor_per_row_or_one_for_all(setup: tuple) -> None:
    x, omega = setup
    m = omega.shape[0]
    plain = PositiveRandomFeatures().forward({}, x, omega)[0]
    row = PositiveRandomFeatures("row").forward({}, x, omega)[0]
    glob = PositiveRandomFeatures("global").forward({}, x, omega)[0]
    # Eq. 4 as printed, written out here
    expected = np.exp(x @ omega.T - 0.5 * np.sum(x**2, axis=1, keepdims=True)) / math.sqrt(m)
    assert max_relative_error(plain, expected) <= RTOL64
    row_factor, global_factor = row / plain, glob / plain  # (N, m)
    np.testing.assert_allclose(row_factor, row_factor[:, :1] * np.ones(m), rtol=1e-12)
    np.testing.assert_allclose(global_factor, global_factor[0, 0], rtol=1e-12)
    # the largest feature is exactly 1 / sqrt(m): per row, and over the whole array
    np.testing.assert_array_equal(row.max(axis=1), 1.0 / math.sqrt(m))
    assert glob.max() == 1.0 / math.sqrt(m)


def kernel_ratio(phi_q: np.ndarray, phi_k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Eq. 5 written out: ``phi_q (phi_k^T V) / phi_q (phi_k^T 1)``."""
    return (phi_q @ (phi_k.T @ v)) / (phi_q @ phi_k.sum(axis=0))[:, None]


def test_query_row_and_key_global_shifts_cancel_a_key_row_shift_does_not() -> None:
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((5, 3)), 1.5 * rng.standard_normal((6, 3))
    v = rng.standard_normal((6, 2))
    omega = draw_projection(rng, 7, 3)
    phi = {s: PositiveRandomFeatures(s).forward({}, q, omega)[0] for s in (None, "row")}
    key = {s: PositiveRandomFeatures(s).forward({}, k, omega)[0] for s in (None, "row", "global")}
    printed = kernel_ratio(phi[None], key[None], v)  # Eq. 4 unshifted
    # rounding only: the shifted exponents lose a few ulps of |shift|
    assert max_relative_error(kernel_ratio(phi["row"], key["global"], v), printed) <= 10 * RTOL64
    assert max_relative_error(kernel_ratio(phi["row"], key[None], v), printed) <= 10 * RTOL64
    # a per-key factor re-weights the keys: the attention changes
    assert max_relative_error(kernel_ratio(phi[None], key["row"], v), printed) > 1e-2


@pytest.mark.parametrize("stabilizer", ["row", "global"])
def test_stabilised_features_stay_finite_where_eq4_overflows(stabilizer: str) -> None:
    # |x| ~ 40 with omega ~ N(0, 1): w^T x reaches a few hundred, ||x||^2 / 2 several thousand,
    # so Eq. 4 as printed is 0 * inf or 0 everywhere; the shifted exponent is <= 0.
    x, omega = make_setup(5, 4, 3, 6, "orthogonal", 40.0)
    with np.errstate(over="ignore", invalid="ignore"):
        plain = PositiveRandomFeatures().forward({}, x, omega)[0]
    assert not np.all(np.isfinite(plain) & (plain > 0))
    block = PositiveRandomFeatures(stabilizer)
    phi, cache = block.forward({}, x, omega)
    assert np.all(np.isfinite(phi)) and phi.max() == 1 / math.sqrt(6)
    d_x, _ = block.backward({}, cache, np.ones_like(phi))
    assert np.all(np.isfinite(d_x))


@pytest.mark.parametrize("scale", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("transposed", [False, True])
def test_feature_exponent_at_a_scale_is_eq4s_exponent_of_s_x(
    scale: float, transposed: bool
) -> None:
    # a(s x) = w^T (s x) - ||s x||^2 / 2, computed without forming s x: every scale applied,
    # 1.0 (the unscaled path) and 0.1 = 1 / sqrt(100) (tau = 100) among them.
    rng = np.random.default_rng(4)
    x, omega = rng.standard_normal((5, 3)), rng.standard_normal((7, 3))
    expected = (scale * x) @ omega.T - 0.5 * np.sum((scale * x) ** 2, axis=1, keepdims=True)
    got = feature_exponent(x, omega, scale, transposed=transposed)
    assert max_relative_error(got.T if transposed else got, expected) <= RTOL64


# -- the projection draw --------------------------------------------------------------------------


@given(seed=seeds(), m=st.integers(1, 20), d=st.integers(1, 5))
def test_orthogonal_blocks_have_mutually_orthogonal_rows(seed: int, m: int, d: int) -> None:
    omega = draw_projection(np.random.default_rng(seed), m, d, "orthogonal")
    assert omega.shape == (m, d) and omega.dtype == np.float64
    for start in range(0, m, d):
        block = omega[start : start + d]
        gram = block @ block.T
        lengths = np.sqrt(np.diag(gram))
        cosines = gram / np.outer(lengths, lengths)
        np.testing.assert_allclose(cosines, np.eye(len(block)), atol=1e-13)


@pytest.mark.parametrize("d", [1, 3, 8])
def test_orthogonal_row_lengths_follow_chi_d(d: int) -> None:
    # The lengths are i.i.d. chi_d (step 2 of the draw): one-sample Kolmogorov-Smirnov.
    omega = draw_projection(np.random.default_rng(10 + d), 3000, d, "orthogonal")
    lengths = np.linalg.norm(omega, axis=1)
    assert stats.kstest(lengths, stats.chi(d).cdf).pvalue > KS_ALPHA


def test_orthogonal_rows_are_marginally_standard_normal_and_lapack_q_is_not() -> None:
    # Every row is N(0, I_d): a uniform direction times a chi_d length. Entry (row, 0) over
    # independent draws is then an i.i.d. N(0, 1) sample. Row 0 of a block is where the
    # missing QR sign correction shows: LAPACK's Q[0, 0] = -|G00| / ||G[:, 0]|| <= 0 always.
    rng = np.random.default_rng(20)
    d, draws = 3, 1500
    omegas = np.stack([draw_projection(rng, d, d, "orthogonal") for _ in range(draws)])
    for row in range(d):
        assert stats.kstest(omegas[:, row, 0], stats.norm.cdf).pvalue > KS_ALPHA
    uncorrected = np.array([np.linalg.qr(rng.standard_normal((d, d)))[0][0, 0] for _ in range(50)])
    assert np.all(uncorrected <= 0)


def test_orthogonal_draw_replays_from_the_documented_order() -> None:
    m, d, seed = 7, 3, 30
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(math.ceil(m / d)):  # step 1, written from the docstring
        q, r = np.linalg.qr(rng.standard_normal((d, d)))
        blocks.append((q @ np.diag(np.where(np.diag(r) < 0, -1.0, 1.0))).T)
    lengths = np.linalg.norm(rng.standard_normal((m, d)), axis=1)  # step 2
    expected = lengths[:, None] * np.vstack(blocks)[:m]  # step 3
    omega = draw_projection(np.random.default_rng(seed), m, d, "orthogonal")
    np.testing.assert_allclose(omega, expected, rtol=1e-15, atol=0)
    iid = draw_projection(np.random.default_rng(seed), m, d)
    np.testing.assert_array_equal(iid, np.random.default_rng(seed).standard_normal((m, d)))


# -- dtypes and backends ------------------------------------------------------------------------


@pytest.mark.parametrize("stabilizer", [None, "row", "global"])
def test_float32_stays_float32_and_agrees_with_float64(stabilizer: str | None) -> None:
    x, omega = make_setup(40, 5, 3, 6, "orthogonal", 1.0)
    block = PositiveRandomFeatures(stabilizer)
    d_phi = np.random.default_rng(0).standard_normal((5, 6))
    phi, cache = block.forward({}, x, omega)
    d_x, _ = block.backward({}, cache, d_phi)
    phi32, cache32 = block.forward({}, x.astype(np.float32), omega.astype(np.float32))
    d_x32, _ = block.backward({}, cache32, d_phi.astype(np.float32))
    assert phi32.dtype == d_x32.dtype == np.float32
    assert max_relative_error(phi32, phi) <= 10 * RTOL32  # widened: exp of a d-term sum
    assert max_relative_error(d_x32, d_x) <= 10 * RTOL32


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@given(setup=setups(), stabilizer=st.sampled_from([None, "row", "global"]), seed=seeds())
def test_device_backend_matches_numpy(
    backend: str, setup: tuple, stabilizer: str | None, seed: int
) -> None:
    x, omega = setup
    d_phi = np.random.default_rng(seed).standard_normal((x.shape[0], omega.shape[0]))
    for hold_shift in (False, True):
        block = PositiveRandomFeatures(stabilizer, hold_shift)
        phi, cache = block.forward({}, x, omega)
        d_x, _ = block.backward({}, cache, d_phi)
        phi_d, cache_d = block.forward(
            {}, asarray(x, backend=backend), asarray(omega, backend=backend)
        )
        assert backend_name(get_array_module(phi_d)) == backend
        d_x_d, _ = block.backward({}, cache_d, asarray(d_phi, backend=backend))
        assert max_relative_error(to_numpy(phi_d), phi) <= RTOL64
        assert max_relative_error(to_numpy(d_x_d), d_x) <= RTOL64


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: PositiveRandomFeatures("max"), ValueError, "stabilizer must be one of"),
        (lambda: PositiveRandomFeatures(None, 1), ValueError, "hold_shift must be True or False"),
        (lambda: draw_projection(np.random.default_rng(0), 0, 3), ValueError, "m must be a posi"),
        (lambda: draw_projection(np.random.default_rng(0), 3, 2.0), ValueError, "d must be a pos"),
        (lambda: draw_projection(np.random.default_rng(0), 3, 2, "qr"), ValueError, "kind must"),
        (lambda: draw_projection(np.random.RandomState(0), 3, 2), TypeError, "Generator"),
    ],
)
def test_bad_configuration(make: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    ("x", "omega", "error", "match"),
    [
        (np.ones((2, 3)), np.ones((4, 2)), ValueError, r"omega has shape \(4, 2\) but must be"),
        (np.ones((2, 3)), np.ones((0, 3)), ValueError, "m >= 1"),
        (np.ones((0, 3)), np.ones((4, 3)), ValueError, "N >= 1 rows"),
        (np.ones(3), np.ones((4, 3)), ValueError, r"x must have shape \(\*, \*\)"),
        (np.full((2, 3), np.nan), np.ones((4, 3)), ValueError, "NaN or infinity"),
        (np.ones((2, 3)), np.full((4, 3), np.inf), ValueError, "NaN or infinity"),
        (np.ones((2, 3), np.float32), np.ones((4, 3)), TypeError, "omega has dtype float64"),
        (np.ones((2, 3), np.int64), np.ones((4, 3)), TypeError, "floating-point"),
    ],
)
def test_bad_input_gives_a_clear_error(x: object, omega: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PositiveRandomFeatures("row").forward({}, x, omega)


def test_bad_params_and_cotangent() -> None:
    block = PositiveRandomFeatures("global")
    x, omega = make_setup(0, 3, 2, 4, "iid", 1.0)
    with pytest.raises(ValueError, match=r"unexpected \['omega'\]"):
        block.forward({"omega": omega}, x, omega)
    _, cache = block.forward({}, x, omega)
    with pytest.raises(ValueError, match=r"d_phi must be an array of the output's shape \(3, 4\)"):
        block.backward({}, cache, np.ones((4, 3)))
    with pytest.raises(TypeError, match="d_phi has dtype float32"):
        block.backward({}, cache, np.ones((3, 4), np.float32))


@pytest.mark.parametrize("scale", [0.5, 1.0, 10.0])
def test_feature_exponent_backward_at_every_scale(scale: float) -> None:
    # Guards the scale == 1.0 shortcut (mutant: the shortcut taken at scale 10, whose vjp then
    # forgot the factor s, passed: the layers' temperatures never gave s = 10). For
    # a = s x omega^T - s^2 ||x||^2 / 2: d_x = s d_a omega - s^2 rowsum(d_a) x.
    rng = np.random.default_rng(9)
    x, omega = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))  # (N, d), (m, d)
    d_a = rng.standard_normal((4, 5))  # (N, m)
    expected = scale * d_a @ omega - scale**2 * d_a.sum(axis=1, keepdims=True) * x
    got = feature_exponent_backward(x, omega, d_a, scale)
    assert max_relative_error(got, expected) <= RTOL64
