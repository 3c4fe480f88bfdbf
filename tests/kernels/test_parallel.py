"""map_blocks: results in block order, errors passed on, nested calls, BLAS on one thread inside;
num_threads from the environment."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

from refimpl.kernels.parallel import map_blocks, num_threads


def blas_threads() -> list[int]:
    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]


@given(count=st.integers(0, 12), threads=st.integers(1, 4))
def test_results_come_back_in_block_order(count: int, threads: int) -> None:
    assert map_blocks(lambda j: j * j, count, threads) == [j * j for j in range(count)]


def test_blocks_run_on_several_threads() -> None:
    # Each block waits until two blocks have started: one thread alone would never get there.
    barrier = threading.Barrier(2, timeout=10)
    names = map_blocks(lambda j: (barrier.wait(), threading.current_thread().name)[1], 2, 2)
    assert len(set(names)) == 2 and all(name.startswith("refimpl") for name in names)


def test_an_error_in_a_block_reaches_the_caller() -> None:
    def block(j: int) -> int:
        if j == 3:
            raise ValueError("block 3 failed")
        return j

    with pytest.raises(ValueError, match="block 3 failed"):
        map_blocks(block, 6, 2)
    assert map_blocks(lambda j: j, 3, 2) == [0, 1, 2]  # the pool still works


def test_a_nested_call_runs_on_the_calling_worker() -> None:
    # Pool threads waiting on their own pool would deadlock once every worker waits.
    outer = map_blocks(lambda i: map_blocks(lambda j: (i, j), 3, 2), 4, 2)
    assert outer == [[(i, j) for j in range(3)] for i in range(4)]


@pytest.mark.parametrize("threads", [1, 2])
def test_blas_runs_on_one_thread_inside_blocks_and_is_restored(threads: int) -> None:
    if not blas_threads():
        pytest.skip("threadpoolctl finds no BLAS library")
    before = blas_threads()
    inside = map_blocks(lambda j: blas_threads(), 3, threads)
    assert all(found == [1] * len(before) for found in inside)
    assert blas_threads() == before


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"REFIMPL_NUM_THREADS": "3", "OMP_NUM_THREADS": "2"}, 3),
        ({"OMP_NUM_THREADS": "2"}, 2),
        # 0 threads is no count: the next variable decides (a mutant taking >= 0 survived)
        ({"REFIMPL_NUM_THREADS": "0", "OMP_NUM_THREADS": "2"}, 2),
    ],
)
def test_thread_count_comes_from_the_environment(monkeypatch, environment, expected) -> None:
    for name in ("REFIMPL_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert num_threads() == expected


def test_one_block_runs_on_the_calling_thread_with_blas_as_it_is() -> None:
    caller = threading.current_thread().name
    assert map_blocks(lambda j: (threading.current_thread().name, blas_threads()), 1, 2) == [
        (caller, blas_threads())
    ]
