"""PairNorm and LayerNorm: finite differences, naive loops, properties, edge cases, bad input.

Torch/PyG parity lives in ``test_norm_torch.py``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.nn.norms.layernorm import LayerNorm
from refimpl.nn.norms.pairnorm import PairNorm
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from tests.backends import DEVICE_BACKENDS

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
RTOL32 = FORWARD_RTOL[np.dtype(np.float32)]
EPS_PLACEMENTS = [None, True, False]

# -- strategies ------------------------------------------------------------------------------


@st.composite
def features(draw: st.DrawFn, max_nodes: int = 6, max_channels: int = 5) -> np.ndarray:
    """(N, C) float64 features: N = 1 and C = 1 included, a drawn magnitude and offset,
    and a drawn structure: a constant column, a zero row, or columns already centred.

    The magnitude spans the regimes where eps dominates the statistic (0.01 with
    eps up to 0.5) and where it is negligible (10).
    """
    shape = (draw(st.integers(1, max_nodes)), draw(st.integers(1, max_channels)))
    rng = np.random.default_rng(draw(seeds()))
    magnitude = draw(st.sampled_from([0.01, 0.3, 1.0, 10.0]))
    offset = draw(st.sampled_from([0.0, 1.0])) * rng.standard_normal(shape[1])
    x = magnitude * (rng.standard_normal(shape) + offset)
    structure = draw(st.sampled_from(["random", "constant column", "zero row", "centred"]))
    if structure == "constant column":  # centres to exactly 0 across the nodes
        x[:, draw(st.integers(0, shape[1] - 1))] = draw(st.sampled_from([0.0, 1.5, -0.75]))
    elif structure == "zero row":  # zero variance for LayerNorm "node", zero norm for PN-SCS
        x[draw(st.integers(0, shape[0] - 1))] = 0.0
    elif structure == "centred":
        x = x - x.mean(axis=0)
    return x


def pairnorms(modes: tuple[str, ...] = ("PN", "PN-SI", "PN-SCS")) -> st.SearchStrategy[PairNorm]:
    return st.builds(
        PairNorm,
        mode=st.sampled_from(modes),
        scale=st.sampled_from([1.0, 0.5, 3.0]),
        eps=st.sampled_from([1e-5, 1e-2, 0.5]),
        eps_inside_sqrt=st.sampled_from(EPS_PLACEMENTS),
    )


@st.composite
def layernorm_setups(draw: st.DrawFn) -> tuple[LayerNorm, dict, np.ndarray]:
    """A LayerNorm for the drawn features, random affine parameters, and the features."""
    x = draw(features())
    norm = LayerNorm(
        x.shape[1],
        mode=draw(st.sampled_from(["node", "graph"])),
        affine=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-5, 1e-2, 0.5])),
        eps_inside_sqrt=draw(st.sampled_from(EPS_PLACEMENTS)),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = {k: rng.standard_normal(v) for k, v in norm.param_shapes().items()}
    return norm, params, x


# -- deliberately naive versions: loops over nodes and channels, exact sums ------------------


def naive_pairnorm(norm: PairNorm, x: np.ndarray) -> np.ndarray:
    n, c = x.shape
    mean = [math.fsum(x[i, k] for i in range(n)) / n for k in range(c)]
    base = x.copy() if norm.mode == "PN-SCS" else x - np.array(mean)
    squared_norms = [math.fsum(base[i, k] ** 2 for k in range(c)) for i in range(n)]
    if norm.mode == "PN":
        squared_norms = [math.fsum(squared_norms) / n] * n
    out = np.empty_like(x)
    for i in range(n):
        q = squared_norms[i]
        denominator = math.sqrt(q + norm.eps) if norm.inside else math.sqrt(q) + norm.eps
        for k in range(c):
            out[i, k] = norm.scale * base[i, k] / denominator
            if norm.mode == "PN-SCS":
                out[i, k] -= mean[k]
    return out


def naive_layernorm(norm: LayerNorm, params: dict, x: np.ndarray) -> np.ndarray:
    n, c = x.shape
    if norm.mode == "node":
        groups = [[(i, k) for k in range(c)] for i in range(n)]
    else:
        groups = [[(i, k) for i in range(n) for k in range(c)]]
    out = np.empty_like(x)
    for group in groups:
        mu = math.fsum(x[i, k] for i, k in group) / len(group)
        var = math.fsum((x[i, k] - mu) ** 2 for i, k in group) / len(group)
        denominator = math.sqrt(var + norm.eps) if norm.inside else math.sqrt(var) + norm.eps
        for i, k in group:
            out[i, k] = (x[i, k] - mu) / denominator
            if norm.affine:
                out[i, k] = out[i, k] * params["weight"][k] + params["bias"][k]
    return out


def pairnorm_statistic_roots(norm: PairNorm, x: np.ndarray) -> np.ndarray:
    """sqrt of the statistic under the denominator, per row (independent of the block)."""
    base = x if norm.mode == "PN-SCS" else x - x.mean(axis=0)
    rows = np.sqrt((base**2).sum(axis=1))
    return np.full(len(x), np.sqrt(np.mean(rows**2))) if norm.mode == "PN" else rows


def layernorm_roots(norm: LayerNorm, x: np.ndarray) -> np.ndarray:
    return x.std(axis=1) if norm.mode == "node" else np.atleast_1d(x.std())


def assert_gradients_agree(
    actual: dict, expected: dict, block: object, params: dict, cache: tuple, d_out: np.ndarray
) -> None:
    """Two computations of the same gradients agree to rounding in the terms they sum.

    The terms are up to ``|d_out| |weight| / D`` (``s`` for PairNorm), and the result can be
    far smaller by cancellation: PN-SI with ``C = 1`` is ``s * sign(xc)`` up to eps, its
    ``d_x ~ s eps / D^2`` the difference of two terms ``~ s / D``, so it is not judged
    relative to itself.
    """
    weight = float(np.abs(params["weight"]).max()) if params else getattr(block, "scale", 1.0)
    terms = float(np.abs(d_out).max()) * max(1.0, weight / float(np.min(cache.denominator)))
    for name, value in expected.items():
        assert np.abs(actual[name] - value).max() <= RTOL64 * terms, name


# -- gradients against central differences ---------------------------------------------------


def fd_step(x: np.ndarray) -> float:
    """Central-difference step, relative to the size of x (floored for x = 0)."""
    return 1e-6 * max(float(np.abs(x).max()), 1e-2)


def smooth_at_step(roots: np.ndarray, block: object, step: float) -> bool:
    """Central differences with ``step`` are accurate to ~(step / r)^2 where r is the scale
    on which the denominator curves: the statistic's root, or sqrt(eps) when eps is inside
    the root. With eps outside, a zero root is a point where the block is differentiable
    but not twice (error ~ step / eps): that case has its own test at a smaller step."""
    floor = math.sqrt(block.eps) if block.inside else 0.0
    return bool(np.all(np.maximum(roots, floor) > 1e4 * step))


@given(norm=pairnorms(), x=features())
def test_pairnorm_backward_matches_central_differences(norm: PairNorm, x: np.ndarray) -> None:
    one_node = x.shape[0] == 1 and norm.mode != "PN-SCS"  # centres to 0 whatever the step
    step = fd_step(x)
    assume(one_node or smooth_at_step(pairnorm_statistic_roots(norm, x), norm, step))
    report = check_gradients(norm, {}, (x,), max_entries=None, eps=step)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=layernorm_setups())
def test_layernorm_backward_matches_central_differences(setup: tuple) -> None:
    norm, params, x = setup
    one_channel = norm.mode == "node" and x.shape[1] == 1  # centres to 0 whatever the step
    step = fd_step(x)
    assume(one_channel or smooth_at_step(layernorm_roots(norm, x), norm, step))
    report = check_gradients(norm, params, (x,), max_entries=None, eps=step)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("eps", [1e-5, 0.1])
@pytest.mark.parametrize("inside", [True, False])
@pytest.mark.parametrize(
    "block",
    [
        lambda eps, inside: PairNorm("PN", scale=2.0, eps=eps, eps_inside_sqrt=inside),
        lambda eps, inside: PairNorm("PN-SI", scale=2.0, eps=eps, eps_inside_sqrt=inside),
        lambda eps, inside: LayerNorm(3, "node", eps=eps, eps_inside_sqrt=inside),
        lambda eps, inside: LayerNorm(3, "graph", eps=eps, eps_inside_sqrt=inside),
    ],
)
def test_backward_at_zero_spread_matches_central_differences(
    block: object, eps: float, inside: bool
) -> None:
    # At x = 0 the statistic is 0. With eps outside the root out = xc / (||xc|| + eps)
    # is differentiable but not twice (the error of a central difference is ~step / eps),
    # so the step is 1e-12: the truncation error is <= 1e-7 and x + step is exact at 0.
    # The bias is 0 so that out = 0 at x = 0 and the weights' perturbations are exact.
    norm = block(eps, inside)
    params = norm.init_params(np.random.default_rng(0))
    if params:
        params["weight"] = np.array([0.5, -2.0, 1.5])
    report = check_gradients(norm, params, (np.zeros((4, 3)),), max_entries=None, eps=1e-12)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


class NumeratorOnly:
    """A wrong backward: the gradient through the numerator only, none through D."""

    def __init__(self, block: object, axis: int | None) -> None:
        self.block, self.axis = block, axis
        self.forward = block.forward

    def backward(self, params: dict, cache: tuple, d_out: np.ndarray) -> tuple:
        d = d_out * params["weight"] if params else self.block.scale * d_out
        d = d / cache.denominator
        _, d_params = self.block.backward(params, cache, d_out)
        return d - d.mean(axis=self.axis, keepdims=True), d_params


def test_gradient_check_catches_a_wrong_backward() -> None:
    # The checks must be able to fail: drop the gradient through the denominator.
    x = np.random.default_rng(3).standard_normal((4, 3))
    layer_params = {"weight": np.array([1.0, -2.0, 0.5]), "bias": np.zeros(3)}
    for broken, params in [
        (NumeratorOnly(PairNorm("PN-SI"), axis=0), {}),
        (NumeratorOnly(PairNorm("PN"), axis=0), {}),
        (NumeratorOnly(LayerNorm(3, "graph"), axis=None), layer_params),
        (NumeratorOnly(LayerNorm(3, "node"), axis=1), layer_params),
    ]:
        report = check_gradients(broken, params, (x,))
        assert report.by_name()["input[0]"].max_rel_error > 1e-2


# -- against the naive loops ---------------------------------------------------------------


@given(norm=pairnorms(), x=features())
def test_pairnorm_matches_naive_loops(norm: PairNorm, x: np.ndarray) -> None:
    out, _ = norm.forward({}, x)
    assert max_relative_error(out, naive_pairnorm(norm, x)) <= RTOL64


@given(setup=layernorm_setups())
def test_layernorm_matches_naive_loops(setup: tuple) -> None:
    norm, params, x = setup
    out, _ = norm.forward(params, x)
    assert max_relative_error(out, naive_layernorm(norm, params, x)) <= RTOL64


# -- properties ------------------------------------------------------------------------------


def _denominator(q: np.ndarray, eps: float, inside: bool) -> np.ndarray:
    return np.sqrt(q + eps) if inside else np.sqrt(q) + eps


@given(norm=pairnorms(), x=features())
def test_pairnorm_output_is_centred_with_the_prescribed_row_norms(
    norm: PairNorm, x: np.ndarray
) -> None:
    out, _ = norm.forward({}, x)
    roots = pairnorm_statistic_roots(norm, x)  # (N,) sqrt(q) per row
    # the scale reached, s * sqrt(q) / D, is s up to the eps effect
    reached = norm.scale * roots / _denominator(roots**2, norm.eps, norm.inside)
    tol = 1e-13 * norm.scale
    if norm.mode == "PN":
        # zero column means; mean squared row norm (s sqrt(q) / D)^2
        np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=tol)
        np.testing.assert_allclose(
            np.mean((out**2).sum(axis=1)), reached[0] ** 2, rtol=1e-13, atol=tol
        )
    elif norm.mode == "PN-SI":  # rows rescaled one by one: column means are not kept at 0
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), reached, rtol=1e-13, atol=tol)
    else:  # "PN-SCS": out + m has the prescribed row norms
        m = x.mean(axis=0)
        np.testing.assert_allclose(np.linalg.norm(out + m, axis=1), reached, rtol=1e-13, atol=tol)


@given(setup=layernorm_setups())
def test_layernorm_standardises_each_group(setup: tuple) -> None:
    norm, params, x = setup
    xhat, _ = replace(norm, affine=False).forward({}, x)
    axis = 1 if norm.mode == "node" else None
    roots = layernorm_roots(norm, x)
    denominators = _denominator(roots**2, norm.eps, norm.inside)  # (N,) or (1,)
    var_reached = (roots / denominators) ** 2  # 1 up to eps
    # The centring rounds relative to |x|, and the division scales that by 1 / D: a row
    # (1.2509, 1.2680) has D = 0.0085, so its mean came out -1.2e-14, not below 1e-14.
    magnitudes = np.abs(x).max(axis=1) if norm.mode == "node" else np.abs(x).max()
    centring = float(np.max(magnitudes / denominators))
    np.testing.assert_allclose(
        xhat.mean(axis=axis), 0.0, atol=1e-14 * max(1.0, np.abs(xhat).max(), centring)
    )
    np.testing.assert_allclose(xhat.var(axis=axis), var_reached, rtol=1e-10, atol=1e-14)
    out, cache = norm.forward(params, x)
    np.testing.assert_array_equal(cache.xhat, xhat)
    if norm.affine:
        np.testing.assert_array_equal(out, xhat * params["weight"] + params["bias"])


@given(norm=pairnorms(("PN", "PN-SI")), x=features(), seed=seeds())
def test_pairnorm_ignores_a_shift_of_all_nodes(norm: PairNorm, x: np.ndarray, seed: int) -> None:
    # PN-SCS is left out: it subtracts the mean after scaling: not shift invariant
    shift = np.random.default_rng(seed).standard_normal(x.shape[1])
    out, cache = norm.forward({}, x)
    shifted, _ = norm.forward({}, x + shift)
    # The centring rounds relative to |x + shift|; the output divides that by D.
    tol = 1e-14 * norm.scale * (1 + np.abs(x + shift).max() / cache.denominator.min())
    assert np.abs(shifted - out).max() <= tol


@pytest.mark.parametrize("power", [-3, 5])
@given(x=features(), norm=pairnorms(("PN", "PN-SI")))
def test_rescaling_x_and_eps_together_changes_nothing_exactly(
    x: np.ndarray, norm: PairNorm, power: int
) -> None:
    # sqrt(a^2 q + a^2 eps) = a sqrt(q + eps) and sqrt(a^2 q) + a eps = a (sqrt(q) + eps) hold
    # in floating point for a = 2^k: every operation is exact up to the power of two.
    # PN-SCS is left out: its "- m" term scales with x
    a = 2.0**power
    blocks = [(norm, {})]
    for mode in ("node", "graph"):
        layer = LayerNorm(x.shape[1], mode, eps=norm.eps, eps_inside_sqrt=norm.eps_inside_sqrt)
        blocks.append(
            (layer, {"weight": np.linspace(-1, 2, x.shape[1]), "bias": np.ones(x.shape[1])})
        )
    for block, params in blocks:
        rescaled = replace(block, eps=block.eps * (a * a if block.inside else a))
        out, cache = block.forward(params, x)
        out_a, cache_a = rescaled.forward(params, a * x)
        np.testing.assert_array_equal(out_a, out)
        d_out = np.random.default_rng(0).standard_normal(out.shape)
        d_x, _ = block.backward(params, cache, d_out)
        d_x_a, _ = rescaled.backward(params, cache_a, d_out)
        np.testing.assert_array_equal(d_x_a * a, d_x)


@given(norm=pairnorms(), setup=layernorm_setups(), seed=seeds())
def test_permuting_nodes_permutes_outputs_and_gradients(
    norm: PairNorm, setup: tuple, seed: int
) -> None:
    layer, params, x = setup
    perm = np.random.default_rng(seed).permutation(x.shape[0])
    d_out = np.random.default_rng(seed).standard_normal(x.shape)
    for block, p in [(norm, {}), (layer, params)]:
        out, cache = block.forward(p, x)
        out_p, cache_p = block.forward(p, x[perm])
        assert max_relative_error(out_p, out[perm]) <= RTOL64
        d_x, d_params = block.backward(p, cache, d_out)
        d_x_p, d_params_p = block.backward(p, cache_p, d_out[perm])
        assert_gradients_agree(
            {**d_params_p, "x": d_x_p}, {**d_params, "x": d_x[perm]}, block, p, cache, d_out
        )


def invariance_axes(block: object) -> tuple[int | None, int | None]:
    """Axes over which a shift, and (with eps = 0) a rescaling, leave the output unchanged."""
    if isinstance(block, PairNorm):
        return 0, None  # add a row vector to every node; rescale all of x
    return (1, 1) if block.mode == "node" else (None, None)


@given(norm=pairnorms(("PN", "PN-SI")), setup=layernorm_setups(), seed=seeds())
def test_input_gradient_is_orthogonal_to_the_invariances(
    norm: PairNorm, setup: tuple, seed: int
) -> None:
    # The output ignores a shift of each centring group, so d_x sums to 0 over it; with
    # eps = 0 it also ignores a rescaling, so <d_x, x> = 0 over it (Euler's theorem).
    layer, params, x = setup
    # PN-SCS is left out: it has neither invariance
    d_out = np.random.default_rng(seed).standard_normal(x.shape)
    for block, p in [(norm, {}), (layer, params)]:
        shift_axis, scale_axis = invariance_axes(block)
        for eps in (block.eps, 0.0):
            block = replace(block, eps=eps)
            if eps == 0 and _roots(block, x).min() <= 1e-3 * np.abs(x).max():
                continue  # eps = 0 refuses zero spread, and near it d_x is huge
            _, cache = block.forward(p, x)
            d_x, _ = block.backward(p, cache, d_out)
            # rounding of sums whose terms are up to |d_out| |weight| / D (times |x| for the
            # inner product): d_x itself can vanish (C = 2, eps = 0: xhat is +-1 whatever x)
            weight = np.abs(p["weight"]).max() if p else getattr(block, "scale", 1.0)
            tol = 1e-14 * x.size * np.abs(d_out).max() * weight / cache.denominator.min()
            np.testing.assert_allclose(d_x.sum(axis=shift_axis), 0.0, atol=tol)
            if eps == 0:
                inner = (d_x * x).sum(axis=scale_axis)
                np.testing.assert_allclose(inner, 0.0, atol=tol * np.abs(x).max())


def _roots(block: object, x: np.ndarray) -> np.ndarray:
    if isinstance(block, PairNorm):
        return pairnorm_statistic_roots(block, x)
    return layernorm_roots(block, x)


# -- named edge cases: N = 1, C = 1, zero spread, already centred, eps = 0 ---------------------


@pytest.mark.parametrize("mode", ["PN", "PN-SI"])
@pytest.mark.parametrize("inside", EPS_PLACEMENTS)
def test_pairnorm_of_one_node_is_zero_with_zero_gradient(mode: str, inside: bool | None) -> None:
    norm = PairNorm(mode, scale=2.0, eps_inside_sqrt=inside)
    x = np.array([[0.3, -1.7, 2.9]])
    out, cache = norm.forward({}, x)
    np.testing.assert_array_equal(out, np.zeros((1, 3)))
    d_x, d_params = norm.backward({}, cache, np.array([[1.0, -2.0, 0.5]]))
    np.testing.assert_array_equal(d_x, np.zeros((1, 3)))
    assert d_params == {}


def test_pairnorm_scs_of_one_node_is_scaled_row_minus_itself() -> None:
    x = np.array([[3.0, 4.0]])  # norm 5
    out, _ = PairNorm("PN-SCS", scale=2.0, eps=11.0).forward({}, x)  # sqrt(11 + 25) = 6
    np.testing.assert_array_equal(out, 2.0 * x / 6.0 - x)


@pytest.mark.parametrize("inside", EPS_PLACEMENTS)
def test_layernorm_node_of_one_channel_outputs_the_bias(inside: bool | None) -> None:
    norm = LayerNorm(1, "node", eps_inside_sqrt=inside)
    params = {"weight": np.array([2.5]), "bias": np.array([-0.75])}
    x = np.array([[1.3], [-4.1], [0.2]])
    out, cache = norm.forward(params, x)
    np.testing.assert_array_equal(out, np.full((3, 1), -0.75))
    d_out = np.array([[1.0], [2.0], [-4.0]])
    d_x, d_params = norm.backward(params, cache, d_out)
    np.testing.assert_array_equal(d_x, np.zeros((3, 1)))
    np.testing.assert_array_equal(d_params["weight"], [0.0])
    np.testing.assert_array_equal(d_params["bias"], [-1.0])


# Dyadic constants: their means are computed exactly, so the centred input is exactly 0.
@pytest.mark.parametrize("value", [0.0, 3.0, -1.25])
@pytest.mark.parametrize("inside", [True, False])
def test_zero_spread_gives_exact_output_and_the_limit_gradient(value: float, inside: bool) -> None:
    eps = 1e-5
    d_out = np.random.default_rng(0).standard_normal((4, 3))
    denominator = np.sqrt(eps) if inside else eps  # D at zero statistic
    weight, bias = np.array([0.5, -2.0, 1.5]), np.array([0.25, 1.0, -3.0])
    cases = [
        # all rows equal: PairNorm's column centring leaves 0
        (PairNorm("PN", 2.0, eps, inside), {}, np.tile([value, 1.5, -0.5], (4, 1)), 0),
        (PairNorm("PN-SI", 2.0, eps, inside), {}, np.tile([value, 1.5, -0.5], (4, 1)), 0),
        # constant rows: each node's features centre to 0
        (
            LayerNorm(3, "node", eps=eps, eps_inside_sqrt=inside),
            {"weight": weight, "bias": bias},
            np.array([[value] * 3, [2.0] * 3, [-0.5] * 3, [value] * 3]),
            1,
        ),
        # one constant: the whole graph centres to 0
        (
            LayerNorm(3, "graph", eps=eps, eps_inside_sqrt=inside),
            {"weight": weight, "bias": bias},
            np.full((4, 3), value),
            None,
        ),
    ]
    for block, params, x, axis in cases:
        out, cache = block.forward(params, x)
        np.testing.assert_array_equal(out, np.tile(bias, (4, 1)) if params else np.zeros((4, 3)))
        # out = s * P x / D near zero spread: the gradient is s * P(d_out) / D (P centres)
        d_x, d_params = block.backward(params, cache, d_out)
        g = d_out * weight if params else block.scale * d_out
        expected = (g - g.mean(axis=axis, keepdims=True)) / denominator
        np.testing.assert_allclose(d_x, expected, rtol=1e-14, atol=1e-14 * np.abs(expected).max())
        if params:
            np.testing.assert_array_equal(d_params["weight"], np.zeros(3))
            np.testing.assert_array_equal(d_params["bias"], d_out.sum(axis=0))


def test_pairnorm_si_row_at_the_mean_outputs_zero() -> None:
    a = np.array([1.5, -2.0, 0.75])
    x = np.stack([a, -a, np.zeros(3), 2 * a, -2 * a])  # column means exactly 0
    for inside in (True, False):
        norm = PairNorm("PN-SI", eps_inside_sqrt=inside)
        out, cache = norm.forward({}, x)
        np.testing.assert_array_equal(out[2], np.zeros(3))
        assert np.all(np.isfinite(norm.backward({}, cache, np.ones((5, 3)))[0]))


def test_already_centred_input_is_only_scaled() -> None:
    # Integer rows with exactly zero column sums (PairNorm) and zero row sums (LayerNorm node):
    # the centring changes nothing, so out = s x / D with D from x directly.
    rng = np.random.default_rng(5)
    block = rng.integers(-4, 5, size=(3, 2)).astype(float)
    x = np.vstack([block, -block.sum(axis=0)])  # (4, 2), column sums 0
    out, _ = PairNorm("PN", scale=1.5).forward({}, x)
    expected = 1.5 * x / np.sqrt(1e-5 + np.mean((x**2).sum(axis=1)))
    np.testing.assert_allclose(out, expected, rtol=1e-15)
    rows = np.hstack([block, -block.sum(axis=1, keepdims=True)])  # (3, 3), row sums 0
    out, _ = LayerNorm(3, "node", affine=False).forward({}, rows)
    np.testing.assert_allclose(
        out, rows / np.sqrt((rows**2).mean(axis=1, keepdims=True) + 1e-5), rtol=1e-15
    )


def test_eps_zero_reaches_the_scale_exactly_and_refuses_zero_spread() -> None:
    x = np.random.default_rng(2).standard_normal((5, 3))
    out, _ = PairNorm("PN", scale=2.0, eps=0.0).forward({}, x)
    np.testing.assert_allclose(np.mean((out**2).sum(axis=1)), 4.0, rtol=1e-14)
    out, _ = PairNorm("PN-SI", scale=2.0, eps=0.0).forward({}, x)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 2.0, rtol=1e-14)
    out, _ = LayerNorm(3, "graph", affine=False, eps=0.0).forward({}, x)
    np.testing.assert_allclose(out.std(), 1.0, rtol=1e-14)
    equal_rows = np.tile([1.0, 2.0, 3.0], (5, 1))
    one_zero_row = np.vstack([x[:4], np.zeros((1, 3))])
    one_constant_row = np.vstack([x[:4], np.full((1, 3), 0.5)])
    for block, bad, match in [
        (PairNorm("PN", eps=0.0), equal_rows, "all rows of x are equal"),
        (PairNorm("PN-SI", eps=0.0), equal_rows, "equals the column mean"),
        (PairNorm("PN-SCS", eps=0.0), one_zero_row, "some row of x is zero"),
        (LayerNorm(3, "node", affine=False, eps=0.0), one_constant_row, "some row of x is const"),
        (LayerNorm(3, "graph", affine=False, eps=0.0), np.full((5, 3), 2.0), "all entries of x"),
    ]:
        with pytest.raises(ValueError, match=match):
            block.forward({}, bad)
        with pytest.raises(ValueError, match=match):  # the check runs on a device array too
            block.forward({}, asarray(bad, backend="strict"))


@pytest.mark.parametrize(
    ("block", "x", "expected"),
    [
        # Worked by hand, with eps chosen so that only the stated placement gives the value.
        # PyG PairNorm "PN": q = 1, sqrt(1 + 0.5625) = 1.25 (outside would be 1.5625)
        (PairNorm("PN", eps=0.5625), [[1.0, 0.0], [-1.0, 0.0]], [[0.8, 0.0], [-0.8, 0.0]]),
        # PyG "PN-SI": ||xc_i|| = 5, 5 + 1 = 6 (inside would be sqrt(26))
        (PairNorm("PN-SI", eps=1.0), [[3.0, 4.0], [-3.0, -4.0]], [[0.5, 2 / 3], [-0.5, -2 / 3]]),
        # authors' "PN-SCS": m = 0, sqrt(25 + 11) = 6 (outside would be 16)
        (PairNorm("PN-SCS", eps=11.0), [[3.0, 4.0], [-3.0, -4.0]], [[0.5, 2 / 3], [-0.5, -2 / 3]]),
        # torch / PyG "node": var = 1, sqrt(1 + 0.5625) = 1.25
        (LayerNorm(2, "node", affine=False, eps=0.5625), [[1.0, 3.0]], [[-0.8, 0.8]]),
        # PyG "graph" without a batch vector: std = 1, 1 + 0.25 = 1.25
        (LayerNorm(2, "graph", affine=False, eps=0.25), [[1.0, 3.0]], [[-0.8, 0.8]]),
        # PyG "graph" with a batch vector: sqrt(1 + 0.5625) = 1.25
        (
            LayerNorm(2, "graph", affine=False, eps=0.5625, eps_inside_sqrt=True),
            [[1.0, 3.0]],
            [[-0.8, 0.8]],
        ),
    ],
)
def test_default_eps_placement_follows_pyg(block: object, x: list, expected: list) -> None:
    out, _ = block.forward({}, np.array(x))
    np.testing.assert_allclose(out, expected, rtol=1e-15)


# -- dtype and backend -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["PN", "PN-SI", "PN-SCS", "node", "graph"])
@pytest.mark.parametrize("inside", EPS_PLACEMENTS)
def test_float32_stays_float32_and_agrees_with_float64(mode: str, inside: bool | None) -> None:
    block = (
        PairNorm(mode, eps_inside_sqrt=inside)
        if mode.startswith("PN")
        else LayerNorm(3, mode, eps_inside_sqrt=inside)
    )
    rng = np.random.default_rng(4)
    params = {k: rng.standard_normal(v) for k, v in block.param_shapes().items()}
    x, d_out = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    out64, cache64 = block.forward(params, x)
    d_x64, d_params64 = block.backward(params, cache64, d_out)
    params32 = {k: v.astype(np.float32) for k, v in params.items()}
    out, cache = block.forward(params32, x.astype(np.float32))
    d_x, d_params = block.backward(params32, cache, d_out.astype(np.float32))
    assert out.dtype == d_x.dtype == np.float32
    assert all(v.dtype == np.float32 for v in d_params.values())
    assert all(v.dtype == np.float32 for v in cache)
    assert max_relative_error(out, out64) <= RTOL32
    errors = relative_errors({**d_params, "x": d_x}, {**d_params64, "x": d_x64})
    assert max(errors.values()) <= 10 * RTOL32, errors  # the backward chains ~10 roundings


def test_init_params() -> None:
    assert PairNorm().init_params(np.random.default_rng(0)) == {}
    assert PairNorm().param_shapes() == {}
    params = LayerNorm(4, "graph").init_params(np.random.default_rng(0), dtype=np.float32)
    np.testing.assert_array_equal(params["weight"], np.ones(4, dtype=np.float32))
    np.testing.assert_array_equal(params["bias"], np.zeros(4, dtype=np.float32))
    assert params["weight"].dtype == np.float32
    assert LayerNorm(4, "node", affine=False).init_params(np.random.default_rng(0)) == {}


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@given(norm=pairnorms(), setup=layernorm_setups(), seed=seeds())
def test_device_backend_matches_numpy(
    backend: str, norm: PairNorm, setup: tuple, seed: int
) -> None:
    # The strict stand-in refuses stray NumPy calls in the math; CuPy runs it on a GPU.
    layer, params, x = setup
    d_out = np.random.default_rng(seed).standard_normal(x.shape)
    for block, p in [(norm, {}), (layer, params)]:
        out, cache = block.forward(p, x)
        d_x, d_params = block.backward(p, cache, d_out)
        device_params = {k: asarray(v, backend=backend) for k, v in p.items()}
        out_d, cache_d = block.forward(device_params, asarray(x, backend=backend))
        assert backend_name(get_array_module(out_d)) == backend
        d_x_d, d_params_d = block.backward(device_params, cache_d, asarray(d_out, backend=backend))
        assert max_relative_error(to_numpy(out_d), out) <= RTOL64
        d_device = {k: to_numpy(v) for k, v in {**d_params_d, "x": d_x_d}.items()}
        assert_gradients_agree(d_device, {**d_params, "x": d_x}, block, p, cache, d_out)


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (np.ones(3), ValueError, r"x must have shape \(\*, \*\)"),
        (np.ones((2, 3, 1)), ValueError, r"x must have shape \(\*, \*\)"),
        (np.ones((0, 3)), ValueError, "at least one row"),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), ValueError, "NaN or infinity"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), ValueError, "NaN or infinity"),
        (np.ones((2, 3), dtype=np.int64), TypeError, "floating-point"),
        ([[1.0, 2.0]], TypeError, "x must be an array"),
    ],
)
def test_pairnorm_bad_input(x: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PairNorm().forward({}, x)


def test_pairnorm_refuses_parameters() -> None:
    with pytest.raises(ValueError, match=r"unexpected \['weight'\]"):
        PairNorm().forward({"weight": np.ones(3)}, np.ones((2, 3)))


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda p, x: (p, np.ones((4, 5))), ValueError, r"x must have shape \(\*, 3\)"),
        (lambda p, x: (p, np.ones(3)), ValueError, "x must have shape"),
        (lambda p, x: (p, np.ones((0, 3))), ValueError, "at least one row"),
        (lambda p, x: (p, np.full((4, 3), np.nan)), ValueError, "NaN or infinity"),
        (lambda p, x: (p, x.astype(np.float32)), TypeError, "x has dtype float32 but params"),
        (lambda p, x: ({"weight": p["weight"]}, x), ValueError, r"missing \['bias'\]"),
        (lambda p, x: ({**p, "weight": np.ones(4)}, x), ValueError, r"params\['weight'\] must"),
        (lambda p, x: ({**p, "bias": np.full(3, np.inf)}, x), ValueError, "NaN or infinity"),
    ],
)
def test_layernorm_bad_input(mutate: object, error: type, match: str) -> None:
    norm = LayerNorm(3, "graph")
    params, x = mutate(norm.init_params(np.random.default_rng(0)), np.ones((4, 3)))
    with pytest.raises(error, match=match):
        norm.forward(params, x)


@pytest.mark.parametrize("block", [PairNorm("PN-SI"), LayerNorm(3, "node")])
def test_bad_upstream_gradient(block: object) -> None:
    params = block.init_params(np.random.default_rng(0))
    _, cache = block.forward(params, np.random.default_rng(1).standard_normal((4, 3)))
    with pytest.raises(ValueError, match=r"d_out must be an array of the output's shape \(4, 3\)"):
        block.backward(params, cache, np.ones((3, 4)))
    with pytest.raises(TypeError, match="d_out has dtype float32"):
        block.backward(params, cache, np.ones((4, 3), dtype=np.float32))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: PairNorm("PN-S"), "PairNorm mode must be one of 'PN', 'PN-SI', 'PN-SCS'"),
        (lambda: PairNorm("pn"), "PairNorm mode must be one of"),
        (lambda: PairNorm(scale=-1.0), "scale must be a finite number > 0"),
        (lambda: PairNorm(scale=0.0), "scale must be a finite number > 0"),
        (lambda: PairNorm(scale=float("inf")), "scale must be a finite number > 0"),
        (lambda: PairNorm(eps=-1e-5), "eps must be a finite number >= 0"),
        (lambda: PairNorm(eps=float("nan")), "eps must be a finite number >= 0"),
        (lambda: PairNorm(eps_inside_sqrt="yes"), "eps_inside_sqrt must be None, True or False"),
        (lambda: LayerNorm(3, "nodes"), "LayerNorm mode must be 'node' or 'graph'"),
        (lambda: LayerNorm(0, "node"), "channels must be a positive int"),
        (lambda: LayerNorm(2.0, "node"), "channels must be a positive int"),
        (lambda: LayerNorm(3, "node", eps=-1.0), "eps must be a finite number >= 0"),
        (lambda: LayerNorm(3, "graph", eps_inside_sqrt=1), "eps_inside_sqrt must be None"),
    ],
)
def test_bad_configuration(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_layernorm_mode_must_be_chosen() -> None:
    # torch.nn.LayerNorm normalises per node, PyG's LayerNorm per graph: no silent default.
    with pytest.raises(TypeError, match="mode"):
        LayerNorm(3)
