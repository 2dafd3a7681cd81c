"""A real `specsteer bridge` child process for tests: send frames, read answers and notifications.

Every stdout line is parsed as JSON-RPC (a stray byte on stdout fails the test); answers are
matched by id, notifications are kept in arrival order with the time they arrived.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from specsteer.bridge.schemas import validator
from specsteer.models.tiny import tiny_model_dir

REPO = Path(__file__).resolve().parents[2]


def python_env() -> dict[str, str]:
    """The test's environment, with this tree's packages first on the path."""
    paths = [str(REPO / "sdk"), str(REPO / "cloud_companion")]
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])]),
            "PYTHONUNBUFFERED": "1"}


class BridgeProcess:
    """`python -m specsteer bridge` on the tiny Specialist."""

    def __init__(self, *args: str, log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specsteer", "bridge", "--specialist",
             str(tiny_model_dir("llama", seed=0)), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=python_env())
        self.frames: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self.notifications: list[tuple[float, dict[str, Any]]] = []
        # answers by id, in arrival order (errors to unreadable lines all have id null)
        self.answers: dict[Any, list[tuple[float, dict[str, Any]]]] = {}
        self.stray: list[bytes] = []
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                frame = json.loads(line)
                assert frame.get("jsonrpc") == "2.0"
            except (ValueError, AssertionError, AttributeError):
                self.stray.append(line)
                continue
            self.frames.put((time.monotonic(), frame))

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, method: str, params: Any = None, *, request_id: Any = None) -> Any:
        """Send a request; returns its id."""
        if request_id is None:
            self._next_id += 1
            request_id = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send_raw(json.dumps(message).encode() + b"\n")
        return request_id

    def _pump(self, timeout: float) -> None:
        arrived, frame = self.frames.get(timeout=timeout)
        if "method" in frame:
            self.notifications.append((arrived, frame))
        else:
            self.answers.setdefault(frame.get("id"), []).append((arrived, frame))

    def answer(self, request_id: Any, timeout: float = 30.0) -> dict[str, Any]:
        """The answer frame to `request_id` (result or error)."""
        return self.answer_at(request_id, timeout)[1]

    def answer_at(self, request_id: Any, timeout: float = 30.0) -> tuple[float, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while not self.answers.get(request_id):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and self.frames.empty():
                raise AssertionError(f"no answer to {request_id!r}; stderr:\n{self.stderr()}")
            try:
                self._pump(min(left, 0.5))
            except queue.Empty:
                continue
        return self.answers[request_id].pop(0)

    def call(self, method: str, params: Any = None, timeout: float = 30.0) -> dict[str, Any]:
        return self.answer(self.send(method, params), timeout)

    def wait_for(self, predicate: Any, timeout: float = 30.0) -> dict[str, Any]:
        """The first notification (already received or coming) that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for _, frame in self.notifications[seen:]:
                if predicate(frame):
                    return frame
            seen = len(self.notifications)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such notification; stderr:\n{self.stderr()}")
            try:
                self._pump(min(left, 0.5))
            except queue.Empty:
                continue

    def stream_of(self, request_id: Any, method: str = "generate.piece") -> list[dict[str, Any]]:
        return [f["params"] for _, f in self.notifications
                if f["method"] == method and f["params"]["id"] == request_id]

    def stderr(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self, timeout: float = 15.0) -> int:
        """Close stdin (the bridge's signal to stop) and wait for the exit code."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            self._reader.join(5)
            self._log.close()
        assert not self.stray, f"non-protocol bytes on stdout: {self.stray[:3]}"
        return code


def assert_valid(name: str, part: str, value: Any) -> None:
    """`value` matches the schema of `part` of method or notification `name`."""
    errors = list(validator(name, part).iter_errors(value))
    assert not errors, f"{name} {part}: {[e.message for e in errors]}"
