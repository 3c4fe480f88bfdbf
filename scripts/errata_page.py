"""Refresh the evaluated blocks of ``docs/errata.md`` from ``python -m proofs_check``'s errata.

    python scripts/errata_page.py [--page docs/errata.md]

Each erratum's section on the page (``### `id```, its **Where:** line, then a ``text`` block)
keeps its hand-written prose; the block is replaced by what the CLI prints for that erratum
(printed, correct, the counterexample evaluated now), wrapped by the same
:func:`proofs_check.runner.format_errata` at the CLI's 100 columns, so the page fits a
1280-pixel window and says what the CLI says. Exit 1 when an erratum has no section on the
page or a section names no erratum (the page lists them all, in its own order); 2 for a page
that cannot be read or written.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the repository's packages

from proofs_check.errata import ERRATA  # noqa: E402
from proofs_check.erratum import Erratum, Evidence  # noqa: E402
from proofs_check.runner import format_errata  # noqa: E402

_SECTION = re.compile(r"^### `([^`]+)`\n(?:(?!^### ).*\n)*?^```text\n(?:.*\n)*?^```$", re.MULTILINE)
_BLOCK = re.compile(r"^```text\n(?:.*\n)*?^```$", re.MULTILINE)


def block(erratum: Erratum, evidence: Evidence) -> str:
    """The page's text block for one erratum: the CLI's lines from ``printed:`` on, dedented."""
    lines = format_errata([(erratum, evidence)]).splitlines()
    start = next(k for k, line in enumerate(lines) if line.lstrip().startswith("printed: "))
    return textwrap.dedent("\n".join(lines[start:]))


def refresh(page: str, blocks: dict[str, str]) -> tuple[str, list[str]]:
    """``page`` with each erratum's text block replaced, and the problems (ids unmatched)."""
    seen: list[str] = []

    def replace(section: re.Match[str]) -> str:
        seen.append(section.group(1))
        if section.group(1) not in blocks:
            return section.group(0)
        new = f"```text\n{blocks[section.group(1)]}\n```"
        return _BLOCK.sub(lambda _: new, section.group(0), count=1)

    updated = _SECTION.sub(replace, page)
    problems = [f"section `{name}` names no erratum" for name in seen if name not in blocks]
    problems += [
        f"erratum {name} has no section on the page" for name in blocks if name not in seen
    ]
    return updated, problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "errata.md")
    args = parser.parse_args(argv)
    try:
        page = args.page.read_text(encoding="utf-8")
    except OSError as error:
        print(f"errata_page: cannot read {args.page}: {error.strerror}", file=sys.stderr)
        return 2
    blocks = {erratum.id: block(erratum, erratum.evaluate()) for erratum in ERRATA}
    updated, problems = refresh(page, blocks)
    for problem in problems:
        print(f"errata_page: {problem}", file=sys.stderr)
    try:
        args.page.write_text(updated, encoding="utf-8")
    except OSError as error:
        print(f"errata_page: cannot write {args.page}: {error.strerror}", file=sys.stderr)
        return 2
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
