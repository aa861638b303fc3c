"""A screenshot of an `arpo view` report in headless Chromium: the docs' picture of the viewer.

    python scripts/screenshot_report.py runs/smollm2-arpo/report.html --out docs/_static/viewer.png

It opens the report, waits for the first trees to be drawn, opens the first trajectory, and saves a PNG. Needs
Debian's chromium (bash scripts/setup.sh --browser) and websocket-client (the dev extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from browser import Browser, find_chromium  # noqa: E402 - the tests' DevTools client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/_static/viewer.png"))
    args = parser.parse_args(argv)
    executable = find_chromium()
    if executable is None:
        raise SystemExit("screenshot_report: no chromium (bash scripts/setup.sh --browser installs it)")
    browser = Browser(executable, width=1280, height=1000)
    try:
        browser.open(args.report.resolve().as_uri())
        browser.wait_for("document.querySelectorAll('svg.tree').length > 0")
        browser.click("svg.tree g.node .hit")
        browser.wait_for("document.querySelectorAll('.traj').length === 1")
        png = browser.screenshot()
    finally:
        browser.close()
    args.out.write_bytes(png)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
