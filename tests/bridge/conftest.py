"""Fixtures of the bridge tests: a real companion process and real bridge processes (tiny pair)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.bridge_process import BridgeProcess

from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.process import start_companion


@pytest.fixture(scope="module")
def companion_url() -> Iterator[str]:
    """`specsteer-companion serve` on the tiny pair (Generalist seed 1, Specialist seed 0)."""
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120)
    try:
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture()
def spawn(tmp_path: Path) -> Iterator:
    """Start bridges with extra arguments; each is closed (stdin EOF) after the test."""
    started: list[BridgeProcess] = []

    def start(*args: str) -> BridgeProcess:
        bridge = BridgeProcess(*args, log=tmp_path / f"bridge-{len(started)}.log")
        started.append(bridge)
        return bridge

    yield start
    for bridge in started:
        if bridge.proc.poll() is None or not bridge._log.closed:
            bridge.close()
