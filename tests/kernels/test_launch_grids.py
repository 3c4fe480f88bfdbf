"""The launchers' grids: every CuPy launcher of a one-thread-per-item kernel launches a grid of
positive whole numbers that covers its items, and launches nothing for none.

The launchers run on CuPy only, so no CPU test ran their grid arithmetic: the mutation run of
stop 42 found a grid of ``num_rows - BLOCK`` blocks (rows left uncomputed; a negative grid
below BLOCK rows) and a launch of zero blocks for an empty array (CUDA refuses it) both
surviving. Here each launcher runs its own code with NumPy arrays and a stand-in module whose
kernel records the launch; the kernels themselves are checked by the twins and host builds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from refimpl.kernels import cross_entropy, dropout_fused, elu_fused


class RecordingModule:
    """``cupy.RawModule`` whose kernels record ``(name, grid, block)`` and compute nothing."""

    def __init__(self, launches: list) -> None:
        self.launches = launches

    def get_function(self, name: str) -> Any:
        def kernel(grid: tuple, block: tuple, arguments: tuple) -> None:
            self.launches.append((name, grid, block))

        return kernel


def launches_of(module: Any, monkeypatch: pytest.MonkeyPatch) -> list:
    launches: list = []
    monkeypatch.setattr(module, "_module", lambda *args, **kwargs: RecordingModule(launches))
    return launches


def assert_covers(launches: list, items: int) -> None:
    """One launch of positive whole numbers covering ``items`` threads, or none for none."""
    if items == 0:
        assert launches == []
        return
    [(name, grid, block)] = launches
    assert all(type(n) is int and n > 0 for n in (*grid, *block)), (name, grid, block)
    assert grid[0] * block[0] >= items > (grid[0] - 1) * block[0], (name, grid, block, items)


SIZES = [0, 1, 255, 256, 257, 3 * 256 + 5]


@pytest.mark.parametrize("n", SIZES)
def test_keep_and_scale_launches_a_grid_over_its_entries(n, monkeypatch):
    launches = launches_of(dropout_fused, monkeypatch)
    x = np.ones(n, np.float32)
    dropout_fused.keep_and_scale(np, x, np.ones(n, bool), 2.0)
    assert_covers(launches, n)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("launcher", ["elu_forward", "elu_backward"])
def test_elu_launches_a_grid_over_its_entries(n, launcher, monkeypatch):
    launches = launches_of(elu_fused, monkeypatch)
    x = np.ones(n)
    if launcher == "elu_forward":
        elu_fused.elu_forward(np, x, 1.0)
    else:
        elu_fused.elu_backward(np, x, np.ones(n), 1.0)
    assert_covers(launches, n)


@pytest.mark.parametrize("num_rows", SIZES)
def test_the_cross_entropy_backward_launches_a_grid_over_its_rows(num_rows, monkeypatch):
    launches = launches_of(cross_entropy, monkeypatch)
    selected = min(num_rows, 3)
    probs, one_hot = np.full((selected, 4), 0.25), np.zeros((selected, 4), bool)
    rows = np.arange(selected)
    cross_entropy.cross_entropy_backward(np, probs, one_hot, np.ones(selected), rows, 1.0, num_rows)
    assert_covers(launches, num_rows)


def test_the_check_finds_a_grid_short_of_its_items():
    # The check must be able to fail: a grid a block short, and a launch for no items.
    with pytest.raises(AssertionError):
        assert_covers([("k", (1,), (256,))], 257)
    with pytest.raises(AssertionError):
        assert_covers([("k", (0,), (256,))], 0)
    with pytest.raises(AssertionError):
        assert_covers([("k", (1.0,), (256,))], 5)


@pytest.mark.parametrize("n", SIZES)
def test_the_fused_draw_launches_positive_blocks_and_nothing_for_no_entries(n, monkeypatch):
    # Its threads stride over the entries (pcg64_draws K3), so its grid need not cover them:
    # positive whole numbers, and no launch (which CUDA would refuse) for an empty input.
    launches = launches_of(dropout_fused, monkeypatch)
    x = np.ones(n, np.float32)
    dropout_fused.draw_keep_and_scale(np, x, np.random.default_rng(0), 0.5, 2.0)
    if n == 0:
        assert launches == []
        return
    [(name, grid, block)] = launches
    assert all(type(k) is int and k > 0 for k in (*grid, *block)), (name, grid, block)
