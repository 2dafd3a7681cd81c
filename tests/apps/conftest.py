"""Browser tests of the sample apps: Debian's chromium driven by Playwright (no browser download).

A missing chromium or Playwright skips these tests on a developer machine and fails them with
CI=true. `SPECSTEER_SCREENSHOTS=DIR` saves the screenshots the docs use into DIR.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.apps import REPO
from helpers.apps import companion_behind_proxy as proxied
from helpers.ci import skip_or_fail

from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.proxy import ProxyThread

CHROMIUM = os.environ.get("SPECSTEER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


# Playwright's waits give up after 30 s by default; an app under a loaded 2-core machine (an
# mbox import in a subprocess, a companion's first round) can take longer without being wrong
PAGE_TIMEOUT_MS = 120_000


class _Patient:
    """The browser, whose new pages wait up to PAGE_TIMEOUT_MS for what a test waits for."""

    def __init__(self, browser: object) -> None:
        self._browser = browser

    def new_page(self, **options: object) -> object:
        page = self._browser.new_page(**options)  # type: ignore[attr-defined]
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        return page

    def __getattr__(self, name: str) -> object:
        return getattr(self._browser, name)


def _missing(what: str) -> None:
    message = f"{what}; install it with `apt-get install -y chromium` and `pip install playwright`"
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests need {message}")
    pytest.skip(f"no browser: {message}")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Chromium for one test module: Playwright's sync API runs an event loop on this thread
    while it is open, so it must be closed before other modules call asyncio.run."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed")
    if not Path(CHROMIUM).is_file():
        _missing(f"chromium is not at {CHROMIUM}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield _Patient(browser)
        browser.close()


@pytest.fixture()
def companion_behind_proxy() -> Iterator[ProxyThread]:
    """A real tiny companion process behind a fault proxy (the switch takes it away)."""
    with proxied(str(tiny_model_dir("llama", seed=1)), str(tiny_model_dir("llama", seed=0)),
                 timeout_s=120) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def node_client_built() -> None:
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        skip_or_fail("node/npm not found")
    folder = REPO / "bindings" / "node"
    for cmd in (["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                ["npm", "run", "build", "--silent"]):
        subprocess.run(cmd, cwd=folder, check=True, capture_output=True, timeout=300)
