"""One device connection on the companion: protocol state machine + verifier, no I/O.

`handle(frame) -> frames` is all a network adapter needs (websocket server, in-process link,
fuzzer); a server whose admission gate already decoded the frame calls `handle_message`. Model
work happens inside them, so adapters call them off their event loop. Every failure becomes an
Error frame and a closed connection; nothing escapes to the adapter. Session quotas and budgets
are the adapter's (`admission`).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Callable

from specsteer import __version__, protocol
from specsteer.errors import SessionError
from specsteer.protocol import (
    CloseRequested,
    CompanionConnection,
    ConnectionFailed,
    DraftReceived,
    DraftS0Received,
    ErrorCode,
    Event,
    HelloReceived,
    Limits,
    Message,
    ResumeRequested,
    RowRequested,
    SessionRequested,
    takes_opening_candidates,
)
from specsteer_companion.cross import CrossVerifierSession, ScoredText
from specsteer_companion.verifier import ScoredDraft, Verifier, VerifierSession

log = logging.getLogger("specsteer_companion")
_connection_ids = itertools.count(1)  # open mode's identities: never sent to a device
# Session ids are random, so a device learns nothing of other sessions from its own: 52 random
# bits under a top bit of 2**52, so every id is exact in a JSON number and takes the same 8
# varint bytes (byte counts do not vary from session to session).
SESSION_ID_BITS = 53


def new_session_id() -> int:
    return secrets.randbits(SESSION_ID_BITS - 1) | 1 << (SESSION_ID_BITS - 1)

# Returns an identity (e.g. the device name) for a valid token, None to refuse.
Authenticator = Callable[[str], "str | None"]


class CompanionEndpoint:
    """The companion side of one connection."""

    def __init__(self, verifier: Verifier, *, authenticate: Authenticator | None = None,
                 limits: Limits | None = None) -> None:
        self.verifier = verifier
        base = limits or Limits()
        self.limits = Limits(
            max_message_bytes=base.max_message_bytes, max_draft=base.max_draft,
            # a session holds prompt + output in one KV cache: never advertise more than that
            max_prompt_tokens=min(base.max_prompt_tokens, verifier.max_session_tokens),
            # ...nor more candidates than every engine can return (vLLM: its max_logprobs)
            max_top_k=min(base.max_top_k, verifier.max_top_k),
            vocab_size=verifier.generalist.vocab_size,
        )
        self.conn = CompanionConnection(self.limits)
        self.authenticate = authenticate
        self.identity: str | None = None
        self.session: VerifierSession | CrossVerifierSession | None = None
        # the outstanding draft, scored, while its P_S0 values are on their way (s0_on_device)
        self.scored: ScoredDraft | ScoredText | None = None
        self.rounds = 0
        self.resumes = 0  # sessions rebuilt here from a device's public state (Resume)
        self.compute_s = 0.0
        self.close_code, self.close_reason = 1000, ""  # every end is the protocol's own

    @property
    def closed(self) -> bool:
        return self.conn.state is protocol.State.CLOSED

    @property
    def frame_limits(self) -> Limits:
        """What the next frame is decoded with (the vocabulary is known after the Hello)."""
        return self.conn.limits

    def handle(self, frame: bytes) -> list[bytes]:
        """Consume one frame; return the frames to send back (possibly an Error)."""
        return self._run(lambda: self.conn.receive_frame(frame))

    def handle_message(self, message: Message, size: int) -> list[bytes]:
        """`handle` for a frame of `size` bytes the adapter decoded, with `conn.limits`."""
        return self._run(lambda: self.conn.receive_message(message, size))

    def _run(self, receive: Callable[[], list[Event]]) -> list[bytes]:
        try:
            for event in receive():
                self._dispatch(event)
        except SessionError as exc:
            # A valid request this companion cannot serve (the session outgrew its KV cache):
            # a limit the device hit, not a bug of ours.
            if not self.closed:
                self.conn.fail(ErrorCode.LIMIT_EXCEEDED, str(exc))
        except Exception as exc:  # a model or programming error: report, never crash the server
            log.exception("internal error while handling a frame")
            if not self.closed:
                self.conn.fail(ErrorCode.INTERNAL, f"internal error ({type(exc).__name__})")
        if self.closed:
            self._end_session()
        return self.conn.data_to_send()

    def fail(self, code: ErrorCode, message: str) -> list[bytes]:
        """Close from the adapter's side (idle timeout, rate limit, shutdown)."""
        if not self.closed:
            self.conn.fail(code, message)
        self._end_session()
        return self.conn.data_to_send()

    def release(self) -> None:
        """The connection is gone: free the session's KV caches."""
        self._end_session()

    def _dispatch(self, event: object) -> None:
        if isinstance(event, HelloReceived):
            self._hello(event.hello)
        elif isinstance(event, SessionRequested | ResumeRequested):
            self._open(event.request)
        elif isinstance(event, DraftReceived):
            assert self.session is not None
            started = time.perf_counter()
            d = event.draft
            # the Generalist's pass now; with P_S0 on the device its values arrive meanwhile
            scored = self.session.score(d.committed_ids, d.draft_ids)
            if self.session.settings.s0_on_device:
                self.scored = scored
                self._account(started, f"draft k={len(d.draft_ids)} scored", round_=False)
            else:
                self._verdict(started, scored, None)
        elif isinstance(event, DraftS0Received):
            assert self.session is not None and self.scored is not None
            scored, self.scored = self.scored, None
            self._verdict(time.perf_counter(), scored, event.s0.logp_s0)
        elif isinstance(event, RowRequested):
            assert self.session is not None
            started = time.perf_counter()
            result = self.session.row(event.request.committed_ids)
            self._account(started, "row")
            self.conn.send_row(result.candidates.ids, result.candidates.values, result.s0_values)
        elif isinstance(event, CloseRequested | ConnectionFailed):
            self._end_session()

    def _verdict(self, started: float, scored: ScoredDraft | ScoredText,
                 logp_s0: tuple[float, ...] | None) -> None:
        assert self.session is not None
        result = self.session.decide(scored, logp_s0)  # type: ignore[arg-type]
        self._account(started, f"draft accepted={result.accepted}")
        self.conn.send_verdict(result.accepted, result.candidates.ids, result.candidates.values)

    def _account(self, started: float, what: str, *, round_: bool = True) -> None:
        elapsed = time.perf_counter() - started
        self.rounds += round_
        self.compute_s += elapsed
        log.debug("%s: %s in %.1f ms", self.identity, what, elapsed * 1e3)

    def _hello(self, hello: protocol.Hello) -> None:
        if self.authenticate is not None:
            self.identity = self.authenticate(hello.auth_token)
            if self.identity is None:
                self.conn.fail(ErrorCode.AUTH_FAILED, "unknown or revoked device token")
                return
        else:  # open mode: client names are not identities, so quotas are per connection
            self.identity = f"{hello.client_name or 'anonymous'}#{next(_connection_ids)}"
        g = self.verifier.generalist
        s = self.verifier.specialist
        if hello.generalist_sha256 and hello.generalist_sha256 != g.sha256:
            self.conn.fail(ErrorCode.MODEL_MISMATCH,
                           f"this companion serves Generalist {g.name} {g.sha256[:12]}, "
                           f"not {hello.generalist_sha256[:12]}")
            return
        # A companion without a generic Specialist never computes P_S0: any device may connect,
        # and only sessions that send P_S0 themselves (s0_on_device) are accepted at open.
        if hello.specialist_sha256 and s is not None and hello.specialist_sha256 != s.sha256:
            self.conn.fail(ErrorCode.MODEL_MISMATCH,
                           f"the device's Specialist {hello.specialist_sha256[:12]} is not the "
                           f"companion's generic Specialist ({s.name} {s.sha256[:12]}); "
                           "both must be the same artifact")
            return
        self.conn.accept_hello(
            companion_version=__version__, generalist_sha256=g.sha256,
            specialist_sha256=s.sha256 if s is not None else "",
            # the device's ids are Specialist ids; they are the Generalist's only on one tokenizer
            vocab_size=s.vocab_size if s is not None
            and s.tokenizer.vocab_hash != g.tokenizer.vocab_hash else g.vocab_size,
        )

    def _open(self, request: protocol.OpenSession | protocol.Resume) -> None:
        """Open a session, or rebuild one (Resume: prompt and committed tokens, one pass)."""
        self._end_session()
        if not request.prompt_ids:  # the verifier needs a position to predict from
            self.conn.fail(ErrorCode.BAD_VALUE, "the prompt is empty")
            return
        resumed = isinstance(request, protocol.Resume)
        try:
            if resumed:
                opened = protocol.OpenSession(request.prompt_ids, request.settings)
                self.session = self.verifier.open(opened, request.committed_ids,
                                                  owner=self.identity or "")
            else:
                self.session = self.verifier.open(request, owner=self.identity or "")
        except SessionError as exc:  # the prompt does not fit the KV cache
            self.conn.fail(ErrorCode.LIMIT_EXCEEDED, f"cannot open the session: {exc}")
            return
        except ValueError as exc:
            self.conn.fail(ErrorCode.UNSUPPORTED, str(exc))
            return
        if resumed:
            self.resumes += 1
            log.info("%s: resumed a session at round %d over %d prompt + %d committed tokens",
                     self.identity, request.round, len(request.prompt_ids),
                     len(request.committed_ids))
        first = self.session.opening_candidates() if takes_opening_candidates(request) else None
        self.conn.session_opened(new_session_id(), ids=() if first is None else first.ids,
                                 values=() if first is None else first.values)

    def _end_session(self) -> None:
        self.scored = None
        if self.session is not None:
            self.session.close()
            self.session = None
