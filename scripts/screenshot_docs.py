"""Screenshots of a built docs site at 1280 pixels wide, in headless Chromium, to look at.

    python scripts/screenshot_docs.py SITE_DIR [--out /tmp/shots] [--browser PATH]

Serves ``SITE_DIR`` (``mkdocs build --site-dir SITE_DIR``) on a local port and saves one PNG
per entry of ``PAGES``: the home page, a guide page with equations, the GATConv API section,
the errata and the benchmarks, each scrolled to its part. The math is typeset by the site's
own KaTeX in the browser, so a screenshot shows what a reader without internet sees. Needs
Playwright (``pip install playwright``) and a Chromium: the system's (``apt-get install
chromium``, found on the PATH or given by ``--browser``) or Playwright's own (``python -m
playwright install chromium``). Exit 2 with one line when either is missing.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WIDTH = 1280
# (file name, page and anchor, window height: enough for the part to look at)
PAGES = [
    ("home.png", "", 1600),
    ("guide_concepts_math.png", "guide/concepts/#aggregation-primitives", 1000),
    ("api_gatconv.png", "api/nn_gat/#refimpl.nn.GATConv", 2400),
    ("errata.png", "errata/#lipschitznorm", 1400),
    ("benchmarks.png", "benchmarks/#a-gat-training-step-against-pytorch-geometric", 1400),
]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # no line per request on the terminal


def take(site: Path, out: Path, browser: str | None) -> list[Path]:
    """Serve ``site`` and save the ``PAGES`` screenshots under ``out``; their paths."""
    from playwright.sync_api import sync_playwright

    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    saved = []
    try:
        with sync_playwright() as playwright:
            # as root in a container, Chromium's sandbox cannot start
            chromium = playwright.chromium.launch(executable_path=browser, args=["--no-sandbox"])
            for name, path, height in PAGES:
                page = chromium.new_page(viewport={"width": WIDTH, "height": height})
                page.goto(f"http://127.0.0.1:{server.server_address[1]}/{path}")
                page.wait_for_load_state("networkidle")  # KaTeX has typeset when this returns
                page.screenshot(path=str(out / name))
                page.close()
                saved.append(out / name)
            chromium.close()
    finally:
        server.shutdown()
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, metavar="SITE_DIR")
    parser.add_argument("--out", type=Path, default=Path("/tmp/shots"))
    parser.add_argument("--browser", help="a Chromium or Chrome binary (default: on the PATH)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"screenshot_docs: {args.site} is not a built site (no index.html)", file=sys.stderr)
        return 2
    try:
        import playwright  # noqa: F401 (only whether it is there)
    except ImportError:
        print("screenshot_docs: needs Playwright: pip install playwright", file=sys.stderr)
        return 2
    browser = args.browser or next(filter(None, map(shutil.which, BROWSERS)), None)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        saved = take(args.site, args.out, browser)
    except Exception as error:  # Playwright's errors name no common type; one line, not a trace
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(
            f"screenshot_docs: Chromium did not start ({first}): apt-get install chromium, "
            "or pass --browser",
            file=sys.stderr,
        )
        return 2
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
