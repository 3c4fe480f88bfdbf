"""A deferred training step reads its checks, its loss and Adam's flag in one launch and one
sync (:func:`refimpl.train.guards.deferred_step`, :mod:`refimpl.kernels.finite`), and still
returns and raises what the checked step (NumPy, read as it goes) returns and raises."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import Graph
from refimpl.backend import asarray, use_backend
from refimpl.kernels.adam import AdamScalars, adam_twin
from refimpl.models import GAT
from refimpl.ops.losses import SoftmaxCrossEntropy
from refimpl.optim import Adam
from refimpl.testing.strict import count_launches
from refimpl.train.guards import TrainingDiverged, deferred_step
from refimpl.train.node_step import node_step


class ScaledLoss(SoftmaxCrossEntropy):
    """Cross-entropy times ``scale``: a NaN or a huge loss from finite logits."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def forward(self, params, logits, *targets):
        value, cache = super().forward(params, logits, *targets)
        return value * self.scale, cache


def one_step(backend: str, lr: float = 0.005, loss=None, deferred: bool = True):
    """One small GAT step: ``(loss, params on the host, step calls, sync count)`` or the error."""
    rng = np.random.default_rng(3)
    graph = Graph(rng.integers(0, 30, (2, 120)), 30)
    x, y = rng.standard_normal((30, 6)), rng.integers(0, 3, 30)
    model = GAT(6, 4, 3, 2, heads=(2, 1), version="v1", dropout=0.5)
    calls = []
    with use_backend(backend):
        x, y, train = asarray(x), asarray(y), asarray(np.arange(30) < 15)
        params = model.init_params(np.random.default_rng(0), backend=backend)
        optimizer, loss = Adam(lr=lr), loss or SoftmaxCrossEntropy()
        state, noise = optimizer.init(params), np.random.default_rng(1)
        data = (x, y, loss.select(y, train, 3, x.dtype), graph)

        def run():
            calls.append(1)
            return node_step(model, params, state, optimizer, None, data, loss, 0, noise)

        try:
            with count_launches() as counts:
                step_loss, _, _, (new, _) = deferred_step(run, noise) if deferred else run()
        except TrainingDiverged as error:
            return error, None, len(calls), None
    host = {k: np.asarray(asarray(v, backend="numpy")) for k, v in new.items()}
    return step_loss, host, len(calls), counts.syncs


def test_a_deferred_steps_loss_is_the_checked_float_read_in_the_steps_one_sync():
    loss, params, calls, syncs = one_step("strict")
    expected, expected_params, _, _ = one_step("numpy", deferred=False)
    assert type(loss) is float and loss == expected  # bit for bit: float(loss) widened exactly
    assert (calls, syncs) == (1, 1)  # no rerun; float(loss) is no sync of its own
    for name, value in expected_params.items():
        np.testing.assert_array_equal(params[name], value, err_msg=name)


@pytest.mark.parametrize(
    "case, lr, scale",
    [("nan loss", 0.005, np.nan), ("frozen optimiser", 1e-30, 1.0)],
)
def test_a_failed_read_reruns_checked_and_raises_the_checked_steps_error(case, lr, scale):
    # the NaN loss comes from finite logits and gradients: only the loss read catches it; the
    # frozen optimiser (every update rounds away) only Adam's flag, which no longer has its 2
    expected, *_ = one_step("numpy", lr=lr, loss=ScaledLoss(scale), deferred=False)
    got, _, calls, _ = one_step("strict", lr=lr, loss=ScaledLoss(scale))
    assert isinstance(expected, TrainingDiverged) and str(got) == str(expected)
    assert calls == 2  # the deferred run, then the checked one
    assert ("loss nan" if case == "nan loss" else "the optimiser is frozen") in str(got)


def test_a_loss_past_the_rules_floor_reruns_checked_which_weighs_it_and_may_pass():
    # 1e5 times cross-entropy is over LOSS_GROWTH * LOSS_FLOOR, but so is the zero output's:
    # the read cannot weigh it (no reference there), the checked rerun does, and passes
    loss, params, calls, _ = one_step("strict", loss=ScaledLoss(1e5))
    expected, expected_params, _, _ = one_step("numpy", loss=ScaledLoss(1e5), deferred=False)
    assert calls == 2 and loss == expected
    for name, value in expected_params.items():
        np.testing.assert_array_equal(params[name], value, err_msg=name)


@pytest.mark.parametrize(
    "grad, decay, bits", [(0.0, 0.0, 0), (1e-3, 0.0, 2), (0.0, 0.5, 2), (np.inf, 0.0, 3)]
)
def test_adams_flag_has_2_exactly_when_an_entry_changed_and_1_when_one_is_not_finite(
    grad, decay, bits
):
    w = np.array([1.0, -2.0, 0.5], np.float32)
    g = np.full(3, grad, np.float32)
    scalars = AdamScalars(decay, 0.1, 0.9, 0.999, 1e-3, 1e-3**0.5, 1e-8, -0.01, decay != 0, True)
    flag = np.zeros(1, np.int32)
    zeros = [np.zeros(3, np.float32)]
    [w_new], _, _ = adam_twin([w], [g], zeros, zeros, *scalars, flag)
    assert flag[0] == bits
    assert (flag[0] & 2 != 0) == (not np.array_equal(w_new, w))  # array_equal's verdict
