"""The divergence guards both training loops share: non-finite optimiser state, loss growth,
a frozen optimiser, overflow in the backward, and no false alarm at a fixed point."""

from __future__ import annotations

import math

import numpy as np
import pytest

from refimpl import optim
from refimpl.ops.losses import L1Loss, SoftmaxCrossEntropy
from refimpl.optim import SGD, Adam, NonFiniteUpdate
from refimpl.train import guards
from refimpl.train.guards import (
    LOSS_GROWTH,
    TrainingDiverged,
    check_gradients,
    checked_backward,
    checked_step,
    loss_of_zero_output,
)
from refimpl.validation import NonFiniteError, all_finite


def params_and_grads(dtype: type, gradient: float) -> tuple[dict, dict]:
    params = {"layer0.W": np.ones((2, 3), dtype), "layer1.b": np.zeros(2, dtype)}
    grads = {"layer0.W": np.full((2, 3), gradient, dtype), "layer1.b": np.zeros(2, dtype)}
    return params, grads


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # v overflows on purpose
def test_adam_second_moment_overflow_names_the_state_entry() -> None:
    # float32 Adam's v accumulates g^2, infinite for |g| > 1.8e19; the update m / sqrt(v)
    # is then exactly 0 and training went on frozen with exit 0: the loop checked gradients
    # and parameters (both finite here), never the optimiser's state.
    params, grads = params_and_grads(np.float32, 1e21)
    opt = Adam(lr=1e-3)
    with pytest.raises(
        TrainingDiverged,
        match=r"^epoch 4: the update made the optimiser state of layer0 non-finite "
        r"\(v\.layer0\.W\); lower the learning rate$",
    ):
        checked_step(opt, params, grads, opt.init(params), epoch=4)


def test_an_overflowing_update_is_divergence_naming_the_parameter() -> None:
    # The optimiser now checks its own result (refimpl.optim.NonFiniteUpdate) and the guard
    # no longer looks at the new parameters itself: its message must stay the one it gave.
    params, grads = params_and_grads(np.float64, 1.0)
    opt = Adam(lr=1e308)
    with pytest.raises(
        TrainingDiverged,
        match=r"^epoch 1: the update made layer0 non-finite \(layer0\.W\); lower the learning "
        r"rate$",
    ) as error:
        checked_step(opt, params, grads, opt.init(params), epoch=1)
    assert isinstance(error.value.__cause__, NonFiniteUpdate)


@pytest.mark.parametrize("opt", [SGD(lr=0.1), Adam(lr=0.1)])
def test_each_array_is_checked_once_per_step_not_again_by_the_guard(
    opt: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One reduction per new parameter and state array, as when the guard made them: moving
    # the check into the optimiser must not add a second pass over the parameters.
    calls = []

    def counted(value: object) -> bool:
        calls.append(value)
        return all_finite(value)

    monkeypatch.setattr(optim, "all_finite", counted)
    monkeypatch.setattr(guards, "all_finite", counted)
    params, grads = params_and_grads(np.float64, 1.0)
    state = opt.init(params)
    checked_step(opt, params, grads, state, epoch=0)
    moments = sum(value.dtype.kind == "f" for value in state.values())  # Adam's m and v
    assert len(calls) == len(params) + moments


def test_an_update_that_rounds_away_everywhere_is_a_frozen_optimiser() -> None:
    # lr * g = 1e-30 vanishes against 1.0 in float32: no parameter moves although the
    # gradient is not zero. The loop took such steps forever without a word.
    params, grads = params_and_grads(np.float32, 1.0)
    with pytest.raises(
        TrainingDiverged,
        match=r"^epoch 2: the update changed no parameter although the gradient of layer0 "
        r"\(layer0\.W\) is non-zero: the optimiser is frozen",
    ):
        checked_step(SGD(lr=1e-30), params, grads, {"step": np.asarray(0)}, epoch=2)


@pytest.mark.parametrize("opt", [SGD(lr=0.1), Adam(lr=0.1)])
def test_zero_gradients_are_a_fixed_point_not_a_frozen_optimiser(opt: object) -> None:
    params, grads = params_and_grads(np.float64, 0.0)
    new_params, state = checked_step(opt, params, grads, opt.init(params), epoch=0)
    assert all(np.array_equal(new_params[k], params[k]) for k in params)
    assert int(state["step"]) == 1
    # one parameter with zero gradient beside a moving one is no fault either
    params, grads = params_and_grads(np.float64, 1.0)
    new_params, _ = checked_step(opt, params, grads, opt.init(params), epoch=0)
    assert np.array_equal(new_params["layer1.b"], params["layer1.b"])
    assert not np.array_equal(new_params["layer0.W"], params["layer0.W"])


def test_loss_growth_threshold_is_exactly_the_documented_rule() -> None:
    # cross-entropy over 3 classes: an all-zero output scores log 3, so the threshold is
    # 1e4 * log 3; the reference is only computed for a loss above 1e4 * LOSS_FLOOR
    logits, labels = np.full((4, 3), 7.0), np.array([0, 1, 2, 0])
    reference = loss_of_zero_output(SoftmaxCrossEntropy(), logits, labels)
    assert reference() == pytest.approx(math.log(3), rel=1e-15)
    _, grads = params_and_grads(np.float64, 1.0)
    grads["layer1.b"] = np.array([0.0, -5.0])
    threshold = LOSS_GROWTH * math.log(3)
    check_gradients(threshold * (1 - 1e-12), grads, 9, reference)
    with pytest.raises(
        TrainingDiverged,
        match=r"^epoch 9: loss 1\.099e\+04 is over 1e\+04 times that of an all-zero output "
        r"\(1\.099\); the largest gradient is in layer1 \(layer1\.b\)",
    ):
        check_gradients(threshold * (1 + 1e-12), grads, 9, reference)

    def never() -> float:
        raise AssertionError("the reference was computed for a small loss")

    check_gradients(LOSS_GROWTH, grads, 0, never)


def test_loss_growth_floor_keeps_room_for_targets_near_zero() -> None:
    # L1 on targets of size 1e-3: the all-zero output scores 1e-3, below the floor of 1,
    # so a loss of 5e3 (far above 1e4 * 1e-3) is no divergence, and 2e4 is
    out, targets = np.zeros((2, 1)), np.full((2, 1), 1e-3)
    reference = loss_of_zero_output(L1Loss(), out, targets)
    _, grads = params_and_grads(np.float64, 1.0)
    check_gradients(5e3, grads, 0, reference)
    with pytest.raises(TrainingDiverged, match=r"all-zero output \(1\);"):
        check_gradients(2e4, grads, 0, reference)


def test_non_finite_loss_or_gradient_names_the_first_layer() -> None:
    _, grads = params_and_grads(np.float64, 1.0)
    grads["layer1.b"] = np.array([1.0, np.inf])
    with pytest.raises(TrainingDiverged, match=r"^epoch 3: loss 1\.0; .* in layer1 \(layer1\.b\)"):
        check_gradients(1.0, grads, 3, lambda: 1.0)
    _, grads = params_and_grads(np.float64, 1.0)
    with pytest.raises(TrainingDiverged, match=r"^epoch 3: loss nan \(the gradients are finite\)"):
        check_gradients(math.nan, grads, 3, lambda: 1.0)


def test_overflow_inside_the_backward_is_divergence_not_a_value_error() -> None:
    # backward passes refuse non-finite cotangents (NonFiniteError, a ValueError); between
    # two layers that means an overflow, which training reports as divergence
    class Overflowing:
        def backward(self, params: dict, cache: object, d_out: object, input_grad: bool) -> None:
            raise NonFiniteError("d_y contains NaN or infinity (3 of 6 entries)")

    with pytest.raises(
        TrainingDiverged, match=r"^epoch 5: the backward pass overflowed: d_y contains NaN"
    ):
        checked_backward(Overflowing(), {}, None, np.ones(2), epoch=5)
