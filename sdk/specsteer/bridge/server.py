"""The bridge's stdio loop: frames in on stdin, frames out on stdout, logs on stderr.

Reads one JSON-RPC 2.0 message per line (`framing`), checks the envelope, hands requests to
`handlers.Bridge` and writes its answers and notifications through one `FrameWriter`. Stops when
stdin reaches end of file or after `shutdown`, cancelling a running generation first. Batches
(JSON arrays) are not supported and are answered with one INVALID_REQUEST error.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any, BinaryIO

from specsteer.bridge.errors import (
    INVALID_REQUEST,
    LINE_TOO_LONG,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    BridgeError,
)
from specsteer.bridge.framing import BadFrame, FrameWriter, read_frames
from specsteer.bridge.handlers import Bridge

log = logging.getLogger("specsteer.bridge")
_FRAMING_CODES = {"parse_error": PARSE_ERROR, "line_too_long": LINE_TOO_LONG}


def serve(bridge_factory: Any, stdin: BinaryIO, writer: FrameWriter, max_line_bytes: int) -> None:
    """Serve until end of input or `shutdown`. `bridge_factory(notify)` builds the Bridge."""

    def notify(method: str, params: dict[str, Any]) -> None:
        writer.write({"jsonrpc": "2.0", "method": method, "params": params})

    bridge: Bridge = bridge_factory(notify)
    try:
        for frame in read_frames(stdin, max_line_bytes):
            if isinstance(frame, BadFrame):
                log.info("bad frame: %s", frame.detail)
                _reply_error(writer, None, BridgeError(_FRAMING_CODES[frame.reason], frame.detail))
                continue
            _receive(bridge, writer, frame.value)
            if bridge.stopping:
                break
    finally:
        bridge.close()
    log.info("bridge stopped")


def serve_until_signal(bridge_factory: Any, writer: FrameWriter) -> None:
    """Without stdio (`--no-stdio`): keep the bridge (and its HTTP server) up until SIGINT/TERM."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    bridge: Bridge = bridge_factory(lambda method, params: None)
    try:
        stop.wait()
    finally:
        bridge.close()
    log.info("bridge stopped")


def _receive(bridge: Bridge, writer: FrameWriter, message: Any) -> None:
    request_id = message.get("id") if isinstance(message, dict) else None
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        request_id = None
    try:
        method, params = _envelope(message)
    except BridgeError as error:
        _reply_error(writer, request_id, error)
        return
    if not bridge.knows(method):
        if request_id is not None:
            _reply_error(writer, request_id, BridgeError(
                METHOD_NOT_FOUND, f"unknown method {method!r}", methods=bridge.methods))
        return
    is_notification = "id" not in message

    def respond(result: Any, error: BridgeError | None) -> None:
        if is_notification:
            if error is not None:
                log.info("notification %s failed: %s", method, error)
            return
        if error is not None:
            _reply_error(writer, request_id, error)
        else:
            writer.write({"jsonrpc": "2.0", "id": request_id, "result": result})

    bridge.call(request_id, method, params, respond)


def _envelope(message: Any) -> tuple[str, Any]:
    """The method and params of a well-formed JSON-RPC 2.0 request or notification."""
    if isinstance(message, list):
        raise BridgeError(INVALID_REQUEST, "batches (JSON arrays) are not supported; send one "
                          "request per line")
    if not isinstance(message, dict):
        raise BridgeError(INVALID_REQUEST, "a request must be a JSON object")
    if message.get("jsonrpc") != "2.0":
        raise BridgeError(INVALID_REQUEST, 'a request needs "jsonrpc": "2.0"')
    method = message.get("method")
    if not isinstance(method, str):
        raise BridgeError(INVALID_REQUEST, 'a request needs a string "method"')
    if "id" in message and (isinstance(message["id"], bool)
                            or not isinstance(message["id"], str | int)):
        raise BridgeError(INVALID_REQUEST, '"id" must be a string or an integer')
    unknown = set(message) - {"jsonrpc", "method", "params", "id"}
    if unknown:
        raise BridgeError(INVALID_REQUEST, f"unknown request members {sorted(unknown)}")
    params = message.get("params", {})
    if not isinstance(params, dict):
        raise BridgeError(INVALID_REQUEST, '"params" must be an object (by-name parameters)')
    return method, params


def _reply_error(writer: FrameWriter, request_id: Any, error: BridgeError) -> None:
    writer.write({"jsonrpc": "2.0", "id": request_id, "error": error.to_json()})


def claim_stdout() -> FrameWriter:
    """Keep the real stdout for frames only: fd 1 (and sys.stdout) now point at stderr.

    Native libraries and stray prints then cannot corrupt the protocol stream.
    """
    sys.stdout.flush()
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return FrameWriter(frames)
