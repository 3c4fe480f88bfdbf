"""One step of the node-level training loop (:func:`refimpl.train.loop.train_model`, its steps
1-4): the training forward, the loss and its gradients with the divergence guards, the
optimiser's update.

:func:`node_step` runs inside :func:`refimpl.train.guards.deferred_step`, so on a device every
finiteness check of the step, the loss and the optimiser's flag are read once, at its end, in
one launch and one sync (a failed one reruns the step on the checked path, which raises the
same error): the loss it returns (and a model's auxiliary loss, where the model gives its
parts) is then a :class:`refimpl.train.guards.DeferredRead` that ``deferred_step`` replaces
by the float.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.backend import get_array_module
from refimpl.train.guards import (
    DeferredRead,
    TrainingDiverged,
    check_gradients,
    checked_backward,
    checked_forward,
    checked_step,
    first_non_finite,
    loss_of_zero_output,
    loss_passes_at_once,
)
from refimpl.validation import all_finite, finite_queues

__all__ = ["node_gradients", "node_step"]


def node_step(
    model: Any,
    params: dict,
    opt_state: Any,
    optimizer: Any,
    reused: tuple | None,
    data: tuple,
    loss_block: Any,
    epoch: int,
    rng: np.random.Generator,
) -> tuple[float, float, dict, tuple]:
    """Steps 1-4 on one batch: ``(loss, auxiliary loss, gradients, (params, opt_state))``
    after the update; ``reused``: the training forward already made (none drawn: the last
    evaluation forward), else made here with dropout from ``rng``."""
    if reused is None:
        reused = checked_forward(model, params, epoch, data[0], data[3], training=True, rng=rng)
    logits, cache = reused
    step_loss, auxiliary, grads = node_gradients(
        model, params, cache, logits, data, loss_block, epoch
    )
    return step_loss, auxiliary, grads, checked_step(optimizer, params, grads, opt_state, epoch)


def node_gradients(
    model: Any, params: dict, cache: Any, logits: Any, data: tuple, loss_block: Any, epoch: int
) -> tuple[float, float, dict]:
    """The training loss (supervised plus the model's auxiliary loss, if any), the auxiliary
    loss alone (0 without one) and the gradients of every parameter, or
    :class:`TrainingDiverged` naming the first non-finite one or a loss grown past
    :mod:`refimpl.train.guards`' rule."""
    _, y, train_mask, _ = data
    if not all_finite(logits):
        last = getattr(model, "num_layers", 1) - 1
        raise TrainingDiverged(
            f"epoch {epoch}: the logits (output of layer{last}) became non-finite"
        )
    loss, loss_cache = loss_block.forward({}, logits, y, train_mask)
    deferred = get_array_module(logits) is not np and bool(finite_queues())  # read at the end
    auxiliary = _auxiliary(model, cache, deferred)
    d_logits, _ = loss_block.backward({}, loss_cache, 1.0)
    grads = checked_backward(model, params, cache, d_logits, epoch)
    if deferred:

        def train_loss(values: np.ndarray) -> float:  # as float(loss) + auxiliary
            if isinstance(auxiliary, DeferredRead):  # read with the loss: values set together
                return float(values[0]) + auxiliary.result(auxiliary.values)
            return float(values[0]) + auxiliary

        def passes(values: np.ndarray) -> bool:  # else the checked rerun weighs the loss
            return loss_passes_at_once(train_loss(values))  # against its reference

        first_non_finite(grads)  # queues each gradient
        return DeferredRead(loss, passes, train_loss).queue(), auxiliary, grads
    train_loss = float(loss) + auxiliary
    zero_output = loss_of_zero_output(loss_block, logits, y, train_mask)
    check_gradients(train_loss, grads, epoch, zero_output)
    return train_loss, auxiliary, grads


def _auxiliary(model: Any, cache: Any, deferred: bool) -> float | DeferredRead:
    """The model's auxiliary loss (0 without one); in a deferred step, where the model gives
    its parts (``auxiliary_loss_parts``: a weight and an unread array), a queued
    :class:`DeferredRead` whose result is the same float, ``weight * float(array)``."""
    parts_of = getattr(model, "auxiliary_loss_parts", None)
    parts = parts_of(cache) if deferred and parts_of is not None else None
    if parts is not None:
        weight, array = parts
        return DeferredRead(array, lambda values: True, lambda v: weight * float(v[0])).queue()
    auxiliary_loss = getattr(model, "auxiliary_loss", None)
    return auxiliary_loss(cache) if auxiliary_loss is not None else 0.0
