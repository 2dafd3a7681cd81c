"""The bridge's methods: one `Client` (models loaded once, history store, companion link).

`Bridge.call` runs a method on validated params and answers through a callback, which a method
may call later and from another thread: `generate` runs on a worker thread of its own and streams
`generate.piece` / `generate.mode` / `generate.stats` notifications; `history.*` run on one
history thread, so a locked database never stalls `cancel` or `status`. One generation at a time:
a second `generate` while one runs is refused with BUSY (the caller decides whether to wait).
`cancel` answers the generation at once with the text so far (finish_reason "cancelled"); its
worker stops at the next cancellation point (between tokens) and frees the model before the next
generation starts. The bridge's threads (generation workers, delayed `prepare` answers) are its
own `Workers`, joined on `close`. The decoding options are the registry's (`specsteer.options`,
surface "bridge"), so a new `Params` option needs no edit here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from specsteer import __version__
from specsteer.bridge.errors import (
    BUSY,
    INVALID_REQUEST,
    NO_HISTORY,
    RECORD_NOT_FOUND,
    BridgeError,
    from_exception,
)
from specsteer.bridge.schemas import PROTOCOL_VERSION, check_params
from specsteer.client import Client, Piece
from specsteer.device import PRESETS, ModeChange, Params
from specsteer.history import HistoryStore, task_names
from specsteer.options import BRIDGE, exposed, names
from specsteer.protocol import describe_frame
from specsteer.settings import PRESET
from specsteer.workers import Workers

log = logging.getLogger("specsteer.bridge")
RequestId = str | int
Respond = Callable[[Any, BridgeError | None], None]  # (result, error): exactly one is used
Notify = Callable[[str, dict[str, Any]], None]

NOTIFICATIONS = ["generate.piece", "generate.mode", "generate.stats"]
# the decoding options of generate and prepare (common.json `decoding_options`, generated from
# the same registry): passed to Client.stream and Client.prepare as they are, so what prepare
# makes ahead (the first round's draft, the companion session) is keyed by the settings the
# generate will use
DECODING_OPTIONS = (PRESET.name, *names(exposed(Params, BRIDGE)))
_PHRASE_OPTIONS = tuple(e.name for e in exposed(Params, BRIDGE) if e.is_phrases)
# what only a stream takes besides them (`query` and `task` are positional)
_STREAM_OPTIONS = (*DECODING_OPTIONS, "stop", "offline", "before", "prefix")


@dataclass
class _Generation:
    """One generate request: its cancel flag, what it streamed, whether it was answered."""

    id: RequestId
    respond: Respond
    notify: Notify
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)  # its worker has finished
    pieces: list[Piece] = field(default_factory=list)
    answered: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Bridge:
    """Method handlers over one Client; `notify` sends a notification frame."""

    def __init__(self, client: Client, notify: Notify, *, max_line_bytes: int,
                 companion: str | None = None, audit_frames: bool = False) -> None:
        self.client = client
        self.audit_frames = audit_frames  # send `companion.frame` for each frame (--audit-frames)
        self._frames_seen = 0
        self.notify = notify
        self.max_line_bytes = max_line_bytes
        self.companion = companion
        self.started = time.monotonic()
        self.generations = 0
        self.cancelled = 0  # generations answered as cancelled (cancel, a gone HTTP client)
        self.last_mode: str | None = None
        self.stopping = False
        self.http_url: str | None = None  # the OpenAI-style endpoint, when one is served
        self._running: _Generation | None = None
        self._lock = threading.Lock()
        self._history_thread = ThreadPoolExecutor(1, thread_name_prefix="bridge-history")
        self._workers = Workers()  # generation workers and delayed prepare answers
        self._methods: dict[str, Callable[[dict[str, Any]], Any]] = {
            "initialize": self.initialize,
            "status": self.status,
            "cancel": self.cancel,
            "shutdown": self.shutdown,
        }
        self._history: dict[str, Callable[[HistoryStore, dict[str, Any]], Any]] = {
            "history.add": _history_add,
            "history.search": _history_search,
            "history.list": _history_list,
            "history.delete": _history_delete,
            "history.forget": _history_forget,
            "history.stats": lambda store, _: store.stats(),
        }

    @property
    def methods(self) -> list[str]:
        return [*self._methods, "prepare", "generate", *self._history]

    def knows(self, method: str) -> bool:
        return method in self.methods

    # -- dispatch ------------------------------------------------------------------------------
    def call(self, request_id: RequestId | None, method: str, params: Any,
             respond: Respond) -> None:
        """Run `method`; `respond` gets its result or error (now or later, from any thread)."""
        try:
            params = check_params(method, params)
            if method == "generate":
                if request_id is None:
                    raise BridgeError(INVALID_REQUEST, "generate needs an id (it was sent as a "
                                      "notification)")
                self.start_generation(request_id, params, respond, self.notify)
                return
            if method in self._history:
                self._run_history(method, params, respond)
                return
            if method == "prepare":
                self.prepare(params, respond)
                return
            respond(self._methods[method](params), None)
        except Exception as exc:  # every failure becomes an error object, never a dead bridge
            respond(None, _logged(method, exc))

    # -- prepare ---------------------------------------------------------------------------------
    def prepare(self, params: dict[str, Any], respond: Respond) -> None:
        """Retrieve and prefill a request in the background (`Client.prepare`). Answered at once
        (`ready`: already done), or with `wait_s` from another thread once the prefill (and the
        session opening) is done or `wait_s` has passed: an app shows "ready" only then. A
        following `generate` of the same task reuses every prompt token they share."""
        task = params.get("task", "email")
        prepared = self.client.prepare(params["query"], task=task, before=params.get("before"),
                                       prefix=params.get("prefix", ""),
                                       open_session=params.get("open_session", True),
                                       **_options(params, DECODING_OPTIONS))
        wait_s = float(params.get("wait_s", 0))

        def answer() -> None:
            respond({"task": task, "prefilling": True, "ready": prepared.wait(wait_s)}, None)

        if wait_s <= 0:
            answer()
        else:
            self._workers.start(answer, "bridge-prepare")

    # -- plain methods ---------------------------------------------------------------------------
    def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        history = self.client.history
        return {
            "protocol_version": PROTOCOL_VERSION,
            "package_version": __version__,
            "specialist": self.client.specialist.name,
            "companion": self.companion,
            "history": history.location if history is not None else None,
            "http": self.http_url,
            "methods": self.methods,
            "notifications": [*NOTIFICATIONS, *(["companion.frame"] if self.audit_frames else [])],
            "capabilities": {
                "cancel": True,
                "concurrent_generate": "refuse",
                "max_line_bytes": self.max_line_bytes,
                "tasks": task_names(),
                "presets": list(PRESETS),
                "offline": ["degrade", "fail", "wait(SECONDS)"],
            },
        }

    def status(self, params: dict[str, Any]) -> dict[str, Any]:
        running = self._running
        history = self.client.history
        return {
            "generating": running.id if running is not None and not running.answered else None,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "generations": self.generations,
            "cancelled": self.cancelled,
            "companion": self.companion,
            "last_mode": self.last_mode,
            "history": history.location if history is not None else None,
            "http": self.http_url,
        }

    def cancel(self, params: dict[str, Any]) -> dict[str, bool]:
        return {"cancelled": self.cancel_generation(params["id"])}

    def cancel_generation(self, request_id: RequestId) -> bool:
        """Answer generation `request_id` as cancelled now; False if it is not running."""
        running = self._running
        if running is None or running.id != request_id or running.answered:
            return False
        running.cancel.set()
        self._answer(running, _cancelled(running.pieces), None)
        self.cancelled += 1
        return True

    def shutdown(self, params: dict[str, Any]) -> dict[str, Any]:
        self.stopping = True
        return {}

    def close(self, wait_s: float = 5.0) -> None:
        """Cancel a running generation and wait (bounded) for the workers to stop; then stop
        what `prepare` runs in the background (a native prefill still running when the
        process exits aborts it) and close the sessions it opened."""
        running = self._running
        if running is not None:
            running.cancel.set()
            self._answer(running, _cancelled(running.pieces), None)
            if not running.done.wait(wait_s):
                log.warning("the generation worker did not stop within %.1f s", wait_s)
        self._history_thread.shutdown(wait=True, cancel_futures=True)
        if running is None or running.done.is_set():  # else the worker still holds the model
            self.client.close()
            self._workers.join(wait_s)

    # -- history ---------------------------------------------------------------------------------
    def _run_history(self, method: str, params: dict[str, Any], respond: Respond) -> None:
        store = self.client.history
        if store is None:
            raise BridgeError(NO_HISTORY, "the bridge runs without a history store; start it "
                              "with --history PATH")

        def run() -> None:
            try:
                respond(self._history[method](store, params), None)
            except Exception as exc:
                respond(None, _logged(method, exc))

        self._history_thread.submit(run)

    def audit_frame(self, direction: str, frame: bytes) -> None:
        """The Client's FrameTap with --audit-frames: each frame to or from the companion as a
        `companion.frame` notification, decoded (`protocol.describe_frame`), so an app can show
        the user what left the device. The device token of a Hello is not repeated."""
        tokenizer = self.client.specialist.tokenizer
        described = describe_frame(direction, frame, lambda i: tokenizer.decode([i]),
                                   tokenizer.decode)
        with self._lock:
            self._frames_seen += 1
            running = self._running.id if self._running is not None else None
            described = {"n": self._frames_seen, "generation": running, **described}
        self.notify("companion.frame", described)

    # -- generation ------------------------------------------------------------------------------
    def start_generation(self, request_id: RequestId, params: dict[str, Any],
                         respond: Respond, notify: Notify) -> None:
        """Run a generate (params already checked) on a worker; BUSY if one is running."""
        with self._lock:
            previous = self._running
            if previous is not None and not previous.answered:
                raise BridgeError(BUSY, f"generation {previous.id!r} is still running; wait for "
                                  "its answer or cancel it", running=previous.id)
            generation = _Generation(request_id, respond, notify)
            self._running = generation
            self.generations += 1
        self._workers.start(lambda: self._generate(generation, params, previous),
                            f"bridge-generate-{request_id}")

    def _generate(self, generation: _Generation, params: dict[str, Any],
                  previous: _Generation | None) -> None:
        try:
            if previous is not None:
                previous.done.wait()  # a cancelled run still winding down holds the model
            if generation.cancel.is_set():
                return
            self._decode(generation, params)
        except Exception as exc:
            self._answer(generation, None, _logged("generate", exc))
        finally:
            generation.done.set()
            with self._lock:
                if self._running is generation:
                    self._running = None

    def _decode(self, generation: _Generation, params: dict[str, Any]) -> None:
        options = _options(params, _STREAM_OPTIONS)

        def on_mode(change: ModeChange) -> None:
            self.last_mode = change.mode
            self._send(generation, "generate.mode", {
                "mode": change.mode, "tokens": change.tokens, "reason": change.reason})

        pace_s = params.get("min_token_ms", 0) / 1000
        stream = self.client.stream(params["query"], task=params.get("task", "email"),
                                    on_mode=on_mode, **options)
        try:
            for piece in stream:
                if generation.cancel.is_set():
                    return
                generation.pieces.append(piece)
                self._send(generation, "generate.piece", {
                    "text": piece.text, "token": piece.token, "provenance": piece.provenance,
                    "round": piece.round})
                if generation.cancel.wait(pace_s):  # paced for reading (min_token_ms)
                    return
        finally:
            stream.close()  # a cancelled run stops here: the decoder's sessions are closed
        if generation.cancel.is_set():
            return
        result = stream.result
        streamed = "".join(piece.text for piece in generation.pieces)
        if len(result.text) > len(streamed) and result.text.startswith(streamed):
            # the stream holds back an incomplete UTF-8 character; the final text keeps it
            self._send(generation, "generate.piece", {
                "text": result.text[len(streamed):], "token": result.tokens[-1],
                "provenance": result.provenance[-1],
                "round": generation.pieces[-1].round if generation.pieces else 0})
        stats = result.stats.to_json()
        self._send(generation, "generate.stats", {"stats": stats})
        limit = params.get("max_new_tokens", Params.max_new_tokens)
        self._answer(generation, {
            "text": result.text,
            "provenance": result.provenance,
            "finish_reason": "length" if len(result.tokens) >= limit else "stop",
            "stats": stats,
        }, None)

    def _send(self, generation: _Generation, method: str, params: dict[str, Any]) -> None:
        """A notification of this generation, unless it was already answered (cancelled)."""
        with generation.lock:
            if not generation.answered:
                generation.notify(method, {"id": generation.id, **params})

    @staticmethod
    def _answer(generation: _Generation, result: Any, error: BridgeError | None) -> None:
        with generation.lock:
            if generation.answered:
                return
            generation.answered = True
        generation.respond(result, error)


def _options(params: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The `names` given in `params`, as Client keyword arguments ("default" preset = none)."""
    options = {name: params[name] for name in names if name in params}
    if options.get("preset") == "default":
        options.pop("preset")
    for name in _PHRASE_OPTIONS:  # JSON lists; Params keeps tuples
        if name in options:
            options[name] = tuple(options[name])
    return options


def _cancelled(pieces: list[Piece]) -> dict[str, Any]:
    return {"text": "".join(p.text for p in pieces), "provenance": [p.provenance for p in pieces],
            "finish_reason": "cancelled", "stats": None}


def _logged(method: str, exc: Exception) -> BridgeError:
    error = from_exception(exc)
    if error.data["reason"] == "internal_error":
        log.exception("%s failed", method)
    else:
        log.info("%s: %s", method, error)
    return error


def _history_add(store: HistoryStore, params: dict[str, Any]) -> dict[str, Any]:
    fields = {"source": "bridge", **params}
    return {"record": store.add(**fields).to_dict()}


def _history_search(store: HistoryStore, params: dict[str, Any]) -> dict[str, Any]:
    hits = store.search(params["query"], params.get("k", 5), kinds=params.get("kinds"),
                        before=params.get("before"))
    return {"hits": [{"score": hit.score, "record": hit.record.to_dict()} for hit in hits]}


def _history_list(store: HistoryStore, params: dict[str, Any]) -> dict[str, Any]:
    records = store.list(params.get("kinds"), params.get("limit", 20),
                         before=params.get("before"), offset=params.get("offset", 0))
    return {"records": [record.to_dict() for record in records]}


def _history_delete(store: HistoryStore, params: dict[str, Any]) -> dict[str, Any]:
    ids = list(dict.fromkeys(params["ids"]))
    missing = [record_id for record_id in ids if record_id not in store]
    if missing:
        raise BridgeError(RECORD_NOT_FOUND, f"no records with ids {missing}; nothing deleted",
                          missing=missing)
    for record_id in ids:
        store.delete(record_id)
    return {"deleted": ids}


def _history_forget(store: HistoryStore, params: dict[str, Any]) -> dict[str, Any]:
    if params.get("all"):
        count = len(store)
        store.wipe()
        return {"deleted": count}
    return {"deleted": store.forget(kind=params.get("kinds"), before=params.get("before"))}
