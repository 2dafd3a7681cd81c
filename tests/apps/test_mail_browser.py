"""The mail app (Node server on bindings/node, the bridge with --audit-frames) in a real browser
on tiny models: inbox, a reply draft prepared while typing that continues the user's text, lose
the companion mid-draft (offline badge, local tokens) and get it back (steering resumes in the
same draft), send (into the history), import an mbox, and a privacy panel whose public request
holds the user's text and never the private history."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.apps import (
    REPO,
    capture_streams,
    check_widths,
    choose_leak_guard,
    done_event,
    leak_guard_line,
    public_request,
    screenshot,
    start_app,
)

from specsteer.history import HistoryStore, retrieve

# a browser, the Node app and a companion process: not in ./dev test --fast
pytestmark = pytest.mark.slow

COLLAB = ", ".join(f"#suggestion-text .tok.{p}" for p in ("draft", "recovered", "bonus"))
CANARY = "Quillwort-canary-2468"  # in the history: private
DRAFT = "Thanks Priya, the salad will be fine under fleece tonight, and"


@pytest.fixture()
def mail_app(node_client_built, companion_behind_proxy, tmp_path: Path) -> Iterator[tuple]:
    history = tmp_path / "mail.db"
    proc, url = start_app(
        ["node", str(REPO / "sample_apps" / "mail" / "server.mjs"), "--tiny", "--port", "0",
         "--companion", companion_behind_proxy.url, "--history", str(history),
         "--min-token-ms", "40"],
        "SpecSteer Mail on", env={"SPECSTEER_PYTHON": sys.executable})
    try:
        yield url, companion_behind_proxy, history
    finally:
        proc.terminate()
        proc.wait(10)


def _mbox(subject: str, body: str, message_id: str) -> str:
    return (f"From me@example.org Mon Jan  1 00:00:00 2024\nFrom: Me <me@example.org>\n"
            f"To: You <you@example.org>\nSubject: {subject}\n"
            f"Date: Mon, 01 Jan 2024 10:00:00 +0000\nMessage-ID: <{message_id}>\n\n{body}\n\n")


def test_reply_draft_offline_and_back_then_send(browser, mail_app, tmp_path: Path) -> None:
    url, proxy, history = mail_app
    page = browser.new_page(viewport={"width": 1440, "height": 860})
    page.goto(url)
    page.wait_for_selector("#messages li >> text=Frost on plot 14")
    assert page.locator("#messages li").count() == 7
    page.wait_for_selector("#badge.online")
    assert page.inner_text("#test-banner").startswith("test models: random text")
    # a private mail of the user's that the reply below retrieves as context
    mbox = tmp_path / "private.mbox"
    mbox.write_text(_mbox("Fleece for the winter salads",
                          f"The spare fleece is in the blue crate, {CANARY}.", "fleece@x"),
                    encoding="utf-8")
    page.set_input_files("#import", str(mbox))
    page.wait_for_selector("#import-report >> text=private.mbox: 1 added")

    page.click("#messages li >> text=Frost on plot 14")
    page.click("#reply")
    assert page.input_value("#c-subject") == "Re: Frost on plot 14"
    # the user starts the reply; a pause in typing prepares the draft that continues it
    page.fill("#c-body", DRAFT)
    page.wait_for_selector("#prepared:visible")
    message = next(m for m in json.loads((REPO / "sample_apps/data/inbox.json").read_text())
                   if m["subject"] == "Frost on plot 14")
    with HistoryStore(history, read_only=True) as store:
        hits = retrieve(store, "reply", {"message": message["body"],
                                         "subject": message["subject"]}, 5)
    assert "Fleece for the winter salads" in [hit.record.title for hit in hits]

    page.click("#privacy-toggle")
    page.click("#draft")
    page.wait_for_function(f"document.querySelectorAll('{COLLAB}').length >= 8")
    screenshot(page, "tiny-mail-draft.png")
    # the companion goes away mid-draft: offline badge, the on-device model goes on
    proxy.set_online(False)
    page.wait_for_selector("#suggestion-text .tok.local")
    page.wait_for_selector("#badge.offline")
    screenshot(page, "tiny-mail-offline.png")
    # it comes back: the bridge reconnects and steering resumes in the same draft
    proxy.set_online(True)
    page.wait_for_function(
        "(() => { const t = [...document.querySelectorAll('#suggestion-text .tok')];"
        " const i = t.findIndex(s => s.dataset.provenance === 'local');"
        " return i >= 0 && t.slice(i).some(s => s.dataset.provenance !== 'local'); })()",
        timeout=20000)
    page.wait_for_selector("#badge.online")
    screenshot(page, "tiny-mail-resumed.png")
    page.wait_for_selector("#draft:enabled", timeout=60000)
    # the draft started from the prompt prepared while typing (all of it, or all but its last
    # tokens)
    # the privacy panel's leak guard line: the default policy and the counts of this draft
    assert leak_guard_line(page)[0] == "redact"
    done = page.inner_text("#suggestion-state")
    assert "partly offline" in done, done
    prefilled = re.search(r"(\d+) of (\d+) prompt tokens prefilled", done)
    assert prefilled, done
    reused, total = map(int, prefilled.groups())
    assert total - 3 <= reused <= total, done

    # cancel a second draft; use what it wrote: it follows the user's text
    page.click("#discard")
    page.click("#draft")
    page.wait_for_function(f"document.querySelectorAll('{COLLAB}').length >= 3")
    page.click("#cancel")
    page.wait_for_selector("#suggestion-state >> text=cancelled")
    # the cancelled draft keeps its counts: the tokens it wrote, by who decided them
    shown = page.locator("#suggestion-text .tok").count()
    assert re.fullmatch(rf"cancelled · {shown} tokens? \(\d+ [a-z ]+(, \d+ [a-z ]+)*\)",
                        page.inner_text("#suggestion-state"))
    suggestion = "".join(page.locator("#suggestion-text .tok").all_text_contents())
    page.click("#accept")
    drafted = page.input_value("#c-body")
    assert drafted == DRAFT + suggestion

    page.fill("#c-body", drafted + "\n\nDirt under the nails,\nWren")
    page.click("#send")
    page.wait_for_selector("#folder-sent.active")
    page.wait_for_selector("#messages li >> text=Re: Frost on plot 14")
    with HistoryStore(history, read_only=True) as store:
        sent = [r for r in store.list(kind="email", limit=100) if r.title == "Re: Frost on plot 14"]
    assert sent and sent[0].body.startswith(DRAFT) and sent[0].meta["to"].startswith("Priya")

    # the privacy panel: the public request holds the message answered and the user's text
    # (they asked for help with it), and nothing of the history the model read
    page.wait_for_function("document.querySelectorAll('#frames li').length > 10")
    panel = page.inner_text("#frames")
    assert "OpenSession" in panel and "Draft" in panel and "Resume" in panel
    # the Resume after the reconnect, in words: the request and the text so far, decoded
    resume = page.locator("#frames li[data-type=Resume]").first
    assert "the link was lost" in resume.inner_text()
    assert resume.locator("q[data-field=prompt_ids]").text_content().endswith(DRAFT)
    assert resume.locator("q[data-field=committed_ids]").text_content()
    words = page.locator("#frames .detail").all_inner_texts()
    assert words and not [w for w in words if w.lstrip().startswith("{")]
    request = public_request(page)
    assert "Frost on plot 14" in request and request.endswith(DRAFT)
    for private in (CANARY, "blue crate", "Dirt under the nails", "envelopes", "Practical bits"):
        assert private not in panel and private not in request
    screenshot(page, "tiny-mail-privacy.png")
    page.close()


def test_the_draft_and_the_panel_fit_from_a_phone_to_a_laptop(browser, mail_app) -> None:
    """A reply being drafted, with the privacy panel open, at 390, 800 and 1,400 px: nothing
    outside the window, clipped ("Use this draft", "Replying") or on top of something else."""
    url, _, _ = mail_app
    page = browser.new_page(viewport={"width": 1400, "height": 860})
    page.goto(url)
    page.wait_for_selector("#badge.online")
    page.click("#messages li >> text=Frost on plot 14")
    page.click("#reply")
    page.fill("#c-body", DRAFT)
    page.click("#privacy-toggle")
    page.click("#draft")
    page.wait_for_selector("#draft:enabled", timeout=60000)
    check_widths(page, "tiny-mail")
    page.close()


def test_a_draft_prepared_while_typing_starts_from_the_draft_made_ahead(browser, mail_app):
    """The server prepares with the draft's decoding options (`no_repeat_ngram` 8, its
    `max_new_tokens`...): the first round's draft made after the prefill is the one the draft
    uses (`stats.drafted_ahead`, shown in the suggestion's state line). Prepared without them,
    the bridge drafted for other settings and the draft drafted again."""
    url, _, _ = mail_app
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("#badge.online")
    page.click("#messages li >> text=Frost on plot 14")
    page.click("#reply")
    page.fill("#c-body", DRAFT)
    page.wait_for_selector("#prepared:visible")  # shown once the prefill and the draft are made
    page.click("#draft")
    page.wait_for_selector("#draft:enabled", timeout=60000)
    done = page.inner_text("#suggestion-state")
    ahead = re.search(r"first (\d+) tokens drafted while you typed", done)
    assert ahead and int(ahead.group(1)) > 0, done
    page.close()


def test_import_my_mbox(browser, mail_app, tmp_path: Path) -> None:
    url, _, history = mail_app
    mbox = tmp_path / "mine.mbox"
    mbox.write_text(_mbox("Old news", f"An old message of mine. {CANARY}",
                          "old-news@example.org"), encoding="utf-8")
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("#messages li")
    page.set_input_files("#import", str(mbox))
    page.wait_for_selector("#import-report >> text=1 added")
    page.click("#folder-sent")
    page.wait_for_selector("#messages li >> text=Old news")
    with HistoryStore(history, read_only=True) as store:
        assert store.stats()["kinds"]["email"] == 17

    # the settings choose the leak guard; the next draft runs under it and the panel says so
    choose_leak_guard(page, "hold")
    page.click("#privacy-toggle")
    page.click("#compose")
    page.fill("#c-subject", "Seed swap")
    streams = capture_streams(page, "**/api/draft")
    page.click("#draft")
    page.wait_for_selector("#leak-guard:visible", timeout=60000)
    policy, flagged, cut, kept = leak_guard_line(page)
    assert policy == "hold" and cut == 0  # hold never cuts a draft: it keeps the rest local
    [stream] = streams
    done = done_event(stream)
    assert (done["leak_guard"], done["leak_flagged"], done["leak_redacted"], done["leak_held"]) \
        == (policy, flagged, cut, kept)
    page.close()

