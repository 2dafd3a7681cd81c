"""Helpers of the sample apps' browser tests: start an app process, save screenshots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def start_app(cmd: list[str], ready: str, env: dict[str, str] | None = None,
              cwd: Path = REPO) -> tuple[subprocess.Popen[str], str]:
    """Start an app process and return it with the http:// URL from its ready line."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ready in line:
            url = next(word for word in line.split() if word.startswith("http://"))
            return proc, url
    raise AssertionError(f"the app did not start: {''.join(seen)[-2000:]}")


def python_app(script: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / script), *args]


def screenshot(page: object, name: str) -> None:
    folder = os.environ.get("SPECSTEER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))  # type: ignore[attr-defined]


def public_request(page: object) -> str:
    """The text of the first OpenSession frame in the privacy panel (the public request), put
    back together from its token spans (`ID "text"`, spaces shown as · and newlines as ⏎)."""
    frame = page.locator("#frames li", has_text="OpenSession").first  # type: ignore[attr-defined]
    spans = frame.locator(".ids span")
    text = "".join(span.split(" ", 1)[1][1:-1] for span in spans.all_inner_texts())
    return text.replace("·", " ").replace("⏎", "\n")


# the privacy panel's leak guard line after a suggestion (shared_ui/frames.js leakGuardLine)
LEAK_GUARD_LINE = (r"leak guard \((allow|redact|hold)\): (\d+) spans? flagged, (\d+) tokens? cut, "
                   r"(\d+) tokens? kept on device")


def leak_guard_line(page: object) -> tuple[str, int, int, int]:
    """The policy and counts the privacy panel shows for the last suggestion."""
    import re

    text = page.inner_text("#leak-guard")  # type: ignore[attr-defined]
    found = re.fullmatch(LEAK_GUARD_LINE, text)
    assert found, text
    policy, *counts = found.groups()
    return policy, *map(int, counts)  # type: ignore[return-value]


def choose_leak_guard(page: object, policy: str) -> None:
    """Pick the leak guard in the settings dialog and save."""
    page.click("#settings-open")  # type: ignore[attr-defined]
    page.select_option("#settings-form select[name=leak_guard]", policy)  # type: ignore[attr-defined]
    page.click("#settings-save")  # type: ignore[attr-defined]
    page.wait_for_selector("#settings", state="hidden")  # type: ignore[attr-defined]


def done_event(stream: str) -> dict:
    """The `done` event of a suggestion's server-sent event stream (what the panel reads)."""
    import json
    import re

    [data] = re.findall(r"^event: done\ndata: (.*)$", stream, re.M)
    return json.loads(data)


def capture_streams(page: object, pattern: str) -> list[str]:
    """The bodies of the suggestion streams the page fetches from `pattern` (each is passed
    on whole once it ends, so the page still reads every event)."""
    bodies: list[str] = []

    def keep(route: object) -> None:
        answer = route.fetch(timeout=120000)  # type: ignore[attr-defined]
        bodies.append(answer.text())
        route.fulfill(response=answer)  # type: ignore[attr-defined]

    page.route(pattern, keep)  # type: ignore[attr-defined]
    return bodies
