"""Tests for refimpl.ops.linear: against loops and finite differences; init, backends, errors."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import asarray, to_numpy
from refimpl.ops import linear
from refimpl.ops.linear import Linear, affine_maps, affine_maps_backward
from refimpl.testing import FORWARD_RTOL, GRADCHECK_RTOL, check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from tests.backends import DEVICE_BACKENDS

F64 = FORWARD_RTOL[np.dtype(np.float64)]


def make_case(n: int, fan_in: int, fan_out: int, bias: bool, seed: int, dtype=np.float64):
    rng = np.random.default_rng(seed)
    layer = Linear(fan_in, fan_out, bias)
    params = layer.init_params(rng, dtype=dtype)
    if bias:  # init gives b = 0; a random b makes the forward's bias term visible
        params["b"] = rng.standard_normal(fan_out).astype(dtype)
    x = rng.standard_normal((n, fan_in)).astype(dtype)
    d_y = rng.standard_normal((n, fan_out)).astype(dtype)
    return layer, params, x, d_y


def naive_linear(x, weight, bias):
    """Forward and backward by explicit sums over indices (bias may be None)."""
    n, fan_in = x.shape
    fan_out = weight.shape[0]
    y = np.array(
        [
            [
                sum(x[i, k] * weight[j, k] for k in range(fan_in))
                + (0 if bias is None else bias[j])
                for j in range(fan_out)
            ]
            for i in range(n)
        ]
    ).reshape(n, fan_out)

    def backward(d_y):
        d_x = np.array(
            [
                [sum(d_y[i, j] * weight[j, k] for j in range(fan_out)) for k in range(fan_in)]
                for i in range(n)
            ]
        ).reshape(n, fan_in)
        d_w = np.array(
            [
                [sum(d_y[i, j] * x[i, k] for i in range(n)) for k in range(fan_in)]
                for j in range(fan_out)
            ]
        ).reshape(fan_out, fan_in)
        d_b = np.array([sum(d_y[i, j] for i in range(n)) for j in range(fan_out)])
        return d_x, d_w, d_b

    return y, backward


sizes = st.tuples(st.integers(0, 6), st.integers(1, 5), st.integers(1, 5), st.booleans())


@given(sizes, seeds())
def test_gradients_match_finite_differences(size, seed):
    layer, params, x, _ = make_case(*size, seed)
    report = check_gradients(layer, params, (x,), rng=np.random.default_rng(seed))
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(sizes, seeds())
def test_matches_naive_loops_and_leaves_inputs_untouched(size, seed):
    layer, params, x, d_y = make_case(*size, seed)
    copies = {"x": x.copy(), "d_y": d_y.copy(), **{k: v.copy() for k, v in params.items()}}
    y, cache = layer.forward(params, x)
    d_x, d_params = layer.backward(params, cache, d_y)

    y_naive, naive_backward = naive_linear(x, params["W"], params.get("b"))
    d_x_naive, d_w_naive, d_b_naive = naive_backward(d_y)
    assert max_relative_error(y, y_naive) <= F64
    assert max_relative_error(d_x, d_x_naive) <= F64
    assert max_relative_error(d_params["W"], d_w_naive) <= F64
    assert set(d_params) == set(params)
    if layer.bias:
        assert max_relative_error(d_params["b"], d_b_naive) <= F64
    for name, value in {"x": x, "d_y": d_y, **params}.items():
        np.testing.assert_array_equal(value, copies[name], err_msg=f"{name} was mutated")


def test_empty_batch_gives_empty_output_and_zero_weight_gradient():
    layer, params, x, d_y = make_case(0, 3, 2, True, seed=1)
    y, cache = layer.forward(params, x)
    d_x, d_params = layer.backward(params, cache, d_y)
    assert y.shape == (0, 2) and d_x.shape == (0, 3)
    np.testing.assert_array_equal(d_params["W"], np.zeros((2, 3)))
    np.testing.assert_array_equal(d_params["b"], np.zeros(2))


def test_float32_stays_float32():
    layer, params, x, d_y = make_case(4, 3, 2, True, seed=2, dtype=np.float32)
    y, cache = layer.forward(params, x)
    d_x, d_params = layer.backward(params, cache, d_y)
    assert y.dtype == d_x.dtype == d_params["W"].dtype == d_params["b"].dtype == np.float32
    y64, _ = naive_linear(*(a.astype(np.float64) for a in (x, params["W"], params["b"])))
    assert max_relative_error(y, y64) <= FORWARD_RTOL[np.dtype(np.float32)]


def test_init_params_is_glorot_uniform_with_zero_bias():
    fan_in, fan_out = 300, 200
    params = Linear(fan_in, fan_out).init_params(np.random.default_rng(3))
    weight, bound = params["W"], math.sqrt(6 / (fan_in + fan_out))
    assert weight.shape == (fan_out, fan_in) and weight.dtype == np.float64
    np.testing.assert_array_equal(params["b"], np.zeros(fan_out))
    assert np.abs(weight).max() <= bound
    # 60000 draws: P(max |W| < 0.99 bound) = 0.99^60000, never.
    assert np.abs(weight).max() >= 0.99 * bound
    # E[W^2] = bound^2 / 3 (Glorot's 2 / (in + out)); Var[W^2] = 4 bound^4 / 45.
    sigma = math.sqrt(4 * bound**4 / 45 / weight.size)
    assert abs(np.mean(weight**2) - bound**2 / 3) <= 5 * sigma
    again = Linear(fan_in, fan_out).init_params(np.random.default_rng(3))
    np.testing.assert_array_equal(weight, again["W"])
    assert "b" not in Linear(2, 3, bias=False).init_params(np.random.default_rng(0))


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_init_params_on_backend_draws_the_same_numbers(backend):
    host = Linear(4, 3).init_params(np.random.default_rng(5), dtype=np.float32)
    device = Linear(4, 3).init_params(np.random.default_rng(5), backend=backend, dtype=np.float32)
    for name in host:
        assert device[name].dtype == np.float32
        np.testing.assert_array_equal(to_numpy(device[name]), host[name])


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("bias", [True, False])
def test_backend_matches_numpy(backend, bias):
    layer, params, x, d_y = make_case(5, 4, 3, bias, seed=6)
    y, cache = layer.forward(params, x)
    d_x, d_params = layer.backward(params, cache, d_y)

    on = {k: asarray(v, backend=backend) for k, v in params.items()}
    y_b, cache_b = layer.forward(on, asarray(x, backend=backend))
    d_x_b, d_params_b = layer.backward(on, cache_b, asarray(d_y, backend=backend))
    assert max_relative_error(to_numpy(y_b), y) <= F64
    assert max_relative_error(to_numpy(d_x_b), d_x) <= F64
    for name in params:
        assert max_relative_error(to_numpy(d_params_b[name]), d_params[name]) <= F64


def _bad_forward(case: str):
    layer, params, x, _ = make_case(3, 4, 2, True, seed=7)
    if case == "x_1d":
        return layer, params, x[0]
    if case == "x_wrong_width":
        return layer, params, x[:, :3]
    if case == "x_float32":
        return layer, params, x.astype(np.float32)
    if case == "x_int":
        return layer, params, x.astype(np.int64)
    if case == "x_list":
        return layer, params, x.tolist()
    if case == "x_nan":
        x[1, 2] = np.nan
        return layer, params, x
    if case == "W_inf":
        params["W"][0, 0] = np.inf
        return layer, params, x
    if case == "W_transposed":
        return layer, {**params, "W": params["W"].T.copy()}, x
    if case == "b_missing":
        return layer, {"W": params["W"]}, x
    if case == "b_unexpected":
        return Linear(4, 2, bias=False), params, x
    if case == "b_float32":
        return layer, {**params, "b": params["b"].astype(np.float32)}, x
    if case == "mixed_backends":
        return layer, params, asarray(x, backend="strict")
    raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("x_1d", ValueError, r"x must have shape \(\*, 4\)"),
        ("x_wrong_width", ValueError, r"x must have shape \(\*, 4\), got"),
        ("x_float32", TypeError, r"x has dtype float32 but params\['W'\] has dtype float64"),
        ("x_int", TypeError, r"x must be a floating-point array.*astype"),
        ("x_list", TypeError, r"x must be an array.*refimpl.backend.asarray"),
        ("x_nan", ValueError, r"x contains NaN or infinity"),
        ("W_inf", ValueError, r"params\['W'\] contains NaN or infinity"),
        ("W_transposed", ValueError, r"params\['W'\] must have shape \(2, 4\), got \(4, 2\)"),
        ("b_missing", ValueError, r"missing \['b'\]"),
        ("b_unexpected", ValueError, r"unexpected \['b'\]"),
        ("b_float32", TypeError, r"has dtype float64 but params\['b'\] has dtype float32"),
        ("mixed_backends", TypeError, r"different backends"),
    ],
)
def test_forward_rejects_bad_input_with_a_fix(case, error, message):
    layer, params, x = _bad_forward(case)
    with pytest.raises(error, match=message):
        layer.forward(params, x)


def test_backward_rejects_bad_cotangent():
    layer, params, x, d_y = make_case(3, 4, 2, True, seed=8)
    _, cache = layer.forward(params, x)
    with pytest.raises(ValueError, match=r"d_y must be an array of the output's shape \(3, 2\)"):
        layer.backward(params, cache, d_y.T)
    with pytest.raises(TypeError, match=r"d_y has dtype float32 but the forward ran in float64"):
        layer.backward(params, cache, d_y.astype(np.float32))


@pytest.mark.parametrize("config", [(0, 3), (3, -1), (2.0, 3), (True, 3)])
def test_config_rejects_non_positive_int_sizes(config):
    with pytest.raises(ValueError, match=r"must be a positive int"):
        Linear(*config)


def test_backward_without_input_grad_skips_only_d_x() -> None:
    rng = np.random.default_rng(0)
    layer = Linear(4, 3)
    params = layer.init_params(rng)
    y, cache = layer.forward(params, rng.standard_normal((5, 4)))
    d_y = rng.standard_normal(y.shape)
    d_x, full = layer.backward(params, cache, d_y)
    skipped, partial = layer.backward(params, cache, d_y, input_grad=False)
    assert d_x.shape == (5, 4) and skipped is None
    for name in full:
        np.testing.assert_array_equal(partial[name], full[name])


# -- several maps at once, in row blocks (affine_maps, as the attention layers use them) --------


@contextlib.contextmanager
def row_block(size: int) -> Iterator[None]:
    """Run the affine maps in blocks of ``size`` rows (the host default is 4096)."""
    saved, linear.ROW_BLOCK = linear.ROW_BLOCK, size
    try:
        yield
    finally:
        linear.ROW_BLOCK = saved


def make_maps(n: int, fan_in: int, widths: list[int], seed: int, dtype=np.float64):
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal((w, fan_in)).astype(dtype) for w in widths]
    biases = [rng.standard_normal(w).astype(dtype) for w in widths]
    x = rng.standard_normal((n, fan_in)).astype(dtype)
    d_ys = [rng.standard_normal((n, w)).astype(dtype) for w in widths]
    return x, weights, biases, d_ys


@given(
    n=st.integers(0, 9),
    fan_in=st.integers(1, 4),
    widths=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    bias=st.booleans(),
    block=st.integers(1, 4),
    seed=seeds(),
)
def test_several_maps_in_row_blocks_match_the_naive_loops(n, fan_in, widths, bias, block, seed):
    # Each map alone is the naive loop; d_x sums the maps' terms; d_W, d_b are each map's.
    x, weights, biases, d_ys = make_maps(n, fan_in, widths, seed)
    with row_block(block):
        outputs = affine_maps(x, weights, biases if bias else None)
        d_x, d_weights, d_biases = affine_maps_backward(x, weights, d_ys, bias)
    expected_d_x = np.zeros_like(x)
    for i, (weight, b) in enumerate(zip(weights, biases, strict=True)):
        y_naive, naive_backward = naive_linear(x, weight, b if bias else None)
        d_x_naive, d_w_naive, d_b_naive = naive_backward(d_ys[i])
        expected_d_x += d_x_naive
        assert outputs[i].shape == (n, widths[i]) and outputs[i].flags.c_contiguous
        assert max_relative_error(outputs[i], y_naive) <= F64
        assert max_relative_error(d_weights[i], d_w_naive) <= F64
        if bias:
            assert max_relative_error(d_biases[i], d_b_naive) <= F64
    assert (d_biases is None) == (not bias)
    assert max_relative_error(d_x, expected_d_x) <= F64


def test_without_input_grad_the_maps_give_only_the_weight_gradients() -> None:
    x, weights, _, d_ys = make_maps(5, 3, [2, 4], seed=3)
    d_x, d_weights, _ = affine_maps_backward(x, weights, d_ys, bias=True, input_grad=False)
    assert d_x is None
    np.testing.assert_array_equal(d_weights[1], affine_maps_backward(x, weights, d_ys, True)[1][1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocked_maps_do_not_depend_on_the_thread_count(monkeypatch, dtype) -> None:
    # 3 blocks of 1024 rows: the gradients' partial sums are added in block order whatever
    # thread made them, and BLAS runs on one thread inside every block.
    x, weights, biases, d_ys = make_maps(2500, 64, [64, 64, 64], seed=4, dtype=dtype)
    results = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("REFIMPL_NUM_THREADS", threads)
        with row_block(1024):
            outputs = affine_maps(x, weights, biases)
            results.append(
                [*outputs, *flat_gradients(affine_maps_backward(x, weights, d_ys, True))]
            )
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


@given(
    n=st.integers(0, 9),
    widths=st.lists(st.integers(1, 3), min_size=2, max_size=4),
    bias=st.booleans(),
    input_grad=st.booleans(),
    seed=seeds(),
)
@example(
    n=6, widths=[2, 2, 2], bias=True, input_grad=True, seed=1
)  # equal widths: swapped maps fit
def test_several_maps_of_a_sparse_x_equal_the_dense_maps(n, widths, bias, input_grad, seed):
    # The sparse path (one sparse product per map, each bias added, d_W over the stored values)
    # against the blocked dense path on x.toarray(): every map's output and gradients.
    x, weights, biases, d_ys = make_maps(n, 5, widths, seed)
    x[np.random.default_rng(seed).random(x.shape) < 0.5] = 0.0
    sparse = sp.csr_matrix(x)
    maps = {}
    for name, features in (("sparse", sparse), ("dense", x)):
        outputs = affine_maps(features, weights, biases if bias else None)
        d_x, d_weights, d_biases = affine_maps_backward(features, weights, d_ys, bias, input_grad)
        maps[name] = [*outputs, *d_weights, *(d_biases or []), *([d_x] if input_grad else [])]
        assert (d_x is None) == (not input_grad) and (d_biases is None) == (not bias)
    for got, expected in zip(maps["sparse"], maps["dense"], strict=True):
        assert isinstance(got, np.ndarray) and got.shape == expected.shape
        assert max_relative_error(got, expected) <= F64


def flat_gradients(gradients: tuple) -> list:
    """The backward's arrays as one flat list: d_x, the d_W, the d_b."""
    d_x, d_weights, d_biases = gradients
    return [d_x, *d_weights, *d_biases]
