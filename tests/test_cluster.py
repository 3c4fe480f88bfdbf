"""Grids on Dask (issue 26): a LocalCluster of two workers gives the sequential results bit for
bit, a worker killed mid-grid loses and duplicates no job, and a scheduler that does not
answer, has no worker left or is lost mid-grid gives one clear line, never a hang."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.train import parallel
from refimpl.train.parallel import SchedulerUnavailable, WorkerLost, run_jobs
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


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s value (or its exception), failing the test where it has not ended within
    ``seconds``: a hang is a failure here, not a suite that never ends."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as err:  # handed to the test's thread
            outcome.append((False, err))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still waiting after {seconds} s: the wait is unbounded"
    ((ok, value),) = outcome
    if not ok:
        raise value
    return value


@pytest.fixture
def no_workers() -> Iterator[Any]:
    """A scheduler with no worker (in this process: it starts in a blink)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        yield cluster


def test_as_completed_waited_forever_on_a_scheduler_without_workers(
    no_workers: Any, tmp_path: Path, capsys
) -> None:
    # A full-suite run hung in this file: the grid's as_completed waited, unbounded, for
    # workers that were gone (the scheduler keeps the jobs queued for workers that never
    # come). Every earlier test had workers, or nannies that restarted them.
    out = tmp_path / "run"
    args = [*GRID, "--scheduler", no_workers.scheduler_address, "--worker-timeout", "0.5"]
    assert _within(60, lambda: main([*args, "--out", str(out)])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"refimpl sweep: error: WorkerLost: the Dask scheduler at {no_workers.scheduler_address} "
        "has had no worker for 0.5 s (they died or were stopped, or never started; "
        "--worker-timeout sets the wait): 0 of 2 jobs finished and are kept; rerun to finish "
        "the rest with --resume"
    ]
    assert (out / "run.json").exists()  # the run folder is kept, for --resume
    assert not list(out.rglob("result.json"))


def test_the_scheduler_lost_mid_grid_is_one_line_keeping_finished_jobs(
    no_workers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scheduler goes away while the grid waits (its first look at the workers shuts it);
    # the client tries to reconnect for CONNECT_SECONDS, then the grid ends
    monkeypatch.setattr(parallel, "CONNECT_SECONDS", 1)
    finished = {"seed": 0, "run_dir": str(tmp_path / "job0"), "value": 1.0}
    Path(finished["run_dir"]).mkdir()
    (tmp_path / "job0" / "result.json").write_text(json.dumps(finished))
    jobs = [{"seed": s, "run_dir": str(tmp_path / f"job{s}")} for s in range(3)]
    check_workers = parallel._check_workers

    def shut_then_check(*args: Any) -> Any:
        no_workers.close()
        return check_workers(*args)

    monkeypatch.setattr(parallel, "_check_workers", shut_then_check)
    with pytest.raises(SchedulerUnavailable, match="0 of 2 jobs finished and are kept") as err:
        address = no_workers.scheduler_address
        _within(60, lambda: run_jobs(square_sum, jobs, 1, lambda r: "", address, 30.0))
    assert len(str(err.value).splitlines()) == 1
    assert json.loads((tmp_path / "job0" / "result.json").read_text()) == finished


def test_a_worker_timeout_must_be_positive(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):  # argparse's refusal, in one line
        main([*GRID, "--scheduler", "local:1", "--worker-timeout", "0"])
    assert capsys.readouterr().err.strip() == (
        "refimpl sweep: error: argument --worker-timeout: must be a finite number > 0, got 0 "
        "(see refimpl sweep --help)"
    )
    with pytest.raises(ValueError, match="worker_timeout must be a number of seconds > 0"):
        run_jobs(square_sum, [], 1, lambda r: "", "local:1", float("nan"))


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
