"""Run records as strict JSON: what ``log.jsonl``, ``summary.json`` and ``sweep.json`` hold.

Python's ``json`` writes NaN and infinity as the bare words ``NaN`` and
``Infinity``, which are not JSON (RFC 8259): ``jq``, JavaScript's
``JSON.parse`` and most readers outside Python reject the whole line. A run
produces such values legitimately (the accuracy of an empty split is NaN), so
they are written as ``null``, which every reader accepts and which reads back
as "no value".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["strict_json"]


def strict_json(record: Any, **dumps_kwargs: Any) -> str:
    """``json.dumps(record)`` with every NaN or infinite float written as ``null``.

    ``record`` nests dicts, lists and tuples of strings, numbers, booleans and
    ``None``; NumPy scalars become the matching Python numbers. ``dumps_kwargs``
    go to ``json.dumps`` (``indent=2``, say). Anything else raises ``TypeError``,
    as ``json.dumps`` does.
    """
    return json.dumps(_finite_or_null(record), allow_nan=False, **dumps_kwargs)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()  # float32(nan) -> nan, int64(3) -> 3, bool_ -> bool
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
