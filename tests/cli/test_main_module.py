"""``python -m refimpl`` is the ``refimpl`` command (for environments without the script)."""

from __future__ import annotations

import subprocess
import sys

from refimpl import __version__


def test_python_m_refimpl_runs_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "refimpl", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"refimpl {__version__}"


def test_python_m_refimpl_reports_bad_input_in_one_line_with_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "refimpl", "train", "--hidden", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--hidden" in done.stderr
