"""The system Chromium that the browser tests drive (JupyterLab in test_browser.py, the
course website in test_site.py), through Playwright for Python.

Without a Chromium executable a browser test is skipped with the install hint, except
under ``CI``, where it must run and so fails.
"""

from __future__ import annotations

import os
import shutil

import pytest

INSTALL_HINT = "install Chromium: `sudo apt-get install chromium` or run .ci/install-browser"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a 64 MB /dev/shm
]


def find_chromium() -> str | None:
    """The system Chromium, or None."""
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def in_ci() -> bool:
    """True when the ``CI`` variable is set to something other than empty/0/false/no."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_chromium() -> str:
    """The Chromium to drive; skip without one (fail under CI, where it must run)."""
    exe = find_chromium()
    if exe is None:
        message = f"no Chromium executable found (chromium on PATH, /usr/bin/chromium); {INSTALL_HINT}"
        if in_ci():
            pytest.fail(f"{message}. CI is set, so the browser test must run, not skip.")
        pytest.skip(message)
    return exe
