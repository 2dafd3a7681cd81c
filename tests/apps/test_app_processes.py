"""The sample apps as processes: `--help` and a wrong option answer in words (no stack trace),
the Qwen pair is the default and its absence is said (not random text), and a companion the app
started is started again after it dies (reaped: no `<defunct>` process), its badge back online
by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.apps import REPO, python_app, start_app

pytestmark = pytest.mark.slow  # starts the apps as processes: the full suite, not the fast lane
NOTES = python_app("sample_apps/notes/app.py")
MAIL = ["node", str(REPO / "sample_apps" / "mail" / "server.mjs")]


def _run(cmd: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "SPECSTEER_PYTHON": sys.executable, **env})


@pytest.mark.parametrize("app", ["notes", "mail"])
def test_help_and_a_wrong_option(app, node_client_built) -> None:
    cmd = NOTES if app == "notes" else MAIL
    helped = _run([*cmd, "--help"])
    assert helped.returncode == 0, helped.stderr
    assert f"usage: ./dev {app}" in helped.stdout
    for option in ("--tiny", "--companion", "--port", "--history", "--no-companion"):
        assert option in helped.stdout, option
    wrong = _run([*cmd, "--bogus"])
    assert wrong.returncode == 2
    assert "--bogus" in wrong.stderr and "usage: ./dev" in wrong.stderr
    assert "Traceback" not in wrong.stderr and "node:internal" not in wrong.stderr


@pytest.mark.parametrize("app", ["notes", "mail"])
def test_without_the_compiled_pair_the_app_says_what_to_do(app, tmp_path, node_client_built
                                                           ) -> None:
    """No `--tiny` and no compiled Qwen pair (an empty model cache): the app stops and says
    how to get the pair or the test models, instead of writing random text."""
    cmd = NOTES if app == "notes" else MAIL
    started = _run([*cmd, "--port", "0", "--no-companion", "--history",
                    str(tmp_path / "h.db")], SPECSTEER_HOME=str(tmp_path / "empty-cache"))
    assert started.returncode != 0
    assert "the Qwen pair is not compiled yet" in started.stderr, started.stderr
    assert "./dev demo" in started.stderr and "--tiny" in started.stderr
    assert "Traceback" not in started.stderr


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def _descendants(root: int) -> list[int]:
    children, found, todo = _children(), [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _state(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _companions(root: int) -> list[int]:
    """The live `specsteer-companion serve` processes under `root`."""
    found = []
    for pid in _descendants(root):
        try:
            cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"specsteer_companion.cli\0serve" in cmdline and _state(pid) not in ("Z", "gone"):
            found.append(pid)
    return found


def _wait(what: str, done, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while not (value := done()):
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.2)
    return value


@pytest.mark.parametrize("app", ["notes", "mail"])
def test_a_companion_that_dies_is_started_again(browser, app, tmp_path, node_client_built
                                                ) -> None:
    cmd = NOTES if app == "notes" else MAIL
    title = "SpecSteer Notes" if app == "notes" else "SpecSteer Mail"
    proc, url = start_app([*cmd, "--tiny", "--port", "0", "--history", str(tmp_path / "h.db")],
                          f"{title} on", env={"SPECSTEER_PYTHON": sys.executable})
    try:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("#badge.online", timeout=60000)
        [first] = _wait("companion", lambda: _companions(proc.pid))
        os.kill(first, signal.SIGTERM)
        [again] = _wait("new companion", lambda: [p for p in _companions(proc.pid) if p != first])
        page.wait_for_selector("#badge.online", timeout=60000)  # by itself: no reload, no click
        assert _state(first) == "gone"  # reaped, not left <defunct>
        assert not [p for p in _descendants(proc.pid) if _state(p) == "Z"]
        assert _companions(proc.pid) == [again]
        page.close()
    finally:
        proc.terminate()
        proc.wait(30)
    _wait("the companion to stop with the app", lambda: _state(again) == "gone", 30)
