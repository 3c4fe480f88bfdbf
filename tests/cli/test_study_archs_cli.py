"""``refimpl train --model graph_transformer --arch gt|graphit|san`` (issue 34): the study's
architectures train from the command line on the synthetic molecules and on a ``.npz`` graph
dataset, their BatchNorm statistics are saved and resumed bit for bit, and options an
architecture does not read are one line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.data import save_graph_dataset, synthetic_molecules

FAST = [
    "train", "--model", "graph_transformer", "--graphs", "30", "--epochs", "2", "--hidden",
    "16", "--layers", "2", "--heads", "2", "--no-progress", "--dtype", "float64",
]  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        ["--arch", "gt", "--explicit-bias", "--pool", "max"],
        ["--arch", "gt", "--pe", "random-walk", "--norm", "layer"],
        ["--arch", "graphit", "--pool", "sum"],
        ["--arch", "graphit", "--no-full-graph", "--explicit-bias", "--pe", "none"],
        ["--arch", "san", "--pe", "learned-laplacian", "--pe-dim", "3"],
        ["--arch", "san", "--no-full-graph", "--dtype", "float32"],
    ],
    ids=["gt", "gt-rwpe", "graphit", "graphit-as-run", "san-lpe", "san-sparse-float32"],
)
def test_each_architecture_trains_from_the_command_line(options: list[str], tmp_path: Path) -> None:
    assert main([*FAST, *options, "--out", str(tmp_path)]) == 0
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 2
    with np.load(tmp_path / "final.npz") as final:
        assert all(np.isfinite(final[k]).all() for k in final.files)
    batch_norm = "layer" not in options
    assert (tmp_path / "final_state.npz").is_file() == batch_norm  # the running statistics


def test_a_users_npz_dataset_trains_each_architecture(tmp_path: Path) -> None:
    path = tmp_path / "mine.npz"
    save_graph_dataset(path, synthetic_molecules(30, seed=3, task="multilabel"))
    for arch in ("gt", "graphit", "san"):
        out = tmp_path / arch
        assert main([*FAST, "--arch", arch, "--dataset", str(path), "--out", str(out)]) == 0
        assert (out / "summary.json").is_file()


def test_a_killed_batch_norm_run_resumes_bit_for_bit(tmp_path: Path) -> None:
    # BatchNorm's running statistics are state beside the parameters: a resume that restarted
    # them from zeros and ones would evaluate (and select) differently from an uninterrupted run
    args = [*FAST, "--arch", "gt", "--checkpoint-every", "1"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main([*args, "--epochs", "4", "--out", str(whole)]) == 0
    assert main([*args, "--epochs", "2", "--out", str(cut)]) == 0
    assert main(["train", "--resume", str(cut), "--epochs", "4", "--no-progress"]) == 0
    for name in ("final.npz", "final_state.npz"):
        with np.load(whole / name) as a, np.load(cut / name) as b:
            assert a.files == b.files
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key])
    assert (whole / "log.jsonl").read_text() == (cut / "log.jsonl").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--arch", "san", "--explicit-bias"], r"--explicit-bias applies to --arch gt or graphit"),
        (["--arch", "gt", "--no-full-graph"], r"--full-graph applies to --arch graphit or san"),
        (["--pe", "learned-laplacian"], r"--pe learned-laplacian is SAN's learned encoding"),
        (["--norm", "batch"], r"--norm batch applies to --arch gt, graphit or san"),
        (["--arch", "gt", "--global-node"], r"--global-node.* apply to --arch transformer-conv"),
        (["--arch", "gt", "--no-layer-norm"], r"--norm sets the study architectures'"),
        (["--arch", "san", "--pe", "learned-laplacian", "--pe-dim", "0"], r"needs --pe-dim >= 1"),
        (["--arch", "gt", "--lr-schedule", "plateau", "--lr-factor", "2"], r"factor must be in"),
    ],
)
def test_an_option_the_architecture_does_not_read_is_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    assert main([*FAST, *extra, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert re.search(message, err[-1]), err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_an_ogb_folder_trains_with_a_plateau_schedule(tmp_path: Path) -> None:
    # issue 35: `--dataset FOLDER` in OGB's raw graph-property layout trains on OGB's own split
    # with its missing labels masked, and `--lr-schedule plateau` steps once per epoch on the
    # validation ROC-AUC (mode max for multi-label data unless --lr-mode is typed)
    from tests.data.test_ogb_graph import ogb_folder

    # eight two-atom molecules: validation and test each hold both classes of task 0
    folder = ogb_folder(
        tmp_path / "data",
        raw__num_node_list="2\n" * 8,
        raw__num_edge_list="1\n" * 8,
        raw__edge="0,1\n" * 8,
        raw__node_feat="5,0\n6,1\n" * 8,
        raw__edge_feat="0\n" * 8,
        raw__graph_label="1,\n0,0\n1,1\n0,\n1,0\n0,1\n1,\n0,1\n",
        split__scaffold__train="0\n1\n2\n3\n",
        split__scaffold__valid="4\n5\n",
        split__scaffold__test="6\n7\n",
    )
    out = tmp_path / "run"
    args = ["--arch", "gt", "--dataset", str(folder), "--lr-schedule", "plateau", "--out", str(out)]
    assert main([*FAST, *args]) == 0
    lines = (out / "log.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all('"lr"' in line for line in lines)
