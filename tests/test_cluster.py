"""Grids on Dask (issue 26): a LocalCluster of two workers gives the sequential results bit for
bit, a worker killed mid-grid loses and duplicates no job, and a scheduler that does not
answer gives one clear line."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.train import parallel
from refimpl.train.parallel import WorkerLost, run_jobs
from tests.cluster_jobs import always_dies, dies_once, square_sum

pytest.importorskip("distributed")

GRID = ["sweep", "--depths", "1", "2", "--seeds", "0", "1", "--epochs", "3", "--hidden", "4",
        "--dtype", "float64", "--no-progress"]  # fmt: skip


def _records(folder: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(folder.rglob("result.json")):
        record = json.loads(path.read_text())
        found[str(path.parent.relative_to(folder))] = record
    return found


def test_a_local_cluster_gives_the_sequential_sweep_bit_for_bit(tmp_path: Path) -> None:
    assert main([*GRID, "--out", str(tmp_path / "here")]) == 0
    assert main([*GRID, "--scheduler", "local:2", "--out", str(tmp_path / "dask")]) == 0
    here, dask = _records(tmp_path / "here"), _records(tmp_path / "dask")
    assert len(here) == 2 and here == dask
    for cell in here:
        for seed in (0, 1):
            with (
                np.load(tmp_path / "here" / cell / f"seed{seed}" / "final.npz") as a,
                np.load(tmp_path / "dask" / cell / f"seed{seed}" / "final.npz") as b,
            ):
                for name in a.files:
                    np.testing.assert_array_equal(a[name], b[name])


def test_a_killed_worker_loses_and_duplicates_no_job(tmp_path: Path, capsys) -> None:
    jobs = []
    for seed in range(6):
        run_dir = tmp_path / f"job{seed}"
        run_dir.mkdir()
        jobs.append({"seed": seed, "run_dir": str(run_dir), "die": seed == 2})
    results = run_jobs(dies_once, jobs, 1, lambda r: f"job {r['seed']}", scheduler="local:2")
    assert sorted(r["seed"] for r in results) == list(range(6))  # none lost, none twice
    # it died once and ran again (a job running beside it on that worker may have too);
    # each job's result is written once, by this process, when the job finishes
    assert (tmp_path / "job2" / "attempts").read_text() == "xx"
    expected = {job["seed"]: square_sum(job)["value"] for job in jobs}
    for job in jobs:
        written = json.loads((Path(job["run_dir"]) / "result.json").read_text())
        assert written["value"] == expected[job["seed"]]  # bitwise: the sequential value
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(printed) == 6  # one line per finished job
    attempts = [(Path(job["run_dir"]) / "attempts").read_text() for job in jobs]
    again = run_jobs(dies_once, jobs, 1, lambda r: "", scheduler="local:2")  # a rerun: all done
    assert sorted(r["seed"] for r in again) == list(range(6))
    assert [(Path(job["run_dir"]) / "attempts").read_text() for job in jobs] == attempts


def test_a_job_that_kills_every_worker_is_one_line(tmp_path: Path) -> None:
    import dask

    jobs = [{"seed": 0, "run_dir": str(tmp_path)}]
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        with pytest.raises(WorkerLost, match="a job's worker died each time it ran"):
            run_jobs(always_dies, jobs, 1, lambda r: "", scheduler="local:2")
    assert not (tmp_path / "result.json").exists()


def test_a_scheduler_that_does_not_answer_is_one_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "CONNECT_SECONDS", 2)
    args = [*GRID, "--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "refimpl sweep: error: no Dask scheduler answered at tcp://127.0.0.1:9 within 2 s: "
        "start one (dask scheduler) and its workers (dask worker ADDRESS), or run here with "
        "--scheduler local:N"
    ]


@pytest.fixture
def not_dask(request: pytest.FixtureRequest) -> Iterator[str]:
    """The address of a local service that answers every connection with ``request.param``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.sendall(request.param)
                stop.wait(3)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize(
    "not_dask",
    [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"\x01" + b"\x00" * 7 + b"\x10"],
    ids=["a web server", "a short frame"],
    indirect=True,
)
def test_a_service_that_is_not_dask_is_one_line(
    not_dask: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dask read the first bytes of another service's reply as a frame length: the CLI said
    # "out of memory (3.07 EiB)" for a web server, and a short reply gave a struct error.
    monkeypatch.setattr(parallel, "CONNECT_SECONDS", 2)
    assert main([*GRID, "--scheduler", not_dask, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"refimpl sweep: error: the service at {not_dask} is not a Dask")
    # nothing ran: the folder holds no run (a rerun there needs no --overwrite)
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["run.json"]


@pytest.mark.parametrize("value", ["local:0", "local:x"])
def test_local_needs_a_worker_count(value: str, tmp_path: Path, capsys) -> None:
    assert main([*GRID, "--scheduler", value, "--out", str(tmp_path)]) == 2
    assert "needs a number of workers N >= 1" in capsys.readouterr().err


def test_without_dask_the_scheduler_option_says_what_to_install(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    assert main([*GRID, "--scheduler", "local:2", "--out", str(tmp_path)]) == 2
    assert 'needs Dask distributed: pip install -e ".[cluster]"' in capsys.readouterr().err
