"""Dropout's keep-mask drawn on the device (:mod:`refimpl.kernels.pcg64_draws`): on a device
backend with NumPy's PCG64, the mask, the output, its gradient and the generator's state after
the draw are bitwise NumPy's, with no host-to-device copy; with any other generator the host
draw and its copy, as before."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import asarray, to_numpy, use_backend
from refimpl.ops.dropout import Dropout
from refimpl.ops.fused_switch import fused_kernels
from refimpl.testing.strategies import seeds
from refimpl.testing.strict import count_launches


def step_on(backend: str, fused: bool, x: np.ndarray, d_y: np.ndarray, p: float, rng) -> tuple:
    """``(mask, y, d_x, counts)`` of a training forward and backward on ``backend``, the
    forward's launches, syncs and copies counted (strict only)."""
    with use_backend(backend), fused_kernels(fused):
        x_b, d_y_b = asarray(x), asarray(d_y)
        with count_launches() as counts:
            y, cache = Dropout(p).forward_unchecked({}, x_b, training=True, rng=rng)
        d_x, _ = Dropout(p).backward({}, cache, d_y_b)
        return to_numpy(cache.mask), to_numpy(y), to_numpy(d_x), counts


@given(
    st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple),
    st.sampled_from([0.1, 0.5, 0.6, 1 - 2**-53]),
    st.sampled_from([np.float32, np.float64]),
    st.booleans(),
    seeds(),
)
def test_device_draw_is_the_host_step_bitwise(shape, p, dtype, fused, seed):
    data = np.random.default_rng(seed)
    values = (data.standard_normal((2, *shape)) * 3).astype(dtype)
    x, d_y = values[0, ...], values[1, ...]  # 0-d arrays where shape is ()
    host_rng, device_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    for rng in (host_rng, device_rng):  # half of a 32-bit draw buffered
        rng.integers(0, 2**32, size=1, dtype=np.uint32)
    want_y, cache = Dropout(p).forward({}, x, training=True, rng=host_rng)
    want_d_x, _ = Dropout(p).backward({}, cache, d_y)
    mask, y, d_x, counts = step_on("strict", fused, x, d_y, p, device_rng)
    assert mask.tobytes() == cache.mask.tobytes()
    assert y.tobytes() == want_y.tobytes() and d_x.tobytes() == want_d_x.tobytes()
    assert device_rng.bit_generator.state == host_rng.bit_generator.state
    # the draw is a launch (fused: the same launch as keep-and-scale), never a copy
    assert (counts.launches, counts.syncs, counts.copies) == ((1 if fused else 3), 0, 0)


@pytest.mark.parametrize("fused", [False, True])
def test_another_generator_draws_on_the_host_as_before(fused):
    def generator():
        return np.random.Generator(np.random.MT19937(5))

    x = np.random.default_rng(0).standard_normal((30, 7))
    want, _ = Dropout(0.6).forward({}, x, training=True, rng=generator())
    mask, y, _, counts = step_on("strict", fused, x, x, 0.6, generator())
    assert y.tobytes() == want.tobytes()
    assert mask.tobytes() == (generator().random(x.shape) >= 0.6).tobytes()
    assert (counts.launches, counts.copies) == ((1 if fused else 2), 1)  # the mask's copy


@pytest.mark.parametrize("fused", [False, True])
def test_a_given_mask_draws_nothing_on_the_device(fused):
    x = np.random.default_rng(1).standard_normal((4, 5))
    keep = np.random.default_rng(2).random(x.shape) >= 0.5
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    with use_backend("strict"), fused_kernels(fused):
        y, cache = Dropout(0.5).forward({}, asarray(x), training=True, rng=rng, mask=asarray(keep))
    assert to_numpy(cache.mask).tobytes() == keep.tobytes()
    assert to_numpy(y).tobytes() == Dropout(0.5).forward({}, x, True, mask=keep)[0].tobytes()
    assert rng.bit_generator.state == state
