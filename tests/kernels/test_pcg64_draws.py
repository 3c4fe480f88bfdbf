"""The device draw of dropout keep-masks (:mod:`refimpl.kernels.pcg64_draws`): its twin bitwise
NumPy's own ``rng.random(shape) >= p``, the generator left exactly as that draw leaves it (the
buffered half of a 32-bit draw included), and a generator other than NumPy's PCG64 left to the
host. The kernel's CUDA source itself is held to the twin in test_pcg64_host_build.py."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import to_numpy
from refimpl.kernels import pcg64_draws
from refimpl.kernels.pcg64_draws import (
    BLOCK,
    MAX_BLOCKS,
    Draws,
    draws_on_device,
    jump,
    keep_mask,
    keep_mask_twin,
    take_draws,
)
from refimpl.testing import strict
from refimpl.testing.strategies import seeds

PROBABILITIES = [0.0, 0.5, 0.6, 1 - 2**-53]  # 1 - 2^-53: the largest double below 1
SHAPES = [(), (0,), (2, 0), (1,), (7,), (3, 5), (2, 3, 37), (BLOCK * MAX_BLOCKS + 3,)]


def earlier_draws(rng: np.random.Generator, doubles: int, words: int) -> None:
    """Draws before the mask: doubles step the LCG once each; an odd count of 32-bit integers
    leaves half of a 64-bit output buffered (``has_uint32``)."""
    rng.random(doubles)
    rng.integers(0, 2**32, size=words, dtype=np.uint32)


def device_and_host(seed: int, shape: tuple, p: float, doubles: int, words: int) -> tuple:
    """``(keep, state)`` of the device draw (the twin, as the strict stand-in runs it), then of
    NumPy's draw, from generators seeded and drawn from alike."""
    device, host = np.random.default_rng(seed), np.random.default_rng(seed)
    earlier_draws(device, doubles, words)
    earlier_draws(host, doubles, words)
    keep = to_numpy(keep_mask(strict, device, shape, p))
    return keep, device.bit_generator.state, host.random(shape) >= p, host.bit_generator.state


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("p", PROBABILITIES)
@pytest.mark.parametrize(("doubles", "words"), [(0, 0), (3, 0), (0, 1), (2, 3)])
def test_twin_is_numpys_draw_bitwise_and_leaves_its_state(shape, p, doubles, words):
    keep, state, want, want_state = device_and_host(len(shape) + 7, shape, p, doubles, words)
    assert keep.dtype == bool and keep.shape == np.shape(want)
    assert keep.tobytes() == np.asarray(want).tobytes()
    assert state == want_state


@given(
    st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
    st.sampled_from([*PROBABILITIES, 0.1, 0.999]),
    seeds(),
    st.integers(0, 5),
    st.integers(0, 5),
)
def test_twin_is_numpys_draw_for_any_shape_and_history(shape, p, seed, doubles, words):
    keep, state, want, want_state = device_and_host(seed, shape, p, doubles, words)
    assert keep.tobytes() == np.asarray(want).tobytes()
    assert state == want_state


def on_grid(draws: Draws, blocks: int) -> Draws:
    """``draws`` launched on ``blocks`` blocks: the stride constants K3 reads follow the grid."""
    stride_mult, stride_plus = jump(blocks * BLOCK, draws.inc)
    return dataclasses.replace(
        draws, blocks=blocks, stride_mult=stride_mult, stride_plus=stride_plus
    )


@pytest.mark.parametrize("blocks", [1, 2, 3])
@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK, 3 * BLOCK + 1, 7 * BLOCK + 5])
def test_every_grid_strides_to_the_same_draw(blocks, n):
    # K3 (a thread's next entry T later) runs only when n > T: a smaller grid than take_draws
    # picks makes each thread step several times, as the largest masks do on a device.
    draws, host = on_grid(take_draws(np.random.default_rng(n), n), blocks), np.random.default_rng(n)
    assert keep_mask_twin(draws, 0.6).tobytes() == (host.random(n) >= 0.6).tobytes()


def test_the_next_host_draw_is_unchanged_by_a_device_draw():
    device, host = np.random.default_rng(3), np.random.default_rng(3)
    for rng in (device, host):
        rng.integers(0, 2**32, size=1, dtype=np.uint32)  # half of an output buffered
    keep_mask(strict, device, (4, 5), 0.5)
    _ = host.random((4, 5))
    # the buffered half comes first, then fresh outputs, then doubles from the same state
    assert (
        device.integers(0, 2**32, 3, np.uint32).tolist()
        == host.integers(0, 2**32, 3, np.uint32).tolist()
    )
    assert device.random(9).tobytes() == host.random(9).tobytes()


def test_advance_empties_the_uint32_buffer_that_the_draw_puts_back():
    # NumPy's PCG64.advance(n) steps as n doubles do but also drops a buffered half of a
    # 32-bit draw (has_uint32), which doubles keep: without the put-back a device draw would
    # change the next 32-bit integer drawn. The tests above hold the put-back; this holds why.
    rng = np.random.default_rng(4)
    rng.integers(0, 2**32, size=1, dtype=np.uint32)
    assert rng.bit_generator.state["has_uint32"] == 1
    rng.bit_generator.advance(5)
    assert rng.bit_generator.state["has_uint32"] == 0
    kept = np.random.default_rng(4)
    kept.integers(0, 2**32, size=1, dtype=np.uint32)
    take_draws(kept, 5)
    assert kept.bit_generator.state["has_uint32"] == 1


@pytest.mark.parametrize("k", [0, 1, 2, 3, 1000, 2**64 + 3, 2**128 - 1])
def test_jump_is_numpys_advance(k):
    rng = np.random.default_rng(9)
    before = rng.bit_generator.state["state"]
    a_k, c_k = jump(k, before["inc"])
    rng.bit_generator.advance(k)
    assert rng.bit_generator.state["state"]["state"] == (a_k * before["state"] + c_k) % 2**128


@pytest.mark.parametrize(
    "rng",
    [
        np.random.Generator(np.random.PCG64DXSM(0)),
        np.random.Generator(np.random.MT19937(0)),
        np.random.Generator(np.random.Philox(0)),
        np.random.Generator(type("MyPCG64", (np.random.PCG64,), {})(0)),
    ],
    ids=["PCG64DXSM", "MT19937", "Philox", "a PCG64 subclass"],
)
def test_another_bit_generator_is_left_to_the_host(rng):
    assert draws_on_device(strict, np.random.default_rng(0), 0.5)
    assert not draws_on_device(strict, rng, 0.5)


def test_numpy_and_a_probability_no_double_holds_are_left_to_the_host():
    # On NumPy the host draw is the draw; u >= Fraction(3, 5) compares exactly, which the
    # kernel's double comparison with 0.6 need not match.
    assert not draws_on_device(np, np.random.default_rng(0), 0.5)
    assert not draws_on_device(strict, np.random.default_rng(0), Fraction(3, 5))
    assert draws_on_device(strict, np.random.default_rng(0), np.float32(0.6))  # exact double


def test_a_wrong_multiplier_is_caught(monkeypatch):
    # The comparison must be able to fail: the twin with another odd multiplier differs.
    monkeypatch.setattr(pcg64_draws, "MULT", pcg64_draws.MULT + 2)
    keep, _, want, _ = device_and_host(1, (300,), 0.5, 0, 0)
    assert keep.tobytes() != want.tobytes()


def test_an_off_by_one_jump_is_caught():
    # Entry i is the output after i + 1 steps; a draw from the state one step on (entry i
    # from i + 2 steps) is the host's draw shifted by one, not the host's draw.
    rng, host = np.random.default_rng(2), np.random.default_rng(2)
    draws = take_draws(rng, 300)
    a_1, c_1 = jump(1, draws.inc)
    shifted = dataclasses.replace(draws, state=(a_1 * draws.state + c_1) % 2**128)
    want = host.random(301) >= 0.5
    assert keep_mask_twin(shifted, 0.5).tobytes() == want[1:].tobytes()
    assert keep_mask_twin(shifted, 0.5).tobytes() != want[:-1].tobytes()
