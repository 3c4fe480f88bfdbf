"""What happened to one bad input: the six outcomes, a case, and the classifiers.

A *case* is one input fed to one public surface: ``run()`` calls the library and returns
what it produced, and ``check(value)`` says whether that agrees with a reference computed
independently (``None`` when it does). A case without ``check`` is an input that means
nothing: the library must refuse it, and accepting it is a silent wrong result.

Outcomes (docs/reliability.md says what each means to a user):

- ``refused``: one clear error line: a ValueError / TypeError / OSError (NonFiniteError,
  FileNotFoundError, FileExistsError are among them) whose message is one line, says
  something of its own (not NumPy's or Python's internals) and names what was wrong;
  on the command line, exit status 2 (or 1) with a line or a few on stderr;
- ``right result``: accepted, and the result agrees with the reference;
- ``crash``: the process died by a signal or hung, an exception of another type escaped
  (IndexError, KeyError, MemoryError, ...), or a refusal was unclear (several lines, an
  internal message such as NumPy's "truth value ... is ambiguous", no argument named);
- ``traceback``: the command line printed a Python traceback, an "internal error", or a
  bare exception type (``IndexError: 3``) instead of a message;
- ``silent wrong``: accepted, and the result differs from the reference, is non-finite,
  or an input was changed in place; or an input that means nothing was accepted;
- ``loss``: a user's file or a finished run's result changed or vanished.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.train import TrainingDiverged

REFUSED = "refused"
RIGHT = "right result"
CRASH = "crash"
TRACEBACK = "traceback"
SILENT = "silent wrong"
LOSS = "loss"
OUTCOMES = (REFUSED, RIGHT, CRASH, TRACEBACK, SILENT, LOSS)
FAILURES = (CRASH, TRACEBACK, SILENT, LOSS)

# TrainingDiverged: a run that diverged stops with one line saying so (exit 1 on the CLI)
REFUSALS = (ValueError, TypeError, OSError, TrainingDiverged)
# Fragments of messages written by Python or NumPy, not by refimpl: an input reached code
# that never expected it, and the user learns nothing about which argument is wrong.
INTERNAL_MESSAGES = (
    "truth value of an array",
    "operands could not be broadcast",
    "could not broadcast",
    "values to unpack",
    "object of type",
    "unsupported operand",
    "has no len()",
    "is not subscriptable",
    "object is not iterable",
    "only integer scalar arrays",
    "cannot reshape array",
    "setting an array element",
    "mismatch in its core dimension",
    "unhashable type",
    "positional argument",
    "unexpected keyword argument",
    "invalid literal for int",
    "could not convert string",
    "cannot be interpreted as an integer",
    "not supported between instances",
    "ufunc '",
    "Cannot cast ufunc",
    "must be real number, not",
    "array is too big",
    "Maximum allowed dimension exceeded",
    "Maximum allowed size exceeded",
)
# Exception names the command line prints before a message it did not write itself.
INTERNAL_TYPES = (
    "IndexError",
    "KeyError",
    "AttributeError",
    "ZeroDivisionError",
    "OverflowError",
    "UnboundLocalError",
    "NameError",
    "AssertionError",
    "RecursionError",
    "EOFError",
    "BadZipFile",
    "UnpicklingError",
    "StopIteration",
    "NotImplementedError",
)
MAX_MESSAGE = 1000  # characters: a longer "line" is a dump, not a message
MAX_CLI_LINES = 3  # a refusal on the command line: a line or a few


class Hung(BaseException):
    """Raised into a case that ran past its time (a BaseException: no ``except Exception``
    in the library swallows it)."""


@dataclass(frozen=True)
class Result:
    """One case's outcome and, for anything but a plain refusal or right result, why."""

    outcome: str
    detail: str = ""


@dataclass(frozen=True)
class Case:
    """One bad input to one surface (see the module docstring)."""

    name: str
    run: Callable[[], Any]
    check: Callable[[Any], str | None] | None = None
    mentions: tuple[str, ...] = ()  # a refusal must name one of these (any case)


def first_line(text: str, width: int = 160) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= width else line[: width - 3] + "..."


def message_problem(
    message: str, mentions: Iterable[str] = (), internal: bool = True
) -> str | None:
    """Why ``message`` is not one clear line naming one of ``mentions``; None if it is.
    ``internal``: look for Python's and NumPy's own words too."""
    mentions = tuple(mentions)
    if not message.strip():
        return "empty message"
    if "\n" in message.strip():
        return "message of several lines"
    if len(message) > MAX_MESSAGE:
        return f"message of {len(message)} characters"
    found = [fragment for fragment in INTERNAL_MESSAGES if internal and fragment in message]
    if found:
        return f"Python/NumPy's own message ({found[0]!r})"
    if mentions and not any(word.lower() in message.lower() for word in mentions):
        return f"names none of {list(mentions)}"
    return None


def judge_refusal(err: BaseException, mentions: Iterable[str] = ()) -> Result:
    """A raised exception: a clean refusal, or a crash (wrong type, unclear message)."""
    text = f"{type(err).__name__}: {first_line(str(err))}"
    if not isinstance(err, REFUSALS):
        return Result(CRASH, f"unexpected {text}")
    # refimpl's own error types wrap what they caught with their own words first
    own = type(err).__module__.startswith("refimpl")
    problem = message_problem(str(err), mentions, internal=not own)
    if problem:
        return Result(CRASH, f"unclear refusal ({problem}): {text}")
    return Result(REFUSED, text)


def classify(case: Case) -> Result:
    """Run ``case`` here and say what happened (a signal is caught by the runner)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflow warnings: the result is judged instead
        try:
            value = case.run()
        except Hung as err:
            return Result(CRASH, f"hung: {err}")
        except Exception as err:  # every escape is judged, none propagates
            return judge_refusal(err, case.mentions)
        if isinstance(value, Result):  # a case that judged itself (commands, run folders)
            return value
        if case.check is None:
            return Result(SILENT, "accepted an input that means nothing")
        try:
            problem = case.check(value)
        except Exception as err:  # a result the reference cannot even be compared with
            problem = f"result not comparable ({type(err).__name__}: {first_line(str(err))})"
    return Result(SILENT, problem) if problem else Result(RIGHT)


def judge_process(
    returncode: int,
    stdout: str,
    stderr: str,
    mentions: Iterable[str] = (),
    accepted: Iterable[int] = (0,),
) -> Result | None:
    """A command's exit: None when it exited with a code in ``accepted`` (the caller judges
    its result), else the refusal, crash or traceback it was."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    tail = first_line(lines[-1] if lines else stdout.strip()[-200:])
    if returncode < 0:
        return Result(CRASH, f"killed by signal {-returncode}")
    if "Traceback (most recent call last)" in stderr + stdout:
        return Result(TRACEBACK, f"traceback: {tail}")
    if "internal error" in stderr or returncode == 3:
        return Result(TRACEBACK, f"internal error (exit {returncode}): {tail}")
    if returncode in tuple(accepted):
        return None
    if returncode not in (1, 2):
        return Result(CRASH, f"exit status {returncode}: {tail}")
    if not lines and stdout.lstrip().startswith("usage:"):  # no command given: the help
        return Result(REFUSED, "usage printed")
    if not lines:
        return Result(TRACEBACK, f"exit status {returncode} with nothing on stderr")
    if len(lines) > MAX_CLI_LINES:
        return Result(TRACEBACK, f"{len(lines)} lines on stderr: {tail}")
    text = " ".join(lines)
    internal = [name for name in INTERNAL_TYPES if f"{name}:" in text or f"{name}(" in text]
    if internal:
        return Result(TRACEBACK, f"bare {internal[0]}: {tail}")
    problem = message_problem(text, mentions)
    if problem:
        return Result(TRACEBACK, f"unclear refusal ({problem}): {tail}")
    return Result(REFUSED, tail)


# -- comparing results -------------------------------------------------------------------------
def flatten(value: Any, prefix: str = "out") -> dict[str, Any]:
    """Nested tuples, lists and dicts of arrays as one flat ``{path: array}``."""
    if isinstance(value, Mapping):
        return {
            k: v for key, item in value.items() for k, v in flatten(item, f"{prefix}.{key}").items()
        }
    if isinstance(value, (tuple, list)):
        return {
            k: v for i, item in enumerate(value) for k, v in flatten(item, f"{prefix}[{i}]").items()
        }
    return {prefix: value}


def as_host(value: Any) -> Any:
    """A sparse matrix or array as a dense NumPy array; anything else as it is."""
    if hasattr(value, "toarray"):
        return np.asarray(value.toarray())
    if hasattr(value, "__array__") and not isinstance(value, np.ndarray):
        return np.asarray(value)
    return value


def difference(ours: Any, reference: Any, rtol: float) -> str | None:
    """Where ``ours`` (nested arrays) differs from ``reference``: a different structure,
    a shape, a non-finite entry, or an entry off by more than ``rtol`` times the largest
    reference entry of its group (the outputs, the gradients: a gradient can be zero by
    cancellation, and is judged on the scale of the others, as refimpl.interop.compare
    does). None if it agrees."""
    ours, reference = flatten(ours), flatten(reference)
    if set(ours) != set(reference):
        return f"returned {sorted(ours)}, expected {sorted(reference)}"
    scales: dict[str, float] = {}
    for name, expected in reference.items():
        expected = as_host(expected)
        if isinstance(expected, np.ndarray) and expected.size and expected.dtype.kind in "fc":
            group = _group(name)
            with np.errstate(invalid="ignore"):
                scales[group] = max(scales.get(group, 0.0), float(np.max(np.abs(expected))))
    for name, expected in reference.items():
        problem = _tensor_difference(
            name, as_host(ours[name]), as_host(expected), rtol, scales.get(_group(name), 0.0)
        )
        if problem:
            return problem
    return None


def non_finite(value: Any) -> str | None:
    """Which returned tensors hold NaN or infinity (None: all finite)."""
    arrays = {name: as_host(array) for name, array in flatten(value).items()}
    bad = [
        name
        for name, array in arrays.items()
        if isinstance(array, np.ndarray)
        and array.dtype.kind in "fc"
        and not np.isfinite(array).all()
    ]
    return f"non-finite entries in {bad}" if bad else None


def _group(name: str) -> str:
    """``out.grads[1].W`` -> ``out.grads``: tensors judged on one scale."""
    return ".".join(name.split(".")[:2]).split("[")[0]


def _tensor_difference(
    name: str, got: Any, expected: Any, rtol: float, group_scale: float
) -> str | None:
    if expected is None or got is None:
        if got is not expected:
            return f"{name}: {type(got).__name__}, expected {type(expected).__name__}"
        return None
    if not isinstance(expected, np.ndarray):
        return None if got == expected else f"{name}: {got!r}, expected {expected!r}"
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"{name}: shape {got.shape}, expected {expected.shape}"
    if got.dtype.kind in "fc" and not np.isfinite(got).all():
        return f"{name}: non-finite entries"
    if expected.dtype.kind in "fc" and not np.isfinite(expected).all():
        return f"{name}: finite, but the reference is not (it overflowed)"
    if got.size == 0:
        return None
    if expected.dtype.kind not in "fc":
        return None if np.array_equal(got, expected) else f"{name}: different entries"
    scale = max(group_scale, np.finfo(np.float64).tiny)
    error = float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64))))
    if not error <= rtol * scale:
        return f"{name}: off by {error:.3g} (relative {error / scale:.3g} > {rtol:g})"
    return None
