"""Bridge framing: newline-delimited JSON, one JSON-RPC object per line, both directions.

A frame is one UTF-8 JSON value followed by `\\n`; JSON escapes every newline inside strings, so
a line is always exactly one message. Lines longer than `max_line_bytes` are refused (their bytes
are read and dropped up to the next newline, so the stream stays in step) rather than buffered.
Owns reading and writing frames only; what a frame means is `handlers`' business.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

DEFAULT_MAX_LINE_BYTES = 1 << 20  # 1 MiB: far above any request, small enough to refuse floods
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Frame:
    """One parsed line."""

    value: Any


@dataclass(frozen=True)
class BadFrame:
    """A line that is not a frame: `reason` is "parse_error" or "line_too_long"."""

    reason: str
    detail: str


def read_frames(stream: BinaryIO, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
                ) -> Iterator[Frame | BadFrame]:
    """Yield each line of `stream` as a Frame or a BadFrame until end of input.

    Blank lines are skipped. A final line without `\\n` still counts.
    """
    while True:
        line = stream.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            dropped = len(line) + _discard_rest_of_line(stream)
            yield BadFrame("line_too_long",
                           f"a line of {dropped} bytes exceeds the limit of {max_line_bytes}")
            continue
        if not line.strip():
            continue
        try:
            yield Frame(json.loads(line.decode("utf-8")))
        except UnicodeDecodeError as exc:
            yield BadFrame("parse_error", f"the line is not UTF-8: {exc}")
        except ValueError as exc:
            yield BadFrame("parse_error", f"the line is not JSON: {exc}")


def _discard_rest_of_line(stream: BinaryIO) -> int:
    dropped = 0
    while True:
        chunk = stream.readline(_CHUNK)
        dropped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return dropped


def encode(message: Any) -> bytes:
    """One frame: compact JSON (non-ASCII kept as UTF-8) and a newline. A lone surrogate (an id
    or method name echoed from a request) is sent as its JSON escape, never a crash."""
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(message, separators=(",", ":")).encode("ascii")
    return text + b"\n"


class FrameWriter:
    """Writes whole frames from any thread; a closed peer makes writes no-ops, not crashes."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.closed = False

    def write(self, message: Any) -> bool:
        """Send one frame; False when the peer has gone away."""
        data = encode(message)
        with self._lock:
            if self.closed:
                return False
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.closed = True
                return False
            return True
