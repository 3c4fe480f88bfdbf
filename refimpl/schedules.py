"""Learning-rate schedules with explicit state: ``MultiStepLR`` and ``ReduceLROnPlateau``, as
``torch.optim.lr_scheduler`` defines them.

A schedule is a frozen configuration, like the optimisers of :mod:`refimpl.optim`; its state is
a small dict of Python numbers that the caller owns and threads through the loop::

    schedule = ReduceLROnPlateau(factor=0.5, patience=25)
    state = schedule.init(lr=1e-3)
    for epoch in range(epochs):
        ...                                     # train with with_lr(optimizer, state["lr"])
        state = schedule.step(state, val_loss)  # pure: the old state is never mutated
    state = schedule.load_state(saved)          # checked; resumes bit for bit

State layout: ``"lr"`` (the learning rate the next optimiser step uses) and ``"last_epoch"``
(the number of ``step`` calls, torch's ``last_epoch``); ``ReduceLROnPlateau`` adds ``"best"``,
``"num_bad_epochs"`` and ``"cooldown_counter"`` (torch's attributes of those names). Every
value is a Python ``int`` or ``float``: a checkpoint stores them as 0-d int64 / float64 arrays,
which hold them exactly. The arithmetic is torch's, operation for operation, on Python floats,
so the learning-rate sequence equals torch's bit for bit (``tests/test_schedules.py``).

Differences from torch: one learning rate (torch keeps one per parameter group);
``ReduceLROnPlateau.step`` refuses a metric that is NaN or infinite (torch counts NaN as a bad
epoch without a word); ``step`` takes no ``epoch`` argument (deprecated in torch).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "SCHEDULES",
    "MultiStepLR",
    "ReduceLROnPlateau",
    "Schedule",
    "check_schedule",
    "with_lr",
]

State = dict[str, Any]


@dataclass(frozen=True)
class MultiStepLR:
    """Multiply the learning rate by ``gamma`` at each milestone, as
    ``torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma)``.

    After the ``t``-th call of :meth:`step` (``last_epoch = t``) the learning rate is
    ``lr * gamma ** c`` where ``c`` counts the milestones equal to ``t`` (a milestone listed
    twice multiplies by ``gamma ** 2``, as torch's ``Counter`` does); a milestone 0 applies at
    :meth:`init`, as torch's constructor applies it. Whether one step is an epoch or an
    optimiser step is the caller's choice (NodeFormer's ``main-batch.py`` steps per batch).

    Parameters
    ----------
    milestones : sequence of int
        The step counts (``last_epoch``) at which the rate is multiplied by ``gamma``: one or
        more ints ``>= 0``, any order, repeats allowed; no default (torch has none).
    gamma : float, default 0.1
        The factor applied at each milestone, finite and ``> 0`` (PyTorch's default).
    """

    milestones: tuple[int, ...]  # no default: torch has none
    gamma: float = 0.1  # PyTorch default

    needs_metric: ClassVar[bool] = False

    def __post_init__(self) -> None:
        milestones = self.milestones
        if isinstance(milestones, (str, bytes)) or not hasattr(milestones, "__iter__"):
            raise TypeError(f"MultiStepLR milestones must be a list of ints, got {milestones!r}")
        milestones = tuple(milestones)
        if not milestones or not all(_is_int(m) and m >= 0 for m in milestones):
            raise ValueError(
                f"MultiStepLR milestones must be one or more ints >= 0, got {milestones!r}"
            )
        object.__setattr__(self, "milestones", tuple(sorted(int(m) for m in milestones)))
        gamma = _real("MultiStepLR gamma", self.gamma)
        if not gamma > 0:  # gamma 0 would set lr 0, which the optimisers refuse
            raise ValueError(f"MultiStepLR gamma must be > 0, got {gamma!r}")
        object.__setattr__(self, "gamma", gamma)

    def init(self, lr: float) -> State:
        """The state before the first step: ``lr`` (times ``gamma`` per milestone 0)."""
        return self._decay({"lr": _lr(lr), "last_epoch": 0})

    def step(self, state: Mapping[str, Any], metric: Any = None) -> State:
        """The state after one more epoch (or batch): ``last_epoch + 1``, decayed at a
        milestone. ``metric`` must be ``None``: this schedule reads none."""
        if metric is not None:
            raise TypeError("MultiStepLR.step takes no metric; ReduceLROnPlateau reads one")
        state = self.load_state(state)
        return self._decay({**state, "last_epoch": state["last_epoch"] + 1})

    def _decay(self, state: State) -> State:
        count = self.milestones.count(state["last_epoch"])
        if count:  # torch: group["lr"] * self.gamma ** self.milestones[self.last_epoch]
            state["lr"] = state["lr"] * self.gamma**count
        return state

    def load_state(self, state: Mapping[str, Any]) -> State:
        """A checked plain copy of ``state`` (e.g. read back from a checkpoint)."""
        return _load_state("MultiStepLR", state, {"lr": float, "last_epoch": int})


@dataclass(frozen=True)
class ReduceLROnPlateau:
    """Multiply the learning rate by ``factor`` once a metric has stopped improving for more
    than ``patience`` steps, as ``torch.optim.lr_scheduler.ReduceLROnPlateau``.

    A step improves on ``best`` when (``mode``, ``threshold_mode``):

    - ``min, rel``: ``metric < best * (1 - threshold)``;  ``min, abs``: ``metric < best -
      threshold``
    - ``max, rel``: ``metric > best * (threshold + 1)``;  ``max, abs``: ``metric > best +
      threshold``

    else it is a bad step. During ``cooldown`` steps after a reduction bad steps are not
    counted. A reduction sets ``lr = max(lr * factor, min_lr)`` unless that changes ``lr`` by
    ``eps`` or less (torch's rule: the learning rate then stays). ``best`` starts at ``+inf``
    (``min``) or ``-inf`` (``max``). All defaults are PyTorch's.

    Parameters
    ----------
    mode : {"min", "max"}, default "min"
        ``"min"`` for a metric that should fall (a loss), ``"max"`` for one that should rise
        (an accuracy).
    factor : float, default 0.1
        What a reduction multiplies the learning rate by, in ``(0, 1)``.
    patience : int, default 10
        Bad steps tolerated before a reduction, ``>= 0``.
    threshold : float, default 1e-4
        The least change that counts as an improvement, ``>= 0`` (relative or absolute, by
        ``threshold_mode``).
    threshold_mode : {"rel", "abs"}, default "rel"
        Whether ``threshold`` is relative to ``best`` or absolute (the rules above).
    cooldown : int, default 0
        Steps after a reduction whose bad steps are not counted, ``>= 0``.
    min_lr : float, default 0.0
        The learning rate never goes below it, ``>= 0``.
    eps : float, default 1e-8
        A reduction that changes the learning rate by ``eps`` or less is not made, ``>= 0``.
    """

    mode: str = "min"  # "min": a loss; "max": an accuracy
    factor: float = 0.1  # PyTorch default; in (0, 1)
    patience: int = 10  # PyTorch default: bad steps tolerated before a reduction
    threshold: float = 1e-4  # PyTorch default: the least change that counts as improvement
    threshold_mode: str = "rel"  # PyTorch default
    cooldown: int = 0  # PyTorch default: steps after a reduction whose bad steps do not count
    min_lr: float = 0.0  # PyTorch default: the learning rate never goes below it
    eps: float = 1e-8  # PyTorch default: smaller changes of the learning rate are not made

    needs_metric: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name, choices in (("mode", ("min", "max")), ("threshold_mode", ("rel", "abs"))):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"ReduceLROnPlateau {name} must be one of {choices}, "
                    f"got {getattr(self, name)!r}"
                )
        factor = _real("ReduceLROnPlateau factor", self.factor)
        if not 0 < factor < 1:  # torch refuses >= 1; 0 would set lr 0 (or min_lr) at once
            raise ValueError(f"ReduceLROnPlateau factor must be in (0, 1), got {factor!r}")
        for name in ("patience", "cooldown"):
            if not (_is_int(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(
                    f"ReduceLROnPlateau {name} must be an int >= 0, got {getattr(self, name)!r}"
                )
        for name in ("factor", "threshold", "min_lr", "eps"):
            value = _real(f"ReduceLROnPlateau {name}", getattr(self, name))
            if value < 0:
                raise ValueError(f"ReduceLROnPlateau {name} must be >= 0, got {value!r}")
            object.__setattr__(self, name, value)

    def init(self, lr: float) -> State:
        """The state before the first step (torch's ``_reset``)."""
        best = math.inf if self.mode == "min" else -math.inf
        return {
            "lr": _lr(lr),
            "last_epoch": 0,
            "best": best,
            "num_bad_epochs": 0,
            "cooldown_counter": 0,
        }

    def step(self, state: Mapping[str, Any], metric: Any = None) -> State:
        """The state after one more step with ``metric`` (torch's ``step(metrics)``, line for
        line); ``ValueError`` if ``metric`` is missing, NaN or infinite."""
        state = self.load_state(state)
        if metric is None:
            raise TypeError("ReduceLROnPlateau.step needs the metric it watches")
        current = _real("ReduceLROnPlateau.step metric", metric)
        state["last_epoch"] += 1
        if self._is_better(current, state["best"]):
            state["best"], state["num_bad_epochs"] = current, 0
        else:
            state["num_bad_epochs"] += 1
        if state["cooldown_counter"] > 0:  # torch's in_cooldown
            state["cooldown_counter"] -= 1
            state["num_bad_epochs"] = 0  # bad steps in cooldown are ignored
        if state["num_bad_epochs"] > self.patience:
            old_lr = state["lr"]
            new_lr = max(old_lr * self.factor, self.min_lr)
            if old_lr - new_lr > self.eps:
                state["lr"] = new_lr
            state["cooldown_counter"], state["num_bad_epochs"] = self.cooldown, 0
        return state

    def _is_better(self, current: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return current < best * (1.0 - self.threshold)
        if self.mode == "min":
            return current < best - self.threshold
        if self.threshold_mode == "rel":
            return current > best * (self.threshold + 1.0)
        return current > best + self.threshold

    def load_state(self, state: Mapping[str, Any]) -> State:
        """A checked plain copy of ``state`` (e.g. read back from a checkpoint)."""
        kinds = {"lr": float, "last_epoch": int, "best": float}
        kinds |= {"num_bad_epochs": int, "cooldown_counter": int}
        loaded = _load_state("ReduceLROnPlateau", state, kinds)
        if math.isnan(loaded["best"]):
            raise ValueError("ReduceLROnPlateau state['best'] is NaN: the state is damaged")
        return loaded


Schedule = MultiStepLR | ReduceLROnPlateau
SCHEDULES: dict[str, type] = {"multistep": MultiStepLR, "plateau": ReduceLROnPlateau}


def with_lr(optimizer: Any, lr: float) -> Any:
    """``optimizer`` with learning rate ``lr``.

    The optimiser's state does not depend on the learning rate, so it carries over, as in
    torch where a scheduler edits ``group["lr"]``.

    Parameters
    ----------
    optimizer : refimpl.optim.SGD or refimpl.optim.Adam
        A frozen optimiser configuration; not modified.
    lr : float
        The new learning rate (the schedule state's ``"lr"``); the optimiser checks it (finite,
        ``> 0``).

    Returns
    -------
    refimpl.optim.SGD or refimpl.optim.Adam
        ``optimizer`` itself when ``lr`` is already its own, else a copy with ``lr`` replaced.
    """
    return optimizer if optimizer.lr == lr else dataclasses.replace(optimizer, lr=lr)


def check_schedule(schedule: Any, every: Any, owner: str) -> None:
    """``schedule`` is ``None`` or a schedule configuration that can be stepped per ``every``.

    Parameters
    ----------
    schedule : MultiStepLR, ReduceLROnPlateau or None
        The schedule to check; ``None`` (no schedule) passes.
    every : {"epoch", "batch"}
        How often it is stepped; ``ReduceLROnPlateau`` only per epoch, where a validation
        metric exists.
    owner : str
        The configuration named in the message, e.g. ``"TrainConfig"``.

    Raises
    ------
    TypeError
        If ``schedule`` is neither ``None`` nor a schedule configuration.
    ValueError
        If ``every`` is unknown, or ``ReduceLROnPlateau`` is to be stepped per batch.
    """
    if schedule is not None and not isinstance(schedule, tuple(SCHEDULES.values())):
        raise TypeError(
            f"{owner} schedule must be None, MultiStepLR or ReduceLROnPlateau "
            f"(refimpl.schedules), got {type(schedule).__name__}"
        )
    if every not in ("epoch", "batch"):
        raise ValueError(f"{owner} schedule_every must be 'epoch' or 'batch', got {every!r}")
    if every == "batch" and getattr(schedule, "needs_metric", False):
        raise ValueError(
            f"{owner}: ReduceLROnPlateau watches a validation metric, measured once per epoch; "
            "set schedule_every='epoch'"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(name: str, value: Any) -> float:
    """A finite real number as a Python float, or one line saying what is wrong."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _lr(lr: Any) -> float:
    value = _real("schedule lr", lr)
    if not value > 0:
        raise ValueError(f"schedule lr must be > 0, got {value!r}")
    return value


def _load_state(owner: str, state: Mapping[str, Any], kinds: dict[str, type]) -> State:
    """``state`` has exactly the keys of ``kinds``, each a number of that kind (a 0-d array from
    a checkpoint counts), counts >= 0 and ``lr`` > 0; returned as Python numbers."""
    if not isinstance(state, Mapping) or set(state) != set(kinds):
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(
            f"{owner} state must hold {sorted(kinds)}, got {found}; was it saved by another "
            "schedule? Create a fresh one with schedule.init(lr)"
        )
    loaded: State = {}
    for key, kind in kinds.items():
        value = state[key]
        value = value.item() if getattr(value, "shape", None) == () else value  # 0-d array
        if kind is int:
            if not (_is_int(value) and value >= 0):
                raise ValueError(f"{owner} state[{key!r}] must be an int >= 0, got {value!r}")
            loaded[key] = int(value)
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{owner} state[{key!r}] must be a number, got {value!r}")
        else:
            loaded[key] = float(value)
    if not (math.isfinite(loaded["lr"]) and loaded["lr"] > 0):
        raise ValueError(f"{owner} state['lr'] must be finite and > 0, got {loaded['lr']!r}")
    return loaded
