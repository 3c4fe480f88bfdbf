"""Divergence guards shared by the training loops (node level and graph level).

A step can go wrong without raising anything: a loss, gradient or parameter
becomes NaN or infinite; the optimiser's state overflows (float32 Adam's second
moment ``v`` accumulates ``g^2``, infinite once ``|g| > 1.8e19``; the update
``m / sqrt(v)`` is then exactly zero there and the run goes on frozen, exit 0);
or the loss explodes while staying finite. Each guard turns one of these into
:class:`TrainingDiverged`, whose message names the epoch and the layer (and the
state entry, for optimiser state), so a run never ends with numbers that mean
nothing.

The loss-growth rule: the training loss of a step must not exceed
``LOSS_GROWTH * max(reference, LOSS_FLOOR)``, where ``reference`` is the loss
of an all-zero output on the same step's targets: ``log C`` for softmax
cross-entropy over ``C`` classes, ``log 2`` for BCE, ``mean |y|`` for L1,
``mean y^2`` for MSE. A freshly initialised model outputs values near zero, so
its loss is about the reference (the cross-entropy of the initial model is
about ``log C``), and training lowers it. A cross-entropy above ``1e4`` means
the true class gets a (geometric mean) probability below ``exp(-1e4)``, which
is zero in float64 (``exp(-745)`` underflows); an L1 loss that far above is off
by ``1e4`` times the targets' own size: no healthy run gets there. The reference
needs no history, so a resumed run applies the same rule as one never
interrupted, and it is only computed once a loss passes ``LOSS_GROWTH *
LOSS_FLOOR``.

Costs per step: one reduction per gradient, parameter and optimiser-state array
(:func:`refimpl.validation.all_finite`; the optimiser's ``step`` makes the last two and
raises :class:`refimpl.optim.NonFiniteUpdate`, translated here), plus one comparison of a
parameter with its previous value (stopping at the first that changed, which in a healthy
run is the first). Inside :func:`deferred_step` on a device, none of these is read on the
way: the arrays, the loss and Adam's flag (which also tells whether a parameter changed)
are read at the step's end in one launch and one sync.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from refimpl.backend import get_array_module
from refimpl.kernels.finite import finite_read
from refimpl.optim import Adam, NonFiniteUpdate
from refimpl.validation import NonFiniteError, all_finite, finite_queues

__all__ = [
    "LOSS_FLOOR",
    "LOSS_GROWTH",
    "DeferredRead",
    "TrainingDiverged",
    "check_gradients",
    "checked_backward",
    "checked_step",
    "deferred_step",
    "first_non_finite",
    "layer_of",
    "loss_of_zero_output",
    "loss_passes_at_once",
]

LOSS_GROWTH = 1e4  # a loss this many times the zero output's has diverged (module docstring)
LOSS_FLOOR = 1.0  # the reference's floor: targets near zero (L1 on tiny y) leave room to fit


class TrainingDiverged(RuntimeError):
    """A loss, gradient, parameter or optimiser state became NaN or infinite, the loss grew
    by orders of magnitude, or the optimiser froze; the message names epoch and layer."""


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: ``"layer0.W"`` -> ``"layer0"``."""
    return name.split(".", 1)[0]


def first_non_finite(arrays: dict[str, Any]) -> str | None:
    """The name of the first array holding NaN or infinity, or ``None``."""
    for name, value in arrays.items():
        if not all_finite(value):
            return name
    return None


class DeferredRead:
    """A small device array a deferred step reads at its end with its checks
    (:func:`deferred_step`), and what the step makes of it on the host.

    Parameters
    ----------
    array : array
        Float32, float64, int32 or bool, a few entries (a loss, a flag).
    passes : callable
        ``passes(values)``, ``values`` its entries as a float64 ``numpy.ndarray``: whether
        the step may stand; False reruns it on the checked path.
    result : callable, optional
        ``result(values)``: what stands for it in the step's result (a tuple's entry, or
        the result itself) once read; by default the read stays out of the result.
    """

    def __init__(
        self, array: Any, passes: Callable[[np.ndarray], bool], result: Callable | None = None
    ) -> None:
        self.array, self.passes, self.result = array, passes, result
        self.values: np.ndarray | None = None  # set by the read

    def queue(self) -> DeferredRead:
        """Queued in the innermost open deferral (:func:`refimpl.validation.finite_queues`)."""
        finite_queues()[-1].append(self)
        return self


def deferred_step(step: Callable[[], Any], rng: Any = None) -> Any:
    """``step()`` (a training step: forward, loss, backward, optimiser step and the guards
    above) with its finiteness checks deferred on a device backend: each queues its array
    instead of reading it (:func:`refimpl.validation.all_finite`), the values the host needs
    (the loss, the optimiser's flag) are queued as :class:`DeferredRead`, and all are read at
    the end in one launch and one sync (:func:`refimpl.kernels.finite.finite_read`); a
    ``DeferredRead`` in the step's result (a tuple's entry) is replaced by its ``result``.
    When an array is not finite, a read does not pass, or the step raised on the way (a
    non-finite value met before its check was read), the step runs again on the checked
    path from the same state of ``rng`` (its dropout generator), raising the error a checked
    step raises. The step must be pure apart from ``rng``. On NumPy nothing is deferred."""
    if rng is not None and not isinstance(rng, np.random.Generator):
        return step()  # a generator whose state cannot be restored: checked as it goes
    saved = None if rng is None else rng.bit_generator.state
    queues = finite_queues()
    queues.append([])
    try:
        result = step()
        passed = _queue_passes(queues[-1])
    except Exception:
        if not queues[-1]:  # no check was deferred yet: the checked path raises this too
            raise
        passed = False  # rerun below: the checked path names what went wrong first
    finally:
        queues.pop()
    if passed:
        if isinstance(result, tuple):
            return tuple(_resolved(item) for item in result)
        return _resolved(result)
    if rng is not None:
        rng.bit_generator.state = saved
    return step()


def _queue_passes(queue: list[Any]) -> bool:
    """Every array in ``queue`` is finite and every :class:`DeferredRead` passes: one launch
    and one sync. Each read keeps its values for :func:`_resolved`."""
    if not queue:
        return True
    reads = [item for item in queue if isinstance(item, DeferredRead)]
    arrays = [item for item in queue if not isinstance(item, DeferredRead)]
    xp = get_array_module(*arrays, *(read.array for read in reads))
    not_finite, values = finite_read(xp, arrays, [read.array for read in reads])
    for read, read_values in zip(reads, values, strict=True):
        read.values = read_values
    return not not_finite.any() and all(read.passes(read.values) for read in reads)


def _resolved(item: Any) -> Any:
    if isinstance(item, DeferredRead) and item.result is not None:
        return item.result(item.values)
    return item


def checked_forward(model: Any, params: dict, epoch: int, *inputs: Any, **kwargs: Any) -> tuple:
    """``model.forward(params, *inputs, **kwargs)``, with an overflow inside (finite
    parameters and input, non-finite activations) reported as divergence at this epoch,
    naming the layer."""
    try:
        return model.forward(params, *inputs, **kwargs)
    except NonFiniteError as err:
        mode = "training" if kwargs.get("training") else "evaluation"
        raise TrainingDiverged(f"epoch {epoch}: the {mode} forward pass overflowed: {err}") from err


def checked_backward(model: Any, params: dict, cache: Any, d_out: Any, epoch: int) -> dict:
    """``model.backward``'s parameter gradients, with an overflow inside (a cotangent
    between two layers that became non-finite) reported as divergence at this epoch."""
    try:
        _, grads = model.backward(params, cache, d_out, input_grad=False)
    except NonFiniteError as err:
        raise TrainingDiverged(f"epoch {epoch}: the backward pass overflowed: {err}") from err
    return grads


def loss_of_zero_output(loss_block: Any, output: Any, *targets: Any) -> Callable[[], float]:
    """The loss-growth rule's reference, deferred: ``loss_block``'s loss with an all-zero
    array in place of ``output`` on the same ``targets`` (and mask)."""

    def compute() -> float:
        zeros = get_array_module(output).zeros_like(output)
        return float(loss_block.forward({}, zeros, *targets)[0])

    return compute


def loss_passes_at_once(loss: float) -> bool:
    """Whether the loss-growth rule passes ``loss`` without its reference: a loss at most
    ``LOSS_GROWTH * LOSS_FLOOR`` (the reference is at least the floor). NaN does not pass."""
    return loss <= LOSS_GROWTH * LOSS_FLOOR


def check_gradients(
    loss: float, grads: dict[str, Any], epoch: int, zero_output_loss: Callable[[], float]
) -> None:
    """``TrainingDiverged`` when the loss or a gradient is not finite (naming the first), or
    when the loss passes the loss-growth rule (module docstring); ``zero_output_loss()`` (from
    :func:`loss_of_zero_output`) is called only for a large loss."""
    bad = first_non_finite(grads)
    if bad is not None:
        raise TrainingDiverged(
            f"epoch {epoch}: loss {loss}; first non-finite gradient in {layer_of(bad)} ({bad}); "
            "lower the learning rate"
        )
    if not math.isfinite(loss):
        raise TrainingDiverged(
            f"epoch {epoch}: loss {loss} (the gradients are finite); lower the learning rate"
        )
    if loss_passes_at_once(loss):
        return
    reference = max(zero_output_loss(), LOSS_FLOOR)
    if loss > LOSS_GROWTH * reference:
        steepest = max(grads, key=lambda name: _largest_magnitude(grads[name]))
        raise TrainingDiverged(
            f"epoch {epoch}: loss {loss:.4g} is over {LOSS_GROWTH:.0e} times that of an "
            f"all-zero output ({reference:.4g}); the largest gradient is in "
            f"{layer_of(steepest)} ({steepest}); lower the learning rate"
        )


def checked_step(
    optimizer: Any, params: dict[str, Any], grads: dict[str, Any], state: Any, epoch: int
) -> tuple[dict[str, Any], Any]:
    """``optimizer.step``, then ``TrainingDiverged`` if the update made a parameter or an
    entry of the optimiser's state non-finite (the optimiser's :class:`NonFiniteUpdate`, the
    first parameter, else the first state entry), or changed no parameter at all although
    some gradient is non-zero (the optimiser froze: overflowed state, or a learning rate so
    small for the dtype that every update rounds away). A zero update where every gradient
    is zero is a fixed point, not a fault. Inside :func:`deferred_step` on a device, Adam's
    fused kernel raises its flag for both and the flag is read with the step's checks."""
    xp = get_array_module(*params.values()) if params else np
    queues = finite_queues() if xp is not np else None
    fused = queues and params and isinstance(optimizer, Adam)
    flag = xp.zeros(1, dtype=np.int32) if fused else None
    try:
        if flag is None:
            new_params, new_state = optimizer.step(params, grads, state)
        else:  # read with the step's checks: 2 (a parameter changed) and not 1 (non-finite)
            new_params, new_state = optimizer.step(params, grads, state, flag=flag)
            DeferredRead(flag, _moved_and_finite).queue()
            return new_params, new_state
    except NonFiniteUpdate as err:
        bad = err.key
        if err.in_state:
            owner = bad.split(".", 1)[-1]  # "v.layer0.W" -> "layer0.W"
            raise TrainingDiverged(
                f"epoch {epoch}: the update made the optimiser state of {layer_of(owner)} "
                f"non-finite ({bad}); lower the learning rate"
            ) from err
        raise TrainingDiverged(
            f"epoch {epoch}: the update made {layer_of(bad)} non-finite ({bad}); "
            "lower the learning rate"
        ) from err
    if queues and params:  # deferred on a device: "no parameter changed" read at the end
        same = [xp.array_equal(new_params[name], params[name]) for name in params]
        DeferredRead(xp.stack(same).all(), _not_set).queue()  # set: the checked rerun decides
    elif all(_unchanged(new_params[name], params[name]) for name in params):
        moving = next((name for name, g in grads.items() if _largest_magnitude(g) > 0), None)
        if moving is not None:
            raise TrainingDiverged(
                f"epoch {epoch}: the update changed no parameter although the gradient of "
                f"{layer_of(moving)} ({moving}) is non-zero: the optimiser is frozen; check "
                "the learning rate (too small for the dtype, or so large its state overflowed)"
            )
    return new_params, new_state


def _moved_and_finite(flag: np.ndarray) -> bool:
    return flag[0] == 2  # Adam's fused flag: an entry changed (2), none non-finite (1)


def _not_set(flag: np.ndarray) -> bool:
    return flag[0] == 0


def _unchanged(new: Any, old: Any) -> bool:
    return bool(get_array_module(new).array_equal(new, old))


def _largest_magnitude(value: Any) -> float:
    xp = get_array_module(value)
    return float(xp.abs(value).max()) if value.size else 0.0
