"""``SoftmaxCrossEntropy`` inside ``fused_kernels()``: one launch each way on a device backend
(:mod:`refimpl.kernels.cross_entropy`), bitwise the literal loss on the strict stand-in, and
the literal loss on NumPy and outside the block."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.backend import asarray, to_numpy, use_backend
from refimpl.nn.gat import fused_kernels
from refimpl.ops.losses import SoftmaxCrossEntropy
from refimpl.testing.strict import count_launches
from refimpl.validation import check_input

LOSS = SoftmaxCrossEntropy()


def loss_and_gradient(backend: str, fused: bool, dtype: type) -> tuple:
    """``(loss, d_logits, launches)`` of the loss on 140 of 300 rows, seven classes, host;
    the launches not counting the logits' finiteness check (queued in a training step)."""
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((300, 7)) * 3).astype(dtype)
    labels, train = rng.integers(0, 7, 300), np.arange(300) < 140
    with use_backend(backend):
        logits, labels, train = asarray(logits), asarray(labels), asarray(train)
        selection = LOSS.select(labels, train, 7, logits.dtype)
        with fused_kernels(fused), count_launches() as counts:
            loss, cache = LOSS.forward({}, logits, labels, selection)
            d_logits, _ = LOSS.backward({}, cache, 0.75)
        with count_launches() as check:
            check_input(logits, "logits", ndim=2)
        return to_numpy(loss), to_numpy(d_logits), counts.launches - check.launches


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_loss_is_one_launch_each_way_and_bitwise_the_literal_loss(dtype):
    loss, d_logits, launches = loss_and_gradient("strict", True, dtype)
    assert launches == 2
    for backend, fused in [("strict", False), ("numpy", True), ("numpy", False)]:
        other_loss, other_d, _ = loss_and_gradient(backend, fused, dtype)
        assert other_loss.tobytes() == loss.tobytes()
        assert other_d.tobytes() == d_logits.tobytes()
    assert loss_and_gradient("strict", False, dtype)[2] > 2  # outside the block: literal
