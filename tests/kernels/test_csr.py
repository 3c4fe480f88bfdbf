"""csr_matmul: row blocks on threads give exactly the single product, whatever the split,
through SciPy's kernel into one output or each block's own product (the fallback); the
head-block product gives exactly each head's own product."""

from __future__ import annotations

from unittest import mock

import numpy as np
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

from refimpl.kernels import csr
from refimpl.kernels.csr import csr_matmul
from refimpl.testing.strategies import seeds


@given(
    seed=seeds(),
    rows=st.integers(0, 30),
    columns=st.integers(1, 30),
    width=st.integers(1, 5),
    density=st.sampled_from([0.0, 0.1, 0.7]),
    threads=st.integers(1, 5),
    dtypes=st.sampled_from([(np.float32,) * 2, (np.float64,) * 2, (np.float32, np.float64)]),
    kernel=st.booleans(),
    transposed=st.booleans(),
)
def test_threaded_blocks_equal_the_single_product(
    seed: int,
    rows: int,
    columns: int,
    width: int,
    density: float,
    threads: int,
    dtypes: tuple,
    kernel: bool,
    transposed: bool,
) -> None:
    rng = np.random.default_rng(seed)
    matrix = sp.random(rows, columns, density=density, format="csr", rng=rng, dtype=dtypes[0])
    dense = rng.standard_normal((width, columns) if transposed else (columns, width))
    dense = dense.astype(dtypes[1])
    dense = dense.T if transposed else dense  # a strided operand is read as the same values
    single = matrix @ dense
    with mock.patch.object(csr, "_csr_matvecs", csr._csr_matvecs if kernel else None):
        split = csr_matmul(matrix, dense, threads=threads, min_work=0)  # always split
    assert split.dtype == single.dtype and split.shape == (rows, width)
    np.testing.assert_array_equal(split, single)  # bitwise: each row is one thread's


@given(
    seed=seeds(),
    rows=st.integers(2, 30),
    threads=st.integers(2, 5),
    kernel=st.booleans(),
)
def test_the_rows_are_split_into_disjoint_blocks_one_per_thread(
    seed: int, rows: int, threads: int, kernel: bool
) -> None:
    # The products are the same however the rows are split, so a path that never split
    # (threads < 20 for threads < 2) or one block computing every row (bounds[k - 1] for
    # bounds[k + 1]) gave the right values and survived: here the split itself is checked.
    rng = np.random.default_rng(seed)
    matrix = sp.random(rows, 7, density=0.5, format="csr", rng=rng)
    dense = rng.standard_normal((7, 3))
    blocks, spans = [], []
    real_map, real_kernel = csr.map_blocks, csr._csr_matvecs

    def counting_map(function, count, threads):
        blocks.append(count)
        return real_map(function, count, threads)

    def recording_kernel(n_rows, *args):
        spans.append(n_rows)
        return real_kernel(n_rows, *args)

    with (
        mock.patch.object(csr, "map_blocks", counting_map),
        mock.patch.object(csr, "_csr_matvecs", recording_kernel if kernel else None),
    ):
        split = csr_matmul(matrix, dense, threads=threads, min_work=0)
    np.testing.assert_array_equal(split, matrix @ dense)
    if rows >= threads:
        assert blocks == [threads]
        if kernel:  # the blocks' rows: none negative, together every row once
            assert len(spans) == threads and min(spans) >= 0 and sum(spans) == rows


def test_scipys_kernel_is_found() -> None:
    """The fast path is taken on the SciPy we depend on (the fallback would hide its loss)."""
    assert csr._csr_matvecs is not None


def test_a_boolean_operand_is_read_as_zero_one() -> None:
    matrix = sp.csr_matrix(np.array([[0.5, 0.0, 2.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    mask = np.array([[True, False], [False, False], [True, True]])
    expected = matrix.toarray() @ mask.astype(float)
    np.testing.assert_array_equal(csr_matmul(matrix, mask, threads=2, min_work=0), expected)


@given(
    seed=seeds(),
    rows=st.integers(0, 7),
    columns=st.integers(1, 6),
    stored=st.integers(0, 20),
    heads=st.integers(1, 4),
    features=st.sampled_from([(), (4,), (2, 3)]),
)
def test_the_head_block_product_is_each_heads_product(
    seed: int, rows: int, columns: int, stored: int, heads: int, features: tuple
) -> None:
    """One product with the block matrix gives, bitwise, every head's own product with the
    same pattern (duplicate entries and empty rows included)."""
    rng = np.random.default_rng(seed)
    stored = stored if rows else 0
    row = np.sort(rng.integers(0, max(rows, 1), stored))
    column = rng.integers(0, columns, stored)  # repeats: duplicate entries, added up
    indptr = np.searchsorted(row, np.arange(rows + 1))
    values = rng.standard_normal((stored, heads))  # entry p's value for head h
    dense = rng.standard_normal((columns, heads, *features))
    source, column_h, indptr_h = csr.head_blocks(indptr, column, heads, columns)
    block = sp.csr_matrix(
        (values.reshape(-1)[source], column_h, indptr_h), shape=(rows * heads, columns * heads)
    )
    out = csr.head_block_matmul(block, dense)
    assert out.shape == (rows, heads, *features)
    for h in range(heads):
        one = sp.csr_matrix((values[:, h], column, indptr), shape=(rows, columns))
        expected = (one @ dense[:, h].reshape(columns, -1)).reshape((rows, *features))
        np.testing.assert_array_equal(out[:, h], expected)
