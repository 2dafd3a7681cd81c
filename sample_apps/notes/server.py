"""The notes app's local web server (standard library only): the page, a JSON API, and the
continuation as server-sent events.

Routes: `GET /` and `/static/*` (the page, no build step); `GET /api/notes?q=` (list or search),
`POST /api/notes` (save `{id?, title, body}`), `DELETE /api/notes/ID` (forget);
`POST /api/prepare` (`{id?, title, body}`: the note in the editor, while the user types: retrieve
and prefill its continuation; answers `{prefilling, ready}` once the prefill is done),
`POST /api/continue` (the same body; the answer is a
text/event-stream of `mode`, `piece`, `done` | `cancelled` | `failed` events), `POST /api/cancel`;
`GET /api/frames?since=N` (the link audit); `GET /api/status` (the badge); `GET|POST
/api/settings` (companion URL, token, preset, leak guard). Binds to loopback only: the app
is for the person at this machine.
"""

from __future__ import annotations

import json
import mimetypes
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from engine import Busy, NotesEngine

from specsteer.errors import RecordNotFound, SpecSteerError
from specsteer.settings import LEAK_GUARDS, PRESETS

# the app's own page, then what both sample apps share (style.css, frames.js)
STATIC = (Path(__file__).resolve().parent / "static",
          Path(__file__).resolve().parents[1] / "shared_ui")


class NotesHandler(BaseHTTPRequestHandler):
    engine: NotesEngine  # set on the subclass `serve` makes
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        pass  # quiet: the console is for the app's own lines

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any, status: int = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json({"error": message}, status)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(length) or b"{}")
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        return data

    def _query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    # -- routes -----------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (stdlib's name)
        path = urlsplit(self.path).path
        if path == "/favicon.ico":
            return self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        if path == "/":
            path = "/static/index.html"
        if path.startswith("/static/"):
            return self._static(path.removeprefix("/static/"))
        query = self._query()
        if path == "/api/notes":
            return self._json(self.engine.notes(query.get("q", "")))
        if path == "/api/frames":
            return self._json(self.engine.frames(int(query.get("since", "0"))))
        if path == "/api/status":
            return self._json(self.engine.status())
        if path == "/api/settings":
            return self._json({**vars(self.engine.settings), "presets": list(PRESETS),
                               "leak_guards": LEAK_GUARDS})
        self._error(HTTPStatus.NOT_FOUND, f"no such page: {path}")

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        try:
            body = self._body()
            if path == "/api/notes":
                note = self.engine.save(str(body.get("title", "")), str(body.get("body", "")),
                                        body.get("id") or None)
                return self._json(note)
            note = (str(body.get("title", "")), str(body.get("body", "")), body.get("id") or None)
            if path == "/api/continue":
                return self._continue(*note)
            if path == "/api/prepare":
                return self._json(self.engine.prepare(*note))
            if path == "/api/cancel":
                return self._json({"cancelled": self.engine.cancel()})
            if path == "/api/settings":
                return self._json(vars(self._settings(body)))
        except (ValueError, SpecSteerError) as exc:
            return self._error(HTTPStatus.BAD_REQUEST, str(exc))
        self._error(HTTPStatus.NOT_FOUND, f"no such action: {path}")

    def do_DELETE(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if not path.startswith("/api/notes/"):
            return self._error(HTTPStatus.NOT_FOUND, f"no such action: {path}")
        try:
            self.engine.delete(unquote(path.removeprefix("/api/notes/")))
        except RecordNotFound as exc:
            return self._error(HTTPStatus.NOT_FOUND, str(exc))
        self._json({"deleted": True})

    # -- handlers ---------------------------------------------------------------------------
    def _static(self, name: str) -> None:
        for folder in STATIC:
            target = (folder / name).resolve()
            if folder in target.parents and target.is_file():
                break
        else:
            return self._error(HTTPStatus.NOT_FOUND, f"no such file: {name}")
        kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        self._send(HTTPStatus.OK, target.read_bytes(), f"{kind}; charset=utf-8")

    def _settings(self, body: dict[str, Any]) -> Any:
        settings = self.engine.settings
        companion = str(body.get("companion", settings.companion)).strip()
        preset = str(body.get("preset", settings.preset))
        leak_guard = str(body.get("leak_guard", settings.leak_guard))
        if companion and not companion.startswith(("ws://", "wss://")):
            raise ValueError("the companion URL must start with ws:// or wss://")
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}")
        if leak_guard not in LEAK_GUARDS:
            raise ValueError(f"leak_guard must be one of {', '.join(LEAK_GUARDS)}")
        settings.companion, settings.preset = companion, preset
        settings.leak_guard = leak_guard
        settings.token = str(body.get("token", settings.token))
        return settings

    def _continue(self, title: str, body: str, note_id: str | None) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        lock = threading.Lock()

        def emit(event: str, data: dict[str, Any]) -> None:
            with lock:
                self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

        try:
            self.engine.continue_note(title, body, note_id, emit)
        except (BrokenPipeError, ConnectionResetError):
            self.engine.cancel()  # the page went away
        except (Busy, SpecSteerError, ValueError) as exc:
            emit("failed", {"error": str(exc)})


def serve(engine: NotesEngine, host: str = "127.0.0.1", port: int = 8300) -> ThreadingHTTPServer:
    """A server bound to `host:port` (port 0: a free one); call `serve_forever()` on it."""
    handler = type("BoundNotesHandler", (NotesHandler,), {"engine": engine})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
