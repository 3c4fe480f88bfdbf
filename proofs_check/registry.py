"""Records, the worst-case accumulator and the ``@check`` registry.

A check is a function of a :class:`Context` (a seeded generator, the number of
random cases, the array module) that evaluates one inequality on many cases and
returns a :class:`WorstCase`. The ``@check`` decorator registers it under an id
and turns it into a :class:`Check`: calling that gives a :class:`Record`.

Sign convention (one rule for every kind of statement)
------------------------------------------------------
``margin`` is how far ``measured`` lies inside ``bound``; positive or zero
means the statement holds, and ``passed == (margin >= 0)``:

* upper bound ``measured <= bound``: ``margin = bound - measured``;
* lower bound ``measured >= bound``: ``margin = measured - bound``;
* equality up to a tolerance: ``measured`` is the deviation ``|lhs - rhs|``
  (absolute or relative, the check says which) and ``bound`` the tolerance, so
  it is an upper bound.

Where a paper's bound can be attained with equality (uniform rows in
LipschitzNorm Lemma 2), rounding can land a correct result an ulp outside it;
the check then reports the paper's bound moved outwards by a rounding
allowance that it justifies in its docstring, so the rule above stays exact.
A NaN anywhere makes the margin NaN and the check fail: a NaN is never inside
a bound.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from types import ModuleType
from typing import Any, Literal

import numpy as np

from refimpl.backend import array_module, to_numpy

__all__ = [
    "DEFAULT_CASES",
    "REGISTRY",
    "Check",
    "Context",
    "Record",
    "Sense",
    "WorstCase",
    "check",
    "margin_of",
    "matches",
    "select",
]

Sense = Literal["upper", "lower"]
DEFAULT_CASES = 40  # random cases per check: the whole run stays around a second


@dataclass(frozen=True)
class Record:
    """The outcome of one check; :meth:`as_dict` is what ``--json`` writes.

    Parameters
    ----------
    id : str
        The check's id, ``"<paper-or-topic>.<result>[.<part>]"``.
    paper : str
        The paper the result is from, e.g. ``"GAT-balance"``.
    statement : str
        The inequality checked, with the result's number (``"... (Thm 2.2, Eq. 3)"``).
    bound : float
        The bound of the worst case.
    measured : float
        The value measured in the worst case.
    margin : float
        How far ``measured`` lies inside ``bound``: ``>= 0`` holds (module docstring).
    passed : bool
        ``margin >= 0`` (False for a NaN or no case).
    n_cases : int
        The cases evaluated; ``measured``, ``bound`` and ``margin`` are the worst one's.
    relation : {"<=", ">="}, default "<="
        What holds: ``measured <= bound`` (an upper bound) or ``measured >= bound``.
    tightness : float, default 0.0
        ``measured / bound`` (``bound / measured`` for ``">="``): 1 when attained, 0 where
        undefined.
    """

    id: str
    paper: str
    statement: str
    bound: float
    measured: float
    margin: float
    passed: bool
    n_cases: int
    relation: str = "<="
    tightness: float = 0.0

    @property
    def sense(self) -> Sense:
        return "upper" if self.relation == "<=" else "lower"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def margin_of(measured: Any, bound: Any, sense: Sense) -> Any:
    """Signed distance of ``measured`` inside ``bound`` (scalars or arrays); NaN propagates."""
    if sense == "upper":
        return bound - measured
    if sense == "lower":
        return measured - bound
    raise ValueError(f"sense must be 'upper' or 'lower', got {sense!r}")


def _scale(bound: np.ndarray) -> np.ndarray:
    magnitude = np.abs(bound)
    return np.where(magnitude > 0, magnitude, 1.0)


class WorstCase:
    """Keeps the worst case among all those added: the smallest margin relative to its bound.

    Ranking by ``margin / |bound|`` (``margin`` alone where the bound is 0)
    compares cases whose bounds differ, such as per-row rounding allowances
    ``2 n eps``: a row that uses 90 of its 100 ulps outranks one that uses 0 of
    its 2. The record then reports that case's own ``measured``, ``bound`` and
    absolute ``margin``.

    ``add`` takes scalars or arrays of any backend (one entry per row,
    neighbourhood or head, say); ``bound`` broadcasts against ``measured``, so a
    per-case rounding allowance can sit next to each value.

    Parameters
    ----------
    sense : {"upper", "lower"}
        Whether each case's ``measured`` must stay at or below its ``bound`` or at or above it.
    """

    def __init__(self, sense: Sense) -> None:
        margin_of(0.0, 0.0, sense)  # validate now, not at the first add
        self.sense = sense
        self.n_cases = 0
        self._empty = True  # no value seen yet (a case can contribute none: a graph without edges)
        self.measured = float("nan")
        self.bound = float("nan")
        self.margin = float("nan")
        self._relative = float("nan")  # margin / |bound| of the worst case: how it is ranked

    def add(self, measured: Any, bound: Any, cases: int = 1) -> None:
        """Fold in ``cases`` cases (default one); ``measured`` may hold many values per case."""
        measured_h, bound_h = np.broadcast_arrays(
            np.asarray(to_numpy(measured), dtype=float), np.asarray(to_numpy(bound), dtype=float)
        )
        if measured_h.size:
            margins = margin_of(measured_h, bound_h, self.sense)
            relative = margins / _scale(bound_h)
            worst = int(np.argmin(relative))  # argmin returns the first NaN if there is one
            # A NaN, once seen, stays the worst case: it is never inside a bound.
            if self._empty or (
                not np.isnan(self._relative)
                and (np.isnan(relative.flat[worst]) or relative.flat[worst] < self._relative)
            ):
                self.measured = float(measured_h.flat[worst])
                self.bound = float(bound_h.flat[worst])
                self.margin = float(margins.flat[worst])
                self._relative = float(relative.flat[worst])
                self._empty = False
        self.n_cases += cases


@dataclass(frozen=True)
class Context:
    """What a check body receives: randomness, the case budget, the array module.

    Parameters
    ----------
    rng : numpy.random.Generator
        Seeded per check from ``(seed, id)``: a check draws the same cases alone or in a run.
    cases : int
        How many random cases to evaluate.
    xp : module
        The array module of the backend under check.
    dtype : dtype, default numpy.float64
        The float type the cases are made in (float64 for checks and tests).
    """

    rng: np.random.Generator
    cases: int
    xp: ModuleType
    dtype: Any = np.float64  # docs/design.md: float64 for checks and tests

    def asarray(self, host: Any) -> Any:
        """A host (NumPy) array moved to the backend under check, in ``dtype``."""
        return self.xp.asarray(np.asarray(host, dtype=self.dtype))


CheckBody = Callable[[Context], WorstCase]


@dataclass(frozen=True)
class Check:
    """A registered check; calling it runs the body and returns a :class:`Record`.

    A call, ``one(seed=0, cases=DEFAULT_CASES, backend=None)``, draws from ``(seed, id)``, so
    a check run alone (``--only``) reproduces the numbers of the full run.

    Parameters
    ----------
    id : str
        The id, ``"<paper-or-topic>.<result>[.<part>]"``.
    paper : str
        The paper the result is from, e.g. ``"GAT-balance"``.
    statement : str
        The inequality checked.
    body : callable
        ``body(context) -> WorstCase``, given a :class:`Context`.
    """

    id: str
    paper: str
    statement: str
    body: CheckBody

    def __call__(
        self, seed: int = 0, cases: int = DEFAULT_CASES, backend: str | None = None
    ) -> Record:
        # The stream depends on (seed, id), not on which other checks ran before,
        # so `--only` reproduces exactly the numbers of the full run.
        rng = np.random.default_rng([seed, zlib.crc32(self.id.encode())])
        worst = self.body(Context(rng=rng, cases=cases, xp=array_module(backend)))
        return Record(
            id=self.id,
            paper=self.paper,
            statement=self.statement,
            bound=float(worst.bound),
            measured=float(worst.measured),
            margin=float(worst.margin),
            # No case evaluated proves nothing: n_cases == 0 leaves the margin NaN.
            passed=bool(worst.margin >= 0),
            n_cases=int(worst.n_cases),
            relation="<=" if worst.sense == "upper" else ">=",
            tightness=_tightness(worst),
        )


def _tightness(worst: WorstCase) -> float:
    """How close the worst case came to its bound: ``measured / bound`` for an upper bound,
    ``bound / measured`` for a lower one (both 1 when attained, small when loose); 0 where
    undefined (a zero or non-finite denominator)."""
    numerator, denominator = (
        (worst.measured, worst.bound) if worst.sense == "upper" else (worst.bound, worst.measured)
    )
    ratio = numerator / denominator if denominator else 0.0
    return float(ratio) if np.isfinite(ratio) else 0.0


REGISTRY: dict[str, Check] = {}  # id -> check, in registration (= module import) order


def check(*, id: str, paper: str, statement: str) -> Callable[[CheckBody], Check]:
    """Register the decorated body under ``id``; the decorator returns the :class:`Check`.

    Parameters
    ----------
    id : str
        ``"<paper-or-topic>.<result>[.<part>]"``, unique among the registered checks.
    paper : str
        The paper the result is from, e.g. ``"GAT-balance"``.
    statement : str
        The inequality checked.

    Returns
    -------
    callable
        The decorator: ``body(context) -> WorstCase`` in, the registered :class:`Check` out
        (``ValueError`` if another body holds ``id``).
    """

    def register(body: CheckBody) -> Check:
        previous = REGISTRY.get(id)
        if previous is not None and (
            (previous.body.__module__, previous.body.__qualname__)
            != (body.__module__, body.__qualname__)
        ):  # the same function again is a module reload, not a clash
            raise ValueError(f"check id {id!r} is already registered by {previous.body.__module__}")
        REGISTRY[id] = Check(id=id, paper=paper, statement=statement, body=body)
        return REGISTRY[id]

    return register


def matches(identifier: str, pattern: str | None) -> bool:
    """``--only`` semantics: ``identifier`` contains ``pattern``, or matches it as a glob
    when the pattern has ``*``, ``?`` or ``[``; ``None`` matches everything."""
    if pattern is None:
        return True
    if any(char in pattern for char in "*?["):
        return fnmatchcase(identifier, pattern)
    return pattern in identifier


def select(pattern: str | None = None) -> list[Check]:
    """Registered checks whose id :func:`matches` ``pattern``, in registration order.

    Parameters
    ----------
    pattern : str or None, default None
        A substring of the id, or a glob when it holds ``*``, ``?`` or ``[``; ``None`` selects
        every check.

    Returns
    -------
    list of Check
        The checks selected.
    """
    return [one for one in REGISTRY.values() if matches(one.id, pattern)]
