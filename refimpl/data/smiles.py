"""Molecules from SMILES: the Open Graph Benchmark's featurisation, and a CSV reader.

:func:`smiles_to_graph` parses one SMILES string with RDKit (the optional extra ``chem``:
``pip install 'refimpl[chem]'``; imported only when a molecule is read) and returns the
molecule as OGB's ``ogb.utils.smiles2graph`` does (``ogb/utils/mol.py``, with
``atom_to_feature_vector`` and ``bond_to_feature_vector`` of ``ogb/utils/features.py``,
snap-stanford/ogb at commit ``61e9784``; the features last changed in ``184e2bf``, 2022):
the heavy atoms as nodes (hydrogens stay implicit, as with ``removeHs=True``), each bond as
two directed edges ``(i, j)`` then ``(j, i)`` with the same features, in RDKit's bond order.

Features are integer category indices into OGB's allowable lists (:data:`ATOM_FEATURES`,
:data:`BOND_FEATURES`), as OGB stores them; a value missing from a list that ends in ``misc``
gets that last index (OGB's ``safe_index``). Atom, 9 columns (list sizes in brackets): atomic
number 1..118 [119], chirality tag UNSPECIFIED, TETRAHEDRAL_CW, TETRAHEDRAL_CCW, OTHER [5],
total degree with hydrogens 0..10 [12], formal charge -5..5 [12], total hydrogens 0..8 [10],
radical electrons 0..4 [6], hybridization SP, SP2, SP3, SP3D, SP3D2 [6] (each with misc), and
aromatic, in a ring: False, True [2 each]. Bond, 3 columns: type SINGLE, DOUBLE, TRIPLE,
AROMATIC, misc [5], stereo STEREONONE, Z, E, CIS, TRANS, ANY [6] (no misc: OGB's
``list.index`` raises on another value, and so does this module, with a message), and
conjugated False, True [2].

How they enter refimpl: a :class:`~refimpl.data.graph_dataset.GraphDataset` holds floats, so
``x`` (n, 9) and ``edge_attr`` (E, 3) are these indices as float64 (carbon is ``x[:, 0] ==
5.0``). They are categories, not magnitudes: OGB's ``AtomEncoder`` and ``BondEncoder`` embed
each column (tables of :data:`ATOM_FEATURE_DIMS`, :data:`BOND_FEATURE_DIMS` rows) and sum the
embeddings, where refimpl's models read ``x`` through a linear layer: one-hot encode the
columns (``np.eye(dim)[column]``) where an embedding is wanted.

:func:`load_smiles_csv` reads a CSV of SMILES and targets into a :class:`GraphDataset`, cut
by a split file of row numbers (the ZINC benchmark's) or a split column if asked.
"""

from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from refimpl.data.graph_dataset import TASKS, GraphDataset
from refimpl.data.pointers import _pointers

__all__ = [
    "ATOM_FEATURES",
    "ATOM_FEATURE_DIMS",
    "BOND_FEATURES",
    "BOND_FEATURE_DIMS",
    "MolecularGraph",
    "load_smiles_csv",
    "smiles_to_graph",
]

MISC = "misc"
# OGB's allowable_features (ogb/utils/features.py), in its order; names as RDKit prints them
ATOM_FEATURES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("atomic_num", (*range(1, 119), MISC)),
    (
        "chirality",
        ("CHI_UNSPECIFIED", "CHI_TETRAHEDRAL_CW", "CHI_TETRAHEDRAL_CCW", "CHI_OTHER", MISC),
    ),
    ("degree", (*range(11), MISC)),
    ("formal_charge", (*range(-5, 6), MISC)),
    ("num_h", (*range(9), MISC)),
    ("num_radical_electrons", (*range(5), MISC)),
    ("hybridization", ("SP", "SP2", "SP3", "SP3D", "SP3D2", MISC)),
    ("is_aromatic", (False, True)),
    ("is_in_ring", (False, True)),
)
BOND_FEATURES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("bond_type", ("SINGLE", "DOUBLE", "TRIPLE", "AROMATIC", MISC)),
    ("stereo", ("STEREONONE", "STEREOZ", "STEREOE", "STEREOCIS", "STEREOTRANS", "STEREOANY")),
    ("is_conjugated", (False, True)),
)
ATOM_FEATURE_DIMS = tuple(len(values) for _, values in ATOM_FEATURES)  # OGB get_atom_feature_dims
BOND_FEATURE_DIMS = tuple(len(values) for _, values in BOND_FEATURES)  # get_bond_feature_dims

# the RDKit reading of each feature, in the tables' order (ogb atom/bond_to_feature_vector)
_ATOM_READERS: tuple[Callable[[Any], Any], ...] = (
    lambda atom: atom.GetAtomicNum(),
    lambda atom: str(atom.GetChiralTag()),
    lambda atom: atom.GetTotalDegree(),
    lambda atom: atom.GetFormalCharge(),
    lambda atom: atom.GetTotalNumHs(),
    lambda atom: atom.GetNumRadicalElectrons(),
    lambda atom: str(atom.GetHybridization()),
    lambda atom: atom.GetIsAromatic(),
    lambda atom: atom.IsInRing(),
)
_BOND_READERS: tuple[Callable[[Any], Any], ...] = (
    lambda bond: str(bond.GetBondType()),
    lambda bond: str(bond.GetStereo()),
    lambda bond: bond.GetIsConjugated(),
)
_SPLIT_NAMES = {"train": 0, "val": 1, "valid": 1, "test": 2}  # a split file's or column's parts


class MolecularGraph(NamedTuple):
    """One molecule as OGB's ``smiles2graph`` returns it (integer category indices).

    Attributes
    ----------
    x : int64 array (n, 9)
        Atom features, one row per heavy atom in RDKit's order (the module's table).
    edge_index : int64 array (2, E)
        ``E = 2 * bonds``: bond ``k`` is columns ``2k`` ``(i, j)`` and ``2k + 1`` ``(j, i)``.
    edge_attr : int64 array (E, 3)
        Bond features, the same row for both directions.
    """

    x: np.ndarray
    edge_index: np.ndarray
    edge_attr: np.ndarray


def _rdkit() -> Any:
    """RDKit's ``Chem`` module, or one clear ``ImportError`` saying how to install it."""
    try:
        from rdkit import Chem
    except ImportError as err:
        raise ImportError(
            "reading molecules from SMILES needs RDKit: install refimpl's chem extra with "
            "pip install 'refimpl[chem]' (or pip install rdkit)"
        ) from err
    return Chem


def _index(values: tuple[Any, ...], value: Any, what: str) -> int:
    """``value``'s position in ``values``; OGB's ``safe_index`` (the last, ``misc``) when the
    list has one, else a ValueError (where OGB's ``list.index`` raises)."""
    if value in values:
        return values.index(value)
    if values[-1] == MISC:
        return len(values) - 1
    raise ValueError(
        f"{what} {value!r} is not among OGB's allowable values {list(values)}: OGB's "
        "featurisation has no index for it"
    )


def _features(item: Any, table: Any, readers: Any, what: str) -> list[int]:
    """One atom's or bond's category indices (OGB's atom_ / bond_to_feature_vector)."""
    return [
        _index(values, read(item), f"{what} {item.GetIdx()}'s {name}")
        for (name, values), read in zip(table, readers, strict=True)
    ]


def smiles_to_graph(smiles: str) -> MolecularGraph:
    """One molecule from its SMILES string, featurised as OGB's ``smiles2graph``.

    Parameters
    ----------
    smiles : str
        A SMILES string RDKit parses (``Chem.MolFromSmiles``); hydrogens stay implicit.

    Returns
    -------
    MolecularGraph
        ``x`` (n, 9), ``edge_index`` (2, E), ``edge_attr`` (E, 3), all int64 category indices
        (the module docstring's tables). A molecule without bonds has ``E = 0``.

    Raises
    ------
    ImportError
        RDKit is not installed (``pip install 'refimpl[chem]'``).
    TypeError
        ``smiles`` is not a string.
    ValueError
        RDKit cannot parse it, it has no atoms, or a bond's stereo is outside OGB's list.
    """
    if not isinstance(smiles, str):
        raise TypeError(f"smiles must be a str, got {type(smiles).__name__}")
    chem = _rdkit()
    from rdkit import rdBase

    with rdBase.BlockLogs():  # RDKit prints parse errors itself; ours is the one message
        mol = chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(
            f"RDKit cannot parse the SMILES {smiles!r} (Chem.MolFromSmiles returns None: check "
            "its brackets, ring-closure digits and valences)"
        )
    if mol.GetNumAtoms() == 0:
        raise ValueError(f"the SMILES {smiles!r} has no atoms: a graph needs at least one node")
    # 1. atoms: one row of 9 category indices per atom
    x = [_features(atom, ATOM_FEATURES, _ATOM_READERS, "atom") for atom in mol.GetAtoms()]
    # 2. bonds: both directions, (i, j) then (j, i), sharing one feature row
    pairs, features = [], []
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        pairs += [(i, j), (j, i)]
        features += [_features(bond, BOND_FEATURES, _BOND_READERS, "bond")] * 2
    edge_index = np.array(pairs, dtype=np.int64).reshape(-1, 2).T.copy()
    edge_attr = np.array(features, dtype=np.int64).reshape(-1, len(BOND_FEATURES))
    return MolecularGraph(np.array(x, dtype=np.int64), edge_index, edge_attr)


def load_smiles_csv(
    path: str | os.PathLike,
    *,
    targets: str | Sequence[str],
    smiles: str = "SMILES",
    split: str | os.PathLike | None = None,
    on_error: str = "raise",
    task: str = "regression",
) -> GraphDataset | tuple[GraphDataset, GraphDataset, GraphDataset]:
    """A CSV file of SMILES and their targets as a :class:`GraphDataset`.

    Parameters
    ----------
    path : str or path
        A CSV file with a header row (comma-separated, quotes as Python's ``csv`` reads them).
        Row ``r`` below is the ``r``-th data row, counted from 0 after the header.
    targets : str or sequence of str
        The target columns, in this order: ``y`` is (G, T) with ``T = len(targets)``.
    smiles : str
        The SMILES column (``"SMILES"`` in ZINC files, ``"smiles"`` in QM9's).
    split : None, a column name, or a path
        None: the whole dataset. A column of this file: each row's value is ``train``, ``val``
        (or ``valid``) or ``test``. Anything else is a path to a CSV file of row numbers with
        the columns ``train``, ``val`` (or ``valid``) and ``test``, shorter columns padded with
        empty cells (the ZINC benchmark's ``micro_zinc_splits.csv``; ``392.0`` reads as row
        392); a row in no part is left out, a row in two is refused.
    on_error : ``"raise"`` or ``"skip"``
        What an unusable SMILES does (RDKit cannot parse it, no atoms, a bond stereo OGB has no
        index for): ``"raise"`` a ``ValueError`` naming the row and the string; ``"skip"`` the
        row, with one ``UserWarning`` listing the rows skipped (and left out of the split).
    task : ``"regression"`` or ``"multilabel"``
        Regression: every target cell a finite number (an empty or NaN cell is refused: a
        regression target must be complete). Multi-label: 0, 1, or empty or NaN for a missing
        label, which the dataset masks (``GraphDataset.y_mask``; TOX21's empty cells).

    Returns
    -------
    GraphDataset, or (train, val, test)
        Named after the file's stem, features as in the module
        docstring (OGB's indices as float64). With ``split``, the three parts as
        :meth:`GraphDataset.split` returns them: a split file's parts in its order, a split
        column's in the file's order.
    """
    for option, value, allowed in (
        ("on_error", on_error, ("raise", "skip")),
        ("task", task, TASKS),
    ):
        if value not in allowed:
            raise ValueError(f"{option} must be one of {allowed}, got {value!r}")
    columns = [targets] if isinstance(targets, str) else list(targets)
    if not columns or not all(isinstance(column, str) for column in columns):
        raise TypeError(f"targets must be a column name or a list of them, got {targets!r}")
    path = Path(path)
    header, rows = _read_csv(path, "SMILES CSV")
    split_column = split if isinstance(split, str) and split in header else None
    _check_columns(path, header, [smiles, *columns])
    at = {name: header.index(name) for name in header}
    parts = None  # the split's parts as row numbers of the file, read before the molecules
    if split_column is not None:
        parts = _split_from_column(path, [row[at[split_column]] for _, row in rows], split_column)
    elif split is not None:
        parts = _split_from_file(Path(split), len(rows), header)
    values, graphs, skipped = [], [], []
    for number, (line, row) in enumerate(rows):
        where = f"{path.name} row {number} (line {line})"
        values.append([_number(row[at[column]], column, where, task) for column in columns])
        try:
            graphs.append(smiles_to_graph(row[at[smiles]]))
        except ValueError as err:
            if on_error == "raise":
                raise ValueError(
                    f"{where}: {err}; fix or drop the row, or pass on_error='skip'"
                ) from None
            graphs.append(None)
            skipped.append(number)
    if len(skipped) == len(rows):
        raise ValueError(f"{path} holds no molecule RDKit can use: every SMILES was skipped")
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
        warnings.warn(
            f"{path.name}: skipped {len(skipped)} of {len(rows)} rows whose SMILES RDKit cannot "
            f"use (rows {shown}, counted from 0 after the header)"
            + ("; they are left out of the split too" if split is not None else ""),
            UserWarning,
            stacklevel=2,
        )
    kept = np.array([graph is not None for graph in graphs], dtype=bool)
    y = np.array(values)[kept]
    dataset = _dataset(path.stem, [g for g in graphs if g is not None], y, task)
    if parts is None:
        return dataset
    position = np.cumsum(kept) - 1  # (rows,) a kept row's index in the dataset
    return tuple(dataset.subset(position[part[kept[part]]]) for part in parts)


def _read_csv(path: Path, what: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the non-blank data rows (each with its line number) of a CSV file."""
    if not path.is_file():
        raise FileNotFoundError(f"no {what} file at {path}")
    try:
        with path.open(newline="", encoding="utf-8-sig") as stream:
            reader = csv.reader(stream)
            header = next(reader, None)
            rows = [(reader.line_num, row) for row in reader if row]
    except (UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"{path} is not a readable CSV text file ({err})") from None
    if not header:
        raise ValueError(f"{path} is empty: a {what} needs a header row naming its columns")
    if not rows:
        raise ValueError(f"{path} has a header but no data rows")
    header = [name.strip() for name in header]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ValueError(f"{path}: the header names the columns {repeated} more than once")
    for line, row in rows:
        if len(row) != len(header):
            raise ValueError(
                f"{path} line {line} has {len(row)} fields where the header has {len(header)}"
            )
    return header, rows


def _check_columns(path: Path, header: list[str], wanted: list[str]) -> None:
    missing = [name for name in wanted if name not in header]
    if missing:
        raise ValueError(
            f"{path} has no column {', '.join(map(repr, missing))}; its columns are {header} "
            "(choose them with smiles= and targets=)"
        )


def _number(text: str, column: str, where: str, task: str) -> float:
    """A target cell as a float (NaN: a missing multi-label label), or one line naming the
    row, the column and the text."""
    try:
        value = float(text) if text.strip() else float("nan")  # an empty cell: missing
    except ValueError:
        raise ValueError(f"{where}: column {column!r} holds {text!r}, not a number") from None
    if task == "multilabel" and not (np.isnan(value) or value in (0.0, 1.0)):
        raise ValueError(
            f"{where}: column {column!r} holds {text!r}; a multi-label target is 0, 1, or "
            "empty where the label is missing"
        )
    if task == "regression" and not np.isfinite(value):
        raise ValueError(
            f"{where}: column {column!r} holds {text!r}; regression targets must be finite "
            "numbers (missing labels are for task='multilabel'): drop or fill the row"
        )
    return value


def _dataset(name: str, graphs: list[MolecularGraph], y: np.ndarray, task: str) -> GraphDataset:
    """The molecules stored flat (the layout of :mod:`refimpl.data.graph_dataset`)."""
    return GraphDataset(
        name=name,
        x=np.concatenate([g.x for g in graphs]).astype(np.float64),
        edge_index=np.concatenate([g.edge_index for g in graphs], axis=1),
        edge_attr=np.concatenate([g.edge_attr for g in graphs]).astype(np.float64),
        node_ptr=_pointers(np.array([g.x.shape[0] for g in graphs])),
        edge_ptr=_pointers(np.array([g.edge_index.shape[1] for g in graphs])),
        y=y.astype(np.float64).reshape(len(graphs), -1),  # NaN: missing (y_mask)
        task=task,
    )


def _split_from_column(path: Path, cells: list[str], column: str) -> list[np.ndarray]:
    """Row numbers of each part named in a split column (train, val or valid, test)."""
    labels = [cell.strip().lower() for cell in cells]
    unknown = sorted(set(labels) - set(_SPLIT_NAMES))
    if unknown:
        row = labels.index(unknown[0])
        raise ValueError(
            f"{path} row {row}: the split column {column!r} holds {cells[row]!r}; its values "
            f"must be train, val (or valid) or test"
        )
    part = np.array([_SPLIT_NAMES[label] for label in labels])
    return [np.flatnonzero(part == k) for k in range(3)]


def _split_from_file(path: Path, num_rows: int, data_header: list[str]) -> list[np.ndarray]:
    """Row numbers of each part from a CSV of index columns train, val (or valid), test."""
    if not path.is_file():
        raise FileNotFoundError(
            f"split={str(path)!r} is neither a column of the SMILES CSV (its columns are "
            f"{data_header}) nor a split file"
        )
    header, rows = _read_csv(path, "split")
    names = [name.lower() for name in header]
    order = [_SPLIT_NAMES.get(name) for name in names]
    if sorted(k for k in order if k is not None) != [0, 1, 2] or None in order:
        raise ValueError(
            f"{path}: a split file has the three columns train, val (or valid) and test, "
            f"got {header}"
        )
    parts: list[list[int]] = [[], [], []]
    for line, row in rows:
        for k, cell in zip(order, row, strict=True):
            if cell.strip():
                parts[k].append(_row_index(cell, f"{path} line {line}", num_rows))
    everything = np.concatenate([np.array(part, dtype=np.int64) for part in parts])
    numbers, counts = np.unique(everything, return_counts=True)
    if (counts > 1).any():
        raise ValueError(
            f"{path}: row {int(numbers[counts > 1][0])} is listed more than once; each row "
            "belongs to one part at most"
        )
    return [np.array(part, dtype=np.int64) for part in parts]


def _row_index(cell: str, where: str, num_rows: int) -> int:
    """A split file's cell as a row number in ``[0, num_rows)`` (``"392.0"`` is 392)."""
    try:
        value = float(cell)
    except ValueError:
        value = float("nan")
    if not np.isfinite(value) or value != int(value) or not 0 <= value < num_rows:
        raise ValueError(
            f"{where}: {cell!r} is no row of the SMILES CSV; a split file holds whole row "
            f"numbers from 0 to {num_rows - 1} (counted after the header)"
        )
    return int(value)
