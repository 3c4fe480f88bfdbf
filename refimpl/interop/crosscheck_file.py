"""The crosscheck file's entries, checked before anything runs, and the error that names them.

The layout itself (each entry's meaning, shapes and dtypes) is documented in
:mod:`refimpl.interop.crosscheck`, which reads the file; this module holds the names it accepts,
:class:`CrosscheckError`, and the checks of the entries and of the config's ``"frozen"`` list.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CONFIG_KEYS", "CrosscheckError", "check_entries", "frozen_parameters"]

CONFIG_KEYS = ("framework", "layer", "kwargs", "frozen")  # the keys the config's JSON may hold
# the entries the reader maps (refimpl.interop.crosscheck's docstring); input/edge_index has
# no gradient
_INPUTS = ("x", "x_src", "x_dst", "edge_index", "edge_attr")
_DIFFERENTIABLE = ("x", "x_src", "x_dst", "edge_attr")
_LAYOUT = (
    "config, param/<name>, input/{x, x_src, x_dst, edge_index, edge_attr}, output/out, "
    "cotangent, grad/input/{x, x_src, x_dst, edge_attr}, grad/param/<name>"
)


class CrosscheckError(ValueError):
    """The file cannot be checked: what is wrong with it, and how to fix it."""


def check_entries(arrays: dict[str, Any], source: str) -> None:
    """Every entry one the reader maps, and no two that mean the same thing.

    Parameters
    ----------
    arrays : dict of str to array
        The file's entries, ``key -> array``.
    source : str
        What the entries came from (a path), named in the error.

    Raises
    ------
    CrosscheckError
        An unknown entry, node features given twice, a non-float entry where floats
        belong, or a ``grad/`` entry for an input or parameter the file does not give.
    """
    unknown = [key for key in arrays if not _known(key)]
    if unknown:
        raise CrosscheckError(
            f"{source} has entries a crosscheck file does not hold: {unknown}; its entries are "
            f"{_LAYOUT} (see refimpl.interop.crosscheck)"
        )
    pair = [key for key in ("input/x_src", "input/x_dst") if key in arrays]
    if "input/x" in arrays and pair:
        raise CrosscheckError(
            f"{source} has input/x and {' and '.join(pair)}: node features twice; give "
            "input/x (one node set) or input/x_src and input/x_dst (a bipartite layer)"
        )
    for key, value in arrays.items():
        floats = key not in ("config", "input/edge_index")
        if floats and getattr(value, "dtype", np.dtype(object)).kind != "f":
            raise CrosscheckError(
                f"{source}: {key} has dtype {getattr(value, 'dtype', type(value).__name__)}; "
                "every entry but config and input/edge_index holds floats"
            )
        if key.startswith("grad/") and key.removeprefix("grad/") not in arrays:
            raise CrosscheckError(
                f"{source} has {key} but no {key.removeprefix('grad/')}: a gradient for an "
                "input or parameter the file does not give"
            )


def _known(key: str) -> bool:
    if key in ("config", "output/out", "cotangent"):
        return True
    for prefix, names in (("grad/input/", _DIFFERENTIABLE), ("input/", _INPUTS)):
        if key.startswith(prefix):
            return key.removeprefix(prefix) in names
    return any(key.startswith(p) and len(key) > len(p) for p in ("param/", "grad/param/"))


def frozen_parameters(
    config: dict[str, Any], params: dict[str, Any], arrays: dict[str, Any]
) -> list[str]:
    """The config's ``"frozen"`` parameter names, each a ``param/`` entry without a gradient.

    Parameters
    ----------
    config : dict
        The file's parsed ``config``; ``"frozen"``, when present, a list of names.
    params : dict of str to array
        The file's parameters, ``param/`` stripped from their keys.
    arrays : dict of str to array
        All the file's entries (a frozen parameter must have no ``grad/param/`` one).

    Returns
    -------
    list of str
        The frozen names, ``[]`` when the config lists none.
    """
    frozen = config.get("frozen", [])
    if not isinstance(frozen, list) or not all(isinstance(name, str) for name in frozen):
        raise CrosscheckError(f"config's frozen must be a list of parameter names, got {frozen!r}")
    for name in frozen:
        if name not in params:
            raise CrosscheckError(
                f"config's frozen lists {name!r}, which is no param/ entry; parameters: "
                f"{sorted(params)}"
            )
        if f"grad/param/{name}" in arrays:
            raise CrosscheckError(
                f"grad/param/{name} is given for a parameter the config lists as frozen "
                "(requires_grad=False, no gradient): drop one or the other"
            )
    return frozen
