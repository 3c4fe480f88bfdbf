"""Molecules from SMILES (issue 35 item 1): OGB's featurisation on hand-checked molecules, the
shared ZINC and QM9 files, and the CSV reader's errors. Skips without RDKit (the ``chem``
extra); the shared-file tests also without ``REFIMPL_DATA``."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from refimpl.data import GraphDataset, load_smiles_csv, smiles_to_graph
from refimpl.data.smiles import (
    ATOM_FEATURE_DIMS,
    ATOM_FEATURES,
    BOND_FEATURE_DIMS,
    BOND_FEATURES,
    _index,
)
from tests.data import data_root

Chem = pytest.importorskip("rdkit.Chem", reason="RDKit (refimpl[chem]) is not installed")

# OGB's atom row: [atomic number - 1, chirality, total degree, formal charge + 5, total Hs,
# radical electrons, hybridization (SP 0, SP2 1, SP3 2), aromatic, in ring]; bond row: [type
# (SINGLE 0, DOUBLE 1, TRIPLE 2, AROMATIC 3), stereo (NONE 0, Z 1, E 2), conjugated].


def test_the_allowable_lists_have_ogbs_sizes() -> None:
    # OGB's get_atom_feature_dims() / get_bond_feature_dims(), the sizes of AtomEncoder's and
    # BondEncoder's embedding tables
    assert ATOM_FEATURE_DIMS == (119, 5, 12, 12, 10, 6, 6, 2, 2)
    assert BOND_FEATURE_DIMS == (5, 6, 2)
    assert ATOM_FEATURES[3][1][5] == 0 and ATOM_FEATURES[0][1][5] == 6  # charge 0, carbon


def test_ethanol() -> None:
    graph = smiles_to_graph("CCO")
    # C0: carbon (5), degree 1 + 3 H = 4, charge 0 (5), 3 H, sp3 (2)
    # C1: degree 2 + 2 H = 4, 2 H;  O2: oxygen (7), degree 1 + 1 H = 2, 1 H, sp3
    assert graph.x.tolist() == [
        [5, 0, 4, 5, 3, 0, 2, 0, 0],
        [5, 0, 4, 5, 2, 0, 2, 0, 0],
        [7, 0, 2, 5, 1, 0, 2, 0, 0],
    ]
    # bonds C0-C1, C1-O2 (RDKit's order), each (i, j) then (j, i); single, no stereo, not
    # conjugated
    assert graph.edge_index.tolist() == [[0, 1, 1, 2], [1, 0, 2, 1]]
    assert graph.edge_attr.tolist() == [[0, 0, 0]] * 4
    assert {a.dtype for a in graph} == {np.dtype(np.int64)}


def test_benzene() -> None:
    graph = smiles_to_graph("c1ccccc1")
    # every carbon: degree 2 + 1 H = 3, 1 H, sp2 (1), aromatic, in a ring
    assert graph.x.tolist() == [[5, 0, 3, 5, 1, 0, 1, 1, 1]] * 6
    # six aromatic (3), conjugated bonds around the ring, both directions
    assert graph.edge_attr.tolist() == [[3, 0, 1]] * 12
    pairs = set(map(tuple, graph.edge_index.T.tolist()))
    ring = {(i, (i + 1) % 6) for i in range(6)}
    assert pairs == ring | {(j, i) for i, j in ring} and graph.edge_index.shape == (2, 12)


def test_a_charged_atom() -> None:
    # methylammonium: N (atomic number 7, index 6), degree 1 + 3 H = 4, charge +1 (index 6), 3 H
    graph = smiles_to_graph("C[NH3+]")
    assert graph.x[1].tolist() == [6, 0, 4, 6, 3, 0, 2, 0, 0]


def test_a_chiral_centre_and_a_stereo_bond() -> None:
    # OGB's own example (ogb/utils/features.py): atom 1 of Cl[C@H](/C=C/C)Br is
    # [5, 2, 4, 5, 1, 0, 2, 0, 0] (@ is CHI_TETRAHEDRAL_CCW, index 2) and bond 2, the double
    # bond between the slashes, [1, 2, 0] (DOUBLE, STEREOE, not conjugated)
    graph = smiles_to_graph("Cl[C@H](/C=C/C)Br")
    assert graph.x[1].tolist() == [5, 2, 4, 5, 1, 0, 2, 0, 0]
    assert graph.edge_attr[4].tolist() == graph.edge_attr[5].tolist() == [1, 2, 0]
    # the mirror image (@@, CHI_TETRAHEDRAL_CW, index 1) and the Z isomer (STEREOZ, index 1)
    mirror = smiles_to_graph("Cl[C@@H](/C=C\\C)Br")
    assert mirror.x[1, 1] == 1 and mirror.edge_attr[4].tolist() == [1, 1, 0]


def test_values_outside_the_lists_take_misc() -> None:
    # a dummy atom * has atomic number 0, not in 1..118: misc (index 118); sodium (11) is 10
    graph = smiles_to_graph("*C.[Na+]")
    assert graph.x[0, 0] == 118 and graph.x[2, 0] == 10 and graph.x[2, 3] == 6
    # a molecule without bonds keeps OGB's (0, 3) edge features
    lone = smiles_to_graph("[Na+]")
    assert lone.edge_index.shape == (2, 0) and lone.edge_attr.shape == (0, 3)
    # the stereo list has no misc; OGB's list.index raises there, and so do we, naming it
    with pytest.raises(ValueError, match="stereo 'STEREOATROPCW' is not among OGB's"):
        _index(BOND_FEATURES[1][1], "STEREOATROPCW", "bond 0's stereo")


@pytest.mark.parametrize(
    ("smiles", "error", "message"),
    [
        ("C1CC", ValueError, "RDKit cannot parse the SMILES 'C1CC'"),
        ("C(C)(C)(C)(C)C", ValueError, "cannot parse"),  # a five-valent carbon
        ("", ValueError, "has no atoms"),
        (b"CCO", TypeError, "smiles must be a str, got bytes"),
    ],
)
def test_unusable_smiles_are_one_clear_line(smiles: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        smiles_to_graph(smiles)  # type: ignore[arg-type]


# -- the shared molecules (REFIMPL_DATA) -----------------------------------------------------


def molecules() -> Path:
    folder = data_root() / "molecules"
    if not folder.is_dir():
        pytest.skip(f"{folder} is missing")
    return folder


def check_against_rdkit(dataset: GraphDataset, smiles: list[str]) -> None:
    """Every molecule as RDKit reads it: its atoms' numbers and its bonds, both directions."""
    assert len(dataset) == len(smiles)
    assert (dataset.x < np.array(ATOM_FEATURE_DIMS)).all() and (dataset.x >= 0).all()
    assert (dataset.edge_attr < np.array(BOND_FEATURE_DIMS)).all()
    for i, text in enumerate(smiles):
        mol = Chem.MolFromSmiles(text)
        graph, x, edge_attr, _ = dataset.graph(i)
        assert (x[:, 0] + 1).tolist() == [atom.GetAtomicNum() for atom in mol.GetAtoms()]
        bonds = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
        assert graph.edge_index[:, 0::2].T.tolist() == [list(b) for b in bonds]
        assert (graph.edge_index[:, 1::2] == graph.edge_index[::-1, 0::2]).all()
        assert (edge_attr[0::2] == edge_attr[1::2]).all()


def read_column(path: Path, column: str) -> list[str]:
    import csv

    with path.open(newline="") as stream:
        return [row[column] for row in csv.DictReader(stream)]


def test_every_shared_zinc_molecule_parses() -> None:
    path = molecules() / "micro_ZINC.csv"
    dataset = load_smiles_csv(path, targets=["score", "logp"])
    check_against_rdkit(dataset, read_column(path, "SMILES"))
    assert dataset.y[:, 0].tolist() == [float(v) for v in read_column(path, "score")]


def test_every_shared_qm9_molecule_parses() -> None:
    path = molecules() / "micro_qm9.csv"
    dataset = load_smiles_csv(path, smiles="smiles", targets="gap")
    check_against_rdkit(dataset, read_column(path, "smiles"))


def test_the_zinc_split_file() -> None:
    folder = molecules()
    whole = load_smiles_csv(folder / "micro_ZINC.csv", targets="score")
    parts = load_smiles_csv(
        folder / "micro_ZINC.csv", targets="score", split=folder / "micro_zinc_splits.csv"
    )
    assert [len(part) for part in parts] == [600, 200, 200]
    # each part holds the rows the file lists, in its order ("392.0" is row 392)
    for part, column in zip(parts, ("train", "val", "test"), strict=True):
        rows = [int(float(v)) for v in read_column(folder / "micro_zinc_splits.csv", column) if v]
        assert part.y[:, 0].tolist() == whole.y[rows, 0].tolist()
        assert np.array_equal(part.x, whole.subset(np.array(rows)).x)


# -- the CSV reader's errors (small files written here) --------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


TABLE = "SMILES,score,part\nCCO,1.5,train\nc1ccccc1,-2.0,val\nC[NH3+],0.25,test\nCC,3.0,train\n"


def test_a_small_file_reads_in_order(tmp_path: Path) -> None:
    dataset = load_smiles_csv(write(tmp_path / "mols.csv", TABLE), targets="score")
    assert dataset.name == "mols" and dataset.task == "regression"
    assert dataset.y[:, 0].tolist() == [1.5, -2.0, 0.25, 3.0]
    assert np.diff(dataset.node_ptr).tolist() == [3, 6, 2, 2]
    assert dataset.x[:3].tolist() == smiles_to_graph("CCO").x.tolist()


def test_a_split_column(tmp_path: Path) -> None:
    train, val, test = load_smiles_csv(
        write(tmp_path / "mols.csv", TABLE), targets="score", split="part"
    )
    assert train.y[:, 0].tolist() == [1.5, 3.0] and val.y[:, 0].tolist() == [-2.0]
    assert test.y[:, 0].tolist() == [0.25]


def test_skipped_rows_are_listed_and_targets_stay_aligned(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "SMILES,y\nCCO,1\nC1CC,2\nCC,3\nnot-smiles,4\nC,5\n")
    split = write(tmp_path / "s.csv", "train,val,test\n0,1,2\n3,,\n4,,\n")
    with pytest.warns(UserWarning, match=r"skipped 2 of 5 rows .*\(rows 1, 3,.*left out of the"):
        train, val, test = load_smiles_csv(path, targets="y", split=split, on_error="skip")
    assert train.y[:, 0].tolist() == [1.0, 5.0] and len(val) == 0
    assert test.y[:, 0].tolist() == [3.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when nothing is skipped
        load_smiles_csv(write(tmp_path / "ok.csv", TABLE), targets="score", on_error="skip")


def test_missing_multilabel_targets_are_masked(tmp_path: Path) -> None:
    # TOX21-style: an empty cell is a label not measured, masked, not a 0
    path = write(tmp_path / "tox.csv", "SMILES,a,b\nCCO,1,\nCC,,0\nC,0,1\n")
    dataset = load_smiles_csv(path, targets=["a", "b"], task="multilabel")
    assert dataset.task == "multilabel"
    assert dataset.y_mask.tolist() == [[True, False], [False, True], [True, True]]
    assert dataset.y[dataset.y_mask].tolist() == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("text", "kwargs", "error", "message"),
    [
        ("", {}, ValueError, "is empty: a SMILES CSV needs a header row"),
        ("SMILES,score\n", {}, ValueError, "has a header but no data rows"),
        ("smiles,score\nC,1\n", {}, ValueError, r"no column 'SMILES'; its columns are \["),
        ("SMILES,score\nC,1\n", {"targets": "logp"}, ValueError, "no column 'logp'"),
        ("SMILES,score\nC,1\nCC,high\n", {}, ValueError, r"row 1 \(line 3\): column 'score' "),
        ("SMILES,score\nC,\n", {}, ValueError, "holds ''; regression targets must be finite"),
        ("SMILES,score\nC,nan\n", {}, ValueError, "holds 'nan'; regression targets must be"),
        ("SMILES,score\nC,0.5\n", {"task": "multilabel"}, ValueError, "target is 0, 1, or"),
        ("SMILES,score\nC,1\nC1CC,2\n", {}, ValueError, r"row 1 \(line 3\): RDKit cannot parse"),
        ("SMILES,score\nC,1,2\n", {}, ValueError, "line 2 has 3 fields where the header has 2"),
        ("SMILES,SMILES\nC,1\n", {}, ValueError, r"names the columns \['SMILES'\] more than"),
        ("SMILES,score\nC,1\n", {"on_error": "warn"}, ValueError, "on_error must be one of"),
        ("SMILES,score\nC,1\n", {"task": "binary"}, ValueError, "task must be one of"),
        ("SMILES,score\nC,1\n", {"targets": []}, TypeError, "targets must be a column name"),
        ("SMILES,score\nC1CC,1\n", {"on_error": "skip"}, ValueError, "every SMILES was skipped"),
        ("SMILES,score,p\nC,1,dev\n", {"split": "p"}, ValueError, "holds 'dev'; its values"),
        ("SMILES,score\nC,1\n", {"split": "part"}, FileNotFoundError, "neither a column"),
    ],
)
def test_bad_files_are_one_clear_line(
    tmp_path: Path, text: str, kwargs: dict, error: type, message: str
) -> None:
    options = {"targets": "score", **kwargs}
    with pytest.raises(error, match=message) as caught:
        load_smiles_csv(write(tmp_path / "m.csv", text), **options)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ("train,val\n0,1\n", "has the three columns train, val"),
        ("train,val,test\n0,1,7\n", "'7' is no row of the SMILES CSV"),
        ("train,val,test\n0,1,1.5\n", "'1.5' is no row"),
        ("train,val,test\n0,1,0\n", "row 0 is listed more than once"),
    ],
)
def test_bad_split_files(tmp_path: Path, split: str, message: str) -> None:
    path = write(tmp_path / "m.csv", "SMILES,score\nC,1\nCC,2\nCCC,3\n")
    with pytest.raises(ValueError, match=message):
        load_smiles_csv(path, targets="score", split=write(tmp_path / "s.csv", split))


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no SMILES CSV file at"):
        load_smiles_csv(tmp_path / "none.csv", targets="score")
