"""Tests of ``refimpl.data``. File-backed tests read the datasets folder from
``REFIMPL_DATA`` (CI: ``../shared/datasets``) and skip cleanly when it is unset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def data_root() -> Path:
    """The datasets folder named by ``REFIMPL_DATA``, or skip the calling test."""
    root = os.environ.get("REFIMPL_DATA")
    if not root:
        pytest.skip("REFIMPL_DATA is not set: file-backed dataset tests need the datasets folder")
    path = Path(root)
    if not path.is_dir():
        pytest.skip(f"REFIMPL_DATA={root} is not a directory")
    return path
