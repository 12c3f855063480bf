"""A real browser for the e2e tests: Debian's Chromium driven by Playwright with the system browser's path (no
browser download). ``make test`` installs both when it can; where it could not, :func:`unavailable` says why in one
line and the browser test skips."""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = os.environ.get("AIRFLOW_TUNE_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Where the tests leave screenshots (kept after the run; not in git).
ARTIFACTS = Path(os.environ.get("AIRFLOW_TUNE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".artifacts"))


def unavailable() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    if not os.access(CHROMIUM, os.X_OK):
        return (
            f"no browser: {CHROMIUM} is missing (make test installs Debian's chromium package when it runs as root or "
            "with passwordless sudo)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no browser driver: playwright is not installed (make test installs it from constraints.txt)"
    return None
