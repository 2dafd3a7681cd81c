"""Fixtures of the history tests: a fresh store per test, the shared data sets, child processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.ci import skip_or_fail

import specsteer
from specsteer.history import HistoryStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    """A file-backed store in WAL mode, closed after the test."""
    with HistoryStore(tmp_path / "history.db") as opened:
        yield opened


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared per-user data sets (../shared/data or $SPECSTEER_DATA_DIR)."""
    candidates = [os.environ.get("SPECSTEER_DATA_DIR"), REPO.parent / "shared" / "data"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "acl_abstracts_top100_authors.json").is_file():
            return Path(candidate)
    skip_or_fail("shared data sets not found; set SPECSTEER_DATA_DIR")


@pytest.fixture(scope="session")
def child_env() -> dict[str, str]:
    """Environment for `python -c` children that import this checkout of specsteer."""
    sdk = str(Path(specsteer.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([sdk, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def python() -> str:
    """The interpreter running the tests (children use the same venv)."""
    return sys.executable
