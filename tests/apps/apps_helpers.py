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
