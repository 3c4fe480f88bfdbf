"""OGB's raw graph-property layout (refimpl.data.ogb_graph): folders written here in that exact
layout, read as OGB's reader would, every broken file refused in one line, and a run that
trains and evaluates on its missing labels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from refimpl.data import collate
from refimpl.data.ogb_graph import load_ogb_graph_dataset
from refimpl.metrics import roc_auc
from refimpl.models import GraphTransformer
from refimpl.testing import FORWARD_RTOL
from refimpl.train import GraphTrainConfig, train_graph_model

# Four graphs as OGB stores them (each bond once, local node indices): a 3-node path, a lone
# atom, a bond, a bond written the other way; two tasks with empty cells (missing labels).
FILES = {
    "raw/num-node-list.csv.gz": "3\n1\n2\n2\n",
    "raw/num-edge-list.csv.gz": "2\n0\n1\n1\n",
    "raw/edge.csv.gz": "0,1\n1,2\n0,1\n1,0\n",
    "raw/node-feat.csv.gz": "5,0\n5,1\n7,0\n8,2\n5,0\n6,1\n16,0\n6,3\n",
    "raw/edge-feat.csv.gz": "0\n1\n3\n2\n",
    "raw/graph-label.csv.gz": "1,\n0,0\n,1\n0,1\n",
    "split/scaffold/train.csv.gz": "2\n0\n",
    "split/scaffold/valid.csv.gz": "1\n",
    "split/scaffold/test.csv.gz": "3\n",
}


def ogb_folder(root: Path, **changes: str | None) -> Path:
    """``root/tox`` in OGB's layout: FILES with ``changes`` (``None`` deletes a file; keys
    with ``__`` for ``/`` and ``_`` for ``-``: ``raw__edge_feat``)."""
    files = dict(FILES)
    for key, text in changes.items():
        name = key.replace("__", "/").replace("_", "-").replace("-csv", ".csv") + ".csv.gz"
        assert name in files, name
        files[name] = text
    folder = root / "tox"
    for name, text in files.items():
        if text is not None:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(folder / name, "wt") as stream:
                stream.write(text)
    return folder


def test_reads_the_layout_as_ogbs_reader_does(tmp_path: Path) -> None:
    train, valid, test = load_ogb_graph_dataset(ogb_folder(tmp_path))
    assert (train.name, valid.name, test.name) == ("tox-train", "tox-valid", "tox-test")
    assert train.task == "multilabel" and len(train) == 2 and len(valid) == len(test) == 1
    # train = graphs 2, 0 in the file's order; each bond followed by its reverse (OGB's
    # add_inverse_edge), the bond's feature row repeated
    np.testing.assert_array_equal(train.node_ptr, [0, 2, 5])
    np.testing.assert_array_equal(train.edge_ptr, [0, 2, 6])
    np.testing.assert_array_equal(train.edge_index, [[0, 1, 0, 1, 1, 2], [1, 0, 1, 0, 2, 1]])
    np.testing.assert_array_equal(train.edge_attr[:, 0], [3, 3, 0, 0, 1, 1])
    np.testing.assert_array_equal(train.x, [[5, 0], [6, 1], [5, 0], [5, 1], [7, 0]])
    assert train.x.dtype == train.edge_attr.dtype == train.y.dtype == np.float64
    # labels: graph 2 lacks task 0, graph 0 task 1; graph 1 (valid) has both
    np.testing.assert_array_equal(train.y, [[0, 1], [1, 0]])
    np.testing.assert_array_equal(train.y_mask, [[False, True], [True, False]])
    assert valid.y_mask is None and valid.y.tolist() == [[0, 0]]
    np.testing.assert_array_equal(test.edge_index, [[1, 0], [0, 1]])  # (1, 0), then (0, 1)


def test_without_inverse_edges_and_with_real_labels(tmp_path: Path) -> None:
    folder = ogb_folder(tmp_path, raw__graph_label="0.5\n-1.25\n3\n0\n")
    train, _, _ = load_ogb_graph_dataset(folder, add_inverse_edge=False)
    assert train.task == "regression" and train.y.tolist() == [[3.0], [0.5]]
    np.testing.assert_array_equal(train.edge_index, [[0, 0, 1], [1, 1, 2]])
    with pytest.raises(ValueError, match=r"task='multilabel' needs labels 0 or 1"):
        load_ogb_graph_dataset(folder, task="multilabel")


def test_feature_files_are_optional(tmp_path: Path) -> None:
    folder = ogb_folder(tmp_path, raw__node_feat=None, raw__edge_feat=None)
    train, _, _ = load_ogb_graph_dataset(folder)
    assert (train.num_node_features, train.num_edge_features) == (0, 0)
    assert train.x.shape == (5, 0) and train.edge_attr.shape == (6, 0)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"raw__edge": None}, FileNotFoundError, r"missing .*raw/edge\.csv\.gz"),
        ({"raw__edge": "0,1,1\n1,2,1\n0,1,1\n1,0,1\n"}, ValueError, r"3 columns .* expected 2"),
        ({"raw__edge": "0,1\n1,2\n0,1\n"}, ValueError, r"edge\.csv\.gz: 3 lines, but the sum"),
        ({"raw__edge": "0,1\n1,3\n0,1\n1,0\n"}, ValueError, r"line 2 joins nodes \[1, 3\]"),
        ({"raw__edge": "0,1\n1,2\n0,-1\n1,0\n"}, ValueError, r"line 3 .* graph 2 \(2 nodes\)"),
        ({"raw__edge": "0,1\n1,x\n0,1\n1,0\n"}, ValueError, r"edge\.csv\.gz: could not convert"),
        ({"raw__node_feat": "5,0\n5,1\n"}, ValueError, r"node-feat\.csv\.gz: 2 lines, but"),
        ({"raw__node_feat": "5,0\n5\n"}, ValueError, r"node-feat\.csv\.gz: the number of col"),
        ({"raw__edge_feat": "0\n1\n3\n"}, ValueError, r"edge-feat\.csv\.gz: 3 lines"),
        ({"raw__num_node_list": "3\n1\n2\n"}, ValueError, r"3 graphs but num-edge-list\.csv\.gz 4"),
        ({"raw__num_node_list": "3\n0\n2\n2\n"}, ValueError, r"line 2 \(graph 1\) is 0"),
        ({"raw__graph_label": "1,\n0,0\n,1\n"}, ValueError, r"3 lines, but the number of gr"),
        ({"raw__graph_label": "1,\n0,0\n,yes\n0,1\n"}, ValueError, r"could not convert"),
        ({"split__scaffold__test": "4\n"}, ValueError, r"index 4 outside \[0, 4\)"),
        ({"split__scaffold__test": "3\n3\n"}, ValueError, r"graph 3 listed twice"),
        ({"split__scaffold__test": "0\n"}, ValueError, r"graph 0 is in both train and test"),
        ({"split__scaffold__valid": None}, FileNotFoundError, r"missing .*valid\.csv\.gz"),
    ],
)
def test_broken_files_are_refused_in_one_line_naming_the_file(
    tmp_path: Path, changes: dict, error: type, match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        load_ogb_graph_dataset(ogb_folder(tmp_path, **changes))
    assert "\n" not in str(info.value)


def test_wrong_folders_are_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no folder at .*absent"):
        load_ogb_graph_dataset(tmp_path / "absent")
    ogb_folder(tmp_path)  # tmp_path/tox/raw: one level too high
    with pytest.raises(FileNotFoundError, match=r"has no raw/ folder.*did you mean .*tox\?"):
        load_ogb_graph_dataset(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"splits found: \['scaffold'\]"):
        load_ogb_graph_dataset(tmp_path / "tox", split="species")
    (tmp_path / "tox" / "raw" / "edge.csv.gz").write_text("0,1\n")  # not gzip-compressed
    with pytest.raises(ValueError, match=r"edge\.csv\.gz: not a readable gzip"):
        load_ogb_graph_dataset(tmp_path / "tox")


def test_a_run_trains_and_evaluates_on_the_observed_labels_only(tmp_path: Path) -> None:
    # Fourteen molecules, two tasks, a third of the cells empty: the first epoch's training loss
    # must be the mean over the observed (graph, task) entries of the initial model's output.
    rng = np.random.default_rng(0)
    sizes = rng.integers(2, 6, 14)
    edges = [(int(i), int(i) + 1) for n in sizes for i in range(n - 1)]  # a path per graph
    labels = (rng.random((14, 2)) < 0.5).astype(int).astype(str)
    labels[rng.random((14, 2)) < 0.35] = ""
    labels[:5] = [["1", "0"], ["0", "1"], ["0", ""], ["", "1"], ["", ""]]  # both classes: train,
    # valid: task 1's only negative would be graph 11's empty cell read as 0
    labels[8:] = [["1", "1"], ["0", "1"], ["1", "1"], ["0", ""], ["1", "0"], ["0", "1"]]
    changes = {
        "raw__num_node_list": "\n".join(map(str, sizes)),
        "raw__num_edge_list": "\n".join(str(n - 1) for n in sizes),
        "raw__edge": "\n".join(f"{u},{v}" for u, v in edges),
        "raw__node_feat": "\n".join(str(int(v)) for v in rng.integers(0, 3, sizes.sum())),
        "raw__edge_feat": "\n".join(str(int(v)) for v in rng.integers(0, 2, len(edges))),
        "raw__graph_label": "\n".join(",".join(row) for row in labels),
        "split__scaffold__train": "\n".join(map(str, range(8))),
        "split__scaffold__valid": "8\n9\n10\n11",
        "split__scaffold__test": "12\n13",
    }
    train, valid, test = load_ogb_graph_dataset(ogb_folder(tmp_path, **changes))
    assert train.y_mask is not None and not train.y_mask.all()
    model = GraphTransformer(
        in_channels=1, out_channels=2, hidden_channels=8, num_layers=1, heads=2, edge_dim=1
    )
    config = GraphTrainConfig(epochs=1, batch_size=8, sign_flip=False)
    result = train_graph_model(model, train, valid, test, config, out_dir=tmp_path / "run")
    assert result.metric == "roc_auc" and 0.0 <= result.val_metric <= 1.0

    params = model.init_params(np.random.default_rng([0, 0]), dtype=np.float64)
    whole = collate(train, np.arange(len(train)))
    z, _ = model.forward(
        params, whole.x, whole.graph, whole.edge_attr, None, whole.batch, whole.num_graphs
    )
    terms = np.logaddexp(0, z) - z * train.y  # (8, 2) binary cross-entropy with logits
    observed_mean = terms[train.y_mask].mean()
    logged = json.loads((tmp_path / "run" / "log.jsonl").read_text())["train_loss"]
    # a few ulps of the terms: the batch holds the same graphs in another order
    assert logged == pytest.approx(observed_mean, rel=FORWARD_RTOL[np.dtype(np.float64)])
    assert abs(logged - terms.mean()) > 1e-6  # the empty cells as 0 would give another loss
    # validation: each task's ROC-AUC over its observed graphs; task 1 has one class there
    whole = collate(valid, np.arange(len(valid)))
    z, _ = model.forward(
        result.params, whole.x, whole.graph, whole.edge_attr, None, whole.batch, len(valid)
    )
    assert result.val_metric == roc_auc(z, valid.y, valid.y_mask) != roc_auc(z, valid.y)
    # graph 4 has no label at all: its batch of one is skipped, not an error
    single = train_graph_model(model, train, valid, test, GraphTrainConfig(epochs=1, batch_size=1))
    assert np.isfinite(single.final_train_loss)
    with pytest.raises(ValueError, match=r"loss='l1' cannot skip missing labels"):
        train_graph_model(model, train, valid, test, GraphTrainConfig(epochs=1, loss="l1"))
    unlabelled = train.subset([4])  # graph 4 alone: not one label to learn from
    with pytest.raises(ValueError, match=r"training split has no observed label"):
        train_graph_model(model, unlabelled, valid, test, GraphTrainConfig(epochs=1))


def test_numpys_row_counts_become_line_numbers(tmp_path: Path) -> None:
    # The reader appended "(numpy counts rows from 0)" to every numpy.loadtxt message, but
    # numpy counts from 1 when the number of columns changes: the user was sent one line too
    # far. The broken-file cases matched the words of the messages, not their numbers.
    changes = {"raw__edge": "0,1\n1\n0,1\n1,0\n"}
    with pytest.raises(ValueError, match=r"changed from 2 to 1 on line 2$"):
        load_ogb_graph_dataset(ogb_folder(tmp_path / "a", **changes))
    changes = {"raw__edge": "0,1\n1,2\n0,x\n1,0\n"}
    with pytest.raises(ValueError, match=r"string 'x' to int64 on line 3, column 2\.$"):
        load_ogb_graph_dataset(ogb_folder(tmp_path / "b", **changes))
