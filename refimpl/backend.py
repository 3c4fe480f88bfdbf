"""The array-module switch: NumPy on the CPU, CuPy on the GPU, one code base.

Math code never imports ``numpy`` directly; it asks for the array module ``xp``
of the arrays it was handed (:func:`get_array_module`) or of the selected
backend (:func:`array_module`) and calls ``xp.exp``, ``xp.take``, ...

Backends
--------
``"numpy"``
    The default. Segment reductions use ``scipy.sparse`` (measured fastest on
    the CPU, see ``scripts/bench_segment.py``).
``"cupy"``
    CuPy arrays on a CUDA device (``pip install -e ".[gpu]"``). Segment sums add
    each segment in one fixed order, with no atomics, so a run repeats bit for bit;
    maxima go through integer keys (:mod:`refimpl.kernels.segment`).
``"strict"``
    A test-only stand-in for a device library (:mod:`refimpl.testing.strict`):
    NumPy underneath, but its arrays refuse silent conversion to NumPy, so a
    stray ``np.`` call in the math raises instead of running on the host. It
    exercises the same generic code path CuPy takes, on a machine without a GPU,
    with :mod:`refimpl.testing.strict_sparse` for its sparse matrices.

Selecting a backend
-------------------
Globally with :func:`set_backend` (or the ``REFIMPL_BACKEND`` environment
variable at import), for a block of code with ``with use_backend("cupy"):``,
and per call: functions that create arrays (``init_params``, the data
generators) take ``backend=``; functions that receive arrays (every
``forward``/``backward``) run on the backend of their inputs.

The graph aggregation primitives (``segment_sum``, ``segment_max``,
``segment_softmax``, ``gather``, ``scatter_add``) are in :mod:`refimpl.kernels.segment`,
the floor above this one.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "BACKENDS",
    "array_module",
    "asarray",
    "backend_name",
    "get_array_module",
    "get_backend",
    "is_array",
    "is_sparse",
    "refuse_array_subclass",
    "set_backend",
    "sparse_module",
    "sparse_owner",
    "to_numpy",
    "use_backend",
]


@dataclass(frozen=True)
class _BackendSpec:
    name: str
    module_path: str  # imported lazily: CuPy is optional
    install_hint: str
    sparse_path: str  # its sparse matrices: sparse input features, host segment sums


_SPECS = {
    "numpy": _BackendSpec("numpy", "numpy", "NumPy is a core dependency", "scipy.sparse"),
    "cupy": _BackendSpec(
        "cupy",
        "cupy",
        'install CuPy with pip install -e ".[gpu]" on a machine with a CUDA GPU',
        "cupyx.scipy.sparse",
    ),
    "strict": _BackendSpec(
        "strict", "refimpl.testing.strict", "part of refimpl", "refimpl.testing.strict_sparse"
    ),
}
BACKENDS: tuple[str, ...] = tuple(_SPECS)


def _check_name(name: str) -> str:
    if name not in _SPECS:
        source = " (from REFIMPL_BACKEND)" if name == os.environ.get("REFIMPL_BACKEND") else ""
        raise ValueError(f"unknown backend {name!r}{source}; choose one of {', '.join(BACKENDS)}")
    return name


# checked at first use, not at import: a bad REFIMPL_BACKEND is then one error message that
# a command line can print, not a traceback from ``import refimpl``
_current: str = os.environ.get("REFIMPL_BACKEND", "numpy")


_loaded: dict[str, ModuleType] = {}  # every array operation asks: skip import_module's lookup


def _load(name: str) -> ModuleType:
    module = _loaded.get(name)
    if module is None:
        spec = _SPECS[_check_name(name)]
        try:
            module = importlib.import_module(spec.module_path)
        except ImportError as err:
            raise ImportError(f"backend {name!r} is not available: {spec.install_hint}") from err
        _loaded[name] = module
    return module


def set_backend(name: str) -> None:
    """Select the global backend, importing its module now (an unavailable one fails here).

    Parameters
    ----------
    name : {"numpy", "cupy", "strict"}
        The backend; ``"cupy"`` needs CuPy and a CUDA device.

    Raises
    ------
    ValueError
        If ``name`` is not a backend.
    ImportError
        If its module cannot be imported (CuPy not installed).
    """
    global _current
    _load(name)  # fail now, not at the first array creation
    _current = name


def get_backend() -> str:
    """Name of the global backend."""
    return _check_name(_current)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[ModuleType]:
    """Select a backend for the duration of a ``with`` block; the previous one comes back after.

    Parameters
    ----------
    name : {"numpy", "cupy", "strict"}
        The backend; ``"cupy"`` needs CuPy and a CUDA device.

    Yields
    ------
    module
        The backend's array module (``numpy``, ``cupy`` or the strict stand-in).
    """
    previous = _current
    set_backend(name)
    try:
        yield _load(name)
    finally:
        set_backend(previous)


def array_module(backend: str | None = None) -> ModuleType:
    """The array module of ``backend``.

    Parameters
    ----------
    backend : {"numpy", "cupy", "strict"} or None, default None
        The backend; ``None`` for the global one (:func:`set_backend`).

    Returns
    -------
    module
        ``numpy``, ``cupy`` or :mod:`refimpl.testing.strict`.
    """
    return _load(_current if backend is None else backend)


def backend_name(xp: ModuleType) -> str:
    """Inverse of :func:`array_module`: the name of array module ``xp``.

    Parameters
    ----------
    xp : module
        An array module of a backend (``numpy``, ``cupy``, the strict stand-in).

    Returns
    -------
    str
        ``"numpy"``, ``"cupy"`` or ``"strict"``; ``ValueError`` for any other module.
    """
    for name, spec in _SPECS.items():
        if xp.__name__ == spec.module_path:
            return name
    raise ValueError(f"{xp.__name__!r} is not a refimpl backend module")


def sparse_module(xp: ModuleType) -> ModuleType:
    """The sparse-matrix module that goes with array module ``xp``.

    Parameters
    ----------
    xp : module
        An array module of a backend.

    Returns
    -------
    module
        ``scipy.sparse``, ``cupyx.scipy.sparse``, or the strict stand-in's
        :mod:`refimpl.testing.strict_sparse`.
    """
    return importlib.import_module(_SPECS[backend_name(xp)].sparse_path)


_SPARSE_OWNERS = {
    "scipy.sparse": "numpy",
    "cupyx.scipy.sparse": "cupy",
    "refimpl.testing.strict_sparse": "strict",
}


def sparse_owner(matrix: Any) -> str | None:
    """Backend of a sparse matrix (``scipy.sparse``, ``cupyx.scipy.sparse``, the strict
    stand-in's).

    Parameters
    ----------
    matrix : Any
        Any value.

    Returns
    -------
    str or None
        ``"numpy"``, ``"cupy"`` or ``"strict"``; ``None`` when ``matrix`` is not a sparse matrix.
    """
    module = type(matrix).__module__
    for prefix, owner in _SPARSE_OWNERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return owner
    return None


def is_sparse(matrix: Any) -> bool:
    """True for a sparse matrix of any backend (sparse input features: ``x`` in CSR).

    Parameters
    ----------
    matrix : Any
        Any value.

    Returns
    -------
    bool
        Whether :func:`sparse_owner` knows its backend.
    """
    return sparse_owner(matrix) is not None


def _owner(array: Any) -> str | None:
    """Backend that owns ``array`` (a dense array or a sparse matrix), or ``None``."""
    if isinstance(array, np.ndarray):
        return "numpy"
    owner = getattr(type(array), "__refimpl_backend__", None)  # the strict stand-in
    if owner is not None:
        return owner
    if type(array).__module__.split(".")[0] == "cupy" and hasattr(
        array, "__cuda_array_interface__"
    ):
        return "cupy"
    return sparse_owner(array)


# The subclasses of numpy.ndarray that compute as it does: a memory-mapped file. Any other
# (numpy.matrix, numpy.ma.MaskedArray, arrays with units) has arithmetic or indexing of its own
# that the math here would not follow: a matrix stays 2-D and its ``*`` multiplies matrices, a
# masked array's mask would be ignored. is_array refuses them.
_PLAIN_SUBCLASSES = (np.memmap,)


def is_array(array: Any) -> bool:
    """True for a dense array of any backend (``numpy.ndarray``, ``cupy.ndarray``, strict);
    False for a sparse matrix (:func:`is_sparse`) and for a subclass of ``numpy.ndarray`` with
    arithmetic of its own (``numpy.matrix``, ``numpy.ma.MaskedArray``: a memmap is an array).

    Parameters
    ----------
    array : Any
        Any value.

    Returns
    -------
    bool
        Whether the math here can take ``array`` as a dense array.
    """
    if type(array) is np.ndarray:  # the common case, without the owner lookup
        return True
    if isinstance(array, np.ndarray):
        return type(array) in _PLAIN_SUBCLASSES
    return _owner(array) is not None and not is_sparse(array)


def refuse_array_subclass(value: Any, name: str) -> None:
    """A ``TypeError`` in one line for ``value``, a subclass of ``numpy.ndarray`` that
    :func:`is_array` refuses, saying what to pass instead; nothing for any other value.

    Parameters
    ----------
    value : Any
        The value to check.
    name : str
        Its name in the message, e.g. ``"x"``.
    """
    if not isinstance(value, np.ndarray) or is_array(value):
        return
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a numpy.ma masked array, whose mask refimpl would ignore: fill or drop "
            f"the masked entries and pass a plain array ({name}.filled(value))"
        )
    if isinstance(value, np.matrix):
        raise TypeError(
            f"{name} is a numpy.matrix, which stays 2-D and multiplies as a matrix: pass "
            f"numpy.asarray({name})"
        )
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise TypeError(
        f"{name} is a {kind}, a subclass of numpy.ndarray whose arithmetic may differ from an "
        f"array's: pass numpy.asarray({name}), a plain array"
    )


def get_array_module(*arrays: Any) -> ModuleType:
    """The array module the given arrays live in.

    Non-arrays (Python scalars, ``None``) are ignored; with no array at all the
    global backend's module is returned. Arrays of two different backends are an
    error: nothing is moved between host and device behind the caller's back.

    Parameters
    ----------
    *arrays : Any
        Dense arrays, sparse matrices, or anything else (ignored).

    Returns
    -------
    module
        ``numpy``, ``cupy`` or the strict stand-in.

    Raises
    ------
    TypeError
        If arrays of two backends are mixed.
    """
    if arrays and all(type(array) is np.ndarray for array in arrays):  # the common case
        return np
    owners = {owner for owner in map(_owner, arrays) if owner is not None}
    if len(owners) > 1:
        raise TypeError(
            f"arrays from different backends were mixed ({', '.join(sorted(owners))}); "
            "move them to one backend first with refimpl.backend.asarray(a, backend=...)"
        )
    return _load(owners.pop() if owners else _current)


def asarray(array: Any, backend: str | None = None, dtype: Any = None) -> Any:
    """Copy or view ``array`` as an array of ``backend`` (explicit host/device move).

    A ``numpy.ma`` masked array is refused (``TypeError``): its mask would be lost unsaid.

    Parameters
    ----------
    array : array_like or sparse matrix
        An array of any backend, a sparse matrix, or what ``xp.asarray`` takes (a list).
    backend : {"numpy", "cupy", "strict"} or None, default None
        The target; ``None`` for the global backend.
    dtype : dtype or None, default None
        Cast to it; ``None`` keeps the dtype.

    Returns
    -------
    array or sparse matrix
        A dense array of ``backend`` (a view when nothing moves or changes), or for a sparse
        ``array`` a CSR matrix of ``backend``'s sparse module.
    """
    if isinstance(array, np.ma.MaskedArray):
        refuse_array_subclass(array, "array")
    source = _owner(array)
    target = _check_name(_current if backend is None else backend)
    if is_sparse(array):
        return _sparse_to(array, source, target, dtype)
    if source is not None and source != target and source != "numpy":
        array = to_numpy(array)  # device -> host first; every backend accepts NumPy input
    return _load(target).asarray(array, dtype=dtype)


def _sparse_to(matrix: Any, source: str, target: str, dtype: Any) -> Any:
    """``matrix`` as a CSR matrix of ``target`` (its data cast to ``dtype`` when given)."""
    csr = matrix.tocsr()
    if source == target:
        return csr if dtype is None else csr.astype(dtype)
    parts = [to_numpy(part) for part in (csr.data, csr.indices, csr.indptr)]  # on the host
    data, indices, indptr = (asarray(part, backend=target) for part in parts)
    if dtype is not None:
        data = data.astype(dtype)
    return sparse_module(_load(target)).csr_matrix((data, indices, indptr), shape=csr.shape)


def to_numpy(array: Any) -> np.ndarray:
    """A NumPy copy (or view) of an array of any backend.

    Parameters
    ----------
    array : array_like
        An array of any backend, or anything ``numpy.asarray`` takes.

    Returns
    -------
    numpy.ndarray
        On the host; a device array is copied.
    """
    owner = _owner(array)
    if owner is None or owner == "numpy":
        return np.asarray(array)
    return _load(owner).asnumpy(array)
