"""All-pair softmax attention of NodeFormer, exact (Eq. 2, 6, 15) and kernelised (Eq. 5, 7, Alg. 1):
finite differences, the naive loops, the stabiliser and its floor, row blocks and threads,
convergence as m grows, the K-sample average, N = 1, the tau -> 0 limit (Eq. 16), torch autograd,
backends, bad input."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy, use_backend
from refimpl.nn.nodeformer import kernel_attention
from refimpl.nn.nodeformer.all_pair_softmax import AllPairSoftmax
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax
from refimpl.nn.nodeformer.random_features import draw_projection
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.strategies import seeds
from refimpl.testing.strict import count_launches
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from refimpl.train.guards import deferred_step
from refimpl.validation import NonFiniteError
from tests.backends import DEVICE_BACKENDS

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
RTOL32 = FORWARD_RTOL[np.dtype(np.float32)]
TAUS = [0.25, 0.5, 1.0, 2.0]


def make_setup(
    seed: int,
    n: int = 4,
    d: int = 3,
    d_v: int = 2,
    m: int = 6,
    samples: int = 2,
    kind: str = "iid",
    scale: float = 0.7,
) -> tuple:
    """``q, k (N, d)`` of entry size ``scale``, ``v (N, d_v)``, ``omega (m, d)``, and
    ``gumbel (N, K)`` drawn Gumbel(0, 1) (``None`` for ``samples = 0``)."""
    rng = np.random.default_rng(seed)
    q, k = scale * rng.standard_normal((n, d)), scale * rng.standard_normal((n, d))
    v = rng.standard_normal((n, d_v))
    omega = draw_projection(rng, m, d, kind)
    gumbel = rng.gumbel(size=(n, samples)) if samples else None
    return q, k, v, omega, gumbel


@st.composite
def setups(draw: st.DrawFn) -> tuple:
    return make_setup(
        draw(seeds()),
        n=draw(st.integers(1, 6)),
        d=draw(st.integers(1, 4)),
        d_v=draw(st.integers(1, 3)),
        m=draw(st.integers(1, 8)),
        samples=draw(st.integers(0, 3)),
        kind=draw(st.sampled_from(["iid", "orthogonal"])),
        scale=draw(st.sampled_from([0.3, 0.7, 1.2])),
    )


SMALLEST = make_setup(0, n=1, d=1, d_v=1, m=1, samples=1)


@contextlib.contextmanager
def row_block(size: int) -> Iterator[None]:
    """Run the kernelised attention in row blocks of ``size`` (the host default is 1024, so
    the small N drawn here would otherwise always be one block)."""
    saved = kernel_attention.ROW_BLOCK
    kernel_attention.ROW_BLOCK = size
    try:
        yield
    finally:
        kernel_attention.ROW_BLOCK = saved


BLOCK_SIZES = [1, 2, 1024]  # one row per block, a few rows, all rows in one block


def gradients(block: object, inputs: tuple, d_z: np.ndarray) -> dict:
    z, cache = block.forward({}, *inputs)
    (d_q, d_k, d_v), d_params = block.backward({}, cache, d_z)
    assert d_params == {}
    return {"z": z, "q": d_q, "k": d_k, "v": d_v}


# -- gradients ------------------------------------------------------------------------------------


@given(setup=setups(), tau=st.sampled_from(TAUS))
@example(setup=SMALLEST, tau=0.25)
def test_all_pair_backward_matches_central_differences(setup: tuple, tau: float) -> None:
    q, k, v, _, gumbel = setup
    block = AllPairSoftmax(tau)
    report = check_gradients(block, {}, (q, k, v, gumbel), wrt_inputs=(0, 1, 2), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(
    setup=setups(),
    tau=st.sampled_from(TAUS),
    stabilize=st.booleans(),
    rows=st.sampled_from(BLOCK_SIZES),
)
@example(setup=SMALLEST, tau=0.25, stabilize=True, rows=1024)
@example(setup=make_setup(1, n=6, d=4, d_v=3, m=8, samples=3), tau=0.25, stabilize=True, rows=4)
def test_kernelized_backward_matches_central_differences(
    setup: tuple, tau: float, stabilize: bool, rows: int
) -> None:
    # The forward recomputes every shift at each perturbed input; the backward holds them.
    q, k, v, omega, gumbel = setup
    block = KernelizedSoftmax(tau, stabilize)
    inputs = (q, k, v, omega, gumbel)
    with row_block(rows):
        report = check_gradients(block, {}, inputs, wrt_inputs=(0, 1, 2), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_gradient_check_catches_a_backward_without_the_denominator_term() -> None:
    # The check must be able to fail: dropping d(den) (treating each sample's normaliser as a
    # constant) leaves the numerator's gradient only.
    class Broken(KernelizedSoftmax):
        def backward(self, params: dict, cache: object, d_z: np.ndarray) -> tuple:
            # d_den = -d_coef coef / den = 0
            huge = cache._replace(denominators=np.full_like(cache.denominators, np.inf))
            return super().backward(params, huge, d_z)

    inputs = make_setup(2)
    report = check_gradients(Broken(0.5), {}, inputs, wrt_inputs=(0, 1, 2), max_entries=None)
    assert report.max_rel_error > 1e-2


# -- against the equations written as loops ------------------------------------------------------


def all_pair_loops(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, gumbel: np.ndarray | None, tau: float
) -> np.ndarray:
    """Eq. 15 literally: for each query u and sample s a softmax over the keys v."""
    n = q.shape[0]
    g = np.zeros((n, 1)) if gumbel is None else gumbel
    z = np.zeros((n, v.shape[1]))
    for u in range(n):
        for s in range(g.shape[1]):
            scores = np.array([(q[u] @ k[w] + g[w, s]) / tau for w in range(n)])
            weights = np.exp(scores - scores.max())
            z[u] += (weights / weights.sum()) @ v / g.shape[1]
    return z


def kernelized_loops(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega: np.ndarray,
    gumbel: np.ndarray | None,
    tau: float,
) -> np.ndarray:
    """Eq. 17 literally, pair by pair, with phi of Eq. 4 unstabilised (moderate inputs)."""
    m, n = omega.shape[0], q.shape[0]

    def phi(x: np.ndarray) -> np.ndarray:
        return np.exp(omega @ x - x @ x / 2) / math.sqrt(m)

    g = np.zeros((n, 1)) if gumbel is None else gumbel
    z = np.zeros((n, v.shape[1]))
    for u in range(n):
        for s in range(g.shape[1]):
            c = [
                phi(q[u] / math.sqrt(tau)) @ phi(k[w] / math.sqrt(tau)) * math.exp(g[w, s] / tau)
                for w in range(n)
            ]
            z[u] += np.array(c) @ v / sum(c) / g.shape[1]
    return z


@given(setup=setups(), tau=st.sampled_from(TAUS), rows=st.sampled_from(BLOCK_SIZES))
def test_forward_matches_the_equations_as_loops(setup: tuple, tau: float, rows: int) -> None:
    q, k, v, omega, gumbel = setup
    z, _ = AllPairSoftmax(tau).forward({}, q, k, v, gumbel)
    assert max_relative_error(z, all_pair_loops(q, k, v, gumbel, tau)) <= RTOL64
    with row_block(rows):
        z, _ = KernelizedSoftmax(tau).forward({}, q, k, v, omega, gumbel)
    # widened: the loops multiply e^{g/tau} by unshifted features, ours adds exponents first
    assert max_relative_error(z, kernelized_loops(q, k, v, omega, gumbel, tau)) <= 1e2 * RTOL64


# -- the stabiliser ------------------------------------------------------------------------------


@given(setup=setups(), tau=st.sampled_from(TAUS), seed=seeds())
def test_stabiliser_cancels(setup: tuple, tau: float, seed: int) -> None:
    # Moderate inputs: Eq. 4 as printed does not overflow, and the two must agree in the output
    # and in every gradient. Rounding: the shifted exponents lose ~|shift| ulps (|shift| <~ 50).
    q, k, v, omega, gumbel = setup
    d_z = np.random.default_rng(seed).standard_normal(v.shape)
    inputs = (q, k, v, omega, gumbel)
    stable = gradients(KernelizedSoftmax(tau, True), inputs, d_z)
    plain = gradients(KernelizedSoftmax(tau, False), inputs, d_z)
    assert max(relative_errors(stable, plain).values()) <= 1e2 * RTOL64


@pytest.mark.parametrize(
    ("scale", "tau", "samples"),
    [(40.0, 1.0, 0), (40.0, 1.0, 3), (1.0, 0.004, 3)],
    ids=["large-q-k", "large-q-k-gumbel", "tiny-tau-gumbel"],
)
def test_stabilised_stays_finite_where_the_unstabilised_overflows(
    scale: float, tau: float, samples: int
) -> None:
    # |q| / sqrt(tau) ~ 40 * sqrt(3): exp(-||x||^2 / 2) underflows to 0 (0 / 0 in Eq. 5), or
    # e^{g / tau} with tau = 0.004 overflows (inf / inf). The stabilised output is a convex
    # combination of the values (positive weights summing to one per sample): within their
    # range, column by column, up to rounding.
    q, k, v, omega, gumbel = make_setup(3, n=5, d=3, m=8, samples=samples, scale=scale)
    inputs = (q, k, v, omega, gumbel)
    with (
        np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"),
        pytest.raises(NonFiniteError, match="use stabilize=True"),
    ):
        KernelizedSoftmax(tau, False).forward({}, *inputs)
    found = gradients(KernelizedSoftmax(tau), inputs, np.ones_like(v))
    assert all(np.all(np.isfinite(a)) for a in found.values())
    slack = 1e-12 * np.max(np.abs(v))
    z = found["z"]
    assert np.all(z >= v.min(axis=0) - slack) and np.all(z <= v.max(axis=0) + slack)


@given(setup=setups(), tau=st.sampled_from(TAUS))
def test_outputs_are_convex_combinations_of_the_values(setup: tuple, tau: float) -> None:
    q, k, v, omega, gumbel = setup
    slack = 1e-12 * np.max(np.abs(v))
    for z in (
        AllPairSoftmax(tau).forward({}, q, k, v, gumbel)[0],
        KernelizedSoftmax(tau).forward({}, q, k, v, omega, gumbel)[0],
    ):
        assert np.all(z >= v.min(axis=0) - slack) and np.all(z <= v.max(axis=0) + slack)


def test_denominator_underflow_is_a_clear_error() -> None:
    # d = 1, omega = (1, -1): the query's features peak on row 0, the key's on row 1, and the
    # kernel estimate exp(-(w0 - w1) * 400) underflows even after the shifts.
    q, k, v = np.array([[400.0]]), np.array([[-400.0]]), np.array([[1.0]])
    omega = np.array([[1.0], [-1.0]])
    with np.errstate(under="ignore"), pytest.raises(NonFiniteError, match="raise tau"):
        KernelizedSoftmax(1.0).forward({}, q, k, v, omega)


def _underflowing_inputs(backend: str) -> tuple:
    """q, k, v, omega whose one denominator underflows to 0 (see the test above)."""
    arrays = (np.array([[400.0]]), np.array([[-400.0]]), np.array([[1.0]]))
    return (
        *(asarray(a, backend=backend) for a in arrays),
        asarray([[1.0], [-1.0]], backend=backend),
    )


@pytest.mark.parametrize("bad", [False, True])
def test_a_deferred_device_step_queues_the_denominator_check_and_a_bad_one_reruns_it(
    bad: bool,
) -> None:
    # Inside a device training step (deferred_step) the denominators are queued for the step's
    # one read instead of read block by block (a sync each); a bad one must still end in the
    # checked path's error, by the rerun.
    if bad:
        q, k, v, omega = _underflowing_inputs("strict")
    else:
        q, k, v, omega, _ = make_setup(2, n=9, samples=3)
        q, k, v, omega = (asarray(a, backend="strict") for a in (q, k, v, omega))
    calls = []

    def step() -> Any:
        calls.append(1)
        return KernelizedSoftmax(1.0).forward({}, q, k, v, omega)[0]

    with use_backend("strict"), np.errstate(under="ignore", divide="ignore", invalid="ignore"):
        with count_launches() as counts, contextlib.ExitStack() as stack:
            if bad:
                stack.enter_context(pytest.raises(NonFiniteError, match="raise tau"))
            z = deferred_step(step)
    assert len(calls) == (2 if bad else 1)  # a bad read reruns the step on the checked path
    if not bad:
        assert counts.syncs == 1  # the step's one read, no read of the block's own
        expected = KernelizedSoftmax(1.0).forward({}, *(to_numpy(a) for a in (q, k, v, omega)))
        np.testing.assert_array_equal(to_numpy(z), expected[0])


def test_exact_scores_overflow_is_a_clear_error() -> None:
    q = np.full((2, 1), 1e200)
    with np.errstate(over="ignore"), pytest.raises(NonFiniteError, match="raise tau"):
        AllPairSoftmax(1e-200).forward({}, q, q, np.ones((2, 1)))


# -- the floor: exact zeros, no subnormals ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_features_below_the_floor_are_exact_zeros_and_none_is_subnormal(dtype: type) -> None:
    # Exponents spread from 0 down past log(tiny): the regime where Gumbel weights at a small
    # tau used to leave a fifth of the float32 key features subnormal (10-100x slower products).
    # Everything the floor keeps is within e^cut of exp, everything below the cut is exactly 0.
    info = np.finfo(dtype)
    cut = math.log(float(info.tiny)) + 40.0
    exponent = np.linspace(2.0 * math.log(float(info.tiny)), 0.0, 20_001).astype(dtype)
    features = kernel_attention._exp_floored(exponent.copy(), kernel_attention._floor(np, dtype))
    below = exponent < cut
    assert below.any() and (~below).any()
    assert np.all(features[below] == 0.0)
    assert np.all(features[~below] >= info.tiny)  # normal: no subnormal enters a product
    exact = np.exp(exponent.astype(np.float64))
    # within e^cut of exp, plus exp's own rounding (a few ulps of the result)
    slack = math.exp(cut) + 4 * float(info.eps) * (math.exp(cut) + exact)
    assert np.all(np.abs(features - exact) <= slack)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_floor_is_the_clamped_exp_bit_for_bit_and_keeps_nan(dtype: type) -> None:
    # The host clamps against a row of cuts (NumPy's maximum with a scalar is slower): it must
    # give exp(max(a, cut)) - e^cut exactly, on every row width and with NaN kept (the
    # denominator check must see it), as the scalar clamp did.
    cut, floor_value = kernel_attention._floor(np, dtype)
    exponent = np.linspace(2.0 * cut, 1.0, 3 * 7 * 5).astype(dtype).reshape(3, 7, 5)
    exponent[1, 2, 3] = np.nan
    expected = np.exp(np.maximum(exponent, cut)) - floor_value
    found = kernel_attention._exp_floored(exponent.copy(), (cut, floor_value))
    np.testing.assert_array_equal(found, expected)
    assert np.isnan(found[1, 2, 3]) and np.sum(found == 0.0) > 10


def test_gumbel_keys_at_small_tau_in_float32_keep_no_subnormal() -> None:
    # The whole block, as the benchmark runs it: tau = 0.25, K = 10, float32.
    q, k, v, omega, gumbel = make_setup(5, n=3000, d=16, d_v=4, m=30, samples=10, scale=0.3)
    inputs = [a.astype(np.float32) for a in (q, k, v, omega, gumbel)]
    _, cache = KernelizedSoftmax(0.25).forward({}, *inputs)
    floor = kernel_attention._floor(np, np.float32)
    every_row = slice(0, 3000)
    keys = kernel_attention.key_features(cache.log_weights, cache.key_exponents, every_row, floor)
    tiny = np.finfo(np.float32).tiny
    assert np.mean(keys == 0.0) > 0.01  # the floor was reached, so the check below means something
    assert np.all((keys == 0.0) | (keys >= tiny))


# -- row blocks and threads -----------------------------------------------------------------------


@given(
    seed=seeds(),
    n=st.integers(1, 40),
    samples=st.integers(0, 3),
    rows=st.integers(1, 9),
    tau=st.sampled_from(TAUS),
)
def test_row_blocks_give_the_one_block_result(
    seed: int, n: int, samples: int, rows: int, tau: float
) -> None:
    # Blocks change only the order in which kv, O_s and their gradients are summed.
    inputs = make_setup(seed, n=n, d=3, d_v=2, m=5, samples=samples)
    d_z = np.random.default_rng(seed).standard_normal((n, 2))
    with row_block(n):
        whole = gradients(KernelizedSoftmax(tau), inputs, d_z)
    with row_block(rows):
        blocked = gradients(KernelizedSoftmax(tau), inputs, d_z)
    assert max(relative_errors(blocked, whole).values()) <= RTOL64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_do_not_depend_on_the_thread_count(monkeypatch, dtype: type) -> None:
    # Bit for bit: blocks are fixed, each is one thread's, partial sums are added in block
    # order, and BLAS runs on one thread inside every block (OpenBLAS's rounding depends on
    # how many threads split a product: with a two-thread BLAS on one block thread, these
    # outputs differed in the last bits). 2500 rows and width 64: products BLAS would split.
    q, k, v, omega, gumbel = make_setup(9, n=2500, d=64, d_v=64, m=30, samples=10, scale=0.2)
    inputs = [a.astype(dtype) for a in (q, k, v, omega, gumbel)]
    d_z = np.random.default_rng(9).standard_normal(v.shape).astype(dtype)
    found = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("REFIMPL_NUM_THREADS", threads)
        found[threads] = gradients(KernelizedSoftmax(0.25), inputs, d_z)
    for threads in ("2", "3"):
        for name, value in found[threads].items():
            np.testing.assert_array_equal(value, found["1"][name], err_msg=name)


# -- kernelised against exact as m grows ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["iid", "orthogonal"])
def test_kernelized_converges_to_exact_at_the_rate_one_over_sqrt_m(kind: str) -> None:
    # Delta method: Z_m - Z = xi / sqrt(m) + O(1/m), so the mean squared error over R independent
    # projections, MSE(m), estimates E||xi||^2 / m and RMS(64) / RMS(4096) -> sqrt(4096 / 64) = 8.
    # Tolerance: for Gaussian xi, Var ||xi||^2 = 2 tr(S^2) <= 2 (tr S)^2, so each MSE has relative
    # standard error <= sqrt(2 / R); the log of the RMS ratio then has standard error
    # <= sqrt(2 * 2 / R) / 2 = 1 / sqrt(R). We accept 4 standard errors. (No convergence gives 1,
    # a 1/m rate 64: both far outside.)
    q, k, v, _, gumbel = make_setup(50, n=5, d=2, samples=2, scale=0.5)
    tau, repeats, small, large = 1.0, 40, 64, 4096
    exact, _ = AllPairSoftmax(tau).forward({}, q, k, v, gumbel)
    rng = np.random.default_rng(51)
    mse = {}
    for m in (small, large):
        errors = [
            KernelizedSoftmax(tau).forward({}, q, k, v, draw_projection(rng, m, 2, kind), gumbel)[0]
            - exact
            for _ in range(repeats)
        ]
        mse[m] = np.mean(np.square(errors))
    ratio = math.sqrt(mse[small] / mse[large])
    assert abs(math.log(ratio / math.sqrt(large / small))) <= 4 / math.sqrt(repeats), ratio


# -- the K-sample average, no noise, N = 1, tau -> 0 ----------------------------------------------


@given(setup=setups(), tau=st.sampled_from(TAUS), seed=seeds())
def test_k_sample_average_is_the_mean_of_single_sample_calls(
    setup: tuple, tau: float, seed: int
) -> None:
    q, k, v, omega, gumbel = setup
    if gumbel is None:
        gumbel = np.random.default_rng(seed).gumbel(size=(q.shape[0], 2))
    d_z = np.random.default_rng(seed).standard_normal(v.shape)
    for block, extra in ((AllPairSoftmax(tau), ()), (KernelizedSoftmax(tau), (omega,))):
        together = gradients(block, (q, k, v, *extra, gumbel), d_z)
        apart = [
            gradients(block, (q, k, v, *extra, gumbel[:, s : s + 1]), d_z)
            for s in range(gumbel.shape[1])
        ]
        mean = {name: np.mean([a[name] for a in apart], axis=0) for name in together}
        assert max(relative_errors(together, mean).values()) <= RTOL64


@given(setup=setups(), tau=st.sampled_from(TAUS), seed=seeds())
def test_zero_gumbel_noise_with_one_sample_is_the_plain_softmax(
    setup: tuple, tau: float, seed: int
) -> None:
    q, k, v, omega, _ = setup
    zeros = np.zeros((q.shape[0], 1))
    d_z = np.random.default_rng(seed).standard_normal(v.shape)
    for block, extra in ((AllPairSoftmax(tau), ()), (KernelizedSoftmax(tau), (omega,))):
        plain = gradients(block, (q, k, v, *extra, None), d_z)
        noisy = gradients(block, (q, k, v, *extra, zeros), d_z)
        for name in plain:  # bit for bit: the same operations on the same numbers
            np.testing.assert_array_equal(noisy[name], plain[name])


@pytest.mark.parametrize("samples", [0, 1, 3])
def test_one_node_attends_to_itself(samples: int) -> None:
    # N = 1: Z = V whatever the scores. AllPairSoftmax: each softmax is exactly 1, so d_Q and
    # d_K are exactly 0; Z and d_V are means of K equal terms (a few ulps for K = 3).
    q, k, v, omega, gumbel = make_setup(60, n=1, d=3, d_v=2, m=5, samples=samples, scale=2.0)
    d_z = np.array([[0.7, -1.3]])
    exact = gradients(AllPairSoftmax(0.5), (q, k, v, gumbel), d_z)
    ulps = 4 * np.finfo(np.float64).eps
    np.testing.assert_allclose(exact["z"], v, rtol=ulps, atol=0)
    np.testing.assert_allclose(exact["v"], d_z, rtol=ulps, atol=0)
    np.testing.assert_array_equal(exact["q"], 0.0)
    np.testing.assert_array_equal(exact["k"], 0.0)
    kernel = gradients(KernelizedSoftmax(0.5), (q, k, v, omega, gumbel), d_z)
    errors = relative_errors(kernel, {**exact, "q": 0 * q, "k": 0 * k})
    assert max(errors.values()) <= RTOL64, errors


def test_small_tau_gives_hard_samples_eq16() -> None:
    # tau -> 0: each sample's softmax is one-hot at argmax_v (q_u^T k_v + g_vs) (Eq. 16), with
    # g_vs one value per key shared by all queries; Z_u is the mean of the picked values.
    q, k, v, _, gumbel = make_setup(70, n=5, d=2, d_v=2, samples=3, scale=1.0)
    scores = (q @ k.T)[None] + gumbel.T[:, None, :]  # (K, N, N)
    top = np.sort(scores, axis=2)
    assert np.min(top[..., -1] - top[..., -2]) > 0.05  # no near-ties at this seed
    picked = v[np.argmax(scores, axis=2)]  # (K, N, d_v)
    z, _ = AllPairSoftmax(1e-3).forward({}, q, k, v, gumbel)
    np.testing.assert_allclose(z, picked.mean(axis=0), atol=1e-12)


# -- torch autograd -----------------------------------------------------------------------------


def torch_all_pair(torch: Any, q: Any, k: Any, v: Any, gumbel: Any, tau: float) -> Any:
    """Eq. 15 in torch: mean over samples of softmax((Q K^T + g_s^T) / tau) V."""
    g = torch.zeros(q.shape[0], 1, dtype=q.dtype) if gumbel is None else gumbel
    scores = ((q @ k.T)[None] + g.T[:, None, :]) / tau
    return (torch.softmax(scores, dim=-1) @ v).mean(0)


def torch_kernelized(
    torch: Any, q: Any, k: Any, v: Any, omega: Any, gumbel: Any, tau: float
) -> Any:
    """Eq. 7 / Alg. 1 in torch, phi of Eq. 4 and e^{g / tau} as printed (moderate inputs)."""

    def phi(x: Any) -> Any:
        return torch.exp(x @ omega.T - (x * x).sum(1, keepdim=True) / 2) / math.sqrt(len(omega))

    g = torch.zeros(q.shape[0], 1, dtype=q.dtype) if gumbel is None else gumbel
    phi_q, phi_k = phi(q / math.sqrt(tau)), phi(k / math.sqrt(tau))
    keys = torch.exp(g / tau).T[:, :, None] * phi_k[None]  # (K, N, m), Alg. 1 line 6
    numerators = phi_q @ (keys.transpose(1, 2) @ v)  # line 7-8
    denominators = phi_q @ keys.sum(1).T  # (N, K)
    return (numerators / denominators.T[:, :, None]).mean(0)


@given(setup=setups(), tau=st.sampled_from(TAUS), seed=seeds())
def test_torch_autograd_agrees(setup: tuple, tau: float, seed: int) -> None:
    torch = pytest.importorskip("torch")
    q, k, v, omega, gumbel = setup
    d_z = np.random.default_rng(seed).standard_normal(v.shape)
    tensors = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    t_gumbel = None if gumbel is None else torch.tensor(gumbel)
    cases = [
        (AllPairSoftmax(tau), (), lambda: torch_all_pair(torch, *tensors, t_gumbel, tau)),
        (
            KernelizedSoftmax(tau),
            (omega,),
            lambda: torch_kernelized(torch, *tensors, torch.tensor(omega), t_gumbel, tau),
        ),
    ]
    for block, extra, torch_forward in cases:
        ours = gradients(block, (q, k, v, *extra, gumbel), d_z)
        out = torch_forward()
        grads = torch.autograd.grad(out, tensors, torch.tensor(d_z))
        theirs = {
            "z": out.detach().numpy(),
            **{n: g.numpy() for n, g in zip("qkv", grads, strict=True)},
        }
        # widened: autograd multiplies e^{g/tau} by unshifted features, ours adds exponents
        assert max(relative_errors(ours, theirs).values()) <= 1e2 * RTOL64


# -- dtypes and backends ------------------------------------------------------------------------


@pytest.mark.parametrize("samples", [0, 3])
def test_float32_stays_float32_and_agrees_with_float64(samples: int) -> None:
    inputs = make_setup(80, n=5, d=3, d_v=2, m=8, samples=samples)
    inputs32 = tuple(None if a is None else a.astype(np.float32) for a in inputs)
    d_z = np.random.default_rng(0).standard_normal((5, 2))
    for block, drop in ((AllPairSoftmax(0.5), 3), (KernelizedSoftmax(0.5), None)):
        pick = [i for i in range(5) if i != drop]
        found64 = gradients(block, tuple(inputs[i] for i in pick), d_z)
        found32 = gradients(block, tuple(inputs32[i] for i in pick), d_z.astype(np.float32))
        assert all(a.dtype == np.float32 for a in found32.values())
        # widened: exponentials of d-term sums over tau, then ratios
        assert max(relative_errors(found32, found64).values()) <= 10 * RTOL32


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@given(setup=setups(), tau=st.sampled_from(TAUS), seed=seeds())
def test_device_backend_matches_numpy(backend: str, setup: tuple, tau: float, seed: int) -> None:
    q, k, v, omega, gumbel = setup
    d_z = np.random.default_rng(seed).standard_normal(v.shape)
    for block, extra in ((AllPairSoftmax(tau), ()), (KernelizedSoftmax(tau), (omega,))):
        inputs = (q, k, v, *extra, gumbel)
        host = gradients(block, inputs, d_z)
        device_inputs = tuple(None if a is None else asarray(a, backend=backend) for a in inputs)
        z_d, cache_d = block.forward({}, *device_inputs)
        assert backend_name(get_array_module(z_d)) == backend
        (d_q, d_k, d_v), _ = block.backward({}, cache_d, asarray(d_z, backend=backend))
        device = {n: to_numpy(a) for n, a in zip("zqkv", (z_d, d_q, d_k, d_v), strict=True)}
        assert max(relative_errors(device, host).values()) <= RTOL64


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: AllPairSoftmax(0.0), "tau must be a finite number > 0"),
        (lambda: AllPairSoftmax(-1.0), "tau must be a finite number > 0"),
        (lambda: KernelizedSoftmax(float("inf")), "tau must be a finite number > 0"),
        (lambda: KernelizedSoftmax(1.0, stabilize=1), "stabilize must be a bool"),
    ],
)
def test_bad_configuration(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def _replace(index: int, value: object) -> object:
    def mutate(inputs: tuple) -> tuple:
        inputs = list(inputs)
        inputs[index] = value
        return tuple(inputs)

    return mutate


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (_replace(0, np.ones((0, 3))), ValueError, "N >= 1 nodes"),
        (_replace(0, np.ones(3)), ValueError, r"q must have shape \(\*, \*\)"),
        (_replace(1, np.ones((4, 2))), ValueError, r"k must have shape \(4, 3\)"),
        (_replace(2, np.ones((3, 2))), ValueError, r"v must have shape \(4, \*\)"),
        (_replace(2, np.ones((4, 0))), ValueError, "d_v >= 1"),
        (_replace(3, np.ones((6, 2))), ValueError, r"omega has shape \(6, 2\) but must be"),
        (_replace(4, np.ones((2, 4))), ValueError, "pass gumbel.T"),
        (_replace(4, np.ones((3, 2))), ValueError, r"gumbel must have shape \(4, \*\)"),
        (_replace(4, np.ones((4, 0))), ValueError, "K >= 1 samples or None"),
        (_replace(1, np.full((4, 3), np.nan)), ValueError, "NaN or infinity"),
        (_replace(4, np.full((4, 2), np.inf)), ValueError, "NaN or infinity"),
        (_replace(2, np.ones((4, 2), np.float32)), TypeError, "v has dtype float32 but q"),
        (_replace(3, np.ones((6, 3), np.float32)), TypeError, "omega has dtype float32"),
        (_replace(4, np.ones((4, 2), np.float32)), TypeError, "gumbel has dtype float32"),
        (_replace(0, [[1.0, 2.0, 3.0]]), TypeError, "q must be an array"),
    ],
)
def test_bad_input_gives_a_clear_error(mutate: object, error: type, match: str) -> None:
    inputs = mutate(make_setup(90))
    with pytest.raises(error, match=match):
        KernelizedSoftmax().forward({}, *inputs)
    if "omega" not in match:
        q, k, v, _, gumbel = inputs
        with pytest.raises(error, match=match):
            AllPairSoftmax().forward({}, q, k, v, gumbel)


def test_bad_params_and_cotangent() -> None:
    q, k, v, omega, gumbel = make_setup(91)
    with pytest.raises(ValueError, match=r"unexpected \['omega'\]"):
        KernelizedSoftmax().forward({"omega": omega}, q, k, v, omega, gumbel)
    for block, extra in ((AllPairSoftmax(), ()), (KernelizedSoftmax(), (omega,))):
        _, cache = block.forward({}, q, k, v, *extra, gumbel)
        with pytest.raises(
            ValueError, match=r"d_z must be an array of the output's shape \(4, 2\)"
        ):
            block.backward({}, cache, np.ones((2, 4)))
        with pytest.raises(TypeError, match="d_z has dtype float32"):
            block.backward({}, cache, np.ones((4, 2), np.float32))
