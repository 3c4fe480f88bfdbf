"""Row blocks (:func:`refimpl.kernels.parallel.row_blocks`): the host's fixed size, the device's
size by memory (:data:`~refimpl.kernels.parallel.DEVICE_BLOCK_BYTES`), and NodeFormer's
kernelised attention in device blocks on the strict stand-in (which takes the device's path).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import array_module, asarray, to_numpy
from refimpl.kernels import parallel
from refimpl.kernels.parallel import row_blocks
from refimpl.nn.nodeformer import kernel_attention
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax
from refimpl.testing import relative_errors
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL
from tests.nn.nodeformer.test_kernel_attention import gradients, make_setup

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]


def covered(blocks: list[slice]) -> list[int]:
    return [row for block in blocks for row in range(block.start, block.stop)]


@given(n=st.integers(0, 50), size=st.integers(1, 9), row_bytes=st.integers(0, 40))
def test_blocks_cover_the_rows_once_in_order(n, size, row_bytes):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel, "DEVICE_BLOCK_BYTES", 64)
        for backend in ("numpy", "strict"):
            blocks = row_blocks(array_module(backend), n, size, row_bytes)
            assert covered(blocks) == list(range(n))
            assert all(block.stop > block.start for block in blocks)


def test_the_host_keeps_the_callers_size_whatever_the_row_bytes():
    assert row_blocks(np, 10, 4, 10**9) == [slice(0, 4), slice(4, 8), slice(8, 10)]


@pytest.mark.parametrize(
    ("row_bytes", "expected_size"),
    [(0, 10), (16, 4), (20, 3), (64, 1), (10**9, 1)],  # 0: all rows; else 64 // row_bytes, >= 1
)
def test_a_device_block_holds_what_the_memory_budget_allows(monkeypatch, row_bytes, expected_size):
    monkeypatch.setattr(parallel, "DEVICE_BLOCK_BYTES", 64)
    blocks = row_blocks(array_module("strict"), 10, 4, row_bytes)
    assert {block.stop - block.start for block in blocks[:-1]} <= {expected_size}
    assert blocks[0].stop - blocks[0].start == expected_size


def test_nodeformer_attention_at_scale_gets_device_blocks_below_the_budget():
    # N = 1e7 nodes, K m = 10 * 30 float32: one block of all rows (12 GB per intermediate, the
    # issue's complaint) became blocks whose four (K m, B) intermediates fit the budget.
    n, row_bytes = 10**7, kernel_attention.block_row_bytes(10, 30, np.dtype(np.float32))
    blocks = row_blocks(array_module("strict"), n, kernel_attention.ROW_BLOCK, row_bytes)
    assert len(blocks) > 1
    assert max(block.stop - block.start for block in blocks) * row_bytes <= (
        parallel.DEVICE_BLOCK_BYTES
    )


@given(seed=seeds(), n=st.integers(1, 30), samples=st.integers(0, 3), budget=st.integers(1, 4))
def test_device_blocks_give_the_one_block_result_on_strict(seed, n, samples, budget):
    # Blocks change only the order in which kv, O_s and their gradients are summed. The budget
    # is a few rows' bytes, so the drawn N runs in several device blocks.
    inputs = make_setup(seed, n=n, d=3, d_v=2, m=5, samples=samples)
    d_z = np.random.default_rng(seed).standard_normal((n, 2))
    strict = [None if a is None else asarray(a, backend="strict") for a in (*inputs, d_z)]
    row_bytes = kernel_attention.block_row_bytes(max(samples, 1), 5, np.dtype(np.float64))
    whole = gradients(KernelizedSoftmax(0.5), strict[:-1], strict[-1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel, "DEVICE_BLOCK_BYTES", budget * row_bytes)
        blocked = gradients(KernelizedSoftmax(0.5), strict[:-1], strict[-1])
    as_numpy = {name: to_numpy(value) for name, value in blocked.items()}
    expected = {name: to_numpy(value) for name, value in whole.items()}
    assert max(relative_errors(as_numpy, expected).values()) <= RTOL64
