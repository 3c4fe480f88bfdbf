"""A strict stand-in for a device array library, for catching stray NumPy calls on a CPU.

Select it with ``refimpl.backend.use_backend("strict")`` or
``REFIMPL_BACKEND=strict``. It behaves like CuPy in the one way that matters
for portability: its arrays (:class:`StrictArray`) are not NumPy arrays and
refuse to become one implicitly. Any ``numpy.<function>`` or NumPy ufunc called
on them raises ``TypeError``, as does ``numpy.asarray``; so math that wrongly
uses ``np.`` instead of the backend's ``xp.`` fails on the CPU exactly where it
would have silently copied device memory to the host (or crashed) under CuPy.

The module itself mirrors NumPy's namespace: ``strict.exp``, ``strict.zeros``,
``strict.add.at``, ``strict.linalg.norm`` ... unwrap their arguments, run NumPy,
and wrap the results. Explicit transfers exist as in CuPy: ``strict.asarray``
(host to "device") and ``strict.asnumpy`` (back). Scalars pass through
``float()``, ``int()``, ``bool()`` and ``.item()`` as in CuPy, where they are
explicit synchronisation points.
"""

from __future__ import annotations

import operator
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["StrictArray", "asarray", "asnumpy"]


class StrictConversionError(TypeError):
    """A strict array met NumPy: the math used ``np.`` where it should use ``xp.``."""


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, StrictArray):
        return obj._data
    if isinstance(obj, np.ndarray):
        # Host data handed to a device function: CuPy raises here too.
        raise StrictConversionError(
            "a numpy.ndarray was passed to the strict backend; convert it explicitly with "
            "xp.asarray (or refimpl.backend.asarray) first"
        )
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(item) for item in obj)
    return obj


def _wrap(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return StrictArray(obj)
    if isinstance(obj, np.generic):
        # A reduction or scalar index gives a 0-d array, as in CuPy; a bare NumPy
        # scalar would let np.exp(xp.sum(x)) slip through unnoticed.
        return StrictArray(np.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(item) for item in obj)
    if isinstance(obj, list):
        return [_wrap(item) for item in obj]
    return obj


def _call(function: Any, args: tuple, kwargs: dict) -> Any:
    return _wrap(function(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))


def _binary(op: Any) -> Any:
    def method(self: StrictArray, other: Any) -> Any:
        if isinstance(other, np.ndarray):
            return NotImplemented
        return _wrap(op(self._data, _unwrap(other)))

    return method


def _reflected(op: Any) -> Any:
    def method(self: StrictArray, other: Any) -> Any:
        if isinstance(other, np.ndarray):
            return NotImplemented
        return _wrap(op(_unwrap(other), self._data))

    return method


def _inplace(op: Any) -> Any:
    def method(self: StrictArray, other: Any) -> StrictArray:
        op(self._data, _unwrap(other))
        return self

    return method


class StrictArray:
    """An ndarray that refuses implicit conversion to NumPy (like ``cupy.ndarray``)."""

    __slots__ = ("_data",)
    __refimpl_backend__ = "strict"
    # Make NumPy's binary operators return NotImplemented and its ufuncs raise.
    __array_ufunc__ = None

    def __init__(self, data: np.ndarray) -> None:
        self._data = data

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise StrictConversionError(
            "implicit conversion of a strict-backend array to numpy.ndarray is not allowed "
            "(a numpy function was called on backend data; use the backend module xp, or "
            "refimpl.backend.to_numpy for an explicit copy)"
        )

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise StrictConversionError(
            f"numpy.{func.__name__} was called on a strict-backend array; "
            f"call xp.{func.__name__} with xp = refimpl.backend.get_array_module(...)"
        )

    # -- attributes and methods -------------------------------------------------
    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    itemsize = property(lambda self: self._data.itemsize)
    nbytes = property(lambda self: self._data.nbytes)
    strides = property(lambda self: self._data.strides)
    flags = property(lambda self: self._data.flags)
    T = property(lambda self: StrictArray(self._data.T))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            # NumPy converts any object with __array_interface__ / __array_struct__;
            # forwarding those to the data would let np.asarray(x) through silently.
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        attribute = getattr(self._data, name)
        if callable(attribute):
            return lambda *args, **kwargs: _call(attribute, args, kwargs)
        return _wrap(attribute)

    def get(self) -> np.ndarray:
        """Explicit device-to-host copy, as ``cupy.ndarray.get``."""
        return self._data.copy()

    def __repr__(self) -> str:
        return f"StrictArray({self._data!r})"

    def __format__(self, format_spec: str) -> str:
        return format(self._data, format_spec)  # as cupy.ndarray: format the host copy

    # -- scalars: explicit synchronisation points, allowed for size-1 arrays ----
    def _scalar(self, kind: type) -> Any:
        if self._data.size != 1:
            raise TypeError(f"only size-1 arrays can be converted to {kind.__name__}")
        return kind(self._data.reshape(()).item())

    def __float__(self) -> float:
        return self._scalar(float)

    def __int__(self) -> int:
        return self._scalar(int)

    def __bool__(self) -> bool:
        return self._scalar(bool)

    def __index__(self) -> int:
        if self._data.ndim != 0 or self._data.dtype.kind not in "iu":
            raise TypeError("only integer scalar arrays can be used as an index")
        return int(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Any:
        return (_wrap(row) for row in self._data)

    # -- indexing -----------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        return _wrap(self._data[_unwrap(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._data[_unwrap(key)] = _unwrap(value)

    # -- operators ---------------------------------------------------------------
    __add__, __radd__, __iadd__ = (
        _binary(operator.add),
        _reflected(operator.add),
        _inplace(operator.iadd),
    )
    __sub__, __rsub__, __isub__ = (
        _binary(operator.sub),
        _reflected(operator.sub),
        _inplace(operator.isub),
    )
    __mul__, __rmul__, __imul__ = (
        _binary(operator.mul),
        _reflected(operator.mul),
        _inplace(operator.imul),
    )
    __truediv__, __rtruediv__, __itruediv__ = (
        _binary(operator.truediv),
        _reflected(operator.truediv),
        _inplace(operator.itruediv),
    )
    __floordiv__, __rfloordiv__ = _binary(operator.floordiv), _reflected(operator.floordiv)
    __mod__, __rmod__ = _binary(operator.mod), _reflected(operator.mod)
    __pow__, __rpow__ = _binary(operator.pow), _reflected(operator.pow)
    __matmul__, __rmatmul__ = _binary(operator.matmul), _reflected(operator.matmul)
    __and__, __rand__ = _binary(operator.and_), _reflected(operator.and_)
    __or__, __ror__ = _binary(operator.or_), _reflected(operator.or_)
    __xor__, __rxor__ = _binary(operator.xor), _reflected(operator.xor)
    __lt__, __le__ = _binary(operator.lt), _binary(operator.le)
    __gt__, __ge__ = _binary(operator.gt), _binary(operator.ge)
    __eq__, __ne__ = _binary(operator.eq), _binary(operator.ne)  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __neg__(self) -> Any:
        return _wrap(-self._data)

    def __pos__(self) -> Any:
        return _wrap(+self._data)

    def __abs__(self) -> Any:
        return _wrap(abs(self._data))

    def __invert__(self) -> Any:
        return _wrap(~self._data)


class _StrictUfunc:
    """A NumPy ufunc behind the strict boundary, with ``at``/``reduce``/... methods."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._ufunc, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._ufunc, name)
        if callable(attribute):
            return lambda *args, **kwargs: _call(attribute, args, kwargs)
        return attribute


class _StrictNamespace(ModuleType):
    """A NumPy submodule (``linalg``, ``fft``) behind the strict boundary."""

    def __init__(self, name: str, numpy_module: ModuleType) -> None:
        super().__init__(name)
        self._numpy_module = numpy_module

    def __getattr__(self, name: str) -> Any:
        return _translate(getattr(self._numpy_module, name), f"{self.__name__}.{name}")


def _translate(attribute: Any, qualified_name: str) -> Any:
    if isinstance(attribute, np.ufunc):
        return _StrictUfunc(attribute)
    if isinstance(attribute, ModuleType):
        return _StrictNamespace(qualified_name, attribute)
    if isinstance(attribute, type):  # dtypes (xp.float64) and classes pass through
        return attribute
    if callable(attribute):
        return lambda *args, **kwargs: _call(attribute, args, kwargs)
    return attribute  # constants: pi, inf, newaxis


def asarray(obj: Any, dtype: Any = None) -> StrictArray:
    """Explicit host-to-"device" copy (``cupy.asarray``)."""
    if isinstance(obj, StrictArray):
        return obj if dtype is None else StrictArray(obj._data.astype(dtype, copy=False))
    return StrictArray(np.array(obj, dtype=dtype))


def array(obj: Any, dtype: Any = None, copy: bool = True) -> StrictArray:
    data = obj._data if isinstance(obj, StrictArray) else obj
    return StrictArray(np.array(data, dtype=dtype, copy=copy))


def asnumpy(obj: Any) -> np.ndarray:
    """Explicit "device"-to-host copy (``cupy.asnumpy``)."""
    if isinstance(obj, StrictArray):
        return obj._data.copy()
    return np.asarray(obj)


ndarray = StrictArray


def __getattr__(name: str) -> Any:
    return _translate(getattr(np, name), f"{__name__}.{name}")
