"""strict_json: run records as standard JSON, non-finite floats as null."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from refimpl.train.records import strict_json


def refuse(word: str) -> None:
    raise AssertionError(f"{word} is not JSON")


# json.dumps writes NaN and infinity as the bare words NaN / Infinity / -Infinity, which
# RFC 8259 does not allow (jq and JSON.parse refuse them); json.loads accepts them, so
# reading a record back in Python never showed it.
def test_non_finite_floats_anywhere_become_null() -> None:
    record = {
        "loss": math.nan,
        "norms": {"layer0": {"feature": math.inf, "attention": None}},
        "curve": [1.0, -math.inf, np.float32(np.nan), (np.float64(2.5), np.int64(3))],
        "ok": np.bool_(True),
    }
    text = strict_json(record)
    assert json.loads(text, parse_constant=refuse) == {
        "loss": None,
        "norms": {"layer0": {"feature": None, "attention": None}},
        "curve": [1.0, None, None, [2.5, 3]],
        "ok": True,
    }


def test_finite_values_are_written_as_json_dumps_writes_them() -> None:
    record = {"epoch": 3, "train_loss": 0.1 + 0.2, "name": "gat", "flags": [True, None]}
    assert strict_json(record) == json.dumps(record)
    assert strict_json(record, indent=2) == json.dumps(record, indent=2)


def test_what_json_cannot_write_is_still_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        strict_json({"params": np.zeros(2)})
