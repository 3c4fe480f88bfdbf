"""Every public name documented as a reader needs it; every layer and model beside the paper.

``numpydoc``'s validation runs on each class and function that refimpl's packages export (their
``__all__``; for ``refimpl.ops`` and ``refimpl.kernels``, each module's) and fails on a missing
docstring (GL08), a constructor argument or dataclass field left out of ``Parameters`` (PR01)
and a documented name the signature does not have (PR02). A cache (a ``NamedTuple``) documents
its fields under ``Attributes`` instead, the numpy style for fields, which the docs build
(griffe) checks against no signature; the same two codes hold for it. A layer or model class
(``refimpl.nn``, ``refimpl.models``) must also state its equation (display math, ``$$``) and a
``Shapes`` section; the caches (``...Cache``) are exempt, as they only name what a backward
reads. Each failure is one line: the object, the code, what is wrong.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

validate = pytest.importorskip("numpydoc.validate", reason="numpydoc: pip install -e .[test]")
docscrape = pytest.importorskip("numpydoc.docscrape")

# the layers and models, whose classes also state their equation and shapes
LAYER_PACKAGES = ("refimpl.nn", "refimpl.models")
# every other public package: its __init__'s __all__
PACKAGES = (
    *LAYER_PACKAGES,
    "refimpl",
    "refimpl.backend",
    "refimpl.graph",
    "refimpl.validation",
    "refimpl.fields",
    "refimpl.files",
    "refimpl.neurons",
    "refimpl.init",
    "refimpl.optim",
    "refimpl.schedules",
    "refimpl.metrics",
    "refimpl.jacobian",
    "refimpl.data",
    "refimpl.train",
    "refimpl.diagnostics",
    "refimpl.interop",
    "refimpl.testing",
    "refimpl.cli",
    "proofs_check",
)
# packages whose __init__ exports nothing: each module's own __all__
MODULE_PACKAGES = ("refimpl.ops", "refimpl.kernels")
# GL08: no docstring; PR01: a parameter not documented; PR02: documented but not a parameter
CODES = ("GL08", "PR01", "PR02")
# numpydoc's section heading: the title over a rule of dashes
_SHAPES = re.compile(r"^\s*Shapes\n\s*-{6,}\s*$", flags=re.MULTILINE)


def public_objects(packages: tuple[str, ...] = PACKAGES) -> Iterator[tuple[str, Any]]:
    """``(import path, object)`` of every class and function the packages export (each once,
    under the first path met), and, for :data:`MODULE_PACKAGES` among them, their modules'."""
    modules = list(packages)
    for package in MODULE_PACKAGES if packages == PACKAGES else ():
        path = importlib.import_module(package).__path__
        modules += [f"{package}.{info.name}" for info in pkgutil.iter_modules(path)]
    seen: set[int] = set()
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and id(obj) not in seen:
                seen.add(id(obj))
                yield f"{module_name}.{name}", obj


def numpydoc_failures(path: str, obj: Any) -> list[str]:
    """One line per failing code of ``CODES`` for ``obj``, importable as ``path``."""
    with warnings.catch_warnings():  # "Unknown section Shapes": ours, checked below
        warnings.simplefilter("ignore", UserWarning)
        # by its defining module: a public path can name a submodule too (the function
        # refimpl.interop.crosscheck and the module of that name), which numpydoc would load
        errors = validate.validate(f"{obj.__module__}.{obj.__qualname__}")["errors"]
        if _is_named_tuple(obj):  # fields under Attributes: numpydoc reads only Parameters
            errors = [error for error in errors if error[0] not in ("PR01", "PR02")]
            errors += _field_errors(obj)
    return [f"{path} {code}: {message}" for code, message in errors if code in CODES]


def _is_named_tuple(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields")


def _field_errors(cls: type) -> list[tuple[str, str]]:
    """PR01 and PR02 of a ``NamedTuple``'s fields against its Parameters and Attributes."""
    doc = docscrape.NumpyDocString(inspect.getdoc(cls) or "")
    documented = {
        name  # "q, k : array" documents two fields
        for section in ("Parameters", "Attributes")
        for item in doc[section]
        for name in item.name.split(", ")
    }
    missing, unknown = set(cls._fields) - documented, documented - set(cls._fields)
    errors = []
    if missing:
        errors.append(("PR01", f"Fields {sorted(missing)} not documented (Attributes)"))
    if unknown:
        errors.append(("PR02", f"Unknown fields {sorted(unknown)} documented"))
    return errors


def layer_failures(path: str, obj: Any) -> list[str]:
    """One line per missing equation or Shapes section of a layer or model class."""
    if not inspect.isclass(obj) or obj.__name__.endswith("Cache"):
        return []
    doc = inspect.getdoc(obj) or ""
    failures = []
    if "$$" not in doc:
        failures.append(f"{path} equation: no display equation ($$ ... $$) in its docstring")
    if not _SHAPES.search(doc):
        failures.append(f"{path} shapes: no 'Shapes' section in its docstring")
    return failures


def _report(failures: list[str]) -> str:
    return f"{len(failures)} docstring failure(s):\n" + "\n".join(failures)


def test_every_public_name_passes_numpydoc() -> None:
    failures = [line for path, obj in public_objects() for line in numpydoc_failures(path, obj)]
    if failures:
        pytest.fail(_report(failures), pytrace=False)


def test_every_public_layer_states_its_equation_and_shapes() -> None:
    layers = public_objects(LAYER_PACKAGES)
    failures = [line for path, obj in layers for line in layer_failures(path, obj)]
    if failures:
        pytest.fail(_report(failures), pytrace=False)


def test_the_packages_export_what_is_checked() -> None:
    # the checks above pass vacuously on an empty export list
    names = {path for path, _ in public_objects()}
    assert {"refimpl.nn.GATConv", "refimpl.nn.NodeFormerConv", "refimpl.models.GAT"} <= names
    assert {"refimpl.data.load_ogb_node_dataset", "refimpl.kernels.segment.Segments"} <= names


# The checker itself: each kind of failure is found and named.


class Undocumented:
    def __init__(self, width: int) -> None:
        self.width = width


class WrongParameter:
    """A layer documenting a name it does not take.

    $$ y = x $$

    Parameters
    ----------
    height : int
        Not an argument.

    Shapes
    ------
    - input $(N, F)$
    """

    def __init__(self, width: int) -> None:
        self.width = width


class ExampleCache(NamedTuple):
    """A cache documenting one field of two, and one it does not have.

    Attributes
    ----------
    x : array
        Documented.
    y : array
        Not a field.
    """

    x: Any
    z: Any


class NoEquation:
    """A layer without its equation or shapes.

    Parameters
    ----------
    width : int
        The width.
    """

    def __init__(self, width: int) -> None:
        self.width = width


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (Undocumented, ["Undocumented GL08"]),
        (WrongParameter, ["WrongParameter PR01", "WrongParameter PR02"]),
        (NoEquation, []),
        (ExampleCache, ["ExampleCache PR01", "ExampleCache PR02"]),
    ],
)
def test_numpydoc_failures_name_object_and_code(cls: type, expected: list[str]) -> None:
    failures = numpydoc_failures(f"{__name__}.{cls.__name__}", cls)
    assert [line.split(":")[0].rsplit(".", 1)[-1] for line in failures] == expected


def test_layer_failures_name_equation_and_shapes() -> None:
    assert layer_failures("x.WrongParameter", WrongParameter) == []
    assert layer_failures("x.ExampleCache", ExampleCache) == []  # caches are exempt
    assert layer_failures("x.NoEquation", NoEquation) == [
        "x.NoEquation equation: no display equation ($$ ... $$) in its docstring",
        "x.NoEquation shapes: no 'Shapes' section in its docstring",
    ]
