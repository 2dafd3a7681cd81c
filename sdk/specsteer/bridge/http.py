"""`specsteer bridge --http`: an OpenAI-compatible loopback endpoint over the bridge's Client.

`GET /v1/models`, `GET /v1/models/{id}` and `POST /v1/chat/completions` (with `stream: true` as
server-sent events), on the standard library's threading HTTP server; what a body may hold and
how errors are answered is `openai_api`'s. Every request needs `Authorization: Bearer
TOKEN`, the token being the content of a local file (created owner-only with a random token when
missing). The server binds loopback addresses only unless `allow_remote`, and checks the Host
header so a web page cannot reach it by DNS rebinding. Generations share the stdio bridge's
one-at-a-time rule (a busy bridge answers 429). Each text delta carries its provenance in the
extension field `specsteer`; the last chunk (or the whole completion) carries the stats. A
client that closes its connection before the answer (streamed or not) cancels its generation:
the handler watches the socket while it waits, so the model is freed for the next request.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import queue
import secrets
import select
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from specsteer.bridge.errors import BridgeError, from_exception
from specsteer.bridge.handlers import Bridge
from specsteer.bridge.openai_api import (
    Completion,
    OpenAIError,
    bridge_error,
    completion_request,
    model_not_found,
    usage,
)

log = logging.getLogger("specsteer.bridge.http")
MAX_BODY_BYTES = 1 << 20
POLL_S = 0.1  # how often a handler waiting for its generation checks that its client is there


def parse_address(text: str, allow_remote: bool) -> tuple[str, int]:
    """HOST:PORT; a host that is not loopback is refused unless `allow_remote`."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--http wants HOST:PORT (e.g. 127.0.0.1:8080), not {text!r}")
    if not allow_remote and not _is_loopback(host):
        raise ValueError(f"--http {text}: {host} is not a loopback address; the endpoint serves "
                         "this machine only unless --allow-remote is given")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: Path) -> str:
    """The bearer token in `path`; a missing file is created (0600) with a random token."""
    path = path.expanduser()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
        log.info("created a new bearer token in %s", path)
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < 16:
        raise ValueError(f"the token in {path} is shorter than 16 characters")
    return token


class OpenAIServer(ThreadingHTTPServer):
    """The HTTP server; `url` is its base URL once bound (port 0 picks a free one)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], bridge: Bridge, token: str) -> None:
        super().__init__(address, _Handler)
        self.bridge = bridge
        self.token = token
        host = address[0]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.server_address[1]}/v1"
        self.hosts = {f"{name}:{self.server_address[1]}" for name in (shown, "localhost",
                                                                      "127.0.0.1", "[::1]")}

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="bridge-http", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.info("%s %s", self.address_string(), format % args)

    # -- plumbing --------------------------------------------------------------------------------
    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None
                   ) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _fail(self, error: OpenAIError) -> None:
        """An OpenAI-style error; it closes the connection, as a refused request's body may
        still be unread (a kept-alive connection would read it as the next request)."""
        self.close_connection = True
        retry = {} if error.retry is None else {"x-should-retry": str(error.retry).lower()}
        self._send_json(error.status, error.body(), retry)

    def _allowed(self) -> bool:
        bound_loopback = _is_loopback(self.server.server_address[0])
        if bound_loopback and self.headers.get("Host", "") not in self.server.hosts:
            self._fail(OpenAIError(403, "unexpected Host header", "forbidden_host"))
            return False
        auth = self.headers.get("Authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self._fail(OpenAIError(401, "a valid bearer token is required (see "
                                   "--http-token-file)", "invalid_api_key",
                                   kind="authentication_error"))
            return False
        return True

    @property
    def _model(self) -> dict[str, Any]:
        """The one model served: the Specialist (steered by the bridge's companion)."""
        return {"id": self.server.bridge.client.specialist.name, "object": "model",
                "created": 0, "owned_by": "specsteer"}

    # -- routes ----------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if not self._allowed():
            return
        path = self.path.rstrip("/")
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [self._model]})
        elif path.startswith("/v1/models/"):
            name = unquote(path.removeprefix("/v1/models/"))
            if name == self._model["id"]:
                self._send_json(200, self._model)
            else:
                self._fail(model_not_found(name))
        else:
            self._fail(OpenAIError(404, f"no route GET {self.path}", "not_found"))

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if not self._allowed():
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._fail(OpenAIError(404, f"no route POST {self.path}", "not_found"))
            return
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self._fail(OpenAIError(411, "a Content-Length header is required",
                                   "length_required"))
            return
        if int(length) > MAX_BODY_BYTES:
            self._fail(OpenAIError(413, f"the body exceeds {MAX_BODY_BYTES} bytes",
                                   "body_too_large"))
            return
        try:
            try:
                body = json.loads(self.rfile.read(int(length)) or b"null")
            except ValueError as exc:
                raise OpenAIError(400, f"the body is not JSON: {exc}", "invalid_json") from None
            request = completion_request(body, self._model["id"])
            self._check_prompt(request.params)
        except OpenAIError as exc:
            self._fail(exc)
            return
        self._complete(request)

    def _check_prompt(self, params: dict[str, Any]) -> None:
        """Render the request's prompt before answering, so that an unknown task, a query
        without its task's field or a request over the prompt budget is a 400 (a streamed
        answer's status is sent before the generation starts)."""
        try:
            self.server.bridge.client.render(params["query"], task=params.get("task", "email"),
                                             before=params.get("before"),
                                             prefix=params.get("prefix", ""))
        except Exception as exc:  # noqa: BLE001 - each SDK error has its bridge reason
            raise bridge_error(from_exception(exc)) from None

    def _complete(self, request: Completion) -> None:
        bridge = self.server.bridge
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            bridge.start_generation(
                request_id, request.params,
                lambda result, error: events.put(("answer", (result, error))),
                lambda method, note: events.put((method, note)))
        except BridgeError as exc:
            self._fail(bridge_error(exc))
            return
        head = {"id": request_id, "created": int(time.time()), "model": self._model["id"]}
        if request.stream:
            self._stream(events, head, request_id, request.include_usage)
            return
        answer = self._await_answer(events, request_id)
        if answer is None:
            return
        result, error = answer
        if error is not None:
            self._fail(bridge_error(error))
            return
        self._send_json(200, {
            **head, "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result["text"]},
                         "finish_reason": _finish(result), "logprobs": None}],
            "usage": _usage(result),
            "specsteer": {"provenance": result["provenance"], "stats": result["stats"]},
        })

    def _stream(self, events: queue.Queue[tuple[str, Any]], head: dict[str, Any],
                request_id: str, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk = {**head, "object": "chat.completion.chunk"}
        if include_usage:  # OpenAI: null on every chunk but the last, which has no choices
            chunk["usage"] = None

        def write(payload: dict[str, Any]) -> None:
            self.wfile.write(b"data: " + json.dumps(payload, ensure_ascii=False).encode()
                             + b"\n\n")
            self.wfile.flush()

        def send(delta: dict[str, Any], finish: str | None, extra: dict[str, Any]) -> None:
            write({**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                         "logprobs": None}], "specsteer": extra})

        try:
            send({"role": "assistant", "content": ""}, None, {})
            while True:
                event = self._next_event(events, request_id)
                if event is None:
                    return
                kind, value = event
                if kind == "generate.piece":
                    send({"content": value["text"]}, None,
                         {"provenance": value["provenance"], "token": value["token"]})
                elif kind == "generate.mode":
                    send({}, None, {"mode": value["mode"], "reason": value["reason"]})
                elif kind == "answer":
                    result, error = value
                    if error is not None:
                        send({}, "error", {"error": error.to_json()})
                    else:
                        send({}, _finish(result), {"stats": result["stats"]})
                        if include_usage:
                            write({**chunk, "choices": [], "usage": _usage(result)})
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    return
        except (BrokenPipeError, ConnectionResetError):
            self._client_gone(request_id)

    def _next_event(self, events: queue.Queue[tuple[str, Any]], request_id: str
                    ) -> tuple[str, Any] | None:
        """The generation's next event; None (the generation cancelled) once the client has
        closed its connection."""
        while not _peer_closed(self.connection):
            try:
                return events.get(timeout=POLL_S)
            except queue.Empty:
                continue
        self._client_gone(request_id)
        return None

    def _await_answer(self, events: queue.Queue[tuple[str, Any]], request_id: str
                      ) -> tuple[Any, BridgeError | None] | None:
        while (event := self._next_event(events, request_id)) is not None:
            if event[0] == "answer":
                return event[1]
        return None

    def _client_gone(self, request_id: str) -> None:
        log.info("client of %s went away: cancelling", request_id)
        self.close_connection = True
        self.server.bridge.cancel_generation(request_id)


def _peer_closed(connection: socket.socket) -> bool:
    """Whether the client closed (or reset) the connection: readable with nothing to read."""
    try:
        return _readable(connection) and connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:  # reset by the peer
        return True


def _readable(connection: socket.socket) -> bool:
    """Readable now (or hung up): `poll` where there is one, as `select` refuses descriptors
    above FD_SETSIZE; `select` on Windows, where it takes any socket."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(connection, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([connection], [], [], 0)
    return bool(readable)


def _finish(result: dict[str, Any]) -> str:
    return "length" if result["finish_reason"] == "length" else "stop"


def _usage(result: dict[str, Any]) -> dict[str, int]:
    stats = result["stats"]
    return usage(stats["prompt_tokens"], stats["tokens"])
