"""The README's "Your first app in 20 lines" runs as written: its Python block, taken from the
README, in a fresh folder, against a real companion process (the tiny test models stand in for
the Qwen pair through the variables the snippet reads)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.process import start_companion

pytestmark = pytest.mark.slow  # a companion and the app as processes: not the fast lane

REPO = Path(__file__).resolve().parents[1]


def first_app() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Your first app in 20 lines", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def _run(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    paths = [str(REPO / "sdk"), os.environ.get("PYTHONPATH", "")]
    return subprocess.run([sys.executable, "first_app.py"], cwd=folder, capture_output=True,
                          text=True, timeout=300, env={
                              **os.environ, **env, "PYTHONPATH": os.pathsep.join(paths)})


def test_the_first_app_runs_as_written(tmp_path: Path) -> None:
    code = first_app()
    assert len(code.strip().splitlines()) <= 20
    (tmp_path / "first_app.py").write_text(code, encoding="utf-8")
    specialist = str(tiny_model_dir("llama", seed=0))
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)), specialist,
                                timeout_s=120)
    try:
        env = {"SPECSTEER_MODEL": specialist, "SPECSTEER_COMPANION": url}
        for _ in (1, 2):  # the second run finds the history it filled
            done = _run(tmp_path, env)
            assert done.returncode == 0, done.stderr
            *text, stats = done.stdout.rstrip("\n").split("\n")
            assert "".join(text).strip(), done.stdout
            rate = re.fullmatch(r"(\d+)% of drafts accepted, (\d+) bytes per token on the wire, "
                                r"history kept here", stats)
            assert rate and int(rate[2]) > 0, stats  # steered: bytes went over the wire
    finally:
        proc.terminate()
        proc.wait(30)
    with socket.socket() as probe:  # a companion that is not there: offline="fail" raises
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = _run(tmp_path, {**env, "SPECSTEER_COMPANION": f"ws://127.0.0.1:{port}"})
    assert down.returncode != 0 and "CompanionUnavailable" in down.stderr, down.stderr
    wrong = _run(tmp_path, {**env, "SPECSTEER_COMPANION": f"127.0.0.1:{port}"})
    assert "ConfigError: companion='127.0.0.1:" in wrong.stderr, wrong.stderr
