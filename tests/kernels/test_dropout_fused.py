"""Dropout's keep-and-scale kernel (:mod:`refimpl.kernels.dropout_fused`): its twin bitwise the
literal :class:`refimpl.ops.dropout.Dropout` (two elementwise roundings, in its order), and
``Dropout`` inside ``fused_kernels()`` one launch each way on the strict stand-in with the
literal results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from refimpl.backend import asarray, to_numpy, use_backend
from refimpl.kernels.dropout_fused import keep_and_scale_twin
from refimpl.nn.gat import fused_kernels
from refimpl.ops.dropout import Dropout
from refimpl.testing.strict import count_launches
from refimpl.validation import check_cotangent


@given(
    st.sampled_from([np.float32, np.float64]).flatmap(
        lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0),
                                 elements={"allow_nan": False, "allow_infinity": False})
    ),
    st.sampled_from([0.1, 0.5, 0.6, 0.9, 0.999]),
    st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_twin_is_bitwise_the_literal_dropout(x, p, seed):
    keep = np.asarray(np.random.default_rng(seed).random(x.shape) >= p)
    y, cache = Dropout(p).forward({}, x, training=True, mask=keep)
    assert keep_and_scale_twin(x, keep, cache.scale).tobytes() == y.tobytes()
    d_x, _ = Dropout(p).backward({}, cache, x)
    assert keep_and_scale_twin(x, keep, cache.scale).tobytes() == d_x.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_dropout_is_one_launch_each_way_and_the_literal_result(dtype):
    rng = np.random.default_rng(5)
    x, d_y = (rng.standard_normal((2, 300, 7)) * 3).astype(dtype)
    keep = rng.random(x.shape) >= 0.6
    want_y, cache = Dropout(0.6).forward({}, x, training=True, mask=keep)
    want_d, _ = Dropout(0.6).backward({}, cache, d_y)
    with use_backend("strict"), fused_kernels():
        s_x, s_keep, s_d_y = asarray(x), asarray(keep), asarray(d_y)
        with count_launches() as forward:
            y, s_cache = Dropout(0.6).forward_unchecked({}, s_x, training=True, mask=s_keep)
        with count_launches() as backward:
            d_x, _ = Dropout(0.6).backward({}, s_cache, s_d_y)
        with count_launches() as check:  # the cotangent's finiteness (queued in a step)
            check_cotangent(s_d_y, x.shape, x.dtype, s_keep)
    assert (forward.launches, backward.launches - check.launches) == (1, 1)
    assert to_numpy(y).tobytes() == want_y.tobytes()
    assert to_numpy(d_x).tobytes() == want_d.tobytes()
