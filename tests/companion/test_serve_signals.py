"""`specsteer-companion serve` stops cleanly on SIGINT and SIGTERM, even with SIGINT ignored.

A background job of a non-interactive shell (nohup, CI runners, `cmd &` in scripts) starts
with SIGINT ignored, and Python then never turns it into KeyboardInterrupt: the server installs
its own handlers, so both signals still stop it and the shutdown log still comes out.
"""

from __future__ import annotations

import signal

import pytest

from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.process import start_companion

# companion processes and signals: not in ./dev test --fast
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_on_signal_even_with_sigint_ignored(sig):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the child
    try:
        proc, _ = start_companion(str(tiny_model_dir("llama", seed=1)),
                                  str(tiny_model_dir("llama", seed=0)), batch=True, timeout_s=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "batching: BatchStats(passes=" in out  # ran the clean shutdown path
