"""A restricted unpickler for the Planetoid files: only the globals they need.

The Planetoid files (``ind.{name}.{x,y,allx,ally,tx,ty,graph}``) are Python 2
``cPickle`` pickles, protocol 2. Unpickling can run arbitrary code: a pickle
may name any importable callable (``os.system``, ``builtins.eval``) and call it.
``RestrictedUnpickler`` admits only the globals these files name (checked with
``pickletools``: ``scipy.sparse.csr.csr_matrix``, ``numpy.core.multiarray._reconstruct``,
``numpy.ndarray``, ``numpy.dtype``, ``collections.defaultdict``, ``__builtin__.list``)
and maps the old module paths to their current homes, so no DeprecationWarning
is raised and a later SciPy/NumPy that drops ``scipy.sparse.csr`` or
``numpy.core`` still loads them. Anything else raises ``UnsafePickleError``.

Allowed globals can still ask for memory the file does not hold, so two more rules keep what
a pickle allocates in proportion to its size: ``_reconstruct`` must build the empty ``(0,)``
array NumPy's pickles always build (then filled from the file's own bytes, which NumPy checks
against the shape), not an array of a claimed shape; and every memo index must be below the
file's size (the unpickler sizes its memo by the largest index: a 9-byte pickle storing at
index ``2**26`` took 1 GiB). The indices are read by :mod:`pickletools` before unpickling.
"""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from refimpl.data.dataset import RESTORE
from refimpl.files import printable

__all__ = ["RestrictedUnpickler", "UnsafePickleError", "load_restricted_pickle"]

try:  # NumPy >= 2: numpy.core is a deprecated alias of numpy._core
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover - NumPy 1.x
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]


# (module, name) as written in the pickle -> the object it may resolve to.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,  # SciPy < 1.8 module path
    ("scipy.sparse._csr", "csr_matrix"): sp.csr_matrix,
    ("scipy.sparse", "csr_matrix"): sp.csr_matrix,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,  # NumPy 1.x path
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,  # Python 2 name of builtins
    ("builtins", "list"): list,
}


class UnsafePickleError(pickle.UnpicklingError, ValueError):
    """A pickle asked for a global outside the allow-list (it may have been tampered with).

    Subclasses both ``pickle.UnpicklingError`` and ``ValueError`` so either
    ``except`` clause catches it.
    """


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` admits only the Planetoid globals.

    Parameters
    ----------
    file : binary file object
        The open pickle.
    path : str
        Shown in error messages (the file's name on disk).
    """

    def __init__(self, file: Any, path: str) -> None:
        # latin1: the files are Python 2 pickles whose str payloads are raw bytes
        # (numpy buffers); ASCII fails on x/tx/allx with UnicodeDecodeError.
        super().__init__(file, encoding="latin1")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = _ALLOWED[(module, name)]
        except KeyError:
            allowed = ", ".join(sorted({f"{m}.{n}" for m, n in _ALLOWED}))
            raise UnsafePickleError(
                f"refusing to load {self._path}: the file asks for {printable(module)}."
                f"{printable(name)}, which a "
                "Planetoid file never contains; the file may be tampered with (get it again "
                f"from its source). Allowed globals: {allowed}"
            ) from None
        return self._reconstruct_empty if found is _reconstruct else found

    def _reconstruct_empty(self, subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
        """``_reconstruct`` of the ``(0,)`` array a NumPy pickle fills from its own bytes."""
        if not isinstance(shape, (tuple, list)) or list(shape) != [0]:
            raise UnsafePickleError(
                f"refusing to load {self._path}: it builds an array of shape {shape!r} before "
                "filling it, where NumPy's pickles build (0,) (a forged shape allocates memory "
                f"the file does not hold); {RESTORE}"
            )
        return _reconstruct(subtype, (0,), dtype)


def load_restricted_pickle(path: str | Path) -> Any:
    """Unpickle ``path`` with ``RestrictedUnpickler`` (latin1, allow-listed globals only).

    Raises ``UnsafePickleError`` for a global outside the allow-list or an array built at a
    claimed shape, and ``ValueError`` naming the file for any other malformed content
    (truncated, empty, not a pickle, a memo index beyond the file's size, an allowed class
    called with arguments it refuses).
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        _check_memo(data)
        return RestrictedUnpickler(io.BytesIO(data), str(path)).load()
    except UnsafePickleError:
        raise
    except Exception as err:  # malformed bytes can make unpickling raise anything
        raise ValueError(
            f"{path}: not a readable pickle ({type(err).__name__}: {printable(str(err))}); "
            f"{RESTORE}"
        ) from err


def _check_memo(data: bytes) -> None:
    """``ValueError`` when an opcode stores at a memo index ``>= len(data)``: a pickler
    numbers its memo 0, 1, 2, ..., one index per stored object, so a real file's indices
    stay below its size."""
    for opcode, argument, position in pickletools.genops(io.BytesIO(data)):
        if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and argument >= len(data):
            raise ValueError(
                f"at byte {position}, {opcode.name} stores at memo index {argument}, beyond "
                f"what a pickle of {len(data)} bytes numbers (a memory bomb)"
            )
