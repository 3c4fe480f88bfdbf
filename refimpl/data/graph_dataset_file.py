"""The ``.npz`` file of a :class:`~refimpl.data.graph_dataset.GraphDataset`: write and read it.

The keys, shapes and dtypes are documented in :mod:`refimpl.data.graph_dataset` ("On
disk: one ``.npz`` file"), with an example that converts your own molecules.
:func:`save_graph_dataset` writes atomically (:func:`refimpl.files.atomic_write`);
:func:`load_graph_dataset` reads without pickle and validates every array.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from refimpl.data.graph_dataset import GraphDataset
from refimpl.files import atomic_write, read_npz

__all__ = [
    "FORMAT_VERSION",
    "load_graph_dataset",
    "save_graph_dataset",
]

FORMAT_VERSION = 1  # the ``format_version`` written and read
FILE_KEYS = (
    "x",
    "edge_index",
    "edge_attr",
    "node_ptr",
    "edge_ptr",
    "y",
    "name",
    "task",
    "format_version",
)
OPTIONAL_KEYS = ("y_mask",)  # written only when some label is missing; older files lack it


def save_graph_dataset(path: str | os.PathLike, dataset: GraphDataset) -> None:
    """Write ``dataset`` to one ``.npz`` file at ``path`` (exactly that name), atomically.

    See the module docstring for the keys. The temporary file lives in the
    target's folder (so ``os.replace`` is a rename on one file system) and is
    removed if the write fails; the result gets the usual permissions
    (``0o666`` less the umask).

    Parameters
    ----------
    path : str or os.PathLike
        The file written, under exactly this name (no ``.npz`` appended).
    dataset : GraphDataset
        The graphs.
    """
    if not isinstance(dataset, GraphDataset):
        raise TypeError(f"dataset must be a GraphDataset, got {type(dataset).__name__}")
    path = Path(path)
    arrays = {
        "x": dataset.x,
        "edge_index": dataset.edge_index,
        "edge_attr": dataset.edge_attr,
        "node_ptr": dataset.node_ptr,
        "edge_ptr": dataset.edge_ptr,
        "y": dataset.y,
        "name": np.array(dataset.name, dtype=np.str_),  # 0-d unicode
        "task": np.array(dataset.task, dtype=np.str_),
        "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
    }
    if dataset.y_mask is not None:
        arrays["y_mask"] = dataset.y_mask
    # a file object: no ".npz" appended to the name
    atomic_write(path, lambda stream: np.savez_compressed(stream, **arrays))


def load_graph_dataset(path: str | os.PathLike) -> GraphDataset:
    """Read a file written by :func:`save_graph_dataset` (or by hand to the same format).

    The optional ``y_mask`` (missing labels) is read when present; files without it (all
    earlier ones) load as before.

    Parameters
    ----------
    path : str or os.PathLike
        A graph dataset file (the format in :mod:`refimpl.data.graph_dataset`).

    Returns
    -------
    GraphDataset
        Validated, as its constructor validates.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ValueError
        A file that is not an ``.npz`` archive, has missing or extra keys, object
        (pickled) arrays or another ``format_version``.
    ValueError or TypeError
        An array the :class:`GraphDataset` validation rejects (the path in front).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no graph dataset file at {path}; write one with save_graph_dataset or see the "
            "format in refimpl.data.graph_dataset"
        )
    hint = "write it with save_graph_dataset; the format is in refimpl.data.graph_dataset"
    found = read_npz(path, ValueError, hint, what="graph dataset file")
    missing = [key for key in FILE_KEYS if key not in found]
    unexpected = sorted(key for key in found if key not in FILE_KEYS + OPTIONAL_KEYS)
    if missing or unexpected:
        raise ValueError(
            f"{path}: missing keys {missing}, unexpected keys {unexpected}; a graph dataset "
            f"file holds exactly {list(FILE_KEYS)}, and {list(OPTIONAL_KEYS)} if some label "
            f"is missing ({hint})"
        )
    arrays = {key: found[key] for key in FILE_KEYS}
    version = arrays["format_version"]
    if version.shape != () or version.dtype.kind not in "iu" or int(version) != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format_version is {version!r}; this refimpl reads format_version = "
            f"{FORMAT_VERSION} (a 0-d integer array)"
        )
    strings = {}
    for key in ("name", "task"):
        value = arrays[key]
        if value.shape != () or value.dtype.kind != "U":
            raise ValueError(
                f"{path}: {key} must be a 0-d unicode array such as np.array('zinc'), got "
                f"{value.dtype}{value.shape}"
            )
        strings[key] = str(value[()])
    try:
        return GraphDataset(
            name=strings["name"],
            x=arrays["x"],
            edge_index=arrays["edge_index"],
            edge_attr=arrays["edge_attr"],
            node_ptr=arrays["node_ptr"],
            edge_ptr=arrays["edge_ptr"],
            y=arrays["y"],
            task=strings["task"],
            y_mask=found.get("y_mask"),
        )
    except (TypeError, ValueError) as err:
        raise type(err)(f"{path}: {err}") from err
