"""Helpers of the sample apps' browser tests: start an app process, save screenshots."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def companion_behind_proxy(generalist: str, specialist: str, timeout_s: float) -> Iterator:
    """A real companion process behind a fault proxy (`set_online` takes it away)."""
    from specsteer_companion.process import start_companion
    from specsteer_companion.proxy import Faults, ProxyThread

    proc, url = start_companion(generalist, specialist, timeout_s=timeout_s)
    try:
        with ProxyThread(url, Faults(delay_s=0.01)) as proxy:
            yield proxy
    finally:
        proc.terminate()
        proc.wait(30)


def python_app(script: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / script), *args]


def screenshot(page: object, name: str, full_page: bool = False) -> None:
    folder = os.environ.get("SPECSTEER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), full_page=full_page)  # type: ignore[attr-defined]


def public_request(page: object) -> str:
    """The public request as the privacy panel shows it: the text of the first OpenSession
    frame, decoded whole (`shared_ui/frames.js` renderFrame)."""
    frame = page.locator("#frames li[data-type=OpenSession]").first  # type: ignore[attr-defined]
    return frame.locator("q[data-field=prompt_ids]").text_content()


WIDTHS = (390, 800, 1400)  # a phone, a half-screen window or a tablet, a laptop

# layout.js: every element a person reads or presses, checked where it is shown: inside the
# window, not clipped, not on top of another one (shared_ui/style.css lays them out from 360 to
# 1,600 px); the text areas wide enough to read and write in
_LAYOUT_PROBLEMS = "\n".join(  # the function itself, without its heading comment
    line for line in (Path(__file__).parent / "layout.js").read_text(encoding="utf-8").splitlines()
    if not line.startswith("//"))


def layout_problems(page: object) -> list[str]:
    """What is outside the window, clipped, overlapping or too narrow on the page now."""
    return page.evaluate(_LAYOUT_PROBLEMS)  # type: ignore[attr-defined,no-any-return]


def check_widths(page: object, name: str, height: int = 860, shown: str = "#accept") -> None:
    """At each of WIDTHS: a screenshot (`NAME-WIDTH.png`, `shown` scrolled into view) and no
    layout problem."""
    found = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": height})  # type: ignore[attr-defined]
        page.wait_for_timeout(150)  # type: ignore[attr-defined]  # one layout pass
        page.locator(shown).scroll_into_view_if_needed()  # type: ignore[attr-defined]
        screenshot(page, f"{name}-{width}.png", full_page=width < 1000)
        if problems := layout_problems(page):
            found[width] = problems
    assert not found, found


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
