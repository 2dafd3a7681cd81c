"""The notes app on the real pair (Qwen2.5 0.5B on the device, 1.5B in the companion), in a
real browser: a steered continuation in the persona's voice, and a public request free of
private text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from apps_helpers import python_app, screenshot, start_app

pytestmark = pytest.mark.real_model


def test_notes_on_the_real_pair(browser, tmp_path: Path) -> None:
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
        page.fill("#body", "Bulbs go in this Saturday, 10 till 12, by the kids' corner.")
        page.click("#privacy-toggle")
        page.click("#continue")
        page.wait_for_selector("#cancel:visible")
        page.wait_for_selector("#cancel", state="hidden", timeout=600000)
        state = page.inner_text("#suggestion-state")
        assert "tokens" in state, state
        tokens = page.locator("#suggestion-text .tok")
        provenance = {tokens.nth(i).get_attribute("data-provenance")
                      for i in range(tokens.count())}
        assert provenance & {"draft", "recovered", "bonus"} and "local" not in provenance
        text = "".join(tokens.all_text_contents())
        assert len(text.split()) >= 10
        # the public request holds the title, not the note nor the history the model read
        spans = page.locator("#frames li", has_text="OpenSession").first.locator(".ids span")
        request = "".join(text.split(" ", 1)[1][1:-1] for text in spans.all_inner_texts())
        request = request.replace("·", " ").replace("⏎", "\n")
        assert "Bulb planting day" in request
        for private in ("kids", "Saturday", "Dirt", "Practical", "growers"):
            assert private not in request
        screenshot(page, "notes-real.png")
        page.close()
    finally:
        proc.terminate()
        proc.wait(30)
