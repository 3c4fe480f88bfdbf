"""compare_tensors: agreement within rtol passes; a missing tensor or a shape mismatch fails."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.interop.compare import compare_tensors


def test_equal_tensors_pass_and_a_perturbed_one_fails() -> None:
    reference = {"out": np.array([1.0, -2.0]), "grad": np.array([[3.0]])}
    assert compare_tensors(dict(reference), reference, rtol=1e-12).passed
    perturbed = {**reference, "grad": np.array([[3.0 + 1e-6]])}
    result = compare_tensors(perturbed, reference, rtol=1e-12)
    assert not result.passed
    assert [t.passed for t in result.tensors] == [True, False]


@pytest.mark.parametrize("side", ["ours", "the reference"])
def test_a_tensor_on_one_side_only_fails_and_says_where_it_is_missing(side: str) -> None:
    shared = {"out": np.ones(3)}
    extra = {**shared, "grad/param/bogus": np.array(1e9)}
    ours, reference = (shared, extra) if side == "ours" else (extra, shared)
    result = compare_tensors(ours, reference, rtol=1e-10)
    missing = [t for t in result.tensors if t.name == "grad/param/bogus"]
    assert len(missing) == 1 and missing[0].passed is False
    assert missing[0].problem == f"missing in {side}" and missing[0].rtol == 1e-10
    assert not result.passed
    assert "FAIL: 1 of 2 tensors" in result.table()


def test_a_shape_mismatch_fails() -> None:
    result = compare_tensors({"out": np.ones((2, 3))}, {"out": np.ones((3, 2))}, rtol=1e-10)
    assert not result.passed and result.tensors[0].problem.startswith("shape (2, 3) (ours)")
