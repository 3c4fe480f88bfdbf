"""OGB's raw node-property layout (refimpl.data.ogb_node): folders written here in that exact
layout (ogbn-proteins' files in miniature), read as OGB's reader would, node features as the
authors derive them, every broken file refused in one line, and ``refimpl train --dataset
FOLDER`` training and scoring on the observed labels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.data import load_dataset, load_ogb_node_dataset
from refimpl.models import GAT
from refimpl.train import TrainConfig, train_model
from tests.data.test_ogb_graph import ogb_folder as graph_folder

# One graph of 6 nodes as ogbn-proteins stores it: each edge once (node 5 has none), two edge
# features, three binary tasks with empty cells (missing labels), species as taxonomy ids.
FILES = {
    "raw/num-node-list.csv.gz": "6\n",
    "raw/num-edge-list.csv.gz": "5\n",
    "raw/edge.csv.gz": "0,1\n1,2\n2,0\n3,4\n0,3\n",
    "raw/edge-feat.csv.gz": "0.5,0.25\n0.125,1\n1,0\n0.75,0.5\n0,0.5\n",
    "raw/node-label.csv.gz": "1,0,1\n0,,1\n1,1,0\n0,1,\n,0,1\n1,0,0\n",
    "raw/node_species.csv.gz": "9606\n3702\n9606\n511145\n3702\n9606\n",
    "split/species/train.csv.gz": "0\n2\n4\n",
    "split/species/valid.csv.gz": "1\n5\n",
    "split/species/test.csv.gz": "3\n",
}


def write_folder(folder: Path, files: dict[str, str | None]) -> Path:
    """``folder`` holding ``files`` (name -> text; ``None``: left out), each gzip-compressed."""
    for name, text in files.items():
        if text is not None:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(folder / name, "wt") as stream:
                stream.write(text)
    return folder


def ogb_folder(root: Path, **changes: str | None) -> Path:
    """``root/proteins`` in OGB's layout: FILES with ``changes`` (``None`` deletes a file; keys
    with ``__`` for ``/`` and ``_`` for ``-`` except in ``node_species``: ``raw__edge_feat``)."""
    files = dict(FILES)
    for key, text in changes.items():
        name = key.replace("__", "/").replace("_", "-").replace("node-species", "node_species")
        name += ".csv.gz"
        assert name in files or name.endswith("node-feat.csv.gz"), name
        files[name] = text
    return write_folder(root / "proteins", files)


def test_reads_the_layout_as_ogbs_reader_does(tmp_path: Path) -> None:
    data = load_ogb_node_dataset(ogb_folder(tmp_path))
    assert data.name == "proteins" and (data.num_nodes, data.num_classes) == (6, 3)
    # each edge followed by its reverse (OGB's add_inverse_edge), its feature row repeated
    np.testing.assert_array_equal(
        data.graph.edge_index, [[0, 1, 1, 2, 2, 0, 3, 4, 0, 3], [1, 0, 2, 1, 0, 2, 4, 3, 3, 0]]
    )
    np.testing.assert_array_equal(
        data.edge_attr,
        [[0.5, 0.25]] * 2 + [[0.125, 1]] * 2 + [[1, 0]] * 2 + [[0.75, 0.5]] * 2 + [[0, 0.5]] * 2,
    )
    # edge-mean by hand: node 0 receives from 1 (0.5, 0.25), 2 (1, 0) and 3 (0, 0.5); node 5
    # from nobody (0, as SparseTensor.mean); every value a binary fraction, so exact
    expected = [[0.5, 0.25], [0.3125, 0.625], [0.5625, 0.5], [0.375, 0.5], [0.75, 0.5], [0, 0]]
    np.testing.assert_array_equal(data.x, expected)
    assert data.x.dtype == data.edge_attr.dtype == data.y.dtype == np.float64
    # edges as stored (no inverses): the end matters, node 0 is the target of 2 -> 0 alone
    directed = load_ogb_node_dataset(tmp_path / "proteins", add_inverse_edge=False)
    np.testing.assert_array_equal(directed.x[[0, 3, 4, 5]], [[1, 0], [0, 0.5], [0.75, 0.5], [0, 0]])
    # empty cells: masked and stored as 0
    np.testing.assert_array_equal(
        data.y_mask, np.array([[1, 1, 1], [1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 1, 1], [1, 1, 1]])
    )
    np.testing.assert_array_equal(
        data.y, [[1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]
    )
    np.testing.assert_array_equal(np.flatnonzero(data.train_mask), [0, 2, 4])
    np.testing.assert_array_equal(np.flatnonzero(data.val_mask), [1, 5])
    np.testing.assert_array_equal(np.flatnonzero(data.test_mask), [3])
    assert data.summary() == (
        "proteins: N=6 E=10 F=2 B=2 classes=3 train/val/test=3/2/1 missing_labels=3"
    )


def test_edge_mean_matches_torchs_scatter_mean(tmp_path: Path) -> None:
    # An independent mean over each node's incoming edges (NodeFormer's SparseTensor rows are
    # the targets), on random features that are no binary fractions.
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    edges = rng.integers(0, 30, (120, 2))
    folder = ogb_folder(
        tmp_path,
        raw__num_node_list="30\n",
        raw__num_edge_list="120\n",
        raw__edge="\n".join(f"{u},{v}" for u, v in edges),
        raw__edge_feat="\n".join(",".join(f"{v:.6f}" for v in row) for row in rng.random((120, 8))),
        raw__node_label="\n".join("1,0,1" if i % 2 else "0,1,0" for i in range(30)),
        raw__node_species="\n".join("9606" for _ in range(30)),
        split__species__train="\n".join(map(str, range(20))),
        split__species__valid="\n".join(map(str, range(20, 25))),
        split__species__test="\n".join(map(str, range(25, 30))),
    )
    data = load_ogb_node_dataset(folder)
    dst = torch.from_numpy(np.array(data.graph.edge_index[1]))  # writable copy
    index = dst[:, None].expand(-1, 8)
    reference = torch.zeros(30, 8, dtype=torch.float64).scatter_reduce(
        0, index, torch.from_numpy(data.edge_attr), reduce="mean", include_self=False
    )
    np.testing.assert_allclose(data.x, reference.numpy(), rtol=1e-15, atol=0)


def test_species_one_hot_also_under_the_zips_file_name(tmp_path: Path) -> None:
    # sorted distinct ids 3702, 9606, 511145 -> indices 0, 1, 2 (the study's
    # _node_species_to_feat), one-hot; OGB's zip calls the file species.csv.gz
    expected = np.eye(3)[[1, 0, 1, 2, 0, 1]]
    data = load_ogb_node_dataset(ogb_folder(tmp_path), node_features="species")
    np.testing.assert_array_equal(data.x, expected)
    files = {name: text for name, text in FILES.items() if "species.csv" not in name}
    files["raw/species.csv.gz"] = FILES["raw/node_species.csv.gz"]
    zipped = write_folder(tmp_path / "zip", files)
    np.testing.assert_array_equal(
        load_ogb_node_dataset(zipped, node_features="species").x, expected
    )


def test_class_ids_own_features_and_no_inverse_edges(tmp_path: Path) -> None:
    # ogbn-arxiv's shape: node-feat, one column of class ids, directed edges kept as stored
    folder = ogb_folder(
        tmp_path,
        raw__node_feat="1,2\n3,4\n5,6\n7,8\n9,10\n11,12\n",
        raw__node_label="3\n0\n1\n3\n2\n0\n",
        raw__edge_feat=None,
    )
    data = load_ogb_node_dataset(folder, node_features="node-feat", add_inverse_edge=False)
    np.testing.assert_array_equal(data.graph.edge_index, [[0, 1, 2, 3, 0], [1, 2, 0, 4, 3]])
    np.testing.assert_array_equal(data.x, np.arange(1, 13).reshape(6, 2))
    assert data.y.tolist() == [3, 0, 1, 3, 2, 0] and data.y.dtype == np.int64
    assert data.num_classes == 4 and data.edge_attr is None and data.y_mask is None
    # a second split folder: the choice is the user's
    write_folder(folder, {f"split/time/{part}.csv.gz": "0\n" for part in ("train",)})
    with pytest.raises(FileNotFoundError, match=r"holds 2 splits \(species, time\); pass split"):
        load_ogb_node_dataset(folder, node_features="node-feat")


LABELS_2 = "1,0,1\n0,,1\n1,2,0\n0,1,\n,0,1\n1,0,0\n"


@pytest.mark.parametrize(
    ("changes", "kwargs", "error", "match"),
    [
        ({"raw__edge": None}, {}, FileNotFoundError, r"missing .*raw/edge\.csv\.gz"),
        ({"raw__edge": "0,1,1\n1,2,1\n"}, {}, ValueError, r"3 columns per line, expected 2"),
        ({"raw__edge": "0,1\n1,2\n2,0\n3,4\n"}, {}, ValueError, r"4 lines, but num-edge-list"),
        (
            {"raw__edge": "0,1\n1,2\n2,6\n3,4\n0,3\n"},
            {},
            ValueError,
            r"edge\.csv\.gz: line 3 joins nodes \[2, 6\], outside 0\.\.5 of its graph 0 "
            r"\(6 nodes\)$",
        ),
        ({"raw__edge": "0,1\n1,x\n2,0\n3,4\n0,3\n"}, {}, ValueError, r"edge\.csv\.gz: could not"),
        (
            {"raw__num_node_list": "6\n4\n", "raw__num_edge_list": "5\n0\n"},
            {},
            ValueError,
            r"num-node-list\.csv\.gz: 2 graphs; a node-property dataset is one graph",
        ),
        ({"raw__num_node_list": "0\n"}, {}, ValueError, r"line 1 \(graph 0\) is 0"),
        ({"raw__edge_feat": "0.5,0.25\n"}, {}, ValueError, r"edge-feat\.csv\.gz: 1 lines, but"),
        ({"raw__edge_feat": "nan,0\n" * 5}, {}, ValueError, r"edge-feat.* NaN or infinity"),
        ({"raw__node_label": "1,0,1\n" * 5}, {}, ValueError, r"node-label.*5 lines, but num-n"),
        ({"raw__node_label": LABELS_2}, {}, ValueError, r"3 columns of labels; labels not all 0/1"),
        (
            {"raw__node_label": LABELS_2},
            {"task": "multilabel"},
            ValueError,
            r"node-label\.csv\.gz: line 3 holds a label other than 0 or 1",
        ),
        ({"raw__node_label": "1\n-1\n2\n0\n0\n1\n"}, {}, ValueError, r"line 2 holds -1\.0, not a"),
        ({"raw__node_label": "1\n0.5\n2\n0\n0\n1\n"}, {}, ValueError, r"line 2 holds 0\.5"),
        (
            {"raw__node_label": "1,0,1\n0,1,yes\n"},
            {},
            ValueError,
            r"label\.csv\.gz: could not convert string 'yes' to float64 on line 2, column 3\.$",
        ),
        (
            {"raw__node_label": "1,0,1\n0\n"},
            {},
            ValueError,
            r"node-label\.csv\.gz: the number of columns changed from 3 to 1 on line 2$",
        ),
        (
            {"raw__node_species": "9606\n" * 5},
            {"node_features": "species"},
            ValueError,
            r"node_species\.csv\.gz: 5 lines, but num-node-list is 6",
        ),
        ({"split__species__test": "6\n"}, {}, ValueError, r"node index 6 outside \[0, 6\)"),
        ({"split__species__test": "3\n3\n"}, {}, ValueError, r"test\.csv\.gz: node 3 listed twi"),
        ({"split__species__test": "0\n"}, {}, ValueError, r"node 0 is in both train and test"),
        ({"split__species__valid": None}, {}, FileNotFoundError, r"missing .*valid\.csv\.gz"),
        (
            {},
            {"node_features": "node-feat"},
            FileNotFoundError,
            r"node_features='node-feat' reads .*node-feat\.csv\.gz, which is missing; this "
            r"folder offers node_features='edge-mean' or 'species'$",
        ),
        (
            {"raw__edge_feat": None},
            {},
            FileNotFoundError,
            r"'edge-mean' averages .*edge-feat\.csv\.gz, .* offers node_features='species'$",
        ),
        (
            {"raw__node_species": None},
            {"node_features": "species"},
            FileNotFoundError,
            r"reads .*node_species\.csv\.gz \(or species\.csv\.gz, its name in OGB's zip\)",
        ),
        ({}, {"node_features": "degree"}, ValueError, r"node_features must be one of 'edge-mean'"),
        ({}, {"task": "multiclass"}, ValueError, r"columns of labels; task='multiclass' reads one"),
        ({}, {"task": "binary"}, ValueError, r"task must be 'multilabel', 'multiclass' or None"),
        ({}, {"split": "random"}, FileNotFoundError, r"splits found: \['species'\]"),
    ],
)
def test_broken_files_are_refused_in_one_line_naming_the_file(
    tmp_path: Path, changes: dict, kwargs: dict, error: type, match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        load_ogb_node_dataset(ogb_folder(tmp_path, **changes), **kwargs)
    assert "\n" not in str(info.value)


def test_a_folder_of_the_other_layout_names_the_command_that_reads_it(tmp_path: Path) -> None:
    # ogbg-moltox21's folder handed to the node reader, ogbn-proteins' to the graph reader
    from refimpl.data import load_ogb_graph_dataset

    graphs, nodes = graph_folder(tmp_path / "g"), ogb_folder(tmp_path / "n")
    with pytest.raises(FileNotFoundError, match=r"holds raw/graph-label\.csv\.gz, not raw/node-"):
        load_ogb_node_dataset(graphs)
    with pytest.raises(FileNotFoundError, match=r"refimpl train --model graph_transformer --dat"):
        load_dataset(str(graphs))
    with pytest.raises(FileNotFoundError, match=r"node-label.*refimpl train --model gat"):
        load_ogb_graph_dataset(nodes)
    with pytest.raises(FileNotFoundError, match=r"has no raw/ folder.*did you mean .*proteins\?"):
        load_ogb_node_dataset(tmp_path / "n")


def test_load_dataset_reads_a_folder_by_path(tmp_path: Path) -> None:
    folder = ogb_folder(tmp_path)
    by_path = load_dataset(str(folder), node_features="species")
    np.testing.assert_array_equal(
        by_path.x, load_ogb_node_dataset(folder, node_features="species").x
    )
    assert by_path.summary().startswith("proteins: N=6 E=10 F=3 B=2")
    with pytest.raises(ValueError, match=r"unknown dataset .*or a folder in OGB's node-property"):
        load_dataset(str(tmp_path / "absent"))


def random_folder(root: Path, seed: int = 0) -> Path:
    """ogbn-proteins in miniature: 40 nodes, 90 stored edges with 3 features, 4 binary tasks
    a quarter of whose cells are empty, species ids, a 24/8/8 split."""
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, 40, (90, 2))
    labels = (rng.random((40, 4)) < 0.5).astype(int).astype(str)
    labels[rng.random((40, 4)) < 0.25] = ""
    order = rng.permutation(40)
    return ogb_folder(
        root,
        raw__num_node_list="40\n",
        raw__num_edge_list="90\n",
        raw__edge="\n".join(f"{u},{v}" for u, v in edges),
        raw__edge_feat="\n".join(",".join(f"{v:.3f}" for v in row) for row in rng.random((90, 3))),
        raw__node_label="\n".join(",".join(row) for row in labels),
        raw__node_species="\n".join(str(v) for v in rng.choice([3702, 9606, 10090], 40)),
        split__species__train="\n".join(map(str, order[:24])),
        split__species__valid="\n".join(map(str, order[24:32])),
        split__species__test="\n".join(map(str, order[32:])),
    )


def test_refimpl_train_gat_on_a_folder_runs_what_the_api_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = random_folder(tmp_path)
    out = tmp_path / "run"
    args = ["train", "--model", "gat", "--dataset", str(folder), "--epochs", "2"]
    assert main([*args, "--dtype", "float64", "--no-progress", "--out", str(out)]) == 0
    assert "data   proteins: N=40 E=180 F=3 B=3 classes=4" in capsys.readouterr().out
    run = json.loads((out / "summary.json").read_text())["runs"][0]
    # the command's defaults: GAT v2 with shared weights, 8 channels, one head, two layers
    data = load_ogb_node_dataset(folder)
    model = GAT(3, 8, 4, 2, heads=1, version="v2", share_weights=True)
    result = train_model(model, data, TrainConfig(epochs=2))
    assert (run["val_acc"], run["test_acc"]) == (result.val_acc, result.test_acc)
    assert 0 < result.val_acc < 1 and 0 < result.test_acc < 1  # ROC-AUCs over observed labels


def test_refimpl_train_nodeformer_on_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--model", "nodeformer", "--dataset", str(random_folder(tmp_path))]
    assert main([*args, "--epochs", "2", "--no-progress", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(0 <= line["val_acc"] <= 1 for line in lines)


def test_the_command_for_the_other_layout_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    graphs, nodes = graph_folder(tmp_path / "g"), ogb_folder(tmp_path / "n")
    common = ["--epochs", "1", "--no-progress"]
    assert main(["train", "--model", "gat", "--dataset", str(graphs), *common]) == 2
    err = capsys.readouterr().err
    assert "--model graph_transformer --dataset FOLDER" in err and err.count("\n") == 1
    assert main(["train", "--model", "graph_transformer", "--dataset", str(nodes), *common]) == 2
    err = capsys.readouterr().err
    assert "refimpl train --model gat" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_refimpl_train_takes_the_node_features_and_replaces_the_graph_of_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # --graph knn / none rebuilt the dataset with dataclasses.replace, which kept edge_attr
    # of the old edges: refused as rows that no longer match. And the node features had no
    # command-line choice, so a folder without edge features could not be trained.
    folder = random_folder(tmp_path)
    common = ["train", "--model", "gat", "--dataset", str(folder), "--epochs", "1"]
    common += ["--no-progress"]
    for i, extra in enumerate([["--graph", "knn", "--knn", "3"], ["--graph", "none"]]):
        assert main([*common, *extra, "--out", str(tmp_path / f"graph{i}")]) == 0
    printed = capsys.readouterr().out
    assert "B=" not in printed  # the edge features went with the edges
    assert "test ROC-AUC at best validation" in printed  # not "accuracy": multi-label data
    species = ["--node-features", "species", "--dtype", "float64"]
    assert main([*common, *species, "--out", str(tmp_path / "sp")]) == 0
    run = json.loads((tmp_path / "sp" / "summary.json").read_text())["runs"][0]
    data = load_ogb_node_dataset(folder, node_features="species")  # three species, one-hot
    model = GAT(3, 8, 4, 2, heads=1, version="v2", share_weights=True)
    result = train_model(model, data, TrainConfig(epochs=1))
    assert (run["val_acc"], run["test_acc"]) == (result.val_acc, result.test_acc)
    edge_mean = train_model(model, load_ogb_node_dataset(folder), TrainConfig(epochs=1))
    assert edge_mean.val_acc != result.val_acc  # so the comparison above can fail
    capsys.readouterr()
    csbm = ["train", "--model", "gat", "--dataset", "csbm", "--epochs", "1"]
    assert main([*csbm, "--node-features", "species", "--out", str(tmp_path / "c")]) == 2
    assert "--node-features chooses an OGB node-property folder" in capsys.readouterr().err
