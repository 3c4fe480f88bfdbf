"""Tests for refimpl.schedules: torch parity of the learning-rate sequence (Hypothesis), sequences
worked by hand, purity, refusals, and the optimiser taking the scheduled rate."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.optim import SGD, Adam
from refimpl.schedules import SCHEDULES, MultiStepLR, ReduceLROnPlateau, with_lr

LRS = st.sampled_from([1e-3, 0.005, 0.1, 1.0, 0.3])


def _torch_sgd(torch: object, lr: float) -> object:
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


@given(
    lr=LRS,
    mode=st.sampled_from(["min", "max"]),
    threshold_mode=st.sampled_from(["rel", "abs"]),
    factor=st.sampled_from([0.1, 0.5, 0.9, 1 / 3]),
    patience=st.integers(0, 4),
    threshold=st.sampled_from([0.0, 1e-4, 0.1, 0.5]),
    cooldown=st.integers(0, 3),
    min_lr=st.sampled_from([0.0, 1e-4, 0.02]),
    eps=st.sampled_from([0.0, 1e-8, 1e-3]),
    # few distinct values, so ties, plateaus and near-threshold changes are common
    metrics=st.lists(st.integers(-3, 3).map(lambda k: 1.0 + 0.05 * k), min_size=1, max_size=40),
)
def test_reduce_lr_on_plateau_follows_torch_bit_for_bit(
    lr: float,
    mode: str,
    threshold_mode: str,
    factor: float,
    patience: int,
    threshold: float,
    cooldown: int,
    min_lr: float,
    eps: float,
    metrics: list[float],
) -> None:
    torch = pytest.importorskip("torch")
    settings = {
        "mode": mode,
        "factor": factor,
        "patience": patience,
        "threshold": threshold,
        "threshold_mode": threshold_mode,
        "cooldown": cooldown,
        "min_lr": min_lr,
        "eps": eps,
    }
    optimizer = _torch_sgd(torch, lr)
    reference = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **settings)
    schedule = ReduceLROnPlateau(**settings)
    state = schedule.init(lr)
    for metric in metrics:
        optimizer.step()
        reference.step(metric)
        state = schedule.step(state, metric)
        assert state["lr"] == optimizer.param_groups[0]["lr"]  # exact: the same float ops
        assert state["best"] == reference.best
        assert state["num_bad_epochs"] == reference.num_bad_epochs
        assert state["cooldown_counter"] == reference.cooldown_counter
        assert state["last_epoch"] == reference.last_epoch


@given(
    lr=LRS,
    milestones=st.lists(st.integers(0, 12), min_size=1, max_size=5),  # duplicates and 0 too
    gamma=st.sampled_from([0.1, 0.5, 1 / 3, 2.0]),
    steps=st.integers(0, 16),
)
def test_multistep_lr_follows_torch_bit_for_bit(
    lr: float, milestones: list[int], gamma: float, steps: int
) -> None:
    torch = pytest.importorskip("torch")
    optimizer = _torch_sgd(torch, lr)
    reference = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma)
    schedule = MultiStepLR(milestones, gamma)
    state = schedule.init(lr)
    assert state["lr"] == optimizer.param_groups[0]["lr"]  # a milestone 0 applies at once
    for _ in range(steps):
        optimizer.step()
        reference.step()
        state = schedule.step(state)
        assert state["lr"] == optimizer.param_groups[0]["lr"]
        assert state["last_epoch"] == reference.last_epoch


def test_plateau_sequence_worked_by_hand() -> None:
    # patience 2: the first step sets best = 1; steps 2-4 are bad (1 is not below
    # 1 * (1 - 1e-4)); the third bad step exceeds the patience and halves lr. Cooldown 1
    # then ignores step 5's bad step; steps 6-8 count again and halve at step 8.
    schedule = ReduceLROnPlateau(factor=0.5, patience=2, cooldown=1)
    state = schedule.init(0.4)
    lrs = []
    for _ in range(8):
        state = schedule.step(state, 1.0)
        lrs.append(state["lr"])
    assert lrs == [0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.2, 0.1]


def test_plateau_respects_min_lr_and_eps() -> None:
    # 0.3 * 0.1 = 0.03 is floored at min_lr 0.05; then 0.05 -> max(0.005, 0.05) changes nothing.
    schedule = ReduceLROnPlateau(mode="max", patience=0, min_lr=0.05)
    state = schedule.init(0.3)
    state = schedule.step(schedule.step(state, 2.0), 2.0)  # best 2, then one bad step
    assert state["lr"] == 0.05
    assert schedule.step(state, 1.0)["lr"] == 0.05
    # a reduction by eps or less is not made (torch's rule)
    tiny = ReduceLROnPlateau(patience=0, eps=0.75)  # 0.8 - 0.08 = 0.72 <= eps
    assert tiny.step(tiny.step(tiny.init(0.8), 1.0), 1.0)["lr"] == 0.8


def test_multistep_sequence_worked_by_hand() -> None:
    # milestones [2, 4, 4]: halved after the second step, quartered after the fourth.
    schedule = MultiStepLR([4, 2, 4], gamma=0.5)
    assert schedule.milestones == (2, 4, 4)
    state = schedule.init(1.0)
    lrs = []
    for _ in range(5):
        state = schedule.step(state)
        lrs.append(state["lr"])
    assert lrs == [1.0, 0.5, 0.5, 0.125, 0.125]


def test_step_is_pure_and_state_survives_pickle_and_arrays() -> None:
    schedule = ReduceLROnPlateau(patience=0)
    state = schedule.init(0.1)
    before = dict(state)
    after = schedule.step(state, 3.0)
    assert state == before and after is not state
    assert pickle.loads(pickle.dumps(schedule)) == schedule
    # as a checkpoint stores it: 0-d int64 / float64 arrays, read back exactly
    saved = {
        k: np.asarray(v, np.int64 if isinstance(v, int) else np.float64) for k, v in after.items()
    }
    assert schedule.load_state(saved) == after


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: MultiStepLR([]), "one or more ints >= 0"),
        (lambda: MultiStepLR([3, -1]), "one or more ints >= 0"),
        (lambda: MultiStepLR("100"), "list of ints"),
        (lambda: MultiStepLR([1], gamma=0.0), "gamma must be > 0"),
        (lambda: ReduceLROnPlateau(factor=1.0), r"factor must be in \(0, 1\)"),
        (lambda: ReduceLROnPlateau(mode="minimum"), "mode must be one of"),
        (lambda: ReduceLROnPlateau(threshold_mode="relative"), "threshold_mode must be one of"),
        (lambda: ReduceLROnPlateau(patience=-1), "patience must be an int >= 0"),
        (lambda: ReduceLROnPlateau(min_lr=-1e-3), "min_lr must be >= 0"),
        (lambda: ReduceLROnPlateau(eps=math.nan), "eps must be finite"),
        (lambda: ReduceLROnPlateau().init(0.0), "lr must be > 0"),
    ],
)
def test_bad_configurations_are_refused_in_one_line(make: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_bad_metrics_and_states_are_refused() -> None:
    plateau = ReduceLROnPlateau()
    state = plateau.init(0.1)
    with pytest.raises(ValueError, match="metric must be finite"):
        plateau.step(state, math.nan)
    with pytest.raises(TypeError, match="needs the metric"):
        plateau.step(state)
    multistep = MultiStepLR([1])
    with pytest.raises(TypeError, match="takes no metric"):
        multistep.step(multistep.init(0.1), 0.5)
    with pytest.raises(ValueError, match="saved by another schedule"):
        multistep.load_state(state)
    with pytest.raises(ValueError, match=r"'num_bad_epochs'.* int >= 0"):
        plateau.load_state({**state, "num_bad_epochs": -1})
    with pytest.raises(ValueError, match=r"'lr'.* > 0"):
        plateau.load_state({**state, "lr": 0.0})
    assert set(SCHEDULES.values()) == {MultiStepLR, ReduceLROnPlateau}


@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), Adam(lr=0.1, weight_decay=0.01)])
def test_the_optimiser_takes_the_scheduled_rate(optimizer: object) -> None:
    # A step with lr 0.05 from the replaced configuration equals a step of a fresh optimiser
    # built with 0.05: the state (Adam's moments, the step count) does not hold the rate.
    params = {"w": np.array([1.0, -2.0])}
    grads = {"w": np.array([0.5, 0.25])}
    state = optimizer.init(params)
    params, state = optimizer.step(params, grads, state)
    assert with_lr(optimizer, 0.1) is optimizer
    scheduled = with_lr(optimizer, 0.05)
    fresh = type(optimizer)(**{**optimizer.__dict__, "lr": 0.05})
    np.testing.assert_array_equal(
        scheduled.step(params, grads, state)[0]["w"], fresh.step(params, grads, state)[0]["w"]
    )
    unscheduled = optimizer.step(params, grads, state)[0]["w"]
    assert not np.array_equal(scheduled.step(params, grads, state)[0]["w"], unscheduled)
