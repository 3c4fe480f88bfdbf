"""Backends the device-parity tests run on: the strict stand-in always, CuPy when installed."""

from __future__ import annotations

import importlib.util

import pytest

DEVICE_BACKENDS = [
    "strict",
    pytest.param(
        "cupy",
        marks=pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="no CuPy"),
    ),
]
