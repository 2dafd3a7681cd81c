"""`pip install specsteer` with no extras is a working device, proved in a fresh environment.

A new virtual environment (no system site packages: only what the SDK declares gets in) receives
the repository's device distribution, built non-editable from a copy of its sources. In it, a
script makes `specsteer.Client` on the tiny Specialist with the URL of a real
`specsteer-companion serve` subprocess (started from the test's own environment on the tiny
pair) and generates 16 tokens. The generation must be collaborative (not offline-degraded, some
tokens drafted/recovered/bonus), and torch, transformers and the companion must not be importable
there. pip uses its configured indexes (PyPI as the fallback). With CI=true nothing here skips:
a failed build or install is a failure. Elsewhere it skips only when PyPI cannot be reached.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from specsteer.models.tiny import tiny_model_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"

GENERATE = r"""
import collections, json, sys
import specsteer
client = specsteer.Client(sys.argv[1], companion=sys.argv[2])
result = client.generate("Budget for next quarter", task="email", max_new_tokens=16)
print(json.dumps({
    "module": specsteer.__file__,
    "text": result.text,
    "provenance": collections.Counter(result.provenance),
    "tokens": len(result.tokens),
    "degraded": result.stats.degraded,
    "offline_reason": result.stats.offline_reason,
}))
"""

ABSENT = r"""
import importlib.util, json
print(json.dumps({name: importlib.util.find_spec(name) is not None
                  for name in ("torch", "transformers", "specsteer_companion", "specsteer_lab")}))
"""


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10):
            return True
    except OSError:
        return False


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run outside the repository with no PYTHONPATH, so the sources never stand in for the
    installed SDK (and pip sees only the fresh environment)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
                          check=False)


def _device_sources(target: Path) -> Path:
    """What the root pyproject builds from (a copy, so the build leaves the worktree alone)."""
    target.mkdir()
    shutil.copy2(REPO / "pyproject.toml", target / "pyproject.toml")
    shutil.copy2(REPO / "README.md", target / "README.md")
    shutil.copytree(REPO / "sdk", target / "sdk",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return target


@pytest.fixture
def device_python(tmp_path: Path) -> Path:
    """The fresh environment's interpreter, with `pip install <repo>` (no extras) done."""
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    source = _device_sources(tmp_path / "src")
    installed = _run([str(python), "-m", "pip", "install", "--quiet", str(source)], tmp_path,
                     timeout=1800)
    if installed.returncode != 0:
        if not IN_CI and not _pypi_reachable():
            pytest.skip("PyPI is not reachable here; the fresh environment cannot be built")
        pytest.fail(f"pip install of the device SDK failed:\n{installed.stdout[-3000:]}"
                    f"\n{installed.stderr[-3000:]}")
    return python


@pytest.fixture
def companion_url():
    """A real `specsteer-companion serve` on the tiny pair, from this test's environment."""
    from specsteer_companion.process import start_companion

    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.timeout(2400)
def test_bare_install_runs_client_against_a_remote_companion(device_python, companion_url,
                                                             tmp_path):
    absent = _run([str(device_python), "-c", ABSENT], tmp_path, timeout=120)
    assert absent.returncode == 0, absent.stderr
    assert json.loads(absent.stdout) == {"torch": False, "transformers": False,
                                         "specsteer_companion": False, "specsteer_lab": False}

    specialist = tiny_model_dir("llama", seed=0)
    ran = _run([str(device_python), "-c", GENERATE, str(specialist), companion_url], tmp_path,
               timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    assert Path(report["module"]).is_relative_to(device_python.parents[1]), report["module"]
    assert report["degraded"] is False, report["offline_reason"]
    assert report["tokens"] == 16 and report["text"]
    collaborative = {p: n for p, n in report["provenance"].items()
                     if p in ("draft", "recovered", "bonus")}
    assert collaborative and sum(report["provenance"].values()) == 16, report["provenance"]
