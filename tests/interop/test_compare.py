"""compare_tensors: agreement within rtol passes; a missing tensor or a shape mismatch fails; the
documented tolerances fail errors above them and pass errors below; per-entry magnitudes excuse
rounding of cancelled terms and nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.interop.compare import compare_tensors
from refimpl.testing.tolerances import FORWARD_RTOL, GRADIENT_RTOL


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


# -- the tolerances, broken by a little ------------------------------------------------------------
# The documented values (README, tolerances.py), written out: errors of 10x and 2x each fail and
# of 0.5x and 0.1x pass, so a tolerance loosened or tightened by 2x or more fails a test here.
DOCUMENTED = [
    ("forward", np.float64, 1e-12),
    ("forward", np.float32, 1e-5),
    ("gradient", np.float64, 1e-10),
    ("gradient", np.float32, 1e-4),
]


@pytest.mark.parametrize(("factor", "passes"), [(10, False), (2, False), (0.5, True), (0.1, True)])
@pytest.mark.parametrize(("kind", "dtype", "documented"), DOCUMENTED)
def test_an_error_around_each_documented_tolerance_fails_above_it_and_passes_below(
    kind: str, dtype: type, documented: float, factor: float, passes: bool
) -> None:
    rtol = (FORWARD_RTOL if kind == "forward" else GRADIENT_RTOL)[np.dtype(dtype)]
    reference = np.random.default_rng(0).standard_normal((4, 3)).astype(dtype)
    ours = (reference.astype(np.float64) * (1 + factor * documented)).astype(dtype)
    result = compare_tensors({"t": ours}, {"t": reference}, rtol)
    assert result.passed == passes, result.table()


# -- magnitudes: the rounding of the terms that cancel ------------------------------------------


def test_an_entry_is_judged_against_the_magnitude_of_the_terms_that_made_it() -> None:
    # entry 0 is a cancellation: autograd's exact 0 against our 3e-8 (2^-25 behind a collapsed
    # PairNorm), from terms of 1e8 whose rounding is ~1e-8
    reference, ours = {"g": np.array([0.0, 1.5])}, {"g": np.array([2.0**-25, 1.5])}
    assert not compare_tensors(ours, reference, 1e-10).passed
    assert compare_tensors(ours, reference, 1e-10, magnitudes={"g": np.array([1e8, 1.5])}).passed
    # terms of 100 round to ~1e-14: 3e-8 is not their rounding
    small = compare_tensors(ours, reference, 1e-10, magnitudes={"g": np.array([1e2, 1.5])})
    assert not small.passed
    assert small.tensors[0].max_rel_error == pytest.approx(2.0**-25 / 1e2)


def test_magnitudes_never_loosen_a_well_conditioned_entry() -> None:
    # a 1e-4 slip in entry 1 fails beside a huge magnitude at entry 0, and zero magnitudes leave
    # the tensor's own scale as the denominator
    reference = {"g": np.array([0.0, 1.5])}
    ours = {"g": np.array([0.0, 1.5 * (1 + 1e-4)])}
    result = compare_tensors(ours, reference, 1e-10, magnitudes={"g": np.array([1e12, 1.5])})
    assert not result.passed
    assert result.tensors[0].max_rel_error == pytest.approx(1e-4)
    zero = compare_tensors(ours, reference, 1e-10, magnitudes={"g": np.zeros(2)})
    assert zero.tensors[0].scale == 1.5 and zero.max_rel_error == pytest.approx(1e-4)


def test_magnitudes_of_another_shape_are_refused() -> None:
    with pytest.raises(ValueError, match="magnitudes \\(3,\\) for a tensor of \\(2,\\)"):
        compare_tensors({"g": np.ones(2)}, {"g": np.ones(2)}, 1e-10, magnitudes={"g": np.ones(3)})
