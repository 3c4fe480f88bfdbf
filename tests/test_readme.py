"""The README's and the docs' Python examples run as written and check what they show.

Each example asserts the facts it illustrates (shapes, attention summing to one, the
gradient check passing, a bound holding, training above chance), so a number that goes
wrong fails here, not only an example that crashes. The same holds for every page under
``docs/`` (examples moved there from the README stay tested). The README stays short (under
500 lines), every relative link in it and in the docs points to a file that exists, and every
``::: name`` the API pages render names an importable object.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
MAX_README_LINES = 500

# The quick start CI runs (.ci/run): these lines must stay exactly as they are.
QUICK_START = (
    '    pip install -e ".[test,crosscheck,jax,plot,cluster,chem]" --extra-index-url https://download.pytorch.org/whl/cpu',
    "    refimpl demo",
    "    pytest",
)

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.DOTALL | re.MULTILINE)


def _blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# Every distinct ```python block, with the first page that shows it (a block shown in both
# the README and a docs page runs once).
_SOURCES: dict[str, str] = {}
for _page in PAGES:
    for _i, _source in enumerate(_blocks(_page, "python")):
        _SOURCES.setdefault(_source, f"{_name(_page)}:block{_i}")
BLOCKS = list(_SOURCES)
IDS = list(_SOURCES.values())
README_BLOCKS = _blocks(README, "python")


def test_readme_has_python_examples() -> None:
    assert README_BLOCKS, "the README lost its runnable examples"


@pytest.mark.parametrize("source", BLOCKS, ids=IDS)
def test_every_example_asserts_what_it_shows(source: str) -> None:
    # Issue 24: the examples were only run, so a wrong number they printed passed. Each now
    # asserts its facts; one without an assert (on a name it computed) would check nothing.
    tree = ast.parse(source)
    assigned = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }
    checked = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        and {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)} & assigned
    ]
    assert checked, "this example asserts nothing it computed"


@pytest.mark.parametrize("source", BLOCKS, ids=IDS)
def test_readme_example_runs_and_its_checks_hold(source: str) -> None:
    exec(compile(source, _SOURCES.get(source, str(README)), "exec"), {"__name__": "readme_example"})


def test_a_failing_check_in_an_example_fails_the_test() -> None:
    # The examples' checks are live: a false one fails the run (under python -O, compile
    # would strip them, and this test would say so).
    source = README_BLOCKS[0] + "\nassert report.max_rel_error > 1.0  # false: the check passed\n"
    with pytest.raises(AssertionError):
        test_readme_example_runs_and_its_checks_hold(source)


def test_readme_stays_short() -> None:
    # Issue 23: the README had grown to 1,846 lines; the details live in docs/ now.
    lines = len(README.read_text().splitlines())
    assert lines < MAX_README_LINES, f"README.md has {lines} lines; move details to docs/"


def test_readme_keeps_the_quick_start_ci_runs() -> None:
    lines = README.read_text().splitlines()
    for line in QUICK_START:
        assert line in lines, f"the README's quick start lost {line.strip()!r}"


def test_every_py_block_in_the_docs_is_the_readme_one() -> None:
    # ```py blocks need torch and are not run here; tests/interop/test_crosscheck.py and
    # tests/interop/test_pyg_module.py run the README's. A copy in the docs must be one of
    # them, so it is tested too.
    readme = set(_blocks(README, "py"))
    for page in PAGES[1:]:
        for block in _blocks(page, "py"):
            assert block in readme, f"{_name(page)} has a ```py block that is not the README's"


# [text](target) and ![alt](target), outside code: the target up to a space or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"^```.*?^```$|^(?: {4}|\t).*$|`+[^`\n]*`+", flags=re.DOTALL | re.MULTILINE)


def _relative_links(text: str) -> list[str]:
    text = CODE.sub("", text)
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE) or target.startswith("#"):
            continue  # https:, mailto:, or an anchor on the same page
        targets.append(target)
    return targets


def test_the_link_finder_finds_links_and_skips_code() -> None:
    text = "See [a](x.md#s), ![b](i.png), [c](https://e.org), [d](#top).\n\n    [e](no.md)\n"
    assert _relative_links(text + "`[f](no.md)`\n") == ["x.md#s", "i.png"]


@pytest.mark.parametrize("page", PAGES, ids=[_name(p) for p in PAGES])
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    missing = []
    for target in _relative_links(page.read_text()):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{_name(page)} links to files that do not exist: {missing}"


def test_readme_links_into_the_docs() -> None:
    assert any(t.startswith("docs/") for t in _relative_links(README.read_text()))


API_DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", flags=re.MULTILINE)


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[i:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_api_directive_names_an_importable_object() -> None:
    # A module moved or a name renamed breaks `mkdocs build --strict`; this says which, without
    # MkDocs installed.
    names = [
        n for page in sorted(DOCS.rglob("*.md")) for n in API_DIRECTIVE.findall(page.read_text())
    ]
    assert names, "the API pages render nothing"
    broken = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            broken.append(name)
    assert not broken, f"API pages render names that do not import: {broken}"


def _docs_extension():  # docs/griffe_rst.py, which needs griffe (the "docs" extra)
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_rst", DOCS / "griffe_rst.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_build_turns_rest_roles_into_code() -> None:
    rewrite = _docs_extension().rewrite
    text = "Uses :class:`GATConv` and :func:`~refimpl.init.balance`, like this::\n\n    x = 1\n"
    assert rewrite(text) == "Uses `GATConv` and `balance`, like this:\n\n    x = 1\n"


def test_docs_build_shows_a_deferred_module_docstring_before_the_sections() -> None:
    combine = _docs_extension().with_module_docstring
    class_doc = "A layer; see the module docstring.\n\nParameters\n----------\nx : array"
    out = combine(class_doc, "Eq. 1: y = W x.\n\nRow blocks\n----------\ntext")
    summary, box, *_ = out.split("\n\n")
    assert summary == "A layer; see the module docstring."
    assert box.startswith("!!! abstract") and "\n    Eq. 1: y = W x." in out
    # The module's headings are indented inside the box (no numpy section can start there);
    # the class's own sections follow, unindented, so they parse as before.
    assert "\n    Row blocks\n    ----------" in out
    assert out.endswith("\n\nParameters\n----------\nx : array")
