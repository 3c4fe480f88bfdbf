"""Messages about a user's data speak of the user's files (issue 36): what is missing, where it
was looked for and where the files come from; never a copy, a file or a git blob that only
this project's own machines have."""

from __future__ import annotations

from pathlib import Path

import pytest

from refimpl.cli import main

PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
SOURCE = "https://github.com/kimiyoung/planetoid"


def test_a_missing_pubmed_allx_names_the_users_folder_and_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The message for a missing ind.pubmed.allx pointed at "the shared datasets copy", a git
    # blob id and datasets/README.md, which a user does not have; the loader's test matched
    # only its start ("missing ind.pubmed.allx in ...").
    folder = tmp_path / "planetoid"
    folder.mkdir()
    for part in PARTS:
        if part != "allx":
            (folder / f"ind.pubmed.{part}").write_bytes(b"")  # present: named, never read
    assert main(["train", "--dataset", "pubmed", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"refimpl train: error: pubmed: missing ind.pubmed.allx in {folder}; all 8 files "
        "ind.pubmed.{x,y,tx,ty,allx,ally,graph,test.index} are needed, as in the data/ folder "
        f"of {SOURCE} (docs: guide/data.md, 'Getting the files')\n"
    )
    for internal in ("shared", "blob", "datasets/README"):
        assert internal not in err


def test_a_folder_without_planetoid_files_says_where_they_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["train", "--dataset", "cora", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"no Planetoid files ind.cora.* in {tmp_path} or" in err[0]
    assert err[0].endswith(f"copied from the data/ folder of {SOURCE}")
