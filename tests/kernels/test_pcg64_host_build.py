"""The device draw's CUDA source itself (:mod:`refimpl.kernels.pcg64_draws`, and the fused draw of
:mod:`refimpl.kernels.dropout_fused`), built for the host and run thread by thread, against
NumPy's own draw.

Without a GPU the twin is what CI runs; this shows that the kernel's 128-bit arithmetic in
64-bit halves, its jump (K1), its output (K2) and its stride (K3) are NumPy's PCG64 as
written. ``g++`` builds the source with the CUDA qualifiers as nothing and ``__umul64hi`` as
the high half of a 128-bit product; every thread of every block is run, those past the last
entry included. Skips without ``g++``.
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from refimpl.kernels.dropout_fused import DRAW_SOURCE, keep_and_scale_twin
from refimpl.kernels.pcg64_draws import BLOCK, SOURCE, Draws, take_draws
from tests.kernels.host_build import build
from tests.kernels.test_pcg64_draws import on_grid

SHIM = """
struct Index { unsigned x; };
static Index threadIdx, blockIdx, blockDim, gridDim;
#define __device__
#define __global__
#define __forceinline__ inline
static unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
extern "C" void refimpl_set_thread(unsigned block, unsigned thread, unsigned threads,
                                   unsigned blocks) {
    blockIdx.x = block; threadIdx.x = thread; blockDim.x = threads; gridDim.x = blocks;
}
"""
MULT_HALVES = ("0x2360ED051FC65DA4ULL", "0x4385DF649FCCF645ULL")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the kernel's source cannot be built on the CPU")
    return tmp_path_factory.mktemp("pcg64_host")


@pytest.fixture(scope="module")
def keep_kernel(folder) -> ctypes.CDLL:
    return build(folder, "pcg64_keep", SHIM, SOURCE)


def launch(library: ctypes.CDLL, name: str, draws: Draws, p: float, *tail: np.ndarray) -> None:
    """Every thread of the launch: ``draws.blocks`` blocks of ``BLOCK``, in order; ``tail``
    the kernel's arguments after ``REFIMPL_PCG64_PARAMS`` (arrays as pointers)."""
    *halves, p_arg, n = draws.kernel_arguments(p)
    values = [ctypes.c_ulonglong(int(h)) for h in halves]
    values += [ctypes.c_double(float(p_arg)), ctypes.c_longlong(int(n))]
    for value in tail:
        if isinstance(value, np.ndarray):
            values.append(value.ctypes.data_as(ctypes.c_void_p))
        else:
            values.append(
                ctypes.c_double(value) if value.dtype == np.float64 else ctypes.c_float(value)
            )
    kernel = getattr(library, name)
    for block in range(draws.blocks):
        for thread in range(BLOCK):
            library.refimpl_set_thread(block, thread, BLOCK, draws.blocks)
            kernel(*values)


def built_keep(library: ctypes.CDLL, draws: Draws, p: float) -> np.ndarray:
    """The mask the built ``refimpl_pcg64_keep`` writes, as bytes 0/1 (7 where unwritten)."""
    keep = np.full(draws.n, 7, np.uint8)
    launch(library, "refimpl_pcg64_keep", draws, p, keep)
    return keep


def host_draw(seed: int, n: int, buffered: bool) -> tuple[Draws, np.ndarray]:
    """``(draws, u)``: the device draw's launch from a generator seeded ``seed``, and the
    doubles NumPy's draw gives from the same history (a 32-bit draw first if ``buffered``)."""
    device, host = np.random.default_rng(seed), np.random.default_rng(seed)
    if buffered:
        for rng in (device, host):
            rng.integers(0, 2**32, size=1, dtype=np.uint32)
    return take_draws(device, n), host.random(n)


@pytest.mark.parametrize("n", [1, 5, BLOCK + 1, 3 * BLOCK + 7])
@pytest.mark.parametrize("blocks", [None, 1, 2])  # None: take_draws's grid
@pytest.mark.parametrize("p", [0.0, 0.5, 0.6, 1 - 2**-53])
@pytest.mark.parametrize("buffered", [False, True])
def test_the_built_kernel_is_numpys_draw(keep_kernel, n, blocks, p, buffered):
    draws, u = host_draw(n + buffered, n, buffered)
    if blocks is not None:
        draws = on_grid(draws, blocks)
    assert built_keep(keep_kernel, draws, p).tobytes() == (u >= p).tobytes()


@pytest.mark.parametrize(("dtype", "c_type"), [(np.float32, "float"), (np.float64, "double")])
@pytest.mark.parametrize("blocks", [1, 3])
def test_the_built_fused_draw_is_numpys_draw_kept_and_scaled(folder, dtype, c_type, blocks):
    library = build(
        folder, f"dropout_draw_{c_type}", SHIM, f"#define REFIMPL_T {c_type}\n{DRAW_SOURCE}"
    )
    n, p = 5 * BLOCK + 3, 0.6
    draws, u = host_draw(blocks, n, buffered=False)
    draws = on_grid(draws, blocks)
    x = (np.random.default_rng(8).standard_normal(n) * 3).astype(dtype)
    scale = x.dtype.type(1 / (1 - p))
    y, keep = np.full(n, np.nan, dtype), np.full(n, 7, np.uint8)
    launch(library, "refimpl_draw_keep_and_scale", draws, p, x, scale, y, keep)
    want_keep = u >= p
    assert keep.tobytes() == want_keep.tobytes()
    assert y.tobytes() == keep_and_scale_twin(x, want_keep, scale).tobytes()


def test_a_wrong_multiplier_in_the_source_is_caught(folder, keep_kernel):
    # The comparison must be able to fail: another odd multiplier (its low half + 2) in K1's
    # jump gives another draw.
    assert SOURCE.count(MULT_HALVES[1]) == 1
    wrong = build(
        folder, "wrong_mult", SHIM, SOURCE.replace(MULT_HALVES[1], "0x4385DF649FCCF647ULL")
    )
    draws, u = host_draw(0, 2 * BLOCK, buffered=False)
    assert built_keep(keep_kernel, draws, 0.5).tobytes() == (u >= 0.5).tobytes()
    assert built_keep(wrong, draws, 0.5).tobytes() != (u >= 0.5).tobytes()


def test_an_off_by_one_jump_in_the_source_is_caught(folder):
    # Entry i is the output after i + 1 steps; a kernel that jumps i steps draws the host's
    # doubles shifted by one (entry 0 from the state before any step).
    assert SOURCE.count("t + 1)") == 1
    early = build(folder, "off_by_one", SHIM, SOURCE.replace("t + 1)", "t)"))
    draws, u = host_draw(1, 300, buffered=False)
    before = np.random.default_rng(1)
    before.bit_generator.advance(-1)  # one step back: its first double is the state's own
    shifted = before.random(300) >= 0.5
    got = built_keep(early, draws, 0.5)
    assert got.tobytes() == shifted.tobytes()
    assert got.tobytes() != (u >= 0.5).tobytes()
