"""Where is a Chromium for the browser checks? Prints its path, or exits 1 saying how to get one.

    .venv/bin/python tests/browser_path.py

Looked for in this order: $PAPERNOTES_CHROMIUM; chromium, chromium-browser, google-chrome or
google-chrome-stable on the PATH (Debian's package is what `make test` installs where apt-get
exists); the macOS applications; playwright's own build (`playwright install chromium`, where the
network allows). tests/test_browser.py and tests/test_jupyterlab.py skip, with this message,
when none is found, except under CI, where a missing browser fails.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MACOS_APPS = (
    "/Applications/Chromium.app/Contents/MacOS/Chromium",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
)
HOW_TO = (
    "no Chromium or Chrome found for the browser checks. Install one (Debian/Ubuntu: "
    "apt-get install chromium; macOS: brew install --cask chromium; or, with network, "
    "`.venv/bin/playwright install chromium`), or point PAPERNOTES_CHROMIUM at its executable, "
    "then run `.venv/bin/python -m pytest -m book`"
)


def find_chromium() -> str | None:
    named = os.environ.get("PAPERNOTES_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    for name in NAMES:
        if path := shutil.which(name):
            return path
    for app in MACOS_APPS:
        if Path(app).is_file():
            return app
    return _playwrights_own()


def _playwrights_own() -> str | None:
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            path = playwright.chromium.executable_path
    except Exception:  # playwright absent, or its driver cannot start: no browser from it
        return None
    return path if path and Path(path).is_file() else None


if __name__ == "__main__":
    found = find_chromium()
    print(found or HOW_TO)
    sys.exit(0 if found else 1)
