"""The mail app (Node server on bindings/node, the bridge with --audit-frames) in a real browser
on tiny models: inbox, draft a reply in the user's voice, lose the companion (offline badge,
local tokens), get it back, send (into the history), import an mbox, and a privacy panel that
never shows the private history."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps_helpers import REPO, screenshot, start_app
from ci import skip_or_fail

from specsteer.history import HistoryStore
from specsteer_companion.proxy import Faults

COLLAB = ", ".join(f"#suggestion-text .tok.{p}" for p in ("draft", "recovered", "bonus"))
CANARY = "Quillwort-canary-2468"


@pytest.fixture(scope="module")
def node_client_built() -> None:
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        skip_or_fail("node/npm not found")
    folder = REPO / "bindings" / "node"
    for cmd in (["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                ["npm", "run", "build", "--silent"]):
        subprocess.run(cmd, cwd=folder, check=True, capture_output=True, timeout=300)


@pytest.fixture()
def mail_app(node_client_built, companion_behind_proxy, tmp_path: Path) -> Iterator[tuple]:
    history = tmp_path / "mail.db"
    proc, url = start_app(
        ["node", str(REPO / "sample_apps" / "mail" / "server.mjs"), "--port", "0",
         "--companion", companion_behind_proxy.url, "--history", str(history)],
        "SpecSteer Mail on", env={"SPECSTEER_PYTHON": sys.executable})
    try:
        yield url, companion_behind_proxy, history
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture()
def companion_behind_proxy(companion_behind_proxy):  # noqa: ANN001, ANN201
    # mail streams as fast as the bridge writes: a slower link keeps the draft going long
    # enough to cut it in the middle
    companion_behind_proxy.proxy.faults = Faults(delay_s=0.03)
    return companion_behind_proxy


def test_reply_draft_offline_and_back_then_send(browser, mail_app) -> None:
    url, proxy, history = mail_app
    page = browser.new_page(viewport={"width": 1440, "height": 860})
    page.goto(url)
    page.wait_for_selector("#messages li >> text=Frost on plot 14")
    assert page.locator("#messages li").count() == 7
    page.wait_for_selector("#badge.online")
    page.click("#messages li >> text=Frost on plot 14")
    page.click("#reply")
    assert page.input_value("#c-subject") == "Re: Frost on plot 14"
    # the user starts the reply; a pause in typing prepares the draft that continues it
    page.fill("#c-body", f"Thanks Priya, the frost cloth is behind {CANARY} and")
    page.wait_for_selector("#prepared:visible")

    page.click("#privacy-toggle")
    page.click("#draft")
    page.wait_for_function(f"document.querySelectorAll('{COLLAB}').length >= 8")
    screenshot(page, "mail-draft.png")
    proxy.set_online(False)
    page.wait_for_selector("#suggestion-text .tok.local")
    page.wait_for_selector("#badge.offline")
    page.wait_for_selector("#draft:enabled", timeout=60000)
    screenshot(page, "mail-offline.png")
    # the draft started from the prompt prepared while typing (all but its last tokens)
    done = page.inner_text("#suggestion-state")
    prefilled = re.search(r"(\d+) of (\d+) prompt tokens prefilled", done)
    assert prefilled, done
    reused, total = map(int, prefilled.groups())
    assert total - 3 <= reused < total, done

    # back online: the badge says so and the next draft is steered again
    proxy.set_online(True)
    page.wait_for_selector("#badge.online", timeout=15000)
    page.click("#discard")
    page.click("#draft")
    page.wait_for_function(f"document.querySelectorAll('{COLLAB}').length >= 3")
    page.click("#cancel")
    page.wait_for_selector("#suggestion-state >> text=cancelled")
    suggestion = "".join(page.locator("#suggestion-text .tok").all_text_contents())
    page.click("#accept")
    drafted = page.input_value("#c-body")
    assert drafted == f"Thanks Priya, the frost cloth is behind {CANARY} and" + suggestion

    page.fill("#c-body", drafted + "\n\nDirt under the nails,\nWren")
    page.click("#send")
    page.wait_for_selector("#folder-sent.active")
    page.wait_for_selector("#messages li >> text=Re: Frost on plot 14")
    with HistoryStore(history, read_only=True) as store:
        sent = [r for r in store.list(kind="email", limit=100) if r.title == "Re: Frost on plot 14"]
    assert sent and CANARY in sent[0].body and sent[0].meta["to"].startswith("Priya")

    page.wait_for_function("document.querySelectorAll('#frames li').length > 10")
    panel = page.inner_text("#frames")
    assert "OpenSession" in panel and "Draft" in panel
    for private in (CANARY, "Dirt under the nails", "envelopes", "Practical bits", "frost cloth"):
        assert private not in panel
    screenshot(page, "mail-privacy.png")
    page.close()


def test_import_my_mbox(browser, mail_app, tmp_path: Path) -> None:
    url, _, history = mail_app
    mbox = tmp_path / "mine.mbox"
    mbox.write_text(
        "From someone@example.org Mon Jan  1 00:00:00 2024\n"
        "From: Me <me@example.org>\nTo: You <you@example.org>\nSubject: Old news\n"
        "Date: Mon, 01 Jan 2024 10:00:00 +0000\nMessage-ID: <old-news@example.org>\n\n"
        f"An old message of mine. {CANARY}\n\n", encoding="utf-8")
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("#messages li")
    page.set_input_files("#import", str(mbox))
    page.wait_for_selector("#import-report >> text=1 added")
    page.click("#folder-sent")
    page.wait_for_selector("#messages li >> text=Old news")
    with HistoryStore(history, read_only=True) as store:
        assert store.stats()["kinds"]["email"] == 17
    page.close()
