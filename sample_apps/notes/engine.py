"""The notes app's engine: notes in the history store, continuations, the link audit, the badge.

Owns one `specsteer.Client` and everything the page asks of it: notes are `note` records of the
history store itself (saving writes the record, deleting forgets it); a continuation streams
`Client.stream` pieces that continue the note's text (`prefix`: the note stays on the device, as
the rest of the user's notes and sent mail the Specialist reads); `prepare` retrieves and
prefills that request while the user types, so the continuation starts from a prefilled prompt;
every frame the Client sends or receives is kept decoded for the "what left this device" panel,
and the companion's reachability feeds the online/offline badge. No HTTP here (`server.py`), no
models chosen here (`app.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from specsteer import protocol
from specsteer.client import NO_TOKEN, Client
from specsteer.device import ModeChange, OfflinePolicy
from specsteer.errors import SpecSteerError
from specsteer.history import HistoryStore
from specsteer.runtime.base import LanguageModel
from specsteer.settings import Params

Emit = Callable[[str, dict[str, Any]], None]
# never repeat an 8-gram of the continuation (the SDK's default): greedy decoding otherwise loops
# on one sentence
NO_REPEAT_NGRAM = Params().no_repeat_ngram
# how long /api/prepare waits for the prefill before answering "not ready yet"
PREPARE_WAIT_S = 30.0


@dataclass
class Settings:
    """What the settings dialog edits."""

    companion: str = ""  # ws:// or wss:// URL; empty: no companion (local only)
    token: str = ""
    preset: str = "default"
    leak_guard: str = Params().leak_guard  # what a draft copying private history does


class Busy(SpecSteerError):
    """A continuation is already running (one at a time, like the bridge)."""


class NotesEngine:
    """Notes, continuations and the audit trail of one user (thread-safe for a threaded server)."""

    def __init__(self, specialist: LanguageModel, store: HistoryStore, settings: Settings, *,
                 max_new_tokens: int = 160, min_token_s: float = 0.0,
                 retry_s: tuple[float, float] = (0.5, 2.0), reply_timeout_s: float = 4.0,
                 no_repeat_ngram: int = NO_REPEAT_NGRAM, test_models: bool = False) -> None:
        self.specialist = specialist
        self.test_models = test_models  # the tiny test models: the page says they write noise
        self.no_repeat_ngram = no_repeat_ngram
        self.store = store
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        # how long a silent companion is waited for before the note goes on locally: short for
        # the tiny models, longer for the real pair (its first round prefills the 1.5B)
        self.reply_timeout_s = reply_timeout_s
        self.min_token_s = min_token_s
        self.policy = OfflinePolicy("degrade", first_retry_s=retry_s[0], max_retry_s=retry_s[1])
        self.mode = "local" if not settings.companion else "unknown"
        self.mode_reason = "no companion configured" if not settings.companion else ""
        self._frames: list[dict[str, Any]] = []
        self._frames_lock = threading.Lock()
        self._running = threading.Lock()
        self._cancel = threading.Event()
        # one Client, kept while the link settings stay the same: it holds the prepared prefill
        self._client_lock = threading.Lock()
        self._client_for: tuple[str, str] | None = None
        self._client_obj: Client | None = None

    # -- notes: records of the history store -------------------------------------------------
    def notes(self, query: str = "") -> list[dict[str, Any]]:
        if query.strip():
            records = [hit.record for hit in self.store.search(query, k=50, kinds=["note"])]
        else:
            records = self.store.list(kind="note", limit=500)
        return [self._note(record) for record in records]

    def save(self, title: str, body: str, note_id: str | None = None) -> dict[str, Any]:
        """Create or update a note; it is history the Specialist reads from now on."""
        if not body.strip() and not title.strip():
            raise ValueError("a note needs a title or some text")
        fields = {"kind": "note", "title": title.strip(), "body": body}
        if note_id:
            if note_id in self.store:
                return self._note(self.store.update(note_id, title=fields["title"], body=body))
            fields["id"] = note_id
        else:
            fields["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return self._note(self.store.add(**fields))

    def delete(self, note_id: str) -> None:
        """Forget a note: the store deletes the record and scrubs its text (secure_delete)."""
        self.store.delete(note_id)

    @staticmethod
    def _note(record: Any) -> dict[str, Any]:
        return {"id": record.id, "title": record.title, "body": record.body,
                "created_at": record.created_at}

    # -- the link audit ---------------------------------------------------------------------
    def _tap(self, direction: str, frame: bytes) -> None:
        tokenizer = self.specialist.tokenizer
        seen = protocol.describe_frame(direction, frame, lambda i: tokenizer.decode([i]),
                                       tokenizer.decode)
        with self._frames_lock:
            seen["n"] = len(self._frames) + 1
            seen["at"] = time.time()
            self._frames.append(seen)

    def frames(self, since: int = 0) -> list[dict[str, Any]]:
        with self._frames_lock:
            return self._frames[since:]

    # -- the badge ----------------------------------------------------------------------------
    def probe(self) -> bool:
        """Whether the companion accepts a websocket connection now (no session is opened)."""
        if not self.settings.companion:
            return False
        from websockets.sync.client import connect

        try:
            with connect(self.settings.companion, open_timeout=1.5, close_timeout=0.5):
                return True
        except Exception:  # refused, 503 from a proxy, timeout, bad URL: all mean unreachable
            return False

    def status(self) -> dict[str, Any]:
        reachable = self.probe()
        if not self._running.locked() and self.settings.companion:
            self.mode = "collaborative" if reachable else "local"
            self.mode_reason = "" if reachable else "the companion is unreachable"
        return {"mode": self.mode, "reason": self.mode_reason, "reachable": reachable,
                "generating": self._running.locked(), "settings": asdict(self.settings),
                "specialist": self.specialist.name, "test_models": self.test_models,
                "history": self.store.stats()["kinds"]}

    # -- continuations ------------------------------------------------------------------------
    def cancel(self) -> bool:
        running = self._running.locked()
        self._cancel.set()
        return running

    def _client(self) -> Client:
        """The Client for the current companion and token (a new one when they change)."""
        key = (self.settings.companion, self.settings.token)
        with self._client_lock:
            if self._client_obj is None or self._client_for != key:
                if self._client_obj is not None:
                    self._client_obj.close()
                self._client_obj = Client(
                    self.specialist, history=self.store, companion=key[0] or None,
                    token=key[1] or NO_TOKEN,
                    timeout_s=self.reply_timeout_s, connect_timeout_s=2.0, tap=self._tap)
                self._client_for = key
            return self._client_obj

    @staticmethod
    def _request(title: str, body: str, note_id: str | None) -> dict[str, Any]:
        """The continuation request of a note: its title is the (public) topic, its text the
        (private) draft to continue; the note's own record is not retrieved as an example."""
        return {"query": {"topic": title.strip() or "a new note"}, "task": "note",
                "prefix": body, "exclude": (note_id,) if note_id else ()}

    def _options(self) -> dict[str, Any]:
        """The decoding options of a continuation, given to `prepare` too: with a companion,
        the first round's draft that prepare makes after the prefill is kept only for a
        continuation with the same draft settings (`rounds.first_draft_key`)."""
        return {"preset": self.settings.preset, "max_new_tokens": self.max_new_tokens,
                "no_repeat_ngram": self.no_repeat_ngram, "leak_guard": self.settings.leak_guard}

    def prepare(self, title: str, body: str, note_id: str | None = None) -> dict[str, Any]:
        """Retrieve and prefill the continuation of the note being typed (debounced by the
        page); the continuation asked for next reuses it. Skipped while one is running.
        `ready`: the prefill finished (or was taken over by a continuation or a newer prepare)
        within PREPARE_WAIT_S."""
        if self._running.locked():
            return {"prefilling": False, "reason": "a continuation is running"}
        request = self._request(title, body, note_id)
        # the device only: the note goes up when the user asks for a continuation, not while
        # they type (the public request holds their draft)
        prepared = self._client().prepare(request.pop("query"), open_session=False,
                                          **self._options(), **request)
        # answered when the prefill is done (the page says "ready" only then) or has run for
        # PREPARE_WAIT_S; a continuation asked for meanwhile takes the prefill over
        return {"prefilling": True, "ready": prepared.wait(PREPARE_WAIT_S)}

    def continue_note(self, title: str, body: str, note_id: str | None, emit: Emit) -> None:
        """Stream the continuation of the note being written (`body`; `note_id` if it is
        saved) through `emit(event, data)`: `mode`, `piece` (text, provenance, token), then
        `done` (stats) or `cancelled`."""
        if not self._running.acquire(blocking=False):
            raise Busy("a continuation is already running; cancel it first")
        try:
            self._cancel.clear()

            def on_mode(change: ModeChange) -> None:
                self.mode, self.mode_reason = change.mode, change.reason
                emit("mode", {"mode": change.mode, "reason": change.reason})

            if self.settings.companion:
                self.mode, self.mode_reason = "collaborative", ""
            emit("mode", {"mode": self.mode, "reason": self.mode_reason})
            request = self._request(title, body, note_id)
            stream = self._client().stream(
                request.pop("query"), offline=self.policy, on_mode=on_mode,
                **self._options(), **request)
            try:
                for piece in stream:
                    emit("piece", {"text": piece.text, "provenance": piece.provenance,
                                   "token": piece.token})
                    if self._cancel.wait(self.min_token_s):
                        emit("cancelled", {})
                        return
            finally:
                stream.close()
            stats = stream.result.stats
            emit("done", {"tokens": stats.tokens, "acceptance_rate": stats.acceptance_rate,
                          "drafted": stats.drafted, "accepted": stats.accepted,
                          "local_tokens": stream.result.provenance.count("local"),
                          "tokens_per_s": stats.tokens_per_s, "bytes_up": stats.bytes_up,
                          "bytes_down": stats.bytes_down, "degraded": stats.degraded,
                          "reconnects": stats.reconnects, "records": list(stats.records),
                          "prefill_reused": stats.prefill_reused,
                          "prefill_tokens": stats.prefill_tokens,
                          "drafted_ahead": stats.drafted_ahead,
                          "leak_guard": self.settings.leak_guard,
                          "leak_flagged": stats.leak_flagged,
                          "leak_redacted": stats.leak_redacted, "leak_held": stats.leak_held})
        finally:
            self._running.release()

    def close(self) -> None:
        with self._client_lock:
            if self._client_obj is not None:
                self._client_obj.close()
                self._client_obj = None
