"""The notes app in a real browser on tiny models: write (the continuation is prepared while
typing), continue the note with provenance colours, lose the companion (offline badge, local
tokens), get it back (resume), and a privacy panel whose public request holds the note being
continued and never the private history."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.apps import (
    capture_streams,
    check_widths,
    choose_leak_guard,
    done_event,
    leak_guard_line,
    public_request,
    python_app,
    screenshot,
    start_app,
)

from specsteer.history import HistoryStore, retrieve

# a browser, the app and a companion process: not in ./dev test --fast
pytestmark = pytest.mark.slow

CANARY = "Marigold-canary-7731 under the blue bench"  # in the history: private
DRAFT = "Tulips along the fence this Saturday, the kids plant the front row."
COLLAB = ", ".join(f"#suggestion-text .tok.{p}" for p in ("draft", "recovered", "bonus"))


@pytest.fixture()
def notes_app(companion_behind_proxy, tmp_path: Path) -> Iterator[tuple[str, object, Path]]:
    history = tmp_path / "notes.db"
    proc, url = start_app(
        python_app("sample_apps/notes/app.py", "--tiny", "--port", "0", "--companion",
                   companion_behind_proxy.url, "--history", str(history), "--min-token-ms", "40"),
        "SpecSteer Notes on")
    try:
        yield url, companion_behind_proxy, history
    finally:
        proc.terminate()
        proc.wait(10)


def test_write_continue_lose_and_regain_the_companion(browser, notes_app) -> None:
    url, proxy, history = notes_app
    page = browser.new_page(viewport={"width": 1400, "height": 860})
    page.goto(url)
    page.wait_for_selector("#note-list li")
    page.wait_for_selector("#badge.online")
    # the tiny test models write random text: the page says so
    assert page.inner_text("#test-banner").startswith("test models: random text")

    # an earlier note, saved: private history the continuation below retrieves
    page.click("#new-note")
    page.fill("#title", "Bulb order")
    page.fill("#body", f"Bulbs ordered from the co-op. {CANARY}.")
    page.click("#save")
    page.wait_for_selector("#note-list li.active >> text=Bulb order")

    # write a note: it is saved into the history store
    page.click("#new-note")
    page.fill("#title", "Bulb planting day")
    page.fill("#body", f"{DRAFT} Bring")
    # a pause in typing prepares the continuation on the device (retrieval and prefill)
    page.wait_for_selector("#prepared:visible")
    page.click("#save")
    page.wait_for_selector("#note-list li.active >> text=Bulb planting day")
    page.wait_for_selector("#prepared:visible")  # prepared again: the history changed
    with HistoryStore(history, read_only=True) as store:
        saved = [r for r in store.list(kind="note") if r.title == "Bulb planting day"]
    assert saved and saved[0].body == f"{DRAFT} Bring"
    with HistoryStore(history, read_only=True) as store:
        retrieved = retrieve(store, "note", "Bulb planting day", 5, exclude=[saved[0].id])
    assert "Bulb order" in [hit.record.title for hit in retrieved]  # the canary is context

    # continue in my voice: provenance-coloured tokens stream in while the companion steers
    page.click("#privacy-toggle")
    page.click("#continue")
    page.wait_for_selector("#cancel:visible")
    page.wait_for_function(f"document.querySelectorAll('{COLLAB}').length >= 8")
    streamed = page.locator("#suggestion-text .tok").count()
    page.wait_for_function(
        f"document.querySelectorAll('#suggestion-text .tok').length > {streamed}")
    screenshot(page, "tiny-notes-online.png")

    # the companion goes away: badge offline, the on-device model goes on (local tokens)
    proxy.set_online(False)
    page.wait_for_selector("#badge.offline")
    page.wait_for_selector("#suggestion-text .tok.local")
    screenshot(page, "tiny-notes-offline.png")

    # it comes back: collaboration resumes in the same continuation
    proxy.set_online(True)
    page.wait_for_function(
        "(() => { const t = [...document.querySelectorAll('#suggestion-text .tok')];"
        " const i = t.findIndex(s => s.dataset.provenance === 'local');"
        " return i >= 0 && t.slice(i).some(s => s.dataset.provenance !== 'local'); })()",
        timeout=20000)
    page.wait_for_selector("#badge.online")
    page.wait_for_selector("#cancel", state="hidden", timeout=60000)
    assert page.locator("#accept").is_enabled()
    # the privacy panel's leak guard line: the default policy and the counts of this run
    assert leak_guard_line(page)[0] == "redact"
    # the continuation started from the prompt prepared while typing: all of it (a prompt held
    # exactly is not run again) or all but its last tokens was prefilled before the click
    done = page.inner_text("#suggestion-state")
    prefilled = re.search(r"(\d+) of (\d+) prompt tokens prefilled", done)
    assert prefilled, done
    reused, total = map(int, prefilled.groups())
    assert total - 3 <= reused <= total, done

    # the privacy panel: frames up and down in words, the public request as text, no private
    # text; the token ids only on demand
    page.wait_for_function("document.querySelectorAll('#frames li').length > 10")
    panel = page.inner_text("#frames")
    assert "OpenSession" in panel and "Draft" in panel and "Verdict" in panel
    assert "a session opens on the public request" in panel
    words = page.locator("#frames .detail").all_inner_texts()
    assert len(words) == page.locator("#frames li").count()
    assert not [w for w in words if w.lstrip().startswith("{")]  # words, never raw JSON
    opened = page.locator("#frames li[data-type=SessionOpened] .detail").first.inner_text()
    assert "candidates for the first token (scores, no text)" in opened, opened
    s0 = page.locator("#frames li[data-type=DraftS0] .detail").first  # P_S0 on the device
    assert "without your history" in s0.inner_text() and "no text" in s0.inner_text()
    drafted = page.locator("#frames li[data-type=Draft] q[data-field=draft_ids]").first
    assert drafted.is_visible() and drafted.text_content()
    ids = page.locator("#frames li[data-type=Draft] details.ids").first
    assert not ids.locator("span").first.is_visible()
    ids.locator("summary").click()
    assert ids.locator("span").first.is_visible()  # "ID \"text\"" chips, on demand
    assert "Public, sent to the companion:" in page.inner_text(".privacy-head")
    assert "Private, never sent:" in page.inner_text(".privacy-head")
    # the public request: the title and the note being continued (the user asked for help
    # with it), then nothing of the history the model read
    request = public_request(page)
    assert "Bulb planting day" in request and request.endswith(f"{DRAFT} Bring")
    for private in ("Marigold", "canary", "co-op", "Dirt under the nails", "Chicken-wire"):
        assert private not in panel and private not in request
    screenshot(page, "tiny-notes-privacy.png")
    # the same page from a phone to a laptop: nothing outside the window, clipped or on top of
    # something else, the note and the suggestion wide enough to read
    check_widths(page, "tiny-notes")
    page.set_viewport_size({"width": 1400, "height": 860})

    # accept appends the continuation to the note (it continues "Bring") and saves it
    suggestion = "".join(page.locator("#suggestion-text .tok").all_text_contents())
    page.click("#accept")
    page.wait_for_selector("#suggestion", state="hidden")
    assert page.input_value("#body") == f"{DRAFT} Bring" + suggestion
    page.close()


def test_search_cancel_and_delete_forgets(browser, notes_app) -> None:
    url, _, history = notes_app
    page = browser.new_page()
    page.goto(url)
    page.fill("#search", "courgettes")
    page.wait_for_function("document.querySelectorAll('#note-list li').length < 25")
    page.wait_for_selector("#note-list li >> text=Courgette glut")
    page.click("#note-list li >> text=Courgette glut")
    assert "A marrow is a courgette someone forgot" in page.input_value("#body")

    page.click("#continue")
    page.wait_for_selector("#suggestion-text .tok")
    page.click("#cancel")
    page.wait_for_selector("#suggestion-state >> text=cancelled")
    assert not page.locator("#cancel").is_visible()
    # a cancelled suggestion keeps its counts: the tokens it wrote, by who decided them
    state = page.inner_text("#suggestion-state")
    shown = page.locator("#suggestion-text .tok").count()
    assert re.fullmatch(rf"cancelled · {shown} tokens? \((\d+ [a-z ]+)(, \d+ [a-z ]+)*\)", state), \
        state

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    page.wait_for_selector("#status-line >> text=Deleted and forgotten")
    with HistoryStore(history, read_only=True) as store:
        assert not [r for r in store.list(kind="note", limit=500) if r.title == "Courgette glut"]
        hits = store.search("marrow courgette glut", kinds=["note"])
        assert "note:wren-17" not in [hit.record.id for hit in hits]
    page.close()


def test_the_settings_choose_the_leak_guard_the_panel_reports(browser, notes_app) -> None:
    url, _, _ = notes_app
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("#note-list li")
    choose_leak_guard(page, "redact")
    page.click("#privacy-toggle")
    page.click("#note-list li >> text=Courgette glut")
    streams = capture_streams(page, "**/api/continue")
    page.click("#continue")
    page.wait_for_selector("#leak-guard:visible", timeout=60000)
    policy, flagged, cut, kept = leak_guard_line(page)
    assert policy == "redact" and kept == 0  # redact cuts drafts; it never stops collaboration
    # the panel shows what the app's API answered: the counts of the generation's stats
    [stream] = streams
    done = done_event(stream)
    assert (done["leak_guard"], done["leak_flagged"], done["leak_redacted"], done["leak_held"]) \
        == (policy, flagged, cut, kept)
    page.close()


def test_a_fully_offline_continuation_says_so(browser, notes_app) -> None:
    """No companion at all during the continuation: every token is the device's, and the end
    of the suggestion says "offline" (not "partly offline · 0 % drafts accepted")."""
    url, proxy, _ = notes_app
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("#badge.online")
    proxy.set_online(False)
    page.wait_for_selector("#badge.offline")
    page.click("#note-list li >> text=Courgette glut")
    page.click("#continue")
    page.wait_for_selector("#cancel", state="hidden", timeout=60000)
    state = page.inner_text("#suggestion-state")
    tokens = page.locator("#suggestion-text .tok")
    assert tokens.count() and tokens.count() == page.locator("#suggestion-text .tok.local").count()
    assert re.match(r"\d+ tokens · offline: written on this device alone · \d+ bytes on the wire",
                    state), state
    assert "partly" not in state and "accepted" not in state
    page.close()
