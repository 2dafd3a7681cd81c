"""The notes app on the real pair (Qwen2.5 0.5B on the device, 1.5B in the companion), in a
real browser: a steered continuation that goes on from the note instead of restating it, a
prompt prepared while typing, and a public request that holds the title and the note being
continued but none of the history the model read."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers.apps import public_request, python_app, screenshot, start_app

pytestmark = pytest.mark.real_model

NOTE = "Bulbs go in this Saturday, 10 till 12, by the kids' corner.\n\nPractical bits:\n-"


def test_notes_continue_on_the_real_pair(browser, tmp_path: Path) -> None:
    if os.environ.get("SPECSTEER_SKIP_REAL"):
        pytest.skip("SPECSTEER_SKIP_REAL is set")
    proc, url = start_app(
        python_app("sample_apps/notes/app.py", "--real", "--port", "0", "--history",
                   str(tmp_path / "notes.db"), "--max-new-tokens", "60"),
        "SpecSteer Notes on")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 860})
        page.goto(url)
        page.wait_for_selector("#badge.online", timeout=60000)
        page.click("#new-note")
        page.fill("#title", "Bulb planting day")
        page.fill("#body", NOTE)
        page.wait_for_selector("#prepared:visible", timeout=30000)
        page.click("#privacy-toggle")
        page.click("#continue")
        page.wait_for_selector("#cancel:visible")
        page.wait_for_selector("#cancel", state="hidden", timeout=600000)
        state = page.inner_text("#suggestion-state")
        assert "tokens" in state, state
        # "ready to continue" showed once the prefill was done: the click ran (almost) none of
        # the prompt again
        prefilled = re.search(r"(\d+) of (\d+) prompt tokens prefilled", state)
        assert prefilled, state
        reused, total = map(int, prefilled.groups())
        assert total - 3 <= reused <= total, state
        tokens = page.locator("#suggestion-text .tok")
        provenance = {tokens.nth(i).get_attribute("data-provenance")
                      for i in range(tokens.count())}
        assert provenance & {"draft", "recovered", "bonus"} and "local" not in provenance
        text = "".join(tokens.all_text_contents())
        print(f"\ncontinuation of the note on the real pair: {text!r}")
        assert len(text.split()) >= 10
        # it goes on from the note: not the title again, not the note's opening restated
        # (naming a place the note named is fine: "Bring your gloves to the kids' corner.")
        assert not text.lstrip().startswith(("Bulb planting day", "Bulbs go in"))
        assert "this Saturday, 10 till 12" not in text and "10 till 12" not in text
        # the public request holds the title and the note (the user asked for help with it),
        # not the history the model read
        request = public_request(page)
        assert "Bulb planting day" in request and request.endswith(NOTE)
        for private in ("Dirt under the nails", "Small win", "growers", "envelopes"):
            assert private not in request
        screenshot(page, "notes-real.png")
        page.click("#accept")
        assert page.input_value("#body") == NOTE + text
        page.close()
    finally:
        proc.terminate()
        proc.wait(30)
