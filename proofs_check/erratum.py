"""What an erratum is: a printed formula, its correction, and the evidence of a counterexample.

The data types of :mod:`proofs_check.errata` (which lists the errata) and of each
package's evidence functions (``proofs_check.prf.errata_evidence``), kept apart from
both so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Erratum", "Evidence"]


@dataclass(frozen=True)
class Evidence:
    """What evaluating a counterexample showed."""

    printed_holds: bool  # must be False: the printed formula fails on the counterexample
    correct_holds: bool  # must be True: the corrected formula holds on it
    detail: str  # the numbers, for the report

    @property
    def demonstrated(self) -> bool:
        return not self.printed_holds and self.correct_holds


@dataclass(frozen=True)
class Erratum:
    id: str
    paper: str
    location: str
    printed: str
    correct: str
    counterexample: str  # the input, in words
    evaluate: Callable[[], Evidence]
