"""Which tests can see a module: the map ``scripts/mutate.py`` runs each mutant's tests by.

A test file is relevant to a module when its imports reach the module, directly or through
any chain of the repository's imports, read with ``ast`` (nothing is imported): imports
inside functions and ``import_module("literal")`` count, and a name a package re-exports
counts as the module that defines it, so importing ``refimpl.nn`` does not make every layer
relevant. :data:`EXTRA_TESTS` adds what no import shows.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

__all__ = ["EXTRA_TESTS", "import_distances", "imports", "relevant_tests"]

# Tests that run a module's code where no chain of imports shows it (relevant_tests).
EXTRA_TESTS = {
    # proofs_check.load_checks imports these by computed name (import_module(f"...{name}"));
    # every registered check runs in test_each_check_passes_with_a_record_of_exact_keys_and_types
    "proofs_check/conservation_layers.py": ["tests/test_proofs_check.py"],
    "proofs_check/variational.py": ["tests/test_proofs_check.py"],
}


def _dotted(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@functools.cache
def _modules(root: Path) -> dict[str, Path]:
    """Every module of the repository's packages and of ``tests``: dotted name -> file."""
    found = {}
    for top in sorted(root.iterdir()):
        if top.is_dir() and (top.name == "tests" or (top / "__init__.py").exists()):
            for path in top.rglob("*.py"):
                found[_dotted(path.relative_to(root).as_posix())] = path
    return found


@functools.cache
def _origin(root: Path, module: str, name: str) -> str:
    """The module that defines ``name`` for ``from module import name``: a submodule, or,
    through the re-exports of package ``__init__`` files, the module it comes from."""
    modules = _modules(root)
    if f"{module}.{name}" in modules:
        return f"{module}.{name}"
    if module in modules and modules[module].name == "__init__.py":
        for node in ast.walk(ast.parse(modules[module].read_text())):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, node, is_package=True)
                for alias in node.names:
                    if (alias.asname or alias.name) == name and source != module:
                        return _origin(root, source, alias.name)
    return module


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The dotted module of ``from <node.module> import ...`` written in ``module``."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
    return ".".join(parts + ([node.module] if node.module else []))


@functools.cache
def imports(root: Path, module: str) -> frozenset[str]:
    """The repository modules ``module`` imports, read with ``ast`` (imports inside functions
    and ``import_module("literal")`` included; a name re-exported by a package counts as the
    module that defines it)."""
    modules = _modules(root)
    path = modules.get(module, root / f"{module.replace('.', '/')}.py")  # or a new test file
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node, path.name == "__init__.py")
            found.update(_origin(root, source, alias.name) for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value))
    return frozenset(found & modules.keys() - {module})


@functools.cache
def import_distances(root: Path, test_file: Path) -> dict[str, int]:
    """Every module a test file reaches through chains of imports, with the fewest imports
    on the way (1: the test imports it itself)."""
    start = _dotted(test_file.relative_to(root).as_posix())
    distances, frontier = {start: 0}, [start]
    while frontier:
        reached = []
        for module in frontier:
            for imported in sorted(imports(root, module)):
                if imported not in distances:
                    distances[imported] = distances[module] + 1
                    reached.append(imported)
        frontier = reached
    del distances[start]
    return distances


def relevant_tests(root: Path, path: str) -> list[str]:
    """Test files for the module at ``path``: the mirrored ones (``nn/gat/conv.py`` ->
    ``tests/nn/gat/test_conv*.py``), then :data:`EXTRA_TESTS`, then every test file whose
    imports reach the module, directly or through a chain of imports, the closest first:
    fewest imports on the way, then the most folders shared with the mirror (``tests/nn/gat``
    before ``tests/interop``), then by name."""
    parts = Path(path).with_suffix("").parts
    mirror_dir = root / "tests" / Path(*parts[1:-1]) if len(parts) > 2 else root / "tests"
    mirrored = sorted(
        p.relative_to(root).as_posix()
        for p in mirror_dir.glob(f"test_{parts[-1]}*.py")
        if p.stem == f"test_{parts[-1]}" or p.stem.startswith(f"test_{parts[-1]}_")
    )
    extra = [t for t in EXTRA_TESTS.get(path, []) if (root / t).exists() and t not in mirrored]
    dotted, mirror = _dotted(path), mirror_dir.relative_to(root)
    importers = []
    for test_file in sorted((root / "tests").rglob("test_*.py")):
        distance = import_distances(root, test_file).get(dotted)
        if distance is not None:
            name = test_file.relative_to(root).as_posix()
            shared = len(Path(os.path.commonpath([mirror, Path(name).parent])).parts)
            importers.append((distance, -shared, name))
    found = mirrored + extra
    return found + [t for *_, t in sorted(importers) if t not in found]
