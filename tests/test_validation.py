"""check_finite: a finite sum clears an array; a non-finite one falls through to the entrywise
check, so finite entries whose sum overflows pass and any NaN or infinity is reported."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.fields import check_bool
from refimpl.interop.golden import _forward as golden_replay
from refimpl.interop.golden_cases import CASES
from refimpl.kernels.segment import Segments
from refimpl.nn.nodeformer.edge_loss import NodeFormerEdgeLoss
from refimpl.ops.activations import ELU, Identity, LeakyReLU, ReLU
from refimpl.ops.dropout import Dropout
from refimpl.ops.linear import Linear
from refimpl.ops.losses import BCEWithLogits, L1Loss, MSELoss, SoftmaxCrossEntropy
from refimpl.ops.pooling import GlobalPool
from refimpl.testing.strategies import seeds
from refimpl.validation import NonFiniteError, check_cotangent, check_finite, check_scalar_cotangent


@given(
    seed=seeds(),
    size=st.integers(0, 40),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    bad=st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), max_size=3),
    huge=st.booleans(),
)
def test_reports_exactly_the_arrays_with_nan_or_infinity(
    seed: int, size: int, dtype: type, bad: list, huge: bool
) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(size).astype(dtype)
    if huge:  # finite entries near the largest float: their sum overflows
        values[:] = np.finfo(dtype).max * 0.75
    places = rng.integers(0, size, len(bad)) if size else []
    for place, value in zip(places, bad, strict=False):
        values[place] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflowing sum is not the caller's business
        if np.isfinite(values).all():
            check_finite(values, "x")
        else:
            with pytest.raises(NonFiniteError, match=r"x contains NaN or infinity \(\d+ of"):
                check_finite(values, "x")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_entries_whose_sum_overflows_pass(dtype: type) -> None:
    values = np.full(4, np.finfo(dtype).max, dtype=dtype)
    with np.errstate(over="ignore"):
        assert not np.isfinite(values.sum())  # the fast check alone would reject them
    check_finite(values, "x")


def test_opposite_infinities_are_reported() -> None:
    # +inf and -inf sum to NaN, and a count of both is given
    with pytest.raises(NonFiniteError, match=r"\(2 of 3 entries\)"):
        check_finite(np.array([np.inf, 1.0, -np.inf]), "x")


# A non-finite cotangent made every backward return NaN gradients without a word, while
# forward refused a non-finite input: check_cotangent checked shape, dtype and backend only,
# and the losses' scalar d_loss was not checked at all. Every earlier test fed finite
# cotangents (random normals or 1.0).
def test_non_finite_cotangent_is_refused_like_a_non_finite_input() -> None:
    d_out = np.ones((2, 3))
    d_out[1, 2] = np.nan
    with pytest.raises(NonFiniteError, match=r"d_out contains NaN or infinity \(1 of 6 entries\)"):
        check_cotangent(d_out, (2, 3), np.float64, name="d_out")
    like = np.zeros(3, np.float32)
    for d_loss in (np.inf, np.nan, np.float32(np.inf), np.array(np.nan, np.float32)):
        with pytest.raises(NonFiniteError, match=r"d_loss (must be finite|contains NaN)"):
            check_scalar_cotangent(d_loss, like)
    assert check_scalar_cotangent(np.float32(2.0), like) == 2.0


def _golden_forward(case: object) -> tuple:
    """A golden case's block, params and forward cache, replayed as ``refimpl golden`` does."""
    block = case.cls(**case.kwargs)
    rng = np.random.default_rng(case.seed)
    params = block.init_params(rng) if hasattr(block, "init_params") else {}
    data = case.build(block, rng)
    arrays = {f"input/{k}": v for k, v in data.inputs.items()}
    arrays |= {f"noise/{k}": np.asarray(v) for k, v in data.noise.items()}
    spec = {
        "args": list(data.args),
        "array_kwargs": dict(data.array_kwargs),
        "kwargs": dict(data.kwargs),
        "noise_kwarg": None if data.draw_noise else data.noise_kwarg,
    }
    out, cache = golden_replay(block, params, arrays, spec, rng=rng if data.draw_noise else None)
    return block, params, out, cache


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_layer_and_model_backward_refuses_a_non_finite_cotangent(case: object) -> None:
    # the golden cases hold every layer and model: each public backward must refuse a NaN
    block, params, out, cache = _golden_forward(case)
    d_out = np.ones_like(out)
    d_out.flat[-1] = np.nan
    with pytest.raises(NonFiniteError, match=r"^d_\w+ contains NaN or infinity \(1 of"):
        block.backward(params, cache, d_out)


def _op_cases() -> list:
    """``(name, block, params, forward args)`` for the ops and the losses."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3))
    labels = np.array([0, 2, 1, 2])
    targets = rng.standard_normal((4, 3))
    segments = Segments(np.array([0, 0, 1, 1]), 2)
    linear = Linear(3, 2)
    return [
        ("relu", ReLU(), {}, (x,)),
        ("leaky_relu", LeakyReLU(), {}, (x,)),
        ("elu", ELU(), {}, (x,)),
        ("identity", Identity(), {}, (x,)),
        ("linear", linear, linear.init_params(rng), (x,)),
        ("dropout", Dropout(0.5), {}, (x, True, rng)),
        ("pool", GlobalPool(), {}, (x, segments)),
        ("cross_entropy", SoftmaxCrossEntropy(), {}, (x, labels)),
        ("bce", BCEWithLogits(), {}, (x, (targets > 0).astype(float))),
        ("mse", MSELoss(), {}, (x, targets)),
        ("l1", L1Loss(), {}, (x, targets)),
    ]


OP_CASES = _op_cases()


@pytest.mark.parametrize("case", OP_CASES, ids=[case[0] for case in OP_CASES])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_every_op_and_loss_backward_refuses_a_non_finite_cotangent(case: tuple, bad: float) -> None:
    _, block, params, args = case
    out, cache = block.forward(params, *args)
    if out.ndim == 0:
        d_out = bad  # the losses take a Python number
    else:
        d_out = np.ones_like(out)
        d_out.flat[0] = bad
    with pytest.raises(NonFiniteError, match=r"^d_\w+ (contains NaN or infinity|must be finite)"):
        block.backward(params, cache, d_out)


def test_nodeformer_edge_loss_refuses_a_non_finite_d_loss() -> None:
    case = next(case for case in CASES if case.name == "nodeformerconv_train_gumbel")
    conv, params, _, cache = _golden_forward(case)
    edge_loss = NodeFormerEdgeLoss(conv)
    _, loss_cache = edge_loss.forward(params, cache)
    with pytest.raises(NonFiniteError, match=r"d_loss must be finite, got nan"):
        edge_loss.backward(params, loss_cache, math.nan)
    with pytest.raises(NonFiniteError, match=r"d_loss contains NaN or infinity"):
        edge_loss.backward(params, loss_cache, np.array(np.inf))


@pytest.mark.parametrize("flag", ["False", "", 0, 1, 1.0, None, [True], np.array([True])])
def test_a_flag_must_be_a_bool_not_something_with_a_truth_value(flag: object) -> None:
    # GATConv(concat="False") behaved as concat=True: the string's truth value was read
    with pytest.raises(ValueError, match=r"^GATConv concat must be True or False, got "):
        check_bool(flag, "GATConv concat")


@pytest.mark.parametrize("flag", [True, False, np.bool_(True), np.bool_(False)])
def test_python_and_numpy_bools_are_flags(flag: object) -> None:
    check_bool(flag, "GATConv concat")
