"""Jobs for the cluster tests, importable by the worker processes a LocalCluster spawns."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def square_sum(job: dict) -> dict:
    """A deterministic float64 job (a seeded reduction), the same wherever it runs."""
    values = np.random.default_rng(job["seed"]).standard_normal(1000)
    return {**job, "value": float(np.sum(values * values))}


def dies_once(job: dict) -> dict:
    """``square_sum``, but the first attempt at the job marked ``die`` kills its worker
    process (as a node lost on a cluster would); the marker file records each attempt."""
    marker = Path(job["run_dir"]) / "attempts"
    with open(marker, "a") as stream:
        stream.write("x")
    if job.get("die") and marker.read_text() == "x":
        os._exit(1)
    return square_sum(job)


def always_dies(job: dict) -> dict:
    """A job that kills every worker it runs on."""
    os._exit(1)
