r"""Check a built docs site for what ``mkdocs build --strict`` lets through.

    python scripts/check_site.py SITE_DIR

Strict mode fails on broken links and bad docstring sections, but a page can still show
its source instead of rendering it. This reads every HTML page of the built site and fails
(exit 1, one line per problem: page, what is wrong, the text) on

- math left as text: ``$...$``, ``$$``, ``\(...\)`` or ``\[...\]`` outside code and outside
  the elements ``pymdownx.arithmatex`` marks (a display block without a blank line before or
  after stays a paragraph with its dollars, and KaTeX never sees it);
- math holding a control character where a backslash was (``\frac`` in a docstring that is
  not raw reads as a form feed and ``rac``: KaTeX shows text, no error);
- math that KaTeX cannot typeset (where Node.js is on the PATH: each marked expression is
  run through the site's own ``assets/katex/katex.min.js``, as the browser would);
- a page with math that does not load KaTeX, or a site without the KaTeX files;
- a table left as text: a reST simple table's ``=====  =====`` rules, or a Markdown pipe table
  that stayed a paragraph (``| a | b |`` lines: no blank line before it, or a bad rule row);
- reST roles (``:class:`X```) that the docs build did not turn into code;
- a signature on one line longer than ``MAX_SIGNATURE_LINE`` characters, which the page
  cuts off (``concat: bool = Tru``): the signature formatter (ruff or black, in the docs
  extra) did not run.

It also fails when no page holds math or a rendered table, so a build that lost its math
extension cannot pass by having nothing to check. Exit 2 for a ``SITE_DIR`` that is not a
built site. ``tests/test_docs_site.py`` tests the checks on hand-made pages and on a small
site built with this project's configuration.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

MAX_SIGNATURE_LINE = 100  # mkdocs.yml formats to 80; one parameter alone may run longer
KATEX_JS = Path("assets") / "katex" / "katex.min.js"

# Text outside these elements is prose; inside them a dollar or a rule line is meant.
_VERBATIM = {"code", "pre", "kbd", "samp", "script", "style", "textarea", "svg"}
_BLOCKS = set("p li td th dd dt div blockquote h1 h2 h3 h4 h5 h6".split())
_VOID = set("area base br col embed hr img input link meta source wbr".split())

# A dollar pair as arithmatex's smart dollars read it: no space just inside either dollar.
_DOLLAR_MATH = re.compile(r"(?<![\\$\w])\$(?=[^\s$])[^$\n]*?(?<=[^\s\\$])\$(?![\w$])")
_DISPLAY_DOLLARS = re.compile(r"\$\$")
_TEX_BRACKETS = re.compile(r"\\\(.*?\\\)|\\\[.*?\\\]", flags=re.DOTALL)
_REST_RULE = re.compile(r"(?:^|\s)={3,}(?:[ \t]+={3,})+(?=\s|$)")
_PIPE_ROW = re.compile(r"^\s*\|.*\|.*\|\s*$", flags=re.MULTILINE)
# What Python makes of \frac, \beta, \alpha, \vec, \times in a docstring that is not raw.
_EATEN_BACKSLASH = re.compile(r"[\a\b\t\v\f]")
_REST_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|term):`")


@dataclass
class Page:
    """What one HTML page holds, as far as the checks care."""

    prose: list[str] = field(default_factory=list)  # text outside code and math
    math: list[tuple[str, bool]] = field(default_factory=list)  # (TeX, display)
    signatures: list[str] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    tables: int = 0


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._stack: list[tuple[str, str]] = []  # (tag, role): "prose", "verbatim", "math", ...
        self._prose: list[str] = []  # the current block's text, code and math as placeholders
        self._special: list[str] = []  # the current math element's or signature's text

    def _role(self) -> str:
        return self._stack[-1][1] if self._stack else "prose"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if tag == "script" and attributes.get("src"):
            self.page.scripts.append(attributes["src"] or "")
        if tag == "table":
            self.page.tables += 1
        if tag in _VOID:
            return
        role = self._role()
        if role == "prose":
            if "arithmatex" in classes:
                role = "math"
                self._prose.append(" MATH ")
            elif "doc-signature" in classes:
                role = "signature"
            elif tag in _VERBATIM:
                role = "verbatim"
                self._prose.append(" CODE ")
        self._stack.append((tag, role))

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID or all(open_tag != tag for open_tag, _ in self._stack):
            return
        role = "prose"
        while self._stack:
            open_tag, role = self._stack.pop()
            if open_tag == tag:
                break
        if role in ("math", "signature") and self._role() == "prose":
            text = "".join(self._special)
            self._special = []
            if role == "math":
                self.page.math.append(_strip_delimiters(text, display=tag == "div"))
            else:
                self.page.signatures.append(text)
        elif role == "prose" and tag in _BLOCKS:
            self.flush()

    def handle_data(self, data: str) -> None:
        role = self._role()
        if role == "prose":
            self._prose.append(data)
        elif role in ("math", "signature"):
            self._special.append(data)

    def flush(self) -> None:
        """End the current block of prose."""
        text = "".join(self._prose)
        self._prose = []
        if text.strip():
            self.page.prose.append(text)


def _strip_delimiters(text: str, display: bool) -> tuple[str, bool]:
    r"""The TeX of an arithmatex element (``\(x\)`` or ``\[x\]`` in generic mode)."""
    tex = text.strip()
    if tex[:2] in ("\\(", "\\[") and tex[-2:] in ("\\)", "\\]"):
        tex = tex[2:-2]
    return tex.strip(" \n"), display  # not str.strip(): a form feed there is a fault to report


def read_page(html: str) -> Page:
    """The prose, math, signatures, scripts and table count of one HTML page."""
    reader = _Reader()
    reader.feed(html)
    reader.close()
    reader.flush()
    return reader.page


def _excerpt(text: str, start: int = 0, width: int = 70) -> str:
    return " ".join(text[max(0, start - 10) : start + width].split())


def page_problems(page: Page, katex_loaded: bool) -> list[str]:
    """What is wrong on one page (see the module docstring); empty when nothing is."""
    problems = []
    for text in page.prose:
        for pattern, what in (
            (_DISPLAY_DOLLARS, "display math left as text (blank line before and after $$?)"),
            (_DOLLAR_MATH, "inline math left as text"),
            (_TEX_BRACKETS, "TeX delimiters left as text"),
            (_REST_RULE, "reST table left as text (write a Markdown pipe table)"),
            (_PIPE_ROW, "Markdown table left as text (blank line before it? rule row?)"),
            (_REST_ROLE, "reST role left as text"),
        ):
            match = pattern.search(text)
            if match:
                problems.append(f"{what}: {_excerpt(text, match.start())!r}")
                break
    for signature in page.signatures:
        longest = max(signature.splitlines() or [""], key=len)
        if len(longest) > MAX_SIGNATURE_LINE:
            problems.append(
                f"signature on a line of {len(longest)} characters, cut off on the page (no "
                f"formatter ran: pip install -e '.[docs]' installs ruff): {_excerpt(longest)!r}"
            )
    for tex, _ in page.math:
        if _EATEN_BACKSLASH.search(tex):
            problems.append(
                "math with a control character where a backslash was: a docstring that is not "
                f'raw read \\f, \\b, \\a, \\v or \\t as an escape (write r"""...): {tex!r}'
            )
    if page.math and not katex_loaded:
        problems.append("page has math but does not load KaTeX (extra_javascript in mkdocs.yml)")
    return problems


def tex_errors(katex_js: Path, expressions: list[tuple[str, bool]]) -> list[str] | None:
    """KaTeX's error for each expression it cannot typeset, or None without Node.js."""
    node = shutil.which("node")
    if node is None or not expressions:
        return None if node is None else []
    script = (
        "const katex = require(process.argv[1]);"
        "const items = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "const errors = items.map(([tex, display]) => {"
        "  try { katex.renderToString(tex, {displayMode: display, throwOnError: true});"
        "        return null; } catch (e) { return String(e.message); } });"
        "process.stdout.write(JSON.stringify(errors));"
    )
    done = subprocess.run(
        [node, "-e", script, str(katex_js.resolve())],
        input=json.dumps(expressions),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return [f"Node.js could not run KaTeX: {done.stderr.strip().splitlines()[-1:]}"]
    return json.loads(done.stdout)


def check_site(site: Path) -> tuple[list[str], str]:
    """Every problem in the built site at ``site`` (``PAGE: problem``), and a summary line."""
    pages = sorted(site.rglob("*.html"))
    problems: list[str] = []
    katex_js = site / KATEX_JS
    if not katex_js.is_file():
        problems.append(f"{KATEX_JS}: missing (mkdocs.yml's extra_javascript names it)")
    expressions: list[tuple[str, bool]] = []
    where: list[str] = []
    tables = signatures = 0
    for path in pages:
        name = path.relative_to(site).as_posix()
        page = read_page(path.read_text(encoding="utf-8"))
        loaded = any(src.split("?")[0].endswith(KATEX_JS.as_posix()) for src in page.scripts)
        problems += [f"{name}: {problem}" for problem in page_problems(page, loaded)]
        expressions += page.math
        where += [name] * len(page.math)
        tables += page.tables
        signatures += len(page.signatures)
    # an eaten backslash is reported above, in words that say how to fix it
    clean = [k for k, (tex, _) in enumerate(expressions) if not _EATEN_BACKSLASH.search(tex)]
    typeset = [expressions[k] for k in clean]
    errors = tex_errors(katex_js, typeset) if katex_js.is_file() else None
    for k, error in zip(clean, errors or [], strict=False):
        if error is not None:
            problems.append(f"{where[k]}: KaTeX cannot typeset {expressions[k][0]!r}: {error}")
    if not expressions:
        problems.append("no page holds math: is pymdownx.arithmatex in mkdocs.yml?")
    if not tables:
        problems.append("no page holds a rendered table: is the tables extension in mkdocs.yml?")
    typeset = "typeset by KaTeX" if errors is not None else "not typeset: no Node.js on PATH"
    summary = (
        f"{len(pages)} pages, {len(expressions)} math expressions ({typeset}), {tables} tables, "
        f"{signatures} signatures checked"
    )
    return problems, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, metavar="SITE_DIR", help="a built site (mkdocs build)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(
            f"check_site: {args.site} is not a built site (no index.html): pass the folder "
            "given to mkdocs build --site-dir",
            file=sys.stderr,
        )
        return 2
    problems, summary = check_site(args.site)
    for problem in problems:
        print(problem)
    print(f"{summary}: {len(problems)} problems" if problems else f"{summary}: no problem")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
