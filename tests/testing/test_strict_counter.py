"""The strict stand-in's launch-and-sync counter (refimpl.testing.launch_counts): a known
sequence of operations gives known counts, each at the line that made it."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.backend import to_numpy
from refimpl.testing import strict
from refimpl.testing.strict import count_launches, run_kernel


def _line() -> int:
    """The caller's line number (the site a count is filed under)."""
    import sys

    return sys._getframe(1).f_lineno


SITE = "tests/testing/test_strict_counter.py"


def test_each_kind_of_operation_counts_as_a_device_would():
    with count_launches() as counts:
        x = strict.asarray([1.0, 2.0, 3.0, 4.0])  # copy: host data
        assert (counts.launches, counts.syncs, counts.copies) == (0, 0, 1)
        y = x * 2 + 1  # two ufuncs (operators)
        y += x  # in place: a ufunc
        z = strict.exp(y)  # a namespace ufunc
        assert (counts.launches, counts.syncs) == (4, 0)
        x.reshape(2, 2), x.T, x[1:], x[0], strict.broadcast_to(x, (3, 4))  # views: free
        strict.empty(3), strict.empty_like(x)  # allocations: free
        strict.result_type(x, 1.0), x.shape, len(x)  # no array, or known on the host: free
        assert (counts.launches, counts.syncs) == (4, 0)
        total = z.sum()  # a reduction, as a method
        strict.zeros(3), x.astype(np.float32), x.copy()  # new arrays: three launches
        x.astype(np.float64, copy=False)  # the same dtype: a view
        assert (counts.launches, counts.syncs) == (8, 0)
        float(total), bool(total > 0), int(x[0]), x[1].item()  # reads: four syncs, one launch
        assert (counts.launches, counts.syncs) == (9, 4)
        x[strict.asarray([0, 2])]  # a gather: copy of the index, a launch
        assert (counts.launches, counts.syncs, counts.copies) == (10, 4, 2)
        x[x > 2]  # a comparison, then a boolean gather: its size is read back
        strict.flatnonzero(x > 2)  # the same
        assert (counts.launches, counts.syncs) == (14, 6)
        x[0] = 5.0  # an assignment: a launch
        x[x > 4] = 0.0  # a comparison, a boolean scatter and its size
        assert (counts.launches, counts.syncs) == (17, 7)
        strict.add.at(x, strict.asarray([0, 0]), 1.0)  # a ufunc method, a launch (+ a copy)
        strict.asnumpy(x), x.get(), f"{total:.3f}"  # device to host: three syncs
        strict.asarray(x), strict.asarray(x, dtype=np.float32)  # a cast on the device: a launch
        assert (counts.launches, counts.syncs, counts.copies) == (19, 10, 3)
        assert bool(strict.array_equal(x, x))  # a 0-d device result (as CuPy's), then its read
        assert (counts.launches, counts.syncs) == (20, 11)


def test_nothing_is_counted_outside_a_block_and_blocks_nest():
    x = strict.ones(3)
    float(x.sum())  # outside: no block to count in
    with count_launches() as outer:
        x + 1
        with count_launches() as inner:
            float(x.sum())
        x - 1
    assert (outer.launches, outer.syncs) == (3, 1)
    assert (inner.launches, inner.syncs) == (1, 1)
    with count_launches() as later:
        pass
    assert (later.launches, later.syncs, later.copies, len(later.sites)) == (0, 0, 0, 0)


def test_sites_name_the_line_outside_the_stand_in():
    x = strict.ones(4)
    with count_launches() as counts:
        for _ in range(3):
            here = _line() + 1
            x = x * 2
        float(x.sum()), float(x.max())
        reads = _line() - 1
    assert counts.hot_spots("launches") == [(f"{SITE}:{here}", 3), (f"{SITE}:{reads}", 2)]
    assert counts.hot_spots("syncs") == [(f"{SITE}:{reads}", 2)]
    assert counts.hot_spots("copies") == []
    assert counts.report().splitlines()[0] == "5 launches, 2 syncs, 0 copies"
    with pytest.raises(ValueError, match="kind must be one of launches, syncs, copies"):
        counts.hot_spots("launch")


def _scaled_sum(x: strict.StrictArray) -> strict.StrictArray:
    return (x * 2).sum()


def test_depth_names_the_caller_of_a_shared_helper():
    x = strict.ones(4)
    with count_launches(depth=2) as counts:
        first = _line() + 1
        _scaled_sum(x)
        second = _line() + 1
        _scaled_sum(x)
    helper = _scaled_sum.__code__.co_firstlineno + 1
    assert sorted(counts.hot_spots("launches")) == [
        (f"{SITE}:{helper} < {SITE}:{first}", 2),
        (f"{SITE}:{helper} < {SITE}:{second}", 2),
    ]
    with pytest.raises(ValueError, match="depth must be a positive int, got 0"):
        with count_launches(depth=0):
            pass


def _twin(a: np.ndarray, b: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    assert type(a) is np.ndarray and type(b) is np.ndarray  # the twin sees NumPy
    total = a * scale + b  # several operations inside: one kernel on the device
    return total, np.sqrt(np.abs(total))


def test_run_kernel_is_one_launch_and_returns_strict_arrays():
    a, b = strict.asarray([1.0, -4.0]), strict.asarray([3.0, 0.0])
    with count_launches() as counts:
        total, root = run_kernel(_twin, a, b, 2.0)
    assert (counts.launches, counts.syncs, counts.copies) == (1, 0, 0)
    assert isinstance(total, strict.StrictArray) and isinstance(root, strict.StrictArray)
    np.testing.assert_array_equal(to_numpy(total), [5.0, -8.0])
    np.testing.assert_array_equal(to_numpy(root), [np.sqrt(5.0), np.sqrt(8.0)])
    with pytest.raises(TypeError, match=r"numpy\.ndarray was passed to the strict backend"):
        run_kernel(_twin, np.ones(2), b, 2.0)  # host data: refused, as by a CuPy kernel
