"""BatchNorm: finite differences, the literal twin, the running statistics worked by hand,
evaluation mode, the strict backend, and bad input. Torch parity: test_batchnorm_torch.py."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import array_module, to_numpy
from refimpl.naive.batchnorm import batchnorm_backward, batchnorm_forward
from refimpl.nn.norms.batchnorm import BatchNorm
from refimpl.testing import check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL, TWIN_RTOL
from refimpl.validation import NonFiniteError
from tests.backends import DEVICE_BACKENDS

RTOL32 = FORWARD_RTOL[np.dtype(np.float32)]


class Case(NamedTuple):
    """A configured block, float64 parameters, input, running statistics, mode, cotangent."""

    norm: BatchNorm
    params: dict
    x: np.ndarray
    state: dict
    training: bool
    d_y: np.ndarray


@st.composite
def cases(draw: st.DrawFn, training: bool | None = None) -> Case:
    """Drawn M (2.. in training, 0.. in evaluation), C, momentum, eps, affine and values: a
    drawn magnitude and offset, and maybe a constant column (variance 0) of a value whose
    mean is exact (so both sides centre it to exactly 0)."""
    training = draw(st.booleans()) if training is None else training
    norm = BatchNorm(
        draw(st.integers(1, 4)),
        momentum=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        eps=draw(st.sampled_from([1e-5, 1e-2, 0.5])),
        affine=draw(st.booleans()),
    )
    rows = draw(st.integers(2 if training else 0, 7))
    rng = np.random.default_rng(draw(seeds()))
    shape = (rows, norm.channels)
    magnitude = draw(st.sampled_from([0.01, 1.0, 10.0]))
    x = magnitude * (rng.standard_normal(shape) + draw(st.sampled_from([0.0, 1.0])))
    if rows and draw(st.booleans()):
        x[:, draw(st.integers(0, norm.channels - 1))] = draw(st.sampled_from([0.0, 1.5, -0.75]))
    params = {k: rng.standard_normal(v) for k, v in norm.param_shapes().items()}
    state = {
        "running_mean": rng.standard_normal(norm.channels),
        "running_var": rng.uniform(0.0, 3.0, norm.channels),
    }
    return Case(norm, params, x, state, training, rng.standard_normal(shape))


def run_ours(case: Case) -> dict:
    y, cache = case.norm.forward(case.params, case.x, case.training, case.state)
    d_x, d_params = case.norm.backward(case.params, cache, case.d_y)
    return {"y": y, **cache.state, "d_x": d_x, **{f"d_{k}": v for k, v in d_params.items()}}


def run_twin(case: Case) -> dict:
    norm, c = case.norm, case.norm.channels
    weight = case.params.get("weight", np.ones(c))
    bias = case.params.get("bias", np.zeros(c))
    mean, var = case.state["running_mean"], case.state["running_var"]
    y, new_mean, new_var = batchnorm_forward(
        case.x, weight, bias, mean, var, case.training, norm.momentum, norm.eps
    )
    d_x, d_weight, d_bias = batchnorm_backward(
        case.x, weight, mean, var, case.training, norm.eps, case.d_y
    )
    out = {"y": y, "running_mean": new_mean, "running_var": new_var, "d_x": d_x}
    return out | ({"d_weight": d_weight, "d_bias": d_bias} if norm.affine else {})


def make_case(norm: BatchNorm, x: np.ndarray, training: bool, seed: int = 0) -> Case:
    """A case on a chosen ``x``: parameters, running statistics and cotangent from ``seed``."""
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(v) for k, v in norm.param_shapes().items()}
    state = {
        "running_mean": rng.standard_normal(norm.channels),
        "running_var": rng.uniform(0.0, 3.0, norm.channels),
    }
    return Case(norm, params, x, state, training, rng.standard_normal(x.shape))


TWO_ROWS = make_case(BatchNorm(3), np.array([[1.0, -2.0, 0.5], [3.0, 4.0, 0.5]]), True)
CONSTANT_COLUMN = make_case(
    BatchNorm(2, eps=1e-5), np.array([[1.5, 0.3], [1.5, -1.2], [1.5, 2]]), True
)
NO_ROWS = make_case(BatchNorm(2), np.zeros((0, 2)), False)


def term_scales(case: Case) -> dict:
    """The largest term each gradient sums, per tensor. With M = 2, or a constant column,
    ``d_x`` is zero up to rounding by cancellation (the output does not depend on ``x``
    there, eps aside), so it is judged against the terms ``d_y weight / sqrt(var + eps)``
    whose rounding it holds, not relative to itself."""
    weight = np.abs(case.params.get("weight", np.ones(case.norm.channels)))
    if case.training:
        mean, var = case.x.mean(axis=0), case.x.var(axis=0)
    else:
        mean, var = case.state["running_mean"], case.state["running_var"]
    inv_std = 1 / np.sqrt(var + case.norm.eps)
    xhat = (case.x - mean) * inv_std
    return {
        "d_x": float(np.max(np.abs(case.d_y) * weight * inv_std, initial=0.0)),
        "d_weight": float(np.max(np.abs(case.d_y * xhat).sum(axis=0), initial=0.0)),
        "d_bias": float(np.max(np.abs(case.d_y).sum(axis=0), initial=0.0)),
    }


# -- the literal twin ------------------------------------------------------------------------


@given(case=cases())
@example(case=TWO_ROWS)
@example(case=CONSTANT_COLUMN)
@example(case=NO_ROWS)
def test_matches_the_literal_twin(case: Case) -> None:
    ours, twin = run_ours(case), run_twin(case)
    assert ours.keys() == twin.keys()
    for name in ("y", "running_mean", "running_var"):
        assert max_relative_error(ours[name], twin[name]) <= TWIN_RTOL, name
    scales = term_scales(case)
    for name in ours.keys() - {"y", "running_mean", "running_var"}:
        error = float(np.max(np.abs(ours[name] - twin[name]), initial=0.0))
        assert error <= TWIN_RTOL * max(scales[name], np.finfo(float).tiny), name


# -- gradients against central differences ---------------------------------------------------


@given(case=cases())
@example(case=TWO_ROWS)
@example(case=CONSTANT_COLUMN)
def test_backward_matches_central_differences(case: Case) -> None:
    report = check_gradients(
        case.norm,
        case.params,
        (case.x,),
        forward_kwargs={"training": case.training, "state": case.state},
        cotangent=case.d_y,
    )
    assert report.passed, report.table()


def test_gradient_check_sees_a_backward_without_the_variance_term() -> None:
    # The drawn checks above could pass a backward that forgot B3 (the path through the
    # batch variance) only if the check were blind to it: here it is not.
    class NoVarianceTerm(BatchNorm):
        def backward(self, params: dict, cache: object, d_y: np.ndarray) -> tuple:
            d_xhat = d_y * params["weight"]
            d_centred = d_xhat * cache.inv_std
            d_x = d_centred - d_centred.mean(axis=0)
            return d_x, {"weight": (d_y * cache.xhat).sum(axis=0), "bias": d_y.sum(axis=0)}

    case = make_case(NoVarianceTerm(3), np.random.default_rng(1).standard_normal((5, 3)), True)
    report = check_gradients(
        case.norm, case.params, (case.x,), forward_kwargs={"training": True, "state": case.state}
    )
    assert report.by_name()["input[0]"].max_rel_error > 1e3 * GRADCHECK_RTOL
    assert report.by_name()["param:weight"].max_rel_error <= GRADCHECK_RTOL


# -- running statistics, evaluation, named cases ---------------------------------------------


def test_running_statistics_worked_by_hand() -> None:
    # Column [1, 2, 3, 4]: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, biased
    # variance 5/4, unbiased 5/3. From torch's initial state (0, 1) with momentum 0.1:
    # running_mean = 0.9 * 0 + 0.1 * 2.5 = 0.25 and running_var = 0.9 * 1 + 0.1 * 5/3 =
    # 1.0666...; the biased variance would give 1.025, a momentum weighting the other way
    # (Keras: 0.1 running + 0.9 batch) 2.25 and 1.6. The output uses the biased variance:
    # y = (x - 2.5) / sqrt(1.25 + eps).
    norm = BatchNorm(1, eps=1e-5, affine=False)
    x = np.array([[1.0], [2.0], [3.0], [4.0]])
    y, cache = norm.forward({}, x, True, norm.init_state())
    assert cache.state["running_mean"][0] == pytest.approx(0.25, rel=1e-15)
    assert cache.state["running_var"][0] == pytest.approx(0.9 + 0.5 / 3, rel=1e-15)
    np.testing.assert_allclose(y[:, 0], (x[:, 0] - 2.5) / np.sqrt(1.25 + 1e-5), rtol=1e-15)
    # evaluation with those statistics: an affine map, the statistics unchanged
    z, after = norm.forward({}, x, False, cache.state)
    np.testing.assert_allclose(z[:, 0], (x[:, 0] - 0.25) / np.sqrt(0.9 + 0.5 / 3 + 1e-5))
    np.testing.assert_array_equal(after.state["running_var"], cache.state["running_var"])


@pytest.mark.parametrize("momentum", [0.0, 1.0])
def test_momentum_zero_freezes_and_one_replaces(momentum: float) -> None:
    norm = BatchNorm(2, momentum=momentum)
    x = np.array([[1.0, 0.0], [2.0, 0.0], [6.0, 3.0]])  # mean (3, 1), unbiased var (7, 3)
    state = {"running_mean": np.array([0.5, -1.0]), "running_var": np.array([2.0, 0.0])}
    _, cache = norm.forward(norm.init_params(None), x, True, state)
    expected = state if momentum == 0 else {"running_mean": [3, 1], "running_var": [7, 3]}
    for name in state:
        np.testing.assert_array_equal(cache.state[name], expected[name])


@given(case=cases())
def test_inputs_and_state_are_not_modified(case: Case) -> None:
    copies = [case.x.copy(), case.d_y.copy(), *(v.copy() for v in case.state.values())]
    _, cache = case.norm.forward(case.params, case.x, case.training, case.state)
    case.norm.backward(case.params, cache, case.d_y)
    originals = [case.x, case.d_y, *case.state.values()]
    for original, copy in zip(originals, copies, strict=True):
        np.testing.assert_array_equal(original, copy)
    assert cache.state is not case.state
    assert all(cache.state[k] is not case.state[k] for k in case.state)


def test_constant_column_outputs_the_bias_with_a_centred_gradient() -> None:
    # var = 0: xhat = 0 exactly (the mean of 1.5s is exact), y = bias; the gradient is
    # weight / sqrt(eps) times the centred cotangent (B3's term vanishes with xc).
    case = CONSTANT_COLUMN
    norm, params = case.norm, case.params
    y, cache = norm.forward(params, case.x, True, case.state)
    np.testing.assert_array_equal(y[:, 0], params["bias"][0])
    d_x, _ = norm.backward(params, cache, case.d_y)
    d = case.d_y[:, 0]
    expected = params["weight"][0] / np.sqrt(norm.eps) * (d - d.mean())
    np.testing.assert_allclose(d_x[:, 0], expected, rtol=1e-12)


def test_evaluation_of_no_rows_gives_an_empty_output() -> None:
    norm, params, x, state, _, _ = NO_ROWS
    y, cache = norm.forward(params, x, False, state)
    assert y.shape == (0, 2)
    d_x, d_params = norm.backward(params, cache, np.zeros((0, 2)))
    assert d_x.shape == (0, 2)
    np.testing.assert_array_equal(d_params["weight"], 0.0)


@pytest.mark.parametrize("rows", [0, 1])
def test_training_on_fewer_than_two_rows_is_refused(rows: int) -> None:
    norm = BatchNorm(3)
    with pytest.raises(ValueError, match=f"at least 2 rows per channel, got {rows}: one row's"):
        norm.forward(norm.init_params(None), np.ones((rows, 3)), True, norm.init_state())


@pytest.mark.parametrize("training", [True, False])
def test_float32_stays_float32_and_agrees_with_float64(training: bool) -> None:
    case = make_case(BatchNorm(3), np.random.default_rng(2).standard_normal((6, 3)), training)
    ours = run_ours(case)
    f32 = {k: v.astype(np.float32) for k, v in case.params.items()}
    state32 = {k: v.astype(np.float32) for k, v in case.state.items()}
    y, cache = case.norm.forward(f32, case.x.astype(np.float32), training, state32)
    d_x, _ = case.norm.backward(f32, cache, case.d_y.astype(np.float32))
    assert y.dtype == d_x.dtype == cache.state["running_var"].dtype == np.float32
    assert max_relative_error(y, ours["y"]) <= RTOL32
    assert max_relative_error(d_x, ours["d_x"]) <= 10 * RTOL32  # a backward rounds more


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@given(case=cases())
def test_device_backend_matches_numpy(backend: str, case: Case) -> None:
    xp = array_module(backend)
    ours = run_ours(case)
    params = {k: xp.asarray(v) for k, v in case.params.items()}
    state = {k: xp.asarray(v) for k, v in case.state.items()}
    y, cache = case.norm.forward(params, xp.asarray(case.x), case.training, state)
    d_x, d_params = case.norm.backward(params, cache, xp.asarray(case.d_y))
    device = {"y": y, **cache.state, "d_x": d_x, **{f"d_{k}": v for k, v in d_params.items()}}
    for name, value in device.items():
        assert max_relative_error(to_numpy(value), ours[name]) <= TWIN_RTOL, name


def test_init_params_and_state_are_torchs() -> None:
    norm = BatchNorm(3)
    params, state = norm.init_params(np.random.default_rng(0)), norm.init_state()
    assert list(params) == ["weight", "bias"] and list(state) == ["running_mean", "running_var"]
    np.testing.assert_array_equal(params["weight"], 1.0)
    np.testing.assert_array_equal(params["bias"], 0.0)
    np.testing.assert_array_equal(state["running_mean"], 0.0)
    np.testing.assert_array_equal(state["running_var"], 1.0)
    assert BatchNorm(3, affine=False).init_params(None) == {}
    assert norm.init_state(dtype=np.float32)["running_var"].dtype == np.float32


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"momentum": -0.1}, r"momentum must be a number in \[0, 1\]"),
        ({"momentum": 1.5}, r"momentum must be a number in \[0, 1\]"),
        ({"momentum": float("nan")}, r"momentum must be a number in \[0, 1\]"),
        ({"momentum": None}, r"momentum must be a number in \[0, 1\]"),
        ({"momentum": True}, r"momentum must be a number in \[0, 1\]"),
        ({"eps": 0.0}, "eps must be a finite number > 0"),
        ({"eps": -1e-5}, "eps must be a finite number > 0"),
        ({"affine": "yes"}, "affine must be True or False"),
        ({"channels": 0}, "channels must be a positive int"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchNorm(**{"channels": 2, **kwargs})


def _state(mean: object = (0.0, 0.0), var: object = (1.0, 1.0)) -> dict:
    return {"running_mean": np.array(mean), "running_var": np.array(var)}


@pytest.mark.parametrize(
    ("x", "training", "state", "error", "match"),
    [
        (
            np.ones((3, 2)),
            True,
            _state(var=(1.0, -0.5)),
            ValueError,
            "running_var'\\] must be >= 0",
        ),
        (np.ones((3, 2)), False, _state(mean=(np.nan, 0)), NonFiniteError, "running_mean"),
        (np.ones((3, 2)), False, _state(var=(np.inf, 1)), NonFiniteError, "running_var"),
        (
            np.ones((3, 2)),
            False,
            _state(var=(1.0, 1.0, 1.0)),
            ValueError,
            r"must have shape \(2\), got \(3,\)",
        ),
        (np.ones((3, 2)), False, {"running_mean": np.zeros(2)}, ValueError, "keys 'running_mean'"),
        (np.ones((3, 2)), False, None, ValueError, "create it with BatchNorm.init_state"),
        (np.ones((3, 2)), "yes", _state(), ValueError, "training must be True or False"),
        (np.ones((3, 3)), True, _state(), ValueError, r"x must have shape \(\*, 2\)"),
        (np.ones(2), True, _state(), ValueError, r"x must have shape \(\*, 2\)"),
        (np.array([[1.0, np.nan]] * 2), True, _state(), NonFiniteError, "x contains NaN"),
        (
            np.ones((3, 2)),
            False,
            {k: v.astype(np.float32) for k, v in _state().items()},
            TypeError,
            "running_mean has dtype float32",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(
    x: np.ndarray, training: object, state: object, error: type, match: str
) -> None:
    norm = BatchNorm(2)
    with pytest.raises(error, match=match) as raised:
        norm.forward(norm.init_params(None), x, training, state)
    assert "\n" not in str(raised.value)


def test_bad_cotangent_and_overflow_are_refused() -> None:
    norm = BatchNorm(2)
    params, state = norm.init_params(None), norm.init_state()
    _, cache = norm.forward(params, np.arange(6.0).reshape(3, 2), True, state)
    with pytest.raises(ValueError, match=r"d_y must be an array of the output's shape \(3, 2\)"):
        norm.backward(params, cache, np.ones((2, 2)))
    with pytest.raises(NonFiniteError, match="d_y contains NaN"):
        norm.backward(params, cache, np.full((3, 2), np.nan))
    huge = np.array([[1e300, 0.0], [-1e300, 1.0]])
    with pytest.raises(NonFiniteError, match="batch variance of x overflowed float64"):
        norm.forward(params, huge, True, state)
