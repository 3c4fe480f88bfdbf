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

:func:`count_launches` counts, inside a block, what each of these calls would cost on a
device (:mod:`refimpl.testing.launch_counts` says what counts), and :func:`run_kernel` runs
the NumPy twin of one fused device kernel as the single launch the kernel is.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from refimpl.testing.launch_counts import OPEN_BLOCKS as _counters
from refimpl.testing.launch_counts import LaunchCounts, count_launches
from refimpl.testing.launch_counts import record as _record

__all__ = ["LaunchCounts", "StrictArray", "asarray", "asnumpy", "count_launches", "run_kernel"]


class StrictConversionError(TypeError):
    """A strict array met NumPy: the math used ``np.`` where it should use ``xp.``."""


_DATA_SIZED = frozenset({"nonzero", "flatnonzero", "argwhere", "unique"})  # + a sync
_ALLOCATIONS = frozenset({"empty", "empty_like"})  # no kernel: memory only
_READS = frozenset({"item", "tolist"})  # array methods that return host values
_FILLS = frozenset({"fill", "sort", "put", "partition"})  # in place, returning None
_DEVICE_BOOLEANS = frozenset({"array_equal", "array_equiv", "allclose"})  # 0-d on CuPy


def _host_arrays(obj: Any) -> list[Any]:
    """The NumPy arrays and scalars in ``obj`` (an array, or a tuple or list of them)."""
    if isinstance(obj, (np.ndarray, np.generic)):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [array for item in obj for array in _host_arrays(item)]
    return []


def _count_call(name: str, result: Any, args: tuple, kwargs: dict, owner: Any) -> None:
    """Record what a namespace function or array method ``name`` costs (:class:`LaunchCounts`):
    a launch when it made a new array (or wrote into ``out=``), a sync when it read one."""
    if name in _READS:
        _record("syncs")
        return
    if name in _ALLOCATIONS:
        return
    outputs = _host_arrays(result)
    inputs = _host_arrays([owner, *args, *kwargs.values()])  # owner: a method's array
    fresh = any(
        not any(np.may_share_memory(output, given) for given in inputs if given.size)
        for output in outputs
        if isinstance(output, np.generic) or output.size
    )
    if fresh or name in _FILLS or kwargs.get("out") is not None:
        _record("launches")
        if name in _DATA_SIZED:
            _record("syncs")


def _count_index(key: Any, assigning: bool) -> None:
    """Record an indexing (:class:`LaunchCounts`): an array in ``key`` gathers or scatters (a
    launch), a boolean one also syncs; basic indexing is a view, an assignment a launch."""
    parts = key if isinstance(key, tuple) else (key,)
    arrays = [part for part in parts if isinstance(part, (np.ndarray, list))]
    if arrays or assigning:
        _record("launches")
    if any(np.asarray(part).dtype == bool for part in arrays):
        _record("syncs")


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


def _call(function: Any, args: tuple, kwargs: dict, name: str = "", owner: Any = None) -> Any:
    """``function`` on the unwrapped arguments, its result wrapped; counted as ``name`` (a
    ufunc: always a launch; else :func:`_count_call`) inside :func:`count_launches`."""
    args, kwargs = _unwrap(args), {k: _unwrap(v) for k, v in kwargs.items()}
    result = function(*args, **kwargs)
    if name in _DEVICE_BOOLEANS:
        result = np.asarray(result)  # a 0-d array, as CuPy's: bool() on it is the sync
    if _counters:
        if name == "ufunc":
            _record("launches")
        else:
            _count_call(name, result, args, kwargs, owner)
    return _wrap(result)


def _binary(op: Any, reflected: bool = False) -> Any:
    def method(self: StrictArray, other: Any) -> Any:
        if isinstance(other, np.ndarray):
            return NotImplemented
        return _call(op, (other, self) if reflected else (self, other), {}, "ufunc")

    return method


def _inplace(op: Any) -> Any:
    def method(self: StrictArray, other: Any) -> StrictArray:
        _call(op, (self, other), {}, "ufunc")
        return self

    return method


def _arithmetic(op: Any, in_place: Any) -> tuple[Any, Any, Any]:
    """The three methods of an arithmetic operator: ``x op y``, ``y op x``, ``x op= y``."""
    return _binary(op), _binary(op, reflected=True), _inplace(in_place)


def _unary(op: Any) -> Any:
    return lambda self: _call(op, (self,), {}, "ufunc")


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
            return lambda *args, **kwargs: _call(attribute, args, kwargs, name, self._data)
        return _wrap(attribute)

    def get(self) -> np.ndarray:
        """Explicit device-to-host copy, as ``cupy.ndarray.get`` (a sync)."""
        _record("syncs")
        return self._data.copy()

    def __repr__(self) -> str:
        return f"StrictArray({self._data!r})"

    def __format__(self, format_spec: str) -> str:
        _record("syncs")
        return format(self._data, format_spec)  # as cupy.ndarray: format the host copy

    # -- scalars: explicit synchronisation points, allowed for size-1 arrays ----
    def _scalar(self, kind: type) -> Any:
        if self._data.size != 1:
            raise TypeError(f"only size-1 arrays can be converted to {kind.__name__}")
        _record("syncs")
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
        _record("syncs")
        return int(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Any:
        return (_wrap(row) for row in self._data)

    # -- indexing -----------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        key = _unwrap(key)
        if _counters:
            _count_index(key, assigning=False)
        return _wrap(self._data[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        key = _unwrap(key)
        if _counters:
            _count_index(key, assigning=True)
        self._data[key] = _unwrap(value)

    # -- operators ---------------------------------------------------------------
    __add__, __radd__, __iadd__ = _arithmetic(operator.add, operator.iadd)
    __sub__, __rsub__, __isub__ = _arithmetic(operator.sub, operator.isub)
    __mul__, __rmul__, __imul__ = _arithmetic(operator.mul, operator.imul)
    __truediv__, __rtruediv__, __itruediv__ = _arithmetic(operator.truediv, operator.itruediv)
    __floordiv__, __rfloordiv__ = _binary(operator.floordiv), _binary(operator.floordiv, True)
    __mod__, __rmod__ = _binary(operator.mod), _binary(operator.mod, True)
    __pow__, __rpow__ = _binary(operator.pow), _binary(operator.pow, True)
    __matmul__, __rmatmul__ = _binary(operator.matmul), _binary(operator.matmul, True)
    __and__, __rand__ = _binary(operator.and_), _binary(operator.and_, True)
    __or__, __ror__ = _binary(operator.or_), _binary(operator.or_, True)
    __xor__, __rxor__ = _binary(operator.xor), _binary(operator.xor, True)
    __lt__, __le__ = _binary(operator.lt), _binary(operator.le)
    __gt__, __ge__ = _binary(operator.gt), _binary(operator.ge)
    __eq__, __ne__ = _binary(operator.eq), _binary(operator.ne)  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    __neg__, __pos__ = _unary(operator.neg), _unary(operator.pos)
    __abs__, __invert__ = _unary(operator.abs), _unary(operator.invert)


class _StrictUfunc:
    """A NumPy ufunc behind the strict boundary, with ``at``/``reduce``/... methods."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._ufunc, args, kwargs, "ufunc")

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._ufunc, name)
        if callable(attribute):  # at, reduce, accumulate, reduceat, outer: launches too
            return lambda *args, **kwargs: _call(attribute, args, kwargs, "ufunc")
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
        name = qualified_name.rsplit(".", 1)[-1]
        return lambda *args, **kwargs: _call(attribute, args, kwargs, name)
    return attribute  # constants: pi, inf, newaxis


def asarray(obj: Any, dtype: Any = None) -> StrictArray:
    """Explicit host-to-"device" copy (``cupy.asarray``)."""
    if isinstance(obj, StrictArray):
        if dtype is None or np.dtype(dtype) == obj.dtype:
            return obj
        _record("launches")  # a cast on the device
        return StrictArray(obj._data.astype(dtype))
    _record("copies")
    return StrictArray(np.array(obj, dtype=dtype))


def array(obj: Any, dtype: Any = None, copy: bool = True) -> StrictArray:
    """A copy (``cupy.array``): on the device of a strict array, else from the host."""
    on_device = isinstance(obj, StrictArray)
    data = obj._data if on_device else obj
    result = np.array(data, dtype=dtype, copy=copy)
    if _counters and (not on_device or not np.may_share_memory(result, data)):
        _record("launches" if on_device else "copies")
    return StrictArray(result)


def asnumpy(obj: Any) -> np.ndarray:
    """Explicit "device"-to-host copy (``cupy.asnumpy``; a sync)."""
    if isinstance(obj, StrictArray):
        _record("syncs")
        return obj._data.copy()
    return np.asarray(obj)


def run_kernel(kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``kernel``, the NumPy twin of one fused device kernel, as ONE counted launch.

    The twin receives the strict arrays among ``args`` as NumPy arrays (anything else as
    given) and returns NumPy arrays (or a tuple of them), handed back as strict arrays. What
    it does inside is not counted: on the device it is one kernel. As with CuPy's kernels, a
    host (NumPy) array among the arguments is refused.
    """
    result = kernel(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
    _record("launches")
    return _wrap(result)


def where(condition: Any, *args: Any) -> Any:
    """``cupy.where``: its ``condition`` must be an array. CuPy calls ``condition.astype``, so
    a Python bool there (``xp.where(branch == pair, ...)`` with an int ``branch``) fails on a
    device; NumPy's ``where`` takes it, which is why no CPU test saw the bug this catches."""
    if not hasattr(condition, "astype"):
        raise StrictConversionError(
            f"where's condition is a {type(condition).__name__}, not an array: CuPy calls its "
            ".astype and fails; pass xp.asarray(condition)"
        )
    return _call(np.where, (condition, *args), {}, "where")


ndarray = StrictArray


def __getattr__(name: str) -> Any:
    return _translate(getattr(np, name), f"{__name__}.{name}")
