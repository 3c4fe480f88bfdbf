"""The backend switch (refimpl.backend) and the strict stand-in (refimpl.testing.strict)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import refimpl.backend as backend
from refimpl.testing import strict
from refimpl.testing.strict import StrictArray

HAS_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.fixture(autouse=True)
def _restore_backend():
    previous = backend.get_backend()
    yield
    backend.set_backend(previous)


# -- selection ---------------------------------------------------------------------------------


def test_default_backend_is_numpy():
    assert os.environ.get("REFIMPL_BACKEND", "numpy") == backend.get_backend()
    assert backend.BACKENDS == ("numpy", "cupy", "strict")


def test_set_and_get_backend():
    backend.set_backend("strict")
    assert backend.get_backend() == "strict"
    assert backend.array_module() is strict
    backend.set_backend("numpy")
    assert backend.get_backend() == "numpy"
    assert backend.array_module() is np


def test_array_module_by_name():
    assert backend.array_module("numpy") is np
    assert backend.array_module("strict") is strict
    assert backend.backend_name(np) == "numpy"
    assert backend.backend_name(strict) == "strict"
    with pytest.raises(ValueError, match="not a refimpl backend"):
        backend.backend_name(pytest)


def test_use_backend_yields_module_and_restores():
    backend.set_backend("numpy")
    with backend.use_backend("strict") as xp:
        assert xp is strict
        assert backend.get_backend() == "strict"
        with backend.use_backend("numpy") as inner:
            assert inner is np
        assert backend.get_backend() == "strict"
    assert backend.get_backend() == "numpy"


def test_use_backend_restores_on_exception():
    backend.set_backend("numpy")
    with pytest.raises(RuntimeError, match="inside"), backend.use_backend("strict"):
        raise RuntimeError("inside")
    assert backend.get_backend() == "numpy"


@pytest.mark.parametrize(
    "call",
    [
        lambda: backend.set_backend("jax"),
        lambda: backend.array_module("jax"),
        lambda: backend.use_backend("jax").__enter__(),
        lambda: backend.asarray(np.zeros(2), backend="jax"),
    ],
    ids=["set_backend", "array_module", "use_backend", "asarray"],
)
def test_unknown_backend_is_a_value_error(call):
    with pytest.raises(ValueError, match=r"unknown backend 'jax'; choose one of numpy, cupy, st"):
        call()
    assert backend.get_backend() in backend.BACKENDS


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed: the missing-CuPy message cannot show")
def test_cupy_missing_names_the_gpu_extra():
    backend.set_backend("numpy")
    with pytest.raises(ImportError, match=r"backend 'cupy' is not available.*\.\[gpu\]"):
        backend.set_backend("cupy")
    assert backend.get_backend() == "numpy"  # a failed switch changes nothing
    with pytest.raises(ImportError, match=r"\.\[gpu\]"), backend.use_backend("cupy"):
        pass  # pragma: no cover
    assert backend.get_backend() == "numpy"


def test_environment_variable_selects_backend_at_import():
    code = "import refimpl.backend as b; print(b.get_backend())"
    env = dict(os.environ, REFIMPL_BACKEND="strict")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "strict"
    env["REFIMPL_BACKEND"] = "nonsense"
    failed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "unknown backend 'nonsense'" in failed.stderr


# -- arrays and their module -------------------------------------------------------------------


def test_get_array_module():
    host, device = np.zeros(2), strict.zeros(2)
    assert backend.get_array_module(host) is np
    assert backend.get_array_module(device) is strict
    assert backend.get_array_module(device, 1.0, None, device) is strict  # non-arrays ignored
    backend.set_backend("strict")
    assert backend.get_array_module() is strict  # no array: the global backend
    assert backend.get_array_module(3, "x") is strict
    backend.set_backend("numpy")
    assert backend.get_array_module(np.float64(1.0)) is np  # a NumPy scalar is not an array


def test_get_array_module_refuses_mixed_backends():
    with pytest.raises(
        TypeError,
        match=r"different backends were mixed \(numpy, strict\).*"
        r"refimpl\.backend\.asarray",
    ):
        backend.get_array_module(np.zeros(2), strict.zeros(2))


def test_is_array():
    assert backend.is_array(np.zeros(2))
    assert backend.is_array(strict.zeros(2))
    assert not backend.is_array([1.0, 2.0])
    assert not backend.is_array(1.0)
    assert not backend.is_array(None)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_asarray_and_to_numpy_round_trip(dtype):
    host = np.arange(6).reshape(2, 3).astype(dtype)
    device = backend.asarray(host, backend="strict")
    assert isinstance(device, StrictArray)
    assert device.dtype == dtype and device.shape == (2, 3)
    back = backend.to_numpy(device)
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, host)
    assert back.dtype == dtype
    # strict -> numpy via asarray goes through the host explicitly
    again = backend.asarray(device, backend="numpy")
    assert isinstance(again, np.ndarray)
    np.testing.assert_array_equal(again, host)
    assert backend.to_numpy(host) is host  # already host data: no copy
    assert backend.to_numpy([1, 2]).tolist() == [1, 2]


def test_asarray_uses_global_backend_and_dtype():
    backend.set_backend("strict")
    converted = backend.asarray([1, 2, 3], dtype=np.float32)
    assert isinstance(converted, StrictArray)
    assert converted.dtype == np.float32
    backend.set_backend("numpy")
    assert isinstance(backend.asarray(converted), np.ndarray)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'segment_mean'"):
        backend.segment_mean  # noqa: B018


# -- the strict stand-in: what it refuses ------------------------------------------------------


def test_strict_refuses_numpy_ufunc():
    with pytest.raises(TypeError):
        np.exp(strict.ones(3))


def test_strict_refuses_numpy_asarray():
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(strict.ones(3))
    with pytest.raises(TypeError, match="implicit conversion"):
        np.array(strict.ones(3))


def test_strict_refuses_numpy_functions():
    with pytest.raises(TypeError, match=r"numpy\.sum was called on a strict-backend array"):
        np.sum(strict.ones(3))
    with pytest.raises(TypeError, match=r"numpy\.concatenate"):
        np.concatenate([strict.ones(3), strict.ones(3)])
    with pytest.raises(TypeError):
        np.take(strict.ones(3), strict.asarray([0]))


def test_strict_refuses_mixing_with_numpy_arrays():
    device, host = strict.ones(3), np.ones(3)
    with pytest.raises(TypeError):
        device + host
    with pytest.raises(TypeError):
        host * device
    with pytest.raises(TypeError):
        device += host
    with pytest.raises(TypeError):
        host += device
    with pytest.raises(TypeError):
        device[host.astype(np.int64)]
    with pytest.raises(TypeError):
        device[0] = host[0:1]


def test_strict_refuses_numpy_arrays_in_its_functions():
    with pytest.raises(TypeError, match=r"numpy\.ndarray was passed to the strict backend"):
        strict.exp(np.ones(3))
    with pytest.raises(TypeError, match=r"numpy\.ndarray was passed"):
        strict.add.at(strict.zeros(3), np.array([0, 1]), 1.0)
    with pytest.raises(TypeError, match=r"numpy\.ndarray was passed"):
        strict.concatenate([strict.ones(2), np.ones(2)])


def test_regression_strict_array_interface_leak():
    # np.asarray(strict_array) returned a NumPy array: StrictArray.__getattr__ forwarded
    # __array_interface__ to the wrapped data, and NumPy converts through that before it
    # ever calls __array__. Earlier checks only tried ufuncs and np.<function> calls.
    device = strict.ones((3, 2))
    for name in ["__array_interface__", "__array_struct__", "__dlpack__", "__array_priority__"]:
        assert not hasattr(device, name)
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(device)
    with pytest.raises(TypeError, match="implicit conversion"):
        np.ascontiguousarray(device)
    with pytest.raises(TypeError, match="implicit conversion"):
        sp.eye(3, format="csr") @ device  # the NumPy-only scipy path of segment_sum


def test_strict_reductions_are_arrays_not_numpy_scalars():
    # A reduction gives a 0-d device array, as CuPy does, so np.exp(xp.sum(x)) is caught too.
    total = strict.sum(strict.ones(3))
    assert isinstance(total, StrictArray) and total.shape == ()
    assert isinstance(strict.ones(3).max(), StrictArray)
    assert isinstance(strict.ones(3)[0], StrictArray)
    with pytest.raises(TypeError):
        np.exp(total)
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(total)


# -- the strict stand-in: what it allows -------------------------------------------------------


def test_strict_explicit_transfers():
    host = np.arange(4.0)
    device = strict.asarray(host)
    assert isinstance(device, StrictArray)
    host[0] = 99.0  # asarray copied: the "device" does not see later host writes
    assert float(device[0]) == 0.0
    back = strict.asnumpy(device)
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(device.get(), back)
    np.testing.assert_array_equal(backend.to_numpy(device), back)
    assert strict.asarray(device) is device
    assert strict.asarray(device, dtype=np.float32).dtype == np.float32
    assert strict.array(device) is not device


def test_strict_scalars_are_explicit_sync_points():
    x = strict.asarray([2.5])
    assert float(x) == 2.5
    assert int(strict.asarray(3)) == 3
    assert bool(strict.asarray([True]))
    assert x.item() == 2.5
    assert f"{strict.sum(x):.2f}" == "2.50"
    assert list(range(10))[strict.asarray(4)] == 4  # __index__
    with pytest.raises(TypeError, match="only size-1 arrays"):
        float(strict.ones(2))


def test_strict_arithmetic_and_in_place():
    x = strict.asarray([1.0, 2.0, 3.0])
    y = (x * 2 + 1) / x - x**2
    assert isinstance(y, StrictArray)
    np.testing.assert_allclose(
        strict.asnumpy(y),
        (np.array([1.0, 2, 3]) * 2 + 1) / np.array([1.0, 2, 3]) - np.array([1.0, 2, 3]) ** 2,
    )
    z = x
    z += 1
    z *= 2
    assert z is x  # in place
    np.testing.assert_array_equal(strict.asnumpy(x), [4.0, 6.0, 8.0])
    np.testing.assert_array_equal(strict.asnumpy(2 - x), [-2.0, -4.0, -6.0])
    np.testing.assert_array_equal(strict.asnumpy(np.float64(2) * x), [8.0, 12.0, 16.0])
    np.testing.assert_array_equal(strict.asnumpy(-x), [-4.0, -6.0, -8.0])
    np.testing.assert_array_equal(strict.asnumpy(x > 5), [False, True, True])
    m = strict.ones((2, 3)) @ strict.ones((3, 2))
    np.testing.assert_array_equal(strict.asnumpy(m), np.full((2, 2), 3.0))


def test_strict_indexing_and_setitem():
    x = strict.arange(12.0).reshape(3, 4)
    assert isinstance(x[1], StrictArray)
    np.testing.assert_array_equal(strict.asnumpy(x[1:, ::2]), [[4.0, 6.0], [8.0, 10.0]])
    rows = strict.asarray([2, 0])
    np.testing.assert_array_equal(strict.asnumpy(x[rows, 1]), [9.0, 1.0])
    np.testing.assert_array_equal(strict.asnumpy(x[x > 9]), [10.0, 11.0])
    x[0] = strict.zeros(4)
    x[rows, 3] = -1.0
    x[:, 0] = 7
    np.testing.assert_array_equal(strict.asnumpy(x), [[7, 0, 0, -1], [7, 5, 6, 7], [7, 9, 10, -1]])
    assert len(x) == 3
    assert [r.shape for r in x] == [(4,), (4,), (4,)]


def test_strict_ufunc_at_and_namespaces():
    out = strict.zeros(3)
    strict.add.at(out, strict.asarray([0, 0, 2]), strict.asarray([1.0, 2.0, 5.0]))
    np.testing.assert_array_equal(strict.asnumpy(out), [3.0, 0.0, 5.0])
    strict.maximum.at(out, strict.asarray([1, 1]), strict.asarray([4.0, -1.0]))
    np.testing.assert_array_equal(strict.asnumpy(out), [3.0, 4.0, 5.0])
    assert float(strict.add.reduce(out)) == 12.0
    assert abs(float(strict.linalg.norm(strict.asarray([3.0, 4.0]))) - 5.0) < 1e-15
    assert strict.float32 is np.float32 and strict.inf == np.inf
    assert strict.ndarray is StrictArray
    rows, cols = strict.nonzero(strict.eye(2))
    assert isinstance(rows, StrictArray) and isinstance(cols, StrictArray)
    with pytest.raises(AttributeError):
        strict.no_such_function  # noqa: B018


def test_strict_array_attributes():
    x = strict.zeros((2, 3), dtype=np.float32)
    assert x.shape == (2, 3) and x.ndim == 2 and x.size == 6 and x.dtype == np.float32
    assert x.itemsize == 4 and x.nbytes == 24
    assert x.T.shape == (3, 2) and isinstance(x.T, StrictArray)
    assert isinstance(x.astype(np.float64), StrictArray)
    assert type(x).__refimpl_backend__ == "strict"
    assert repr(strict.asarray([1])).startswith("StrictArray(")
    with pytest.raises(TypeError):
        hash(x)
