"""The deferred checks' one read (:mod:`refimpl.kernels.finite`): its twin on the strict stand-in
against ``numpy.isfinite`` entry by entry, its cost (one launch, one sync, no copy), its
refusals, and on CuPy (when there is one) the kernel against the twin.

Expected flags come from ``numpy.isfinite`` on the host copy, and expected values from the
arrays themselves: nothing is copied from the read's own output.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import asarray
from refimpl.kernels import finite
from refimpl.testing import strict
from refimpl.testing.strict import count_launches

SPECIALS = (np.nan, np.inf, -np.inf)


def queue(rng: np.random.Generator, sizes: list[int], bad: dict[int, list[int]]) -> list:
    """Host arrays of ``sizes``, alternating float32 and float64, with a NaN or infinity at
    the flat positions ``bad[k]`` of array ``k``."""
    arrays = []
    for k, size in enumerate(sizes):
        dtype = (np.float32, np.float64)[k % 2]
        array = (rng.standard_normal(size) * 1e3).astype(dtype)
        for position in bad.get(k, []):
            array[position] = SPECIALS[position % 3]
        arrays.append(array)
    return arrays


@given(
    sizes=st.lists(st.integers(0, 3 * finite.CHUNK + 5), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_the_twin_flags_exactly_the_arrays_numpy_finds_non_finite(sizes, seed, data):
    rng = np.random.default_rng(seed)
    bad = {}
    for k, size in enumerate(sizes):
        if size and data.draw(st.booleans()):  # a NaN or infinity, often at a block's edge
            edges = [0, size - 1, min(finite.CHUNK, size - 1), min(finite.CHUNK - 1, size - 1)]
            bad[k] = [data.draw(st.sampled_from(edges) | st.integers(0, size - 1))]
    host = queue(rng, sizes, bad)
    loss = np.float32(rng.standard_normal())
    arrays = [asarray(a, backend="strict") for a in host]
    values = [asarray(np.asarray(loss), backend="strict")]
    not_finite, read = finite.finite_read(strict, arrays, values)
    np.testing.assert_array_equal(not_finite, [not np.isfinite(a).all() for a in host])
    assert read[0].dtype == np.float64 and read[0][0] == float(loss)  # widened exactly


def test_a_read_is_one_launch_and_one_sync_and_copies_nothing():
    # the gat-a step queues about 40 arrays, the loss and Adam's flag: one launch, one read
    rng = np.random.default_rng(0)
    arrays = [asarray(a, backend="strict") for a in queue(rng, [5, 0, 20000, 1] * 10, {})]
    loss = asarray(np.float32(0.25), backend="strict")
    flag = asarray(np.array([2], np.int32), backend="strict")
    with count_launches() as counts:
        not_finite, (loss_read, flag_read) = finite.finite_read(strict, arrays, [loss, flag])
    assert (counts.launches, counts.syncs, counts.copies) == (1, 1, 0), counts.report()
    assert not not_finite.any() and not_finite.shape == (40,)
    assert loss_read.tolist() == [0.25] and flag_read.tolist() == [2.0]


def test_a_queue_past_one_launchs_arguments_takes_a_launch_per_group_and_still_one_sync():
    rng = np.random.default_rng(1)
    count = 2 * finite.GROUP + 3
    host = queue(rng, [3] * count, {finite.GROUP: [1], count - 1: [2]})  # in groups 2 and 3
    arrays = [asarray(a, backend="strict") for a in host]
    values = [asarray(np.array([True, False]), backend="strict")]
    with count_launches() as counts:
        not_finite, (read,) = finite.finite_read(strict, arrays, values)
    assert (counts.launches, counts.syncs) == (3, 1), counts.report()
    assert np.flatnonzero(not_finite).tolist() == [finite.GROUP, count - 1]
    assert read.tolist() == [1.0, 0.0]


def test_a_read_refuses_integer_arrays_other_value_types_and_numpy():
    ints = asarray(np.arange(3), backend="strict")
    with pytest.raises(TypeError, match="takes arrays of dtype float32, float64, got int64"):
        finite.finite_read(strict, [ints], [])
    with pytest.raises(TypeError, match=r"takes values of dtype .*int32, bool, got int64"):
        finite.finite_read(strict, [], [ints])
    with pytest.raises(ValueError, match="runs on a device backend, not 'numpy'"):
        finite.finite_read(np, [np.ones(2)], [])


def test_the_kernel_source_has_one_pointer_and_size_per_array_and_copies_each_value():
    source = finite.cuda_source(("float", "double", "float"), (("float", 1), ("int", 2)))
    assert "const float* a0, const long long n0, const double* a1" in source
    assert source.count("refimpl_any_bad(a") == 3
    assert "read[0] = (double)v0[0];" in source and "read[2] = (double)v1[1];" in source
    assert "atomic" not in source  # every output written once, by one thread


def test_the_kernel_gives_the_twins_flags_and_values_on_cupy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(2)
    sizes = [0, 1, finite.CHUNK, finite.CHUNK + 1, 3 * finite.CHUNK, 7]
    host = queue(rng, sizes, {2: [finite.CHUNK - 1], 3: [finite.CHUNK], 4: [2 * finite.CHUNK]})
    values = [np.float32(1.5), np.float64(-2.25), np.array([3], np.int32), np.array(True)]
    not_finite, read = finite.finite_read(
        cupy, [cupy.asarray(a) for a in host], [cupy.asarray(v) for v in values]
    )
    np.testing.assert_array_equal(not_finite, [not np.isfinite(a).all() for a in host])
    assert [r.tolist() for r in read] == [[1.5], [-2.25], [3.0], [1.0]]
