"""Dropout keep-masks drawn on the device, bit for bit NumPy's PCG64 draw on the host.

One seed gives one run on every backend (docs/design.md, Randomness): a keep-mask is
``rng.random(shape) >= p`` with the loop's ``numpy.random.Generator``. On a device that
draw and its copy cost more host time than a whole fused step, so this kernel makes the same
draw on the device. NumPy's PCG64 (``numpy/random/src/pcg64``) is the 128-bit LCG
``s <- s * MULT + inc`` (mod 2^128); a draw steps the state, then outputs XSL-RR of the NEW
state, ``rotr64(hi ^ lo, hi >> 58)``, and ``Generator.random()`` is
``(next64 >> 11) * 2^-53``, filling the array in C order. Entry ``i`` of a draw is therefore
the output after ``i + 1`` steps, and ``k`` steps are one affine map,
``s_k = A_k s + C_k`` with ``A_k = MULT^k`` and ``C_k = inc (MULT^k - 1) / (MULT - 1)``,
found by squaring and multiplying over the bits of ``k`` (no division: F. Brown, "Random
number generation with arbitrary stride", 1994; NumPy's ``pcg_advance_lcg_128``). The
kernel (``T`` threads, ``grid x BLOCK``):

    K1  thread t jumps from the generator's state s_0 to s_{t+1} = A_{t+1} s_0 + C_{t+1}
    K2  entry i = t, t + T, t + 2T, ... < n: u_i = (xsl_rr(s_{i+1}) >> 11) * 2^-53,
        keep[i] = u_i >= p (in double)
    K3  then s_{i+T+1} = A_T s_{i+1} + C_T, with (A_T, C_T) computed once on the host

Every entry is written by one thread from integers alone, so nothing depends on scheduling
and the mask is bitwise the host's: ``u_i`` is exact (a 53-bit integer times a power of
two) and the comparison is IEEE. The 128-bit products are 64-bit halves with
``__umul64hi``, so the source asks no ``__int128`` of the compiler. :func:`keep_mask_twin`
is the kernel on NumPy, vectorised across threads (the strict stand-in's one launch,
``strict.run_kernel``). The host side (:func:`take_draws`) reads the generator's state
and advances it exactly as the host draw would have, so the next draw on the host is
unchanged; a generator other than NumPy's PCG64 is left to the host draw
(:func:`draws_on_device`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.backend import backend_name

__all__ = [
    "BLOCK",
    "DEVICE_SOURCE",
    "MAX_BLOCKS",
    "MULT",
    "SOURCE",
    "Draws",
    "cuda_sources",
    "draws_on_device",
    "jump",
    "keep_mask",
    "keep_mask_twin",
    "take_draws",
]

MULT = 0x2360ED051FC65DA44385DF649FCCF645  # PCG64's multiplier (numpy/random/src/pcg64)
BLOCK = 256  # threads per block
MAX_BLOCKS = 1024  # beyond this, threads take every T-th entry (K3)
_MASK64 = (1 << 64) - 1
_MASK128 = (1 << 128) - 1
_TO_UNIT = 2.0**-53  # Generator.random(): (next64 >> 11) * 2^-53

DEVICE_SOURCE = r"""
struct refimpl_u128 { unsigned long long hi, lo; };

__device__ __forceinline__ refimpl_u128 refimpl_u128_of(const unsigned long long hi,
                                                        const unsigned long long lo) {
    refimpl_u128 r; r.hi = hi; r.lo = lo; return r;
}
__device__ __forceinline__ refimpl_u128 refimpl_mul(const refimpl_u128 a, const refimpl_u128 b) {
    refimpl_u128 r;  // mod 2^128: the high halves' product leaves the range
    r.lo = a.lo * b.lo;
    r.hi = __umul64hi(a.lo, b.lo) + a.lo * b.hi + a.hi * b.lo;
    return r;
}
__device__ __forceinline__ refimpl_u128 refimpl_add(const refimpl_u128 a, const refimpl_u128 b) {
    refimpl_u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ULL : 0ULL);  // the low halves' carry
    return r;
}
// K1: s_k = A_k s + C_k, squaring and multiplying over the bits of k
__device__ refimpl_u128 refimpl_pcg64_jump(const refimpl_u128 s, const refimpl_u128 inc,
                                           unsigned long long k) {
    refimpl_u128 cur_mult = refimpl_u128_of(0x2360ED051FC65DA4ULL, 0x4385DF649FCCF645ULL);
    refimpl_u128 cur_plus = inc, acc_mult = refimpl_u128_of(0, 1), acc_plus = refimpl_u128_of(0, 0);
    const refimpl_u128 one = refimpl_u128_of(0, 1);
    while (k > 0) {
        if (k & 1ULL) {
            acc_mult = refimpl_mul(acc_mult, cur_mult);
            acc_plus = refimpl_add(refimpl_mul(acc_plus, cur_mult), cur_plus);
        }
        cur_plus = refimpl_mul(refimpl_add(cur_mult, one), cur_plus);
        cur_mult = refimpl_mul(cur_mult, cur_mult);
        k >>= 1;
    }
    return refimpl_add(refimpl_mul(acc_mult, s), acc_plus);
}
// K2: Generator.random() of the state after a step: XSL-RR, then the top 53 bits
__device__ __forceinline__ double refimpl_pcg64_unit(const refimpl_u128 s) {
    const unsigned long long v = s.hi ^ s.lo;
    const unsigned r = (unsigned)(s.hi >> 58);
    const unsigned long long out = (v >> r) | (v << ((64u - r) & 63u));
    return (double)(out >> 11) * (1.0 / 9007199254740992.0);
}
// A kernel's leading parameters (Draws.kernel_arguments): the 128-bit values as halves
#define REFIMPL_PCG64_PARAMS \
    const unsigned long long state_hi, const unsigned long long state_lo, \
    const unsigned long long inc_hi, const unsigned long long inc_lo, \
    const unsigned long long stride_mult_hi, const unsigned long long stride_mult_lo, \
    const unsigned long long stride_plus_hi, const unsigned long long stride_plus_lo, \
    const double p, const long long n
// K1-K3 around a body that reads entry i's double u (and writes entry i alone)
#define REFIMPL_PCG64_FOR_EACH(...) { \
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; \
    const long long threads = gridDim.x * (long long)blockDim.x; \
    if (t < n) { \
        const refimpl_u128 stride_mult = refimpl_u128_of(stride_mult_hi, stride_mult_lo); \
        const refimpl_u128 stride_plus = refimpl_u128_of(stride_plus_hi, stride_plus_lo); \
        refimpl_u128 s = refimpl_pcg64_jump(refimpl_u128_of(state_hi, state_lo), \
                                            refimpl_u128_of(inc_hi, inc_lo), t + 1); \
        for (long long i = t; i < n; i += threads) { \
            const double u = refimpl_pcg64_unit(s); \
            __VA_ARGS__ \
            s = refimpl_add(refimpl_mul(s, stride_mult), stride_plus); \
        } \
    } \
}
"""

SOURCE = (
    DEVICE_SOURCE
    + r"""
extern "C" __global__ void refimpl_pcg64_keep(REFIMPL_PCG64_PARAMS, bool* keep)
REFIMPL_PCG64_FOR_EACH(keep[i] = u >= p;)  // K2
"""
)


def cuda_sources() -> dict[str, str]:
    """:data:`SOURCE` by name (what CuPy compiles, and the PTX test)."""
    return {"pcg64_keep": SOURCE}


@dataclass(frozen=True)
class Draws:
    """What one launch reads: the generator's state before the draw and the launch's shape.

    Parameters
    ----------
    state : int
        The 128-bit LCG state ``s_0`` before the draw.
    inc : int
        The LCG's (odd) increment.
    n : int
        The number of doubles drawn.
    blocks : int
        Blocks of :data:`BLOCK` threads in the launch; ``T = blocks * BLOCK``.
    stride_mult : int
        ``A_T`` (K3).
    stride_plus : int
        ``C_T`` (K3).
    """

    state: int
    inc: int
    n: int
    blocks: int
    stride_mult: int
    stride_plus: int

    def kernel_arguments(self, p: float) -> tuple:
        """A kernel's leading arguments (``REFIMPL_PCG64_PARAMS``): each 128-bit value as its
        high and low halves, then ``p`` and ``n``."""
        values = (self.state, self.inc, self.stride_mult, self.stride_plus)  # the kernel's order
        halves = [np.uint64(half) for v in values for half in (v >> 64, v & _MASK64)]
        return (*halves, np.float64(p), np.int64(self.n))


def jump(k: int, inc: int) -> tuple[int, int]:
    """``(A_k, C_k)``: ``k`` steps of the LCG as one affine map, ``s_k = A_k s + C_k`` (mod
    2^128), by squaring and multiplying over the bits of ``k`` (K1's loop on Python ints).

    Parameters
    ----------
    k : int
        Steps, ``>= 0``.
    inc : int
        The LCG's increment.

    Returns
    -------
    tuple of int
        ``(MULT^k, inc (MULT^k - 1) / (MULT - 1))``, both mod 2^128.
    """
    cur_mult, cur_plus, acc_mult, acc_plus = MULT, inc, 1, 0
    while k > 0:
        if k & 1:
            acc_mult = acc_mult * cur_mult & _MASK128
            acc_plus = (acc_plus * cur_mult + cur_plus) & _MASK128
        cur_plus = (cur_mult + 1) * cur_plus & _MASK128
        cur_mult = cur_mult * cur_mult & _MASK128
        k >>= 1
    return acc_mult, acc_plus


def draws_on_device(xp: Any, rng: Any, p: Any) -> bool:
    """Whether ``rng.random(shape) >= p`` can be drawn on ``xp``'s device bit for bit: a
    device backend, NumPy's own ``Generator`` over ``PCG64`` (not a subclass, not another
    bit generator, not CuPy's), and ``p`` a double exactly (``u >= p`` is then the double
    comparison the kernel makes).

    Parameters
    ----------
    xp : module
        The array module the mask is wanted on.
    rng : Any
        The generator given.
    p : Any
        The drop probability.

    Returns
    -------
    bool
        True where :func:`keep_mask` may replace the host draw.
    """
    return (
        backend_name(xp) != "numpy"
        and type(rng) is np.random.Generator
        and type(rng.bit_generator) is np.random.PCG64
        and float(p) == p
    )


def take_draws(rng: np.random.Generator, n: int) -> Draws:
    """The state ``n`` draws of doubles start from, and the generator advanced past them
    exactly as ``rng.random(n)`` would have left it.

    ``PCG64.advance(n)`` steps the LCG ``n`` times, as ``n`` doubles do (one 64-bit output
    each), but also empties the buffered half of a 32-bit draw (``has_uint32``,
    ``uinteger``), which doubles leave alone: the buffer is put back.

    Parameters
    ----------
    rng : numpy.random.Generator
        Over ``PCG64`` (:func:`draws_on_device`).
    n : int
        The number of doubles.

    Returns
    -------
    Draws
        What the launch reads.
    """
    bit_generator = rng.bit_generator
    with bit_generator.lock:  # as NumPy's draws: no other thread draws in between
        before = bit_generator.state
        bit_generator.advance(n)
        after = bit_generator.state
        after["has_uint32"], after["uinteger"] = before["has_uint32"], before["uinteger"]
        bit_generator.state = after
    state, inc = before["state"]["state"], before["state"]["inc"]
    blocks = min(max(1, -(-n // BLOCK)), MAX_BLOCKS)
    return Draws(state, inc, n, blocks, *jump(blocks * BLOCK, inc))


def _mul(hi: np.ndarray, lo: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """``(hi, lo) * b`` mod 2^128 for uint64 halves and an int ``b``: K's ``refimpl_mul``."""
    b_hi, b_lo = np.uint64(b >> 64), np.uint64(b & _MASK64)
    return _mulhi(lo, b & _MASK64) + lo * b_hi + hi * b_lo, lo * b_lo


def _mulhi(a: np.ndarray, b: int) -> np.ndarray:
    """The high 64 bits of ``a * b`` (``__umul64hi``), from 32-bit halves."""
    low32 = np.uint64(0xFFFFFFFF)
    a1, a0 = a >> np.uint64(32), a & low32
    b1, b0 = np.uint64(b >> 32), np.uint64(b & 0xFFFFFFFF)
    cross1, cross0 = a1 * b0, a0 * b1
    middle = ((a0 * b0) >> np.uint64(32)) + (cross1 & low32) + (cross0 & low32)
    high = a1 * b1 + (cross1 >> np.uint64(32)) + (cross0 >> np.uint64(32))
    return high + (middle >> np.uint64(32))


def _add(hi: np.ndarray, lo: np.ndarray, b_hi: Any, b_lo: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(hi, lo) + (b_hi, b_lo)`` mod 2^128: K's ``refimpl_add``."""
    total = lo + b_lo
    return hi + b_hi + (total < lo).astype(np.uint64), total


def keep_mask_twin(draws: Draws, p: float) -> np.ndarray:
    """The kernel on NumPy (K1-K3), its threads as array entries: ``(n,)`` bool.

    Parameters
    ----------
    draws : Draws
        What the launch reads (:func:`take_draws`).
    p : float
        The drop probability, a double.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` bool, ``keep[i] = u_i >= p``.
    """
    threads = min(draws.n, draws.blocks * BLOCK)  # the threads with an entry
    k = np.arange(1, threads + 1, dtype=np.uint64)  # K1 thread t jumps t + 1 steps
    acc_hi, acc_lo = np.zeros(threads, np.uint64), np.ones(threads, np.uint64)
    plus_hi, plus_lo = np.zeros(threads, np.uint64), np.zeros(threads, np.uint64)
    cur_mult, cur_plus = MULT, draws.inc  # the same at each bit for every thread
    while k.any():
        bit = (k & np.uint64(1)).astype(bool)
        new_plus = _add(*_mul(plus_hi, plus_lo, cur_mult), cur_plus >> 64, cur_plus & _MASK64)
        new_acc = _mul(acc_hi, acc_lo, cur_mult)
        acc_hi, acc_lo = np.where(bit, new_acc[0], acc_hi), np.where(bit, new_acc[1], acc_lo)
        plus_hi, plus_lo = np.where(bit, new_plus[0], plus_hi), np.where(bit, new_plus[1], plus_lo)
        cur_plus = (cur_mult + 1) * cur_plus & _MASK128
        cur_mult = cur_mult * cur_mult & _MASK128
        k >>= np.uint64(1)
    s_hi, s_lo = _add(*_mul(acc_hi, acc_lo, draws.state), plus_hi, plus_lo)
    keep = np.empty(draws.n, bool)
    plus = draws.stride_plus
    for first in range(0, draws.n, max(threads, 1)):  # K2 entries first + t; K3 the next s
        count = min(threads, draws.n - first)
        keep[first : first + count] = _unit(s_hi[:count], s_lo[:count]) >= p
        s_hi, s_lo = _add(*_mul(s_hi, s_lo, draws.stride_mult), plus >> 64, plus & _MASK64)
    return keep


def _unit(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """K2's ``Generator.random()`` of each state: XSL-RR, then the top 53 bits."""
    v, r = hi ^ lo, hi >> np.uint64(58)
    out = (v >> r) | (v << ((np.uint64(64) - r) & np.uint64(63)))
    return (out >> np.uint64(11)).astype(np.float64) * _TO_UNIT


@functools.cache
def _kernel() -> Any:
    import cupy

    module = cupy.RawModule(code=SOURCE, options=("--fmad=false",))
    return module.get_function("refimpl_pcg64_keep")


def keep_mask(xp: Any, rng: np.random.Generator, shape: tuple[int, ...], p: float) -> Any:
    """``rng.random(shape) >= p`` drawn on ``xp``'s device in one launch, bitwise the host's
    draw, ``rng`` left as that draw leaves it (:func:`draws_on_device` says when).

    Parameters
    ----------
    xp : module
        CuPy or the strict stand-in.
    rng : numpy.random.Generator
        Over ``PCG64``; advanced past the draw.
    shape : tuple of int
        The mask's shape ``(*S,)``.
    p : float
        The drop probability.

    Returns
    -------
    array
        ``(*S,)`` bool on ``xp``'s backend, True = kept.
    """
    draws = take_draws(rng, int(np.prod(shape, dtype=np.int64)))
    if backend_name(xp) == "strict":
        return xp.run_kernel(keep_mask_twin, draws, float(p)).reshape(shape)
    keep = xp.empty(shape, dtype=xp.bool_)
    if draws.n > 0:
        _kernel()((draws.blocks,), (BLOCK,),
                  (*draws.kernel_arguments(p), keep))  # fmt: skip
    return keep
