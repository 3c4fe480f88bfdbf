"""The fused cross-entropy kernels' twins (:mod:`refimpl.kernels.cross_entropy`) against the
literal :class:`refimpl.ops.losses.SoftmaxCrossEntropy`.

The twins make the literal loss's operations in its order, its sums in NumPy's pairwise
order included, so they are held bitwise (a tolerance would hide an order slip): the loss,
the softmax kept for the backward and ``d_logits``, compared as bytes (the sign of a zero
too). The literal loss runs on NumPy; the launchers run the twins on the strict stand-in as
one launch each. On CuPy, when a device is here, the kernels are held to the twins within
the exponential's and logarithm's rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import asarray, get_array_module, to_numpy, use_backend
from refimpl.kernels.cross_entropy import (
    cross_entropy_backward,
    cross_entropy_backward_twin,
    cross_entropy_forward,
    cross_entropy_forward_twin,
    pairwise_sum_twin,
)
from refimpl.ops.losses import SoftmaxCrossEntropy
from refimpl.testing.strict import count_launches
from refimpl.testing.tolerances import FORWARD_RTOL

LOSS = SoftmaxCrossEntropy()


@st.composite
def loss_inputs(draw: st.DrawFn) -> tuple:
    """``(logits, labels, mask, d_loss)`` on the host: logits from few distinct values (ties)
    scaled up to near float32's largest (``z - max`` overflows to -inf there), masks selecting one
    row, every row (``None`` or all True) or some."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    num_rows = draw(st.integers(1, 40))
    k = draw(st.sampled_from([1, 2, 7, 8, 9, 17, 130]))
    levels = draw(st.lists(st.floats(-1, 1, width=32), min_size=1, max_size=4))
    scale = draw(st.sampled_from([4.0, 1e-30, 1e30, 3e38]))  # 3e38: finite, z - max is not
    picks = draw(st.lists(st.integers(0, len(levels) - 1), min_size=num_rows * k,
                          max_size=num_rows * k))  # fmt: skip
    logits = (np.array(levels)[picks].reshape(num_rows, k) * scale).astype(dtype)
    labels = np.array(draw(st.lists(st.integers(0, k - 1), min_size=num_rows,
                                    max_size=num_rows)))  # fmt: skip
    kind = draw(st.sampled_from(["none", "all", "one", "some"]))
    mask = None if kind == "none" else np.ones(num_rows, bool)
    if kind == "one":
        mask = np.arange(num_rows) == draw(st.integers(0, num_rows - 1))
    elif kind == "some":
        mask = np.array(draw(st.lists(st.booleans(), min_size=num_rows, max_size=num_rows)))
        mask[draw(st.integers(0, num_rows - 1))] = True
        labels[~mask] = -1  # never read outside the mask
    d_loss = draw(st.sampled_from([1.0, 0.0, -2.5, 3e-3]))
    return logits, labels, mask, d_loss


def literal(logits, labels, mask, d_loss) -> tuple:
    """The literal loss on NumPy: ``(loss, probs, d_logits, selection)``."""
    selection = LOSS.select(labels, mask, logits.shape[1], logits.dtype)
    with np.errstate(over="ignore"):
        loss, cache = LOSS.forward({}, logits, labels, selection)
    d_logits, _ = LOSS.backward({}, cache, d_loss)
    return loss, cache.probs, d_logits, selection


def assert_same_bits(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"{got!r} != {want!r}"


@given(loss_inputs())
@example((np.array([[3.0]], np.float32), np.array([0]), None, 1.0))  # one row, K = 1: loss 0
@example((np.array([[-0.0, 0.0], [0.0, -0.0]]), np.array([0, 1]), None, 0.0))  # zero ties
@example((np.array([[3e38, -3e38, 0.0]], np.float32), np.array([1]), None, 1.0))  # loss inf
def test_twins_are_bitwise_the_literal_loss(inputs):
    logits, labels, mask, d_loss = inputs
    loss, probs, d_logits, selection = literal(logits, labels, mask, d_loss)
    rows, one_hot, weight = selection.rows, selection.one_hot, selection.weight
    twin_loss, twin_probs = cross_entropy_forward_twin(logits, rows, one_hot, weight)
    assert_same_bits(twin_loss, loss)
    assert_same_bits(twin_probs, probs)
    d_twin = cross_entropy_backward_twin(probs, one_hot, weight, rows, d_loss, logits.shape[0])
    assert_same_bits(d_twin, d_logits)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pairwise_sum_twin_is_numpys_sum(dtype):
    # Every branch of NumPy's pairwise_sum: under 8 terms, the 8 strided partial sums with a
    # rest, and the split at a multiple of 8 (several levels deep), against NumPy itself.
    rng = np.random.default_rng(0)
    for n in [*range(0, 140), 255, 256, 257, 1000, 8193, 20000]:
        terms = (rng.standard_normal((3, n)) * 10.0 ** rng.uniform(-6, 6, (3, n))).astype(dtype)
        assert_same_bits(pairwise_sum_twin(terms), terms.sum(axis=1))
        assert_same_bits(pairwise_sum_twin(terms[0]), terms[0].sum())


def test_launchers_run_each_twin_as_one_launch_on_strict():
    rng = np.random.default_rng(1)
    logits, labels = rng.standard_normal((30, 7)).astype(np.float32), rng.integers(0, 7, 30)
    mask = rng.random(30) < 0.5
    loss, probs, d_logits, _ = literal(logits, labels, mask, 1.0)
    with use_backend("strict"):
        s_logits, s_labels, s_mask = asarray(logits), asarray(labels), asarray(mask)
        selection = LOSS.select(s_labels, s_mask, 7, s_logits.dtype)
        sel = (selection.rows, selection.one_hot, selection.weight)
        xp = get_array_module(s_logits)
        with count_launches() as counts:
            s_loss, s_probs = cross_entropy_forward(xp, s_logits, *sel)
        assert (counts.launches, counts.syncs, counts.copies) == (1, 0, 0)
        with count_launches() as counts:
            s_d_logits = cross_entropy_backward(xp, s_probs, *sel[1:], selection.rows, 1.0, 30)
        assert (counts.launches, counts.syncs, counts.copies) == (1, 0, 0)
        got = [to_numpy(a) for a in (s_loss, s_probs, s_d_logits)]
    for one, other in zip(got, (loss, probs, d_logits), strict=True):
        assert_same_bits(one, other)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_device_kernels_match_their_twins(dtype):
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(2)
    for num_rows, k in [(1, 1), (2708, 7), (500, 130)]:  # 300 rows: the block strides twice
        logits = (rng.standard_normal((num_rows, k)) * 4).astype(dtype)
        mask = rng.random(num_rows) < 0.4
        mask[0] = True
        labels = rng.integers(0, k, num_rows)
        loss, probs, d_logits, _ = literal(logits, labels, mask, 0.5)
        with use_backend("cupy"):
            sel = LOSS.select(asarray(labels), asarray(mask), k, dtype)
            got_loss, got_probs = cross_entropy_forward(
                cupy, asarray(logits), sel.rows, sel.one_hot, sel.weight
            )
            got_d = cross_entropy_backward(
                cupy, asarray(probs), sel.one_hot, sel.weight, sel.rows, 0.5, num_rows
            )
            d_from_array = cross_entropy_backward(
                cupy, asarray(probs), sel.one_hot, sel.weight, sel.rows,
                cupy.asarray(0.5, dtype=dtype), num_rows,
            )  # fmt: skip
        # CUDA's exp and log round differently from NumPy's: the twin's order, not its bits
        np.testing.assert_allclose(to_numpy(got_loss), loss, rtol=FORWARD_RTOL[np.dtype(dtype)])
        np.testing.assert_allclose(to_numpy(got_probs), probs, rtol=FORWARD_RTOL[np.dtype(dtype)])
        # the backward reads the same probs, and makes the same operations: bitwise
        assert_same_bits(to_numpy(got_d), d_logits)
        assert_same_bits(to_numpy(d_from_array), d_logits)
