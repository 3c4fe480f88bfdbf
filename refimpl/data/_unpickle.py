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
"""

from __future__ import annotations

import collections
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

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
            return _ALLOWED[(module, name)]
        except KeyError:
            allowed = ", ".join(sorted({f"{m}.{n}" for m, n in _ALLOWED}))
            raise UnsafePickleError(
                f"refusing to load {self._path}: the file asks for {module}.{name}, which a "
                "Planetoid file never contains; the file may be tampered with (check it against "
                f"SHA256SUMS). Allowed globals: {allowed}"
            ) from None


def load_restricted_pickle(path: str | Path) -> Any:
    """Unpickle ``path`` with ``RestrictedUnpickler`` (latin1, allow-listed globals only).

    Raises ``UnsafePickleError`` for a global outside the allow-list and ``ValueError``
    naming the file for any other malformed content (truncated, empty, not a pickle, an
    allowed class called with arguments it refuses).
    """
    path = Path(path)
    with path.open("rb") as f:
        try:
            return RestrictedUnpickler(f, str(path)).load()
        except UnsafePickleError:
            raise
        except Exception as err:  # malformed bytes can make unpickling raise anything
            raise ValueError(
                f"{path}: not a readable pickle ({type(err).__name__}: {err}); restore the "
                "file from its source (check it against SHA256SUMS)"
            ) from err
