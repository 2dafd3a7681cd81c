"""The sans-I/O state machines: `DeviceConnection` and `CompanionConnection`.

This module owns the order in which messages may cross: each side's `State`, what it may send
in each state, what it accepts on receipt, and the byte and frame counts. It does no I/O
(adapters move frames; one websocket message carries exactly one protocol frame), no model work
and no decoding maths: methods queue encoded frames for `data_to_send()`, and `receive_frame`
decodes one frame and returns `events`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import replace

from specsteer.errors import ProtocolError
from specsteer.protocol.codec import decode, encode
from specsteer.protocol.events import (
    Closed,
    CloseRequested,
    ConnectionFailed,
    DraftReceived,
    DraftS0Received,
    ErrorReceived,
    Event,
    HelloAccepted,
    HelloReceived,
    ResumeRequested,
    RowReceived,
    RowRequested,
    SessionReady,
    SessionRequested,
    VerdictReceived,
)
from specsteer.protocol.messages import (
    Close,
    Draft,
    DraftS0,
    Error,
    ErrorCode,
    Hello,
    HelloOk,
    Limits,
    Message,
    Mode,
    OpenSession,
    Resume,
    RowReply,
    RowRequest,
    SessionOpened,
    SessionSettings,
    Verdict,
    _ids,
)


class State(enum.Enum):
    """Where a connection stands; the same phases on both sides."""

    START = "start"  # nothing exchanged yet
    HANDSHAKE = "handshake"  # Hello sent/received, HelloOk pending
    READY = "ready"  # handshake done, no session open
    OPENING = "opening"  # OpenSession sent/received, SessionOpened pending
    SESSION = "session"  # a session is open and no request is outstanding
    WAITING = "waiting"  # a Draft (and its DraftS0) or a RowRequest is outstanding
    CLOSED = "closed"  # Close or Error sent or received: nothing more is accepted


def _check_candidate_count(n: int, what: str, session: OpenSession | Resume) -> None:
    """A reply must give the device something to choose from, and no more than it asked."""
    settings = session.settings
    if settings.mode is Mode.SPECULATIVE:
        if n != 1:
            raise ProtocolError(ErrorCode.BAD_VALUE, f"a speculative {what} carries 1 id, got {n}")
    elif not 1 <= n <= settings.top_k:
        raise ProtocolError(
            ErrorCode.BAD_VALUE,
            f"{what} carries {n} candidates, the session asked for 1..{settings.top_k}",
        )


def takes_opening_candidates(session: OpenSession | Resume) -> bool:
    """Whether SessionOpened may carry the first position's candidates for `session`: a new
    greedy SPECSTEER session with P_S0 on the device (which can then run its first ratio test
    itself)."""
    settings = session.settings
    return (isinstance(session, OpenSession) and settings.mode is Mode.SPECSTEER
            and settings.s0_on_device and settings.temperature <= 0)


def _check_opening_candidates(n: int, session: OpenSession | Resume) -> None:
    """SessionOpened's candidates: none, or a first-round verdict's in a session that takes
    them (both sides check it)."""
    if not n:
        return
    if not takes_opening_candidates(session):
        raise ProtocolError(ErrorCode.BAD_VALUE, "SessionOpened carries candidates only for a "
                            "new greedy SPECSTEER session with P_S0 on the device")
    _check_candidate_count(n, "SessionOpened", session)


def _check_draft_s0(round_: int, values: int, draft: Draft | None, owed: bool) -> Draft:
    """The Draft a DraftS0 of `round_` with `values` values belongs to: the outstanding one of
    an `s0_on_device` session, whose DraftS0 is still `owed`, with one value per drafted id
    (both sides check it: one sends, one receives)."""
    if draft is None or not owed:
        raise ProtocolError(ErrorCode.OUT_OF_ORDER,
                            "a DraftS0 follows a Draft of a session with s0_on_device, once")
    if round_ != draft.round:
        raise ProtocolError(
            ErrorCode.OUT_OF_ORDER,
            f"DraftS0 for round {round_} while round {draft.round} is outstanding",
        )
    if values != len(draft.draft_ids):
        raise ProtocolError(
            ErrorCode.BAD_VALUE, f"logp_s0 has {values} values for {len(draft.draft_ids)} drafts"
        )
    return draft


def _held(session: OpenSession | Resume) -> int:
    """Tokens an opened session holds: its prompt (and, resumed, the committed tokens)."""
    return len(session.held_ids if isinstance(session, Resume) else session.prompt_ids)


def _first_round(session: OpenSession | Resume) -> int:
    return session.round if isinstance(session, Resume) else 0


class _Connection:
    """What both sides share: state, outgoing queue, byte accounting, decoding limits."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits: Limits = limits if limits is not None else Limits()
        self.state: State = State.START
        self.session: OpenSession | Resume | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.frames_sent = 0
        self.frames_received = 0
        self._outgoing: list[bytes] = []

    def data_to_send(self) -> list[bytes]:
        """Frames queued since the last call, in order; each is one websocket message."""
        frames, self._outgoing = self._outgoing, []
        return frames

    def _send(self, message: Message) -> bytes:
        frame = encode(message)
        self._outgoing.append(frame)
        self.bytes_sent += len(frame)
        self.frames_sent += 1
        return frame

    def _count_received(self, data: bytes) -> None:
        self.bytes_received += len(data)
        self.frames_received += 1

    def _require(self, *states: State, action: str) -> None:
        if self.state not in states:
            wanted = " or ".join(s.value for s in states)
            raise ProtocolError(
                ErrorCode.OUT_OF_ORDER,
                f"cannot {action} in state {self.state.value} (needs {wanted})",
            )

    def _unexpected(self, message: Message) -> ProtocolError:
        return ProtocolError(
            ErrorCode.OUT_OF_ORDER,
            f"unexpected {type(message).__name__} in state {self.state.value}",
        )

    def _check_ids(self, what: str, ids: Sequence[int], limit: int) -> tuple[int, ...]:
        checked = _ids(what, ids)
        if len(checked) > limit:
            raise ProtocolError(
                ErrorCode.LIMIT_EXCEEDED, f"{len(checked)} {what} exceed the limit of {limit}"
            )
        vocab = self.limits.vocab_size
        if vocab is not None and any(token >= vocab for token in checked):
            raise ProtocolError(ErrorCode.BAD_TOKEN, f"{what} holds an id >= vocab size {vocab}")
        return checked

    def _send_checked(self, message: Message, peer: Limits) -> None:
        frame = encode(message)
        if len(frame) > peer.max_message_bytes:
            raise ProtocolError(
                ErrorCode.TOO_LARGE,
                f"{type(message).__name__} of {len(frame)} bytes exceeds the peer's limit of "
                f"{peer.max_message_bytes}",
            )
        self._outgoing.append(frame)
        self.bytes_sent += len(frame)
        self.frames_sent += 1

    def _fail(self, code: int, message: str) -> None:
        if self.state is not State.CLOSED:
            self._send(Error(code, message))
            self.state = State.CLOSED

    def close(self, reason: str = "") -> None:
        """Queue a Close and stop; idempotent, so adapters may call it in `finally:`."""
        if self.state is not State.CLOSED:
            self._send(Close(reason))
            self.state = State.CLOSED

    def _ended_by(
        self, message: Message, closed: Callable[[str], Event]
    ) -> list[Event] | None:
        """A Close (reported as `closed(reason)`) or an Error from the peer ends the connection,
        on either side; None for every other message."""
        if isinstance(message, Close):
            self.state = State.CLOSED
            return [closed(message.reason)]
        if isinstance(message, Error):
            self.state = State.CLOSED
            return [ErrorReceived(message.code, message.message)]
        return None


class DeviceConnection(_Connection):
    """The device's side: Hello, OpenSession, then Draft/Verdict (or RowRequest/RowReply) rounds.

    Methods queue frames and raise `ProtocolError` on misuse without changing state.
    `receive_frame` raises `ProtocolError` on an invalid or unexpected frame after queueing an
    Error frame for the companion and moving to CLOSED, so the adapter sends and closes.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(limits)
        self.peer_limits: Limits = Limits()  # replaced by the companion's in HelloOk
        self.hello_ok: HelloOk | None = None
        self.session_id: int | None = None
        self.round = 0  # number of the next draft in this session
        self._hello: Hello | None = None
        self._draft: Draft | None = None  # the outstanding draft, if any
        self._s0_owed = False  # its DraftS0 is still to be sent (s0_on_device)
        self._row_pending = False
        # the first position's candidates SessionOpened carried, until round 0's verdict
        self.opening: tuple[tuple[int, ...], tuple[float, ...]] | None = None

    def hello(
        self,
        generalist_sha256: str,
        specialist_sha256: str = "",
        *,
        auth_token: str = "",
        client_name: str = "specsteer-python",
    ) -> None:
        """Queue the Hello: first frame of every connection."""
        self._require(State.START, action="send Hello")
        self._hello = Hello(generalist_sha256, specialist_sha256, auth_token, client_name)
        self._send(self._hello)
        self.state = State.HANDSHAKE

    def open_session(
        self,
        prompt_ids: Sequence[int],
        settings: SessionSettings | None = None,
    ) -> OpenSession:
        """Queue an OpenSession (the method's defaults without `settings`); an open session
        (with nothing outstanding) is replaced."""
        settings = settings if settings is not None else SessionSettings()
        self._require(State.READY, State.SESSION, action="open a session")
        prompt = self._check_ids("prompt ids", prompt_ids, self.peer_limits.max_prompt_tokens)
        request = OpenSession(prompt, settings)
        self._start_session(request)
        return request

    def resume_session(
        self,
        prompt_ids: Sequence[int],
        committed_ids: Sequence[int],
        settings: SessionSettings,
        round_: int = 0,
    ) -> Resume:
        """Queue a Resume: rebuild a session (on a fresh connection, usually another companion)
        from the public prompt, the tokens committed so far and the settings; the next Draft
        carries number `round_`. An open session (with nothing outstanding) is replaced."""
        self._require(State.READY, State.SESSION, action="resume a session")
        peer = self.peer_limits
        request = Resume(
            self._check_ids("prompt ids", prompt_ids, peer.max_prompt_tokens),
            self._check_ids("committed ids", committed_ids, peer.max_prompt_tokens),
            settings,
            round_,
        )
        self._start_session(request)
        return request

    def _start_session(self, request: OpenSession | Resume) -> None:
        """Send an OpenSession or a Resume within the companion's limits; await SessionOpened."""
        if request.settings.top_k > self.peer_limits.max_top_k:
            raise ProtocolError(
                ErrorCode.LIMIT_EXCEEDED,
                f"top_k={request.settings.top_k} exceeds the companion's limit of "
                f"{self.peer_limits.max_top_k}",
            )
        self._send_checked(request, self.peer_limits)
        self.session = request
        self.session_id = None
        self.state = State.OPENING

    def send_draft(
        self,
        draft_ids: Sequence[int],
        *,
        committed_ids: Sequence[int] = (),
    ) -> int:
        """Queue this round's Draft; return its round number (the Verdict must echo it).

        In a session opened with `s0_on_device` a `send_draft_s0` must follow before the
        Verdict can be accepted.
        """
        self._require(State.SESSION, action="send a Draft")
        assert self.session is not None
        if self.session.settings.mode is Mode.ROWS:
            raise ProtocolError(
                ErrorCode.OUT_OF_ORDER, "a ROWS session takes request_row, not drafts"
            )
        peer = self.peer_limits
        draft = Draft(
            self.round,
            self._check_ids("committed ids", committed_ids, peer.max_committed),
            self._check_ids("draft ids", draft_ids, peer.max_draft),
        )
        self._send_checked(draft, peer)
        self._draft = draft
        self._s0_owed = self.session.settings.s0_on_device
        self.state = State.WAITING
        return draft.round

    def send_draft_s0(self, logp_s0: Sequence[float]) -> None:
        """Queue P_S0's log-probabilities of the outstanding Draft's ids (`s0_on_device`
        sessions; once per Draft, after it)."""
        self._require(State.WAITING, action="send a DraftS0")
        draft = _check_draft_s0(self.round, len(logp_s0), self._draft, self._s0_owed)
        self._send_checked(DraftS0(draft.round, logp_s0), self.peer_limits)
        self._s0_owed = False

    def request_row(self, committed_ids: Sequence[int] = ()) -> None:
        """Queue a RowRequest (ROWS sessions): commit these ids, ask for the next row."""
        self._require(State.SESSION, action="request a row")
        assert self.session is not None
        if self.session.settings.mode is not Mode.ROWS:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "only a ROWS session takes request_row")
        peer = self.peer_limits
        ids = self._check_ids("committed ids", committed_ids, peer.max_committed)
        self._send_checked(RowRequest(ids), peer)
        self._row_pending = True
        self.state = State.WAITING

    def receive_frame(self, data: bytes) -> list[Event]:
        """Handle one frame from the companion; return what happened.

        Frames arriving after CLOSED are counted and ignored: the companion may have sent them
        before it saw our Close.
        """
        self._count_received(data)
        if self.state is State.CLOSED:
            return []
        try:
            return self._handle(decode(data, self.limits))
        except ProtocolError as exc:
            self._fail(exc.code, str(exc))
            raise

    def _handle(self, message: Message) -> list[Event]:
        if (ended := self._ended_by(message, Closed)) is not None:
            return ended
        if isinstance(message, HelloOk) and self.state is State.HANDSHAKE:
            return [self._on_hello_ok(message)]
        if isinstance(message, SessionOpened) and self.state is State.OPENING:
            assert self.session is not None
            held = _held(self.session)
            if message.prompt_length != held:
                raise ProtocolError(
                    ErrorCode.BAD_VALUE,
                    f"companion holds {message.prompt_length} prompt tokens, device sent {held}",
                )
            self.opening = self._check_opening(message)
            self.session_id, self.round = message.session_id, _first_round(self.session)
            self.state = State.SESSION
            return [SessionReady(message.session_id, message.prompt_length)]
        if isinstance(message, Verdict) and self._draft is not None:
            return [self._on_verdict(message)]
        if isinstance(message, RowReply) and self._row_pending:
            assert self.session is not None
            _check_candidate_count(len(message.ids), "row", self.session)
            self._row_pending = False
            self.state = State.SESSION
            return [RowReceived(message)]
        raise self._unexpected(message)

    def _check_opening(self, message: SessionOpened
                       ) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """SessionOpened's candidates, where a session may carry them (a fresh SPECSTEER
        session, P_S0 on the device, greedy): a first-round verdict's, so as many as one."""
        if not message.ids:
            return None
        session = self.session
        assert session is not None
        _check_opening_candidates(len(message.ids), session)
        return self._check_ids("opening ids", message.ids, session.settings.top_k), message.values

    def _on_hello_ok(self, message: HelloOk) -> HelloAccepted:
        assert self._hello is not None
        for what, expected, got in (
            ("Generalist", self._hello.generalist_sha256, message.generalist_sha256),
            ("Specialist", self._hello.specialist_sha256, message.specialist_sha256),
        ):
            # an empty Specialist hash: the companion hosts no generic Specialist, so only
            # sessions with P_S0 on the device will open (it refuses the others at open)
            if expected and expected != got and (got or what == "Generalist"):
                raise ProtocolError(
                    ErrorCode.MODEL_MISMATCH,
                    f"companion serves {what} {got or '(none)'}, device expects {expected}",
                )
        self.hello_ok = message
        self.peer_limits = message.limits()
        self.limits = replace(self.limits, vocab_size=message.vocab_size)
        self.state = State.READY
        return HelloAccepted(message)

    def _on_verdict(self, message: Verdict) -> VerdictReceived:
        draft, session = self._draft, self.session
        assert draft is not None and session is not None
        if message.round != draft.round:
            raise ProtocolError(
                ErrorCode.OUT_OF_ORDER,
                f"verdict for round {message.round} while round {draft.round} is outstanding",
            )
        if self._s0_owed:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER,
                                f"verdict for round {draft.round} before its DraftS0 was sent")
        if message.accepted > len(draft.draft_ids):
            raise ProtocolError(
                ErrorCode.BAD_VALUE,
                f"verdict accepts {message.accepted} of {len(draft.draft_ids)} drafts",
            )
        _check_candidate_count(len(message.ids), "verdict", session)
        self._draft = None
        self.round += 1
        self.opening = None
        self.state = State.SESSION
        return VerdictReceived(message)


class CompanionConnection(_Connection):
    """The companion's side of one device connection.

    `receive_frame` never raises: an invalid or unexpected frame queues an Error frame, moves
    to CLOSED and returns `[ConnectionFailed(code, message)]`, so the server adapter only sends
    `data_to_send()` and closes. Reply methods raise `ProtocolError` on misuse (a server bug),
    without changing state.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(limits)
        self.hello: Hello | None = None
        self.session_id: int | None = None
        self.round = 0  # number the next Draft must carry
        self._draft: Draft | None = None
        self._s0_owed = False  # the outstanding Draft's DraftS0 has not arrived (s0_on_device)
        self._row_pending = False

    def receive_frame(self, data: bytes) -> list[Event]:
        """Handle one frame from the device; never raises (see the class docstring)."""
        return self._receive(len(data), lambda: decode(data, self.limits))

    def receive_message(self, message: Message, size: int) -> list[Event]:
        """Handle a message an adapter already decoded, with this connection's `limits`, from
        a frame of `size` bytes (a server's admission gate decodes each frame once); never
        raises."""
        return self._receive(size, lambda: message)

    def _receive(self, size: int, message: Callable[[], Message]) -> list[Event]:
        self.bytes_received += size
        self.frames_received += 1
        if self.state is State.CLOSED:
            return []
        try:
            return self._handle(message())
        except ProtocolError as exc:
            code, text = exc.code, str(exc)
        except Exception as exc:  # a bug here must not take the server loop down
            code, text = ErrorCode.INTERNAL, f"internal error ({type(exc).__name__})"
        self.fail(code, text)
        return [ConnectionFailed(code, text)]

    def _handle(self, message: Message) -> list[Event]:
        if (ended := self._ended_by(message, CloseRequested)) is not None:
            return ended
        if isinstance(message, Hello) and self.state is State.START:
            self.hello = message
            self.state = State.HANDSHAKE
            return [HelloReceived(message)]
        if isinstance(message, OpenSession | Resume) and self.state in (
            State.READY,
            State.SESSION,
        ):
            self.session = message
            self.session_id = None
            self.state = State.OPENING
            if isinstance(message, Resume):
                return [ResumeRequested(message)]
            return [SessionRequested(message)]
        if isinstance(message, Draft) and self.state is State.SESSION:
            return [self._on_draft(message)]
        if isinstance(message, DraftS0) and self.state is State.WAITING \
                and self._draft is not None:
            return [self._on_draft_s0(message)]
        if isinstance(message, RowRequest) and self.state is State.SESSION:
            assert self.session is not None
            if self.session.settings.mode is not Mode.ROWS:
                raise ProtocolError(
                    ErrorCode.OUT_OF_ORDER,
                    f"RowRequest in a {self.session.settings.mode.name} session",
                )
            self._row_pending = True
            self.state = State.WAITING
            return [RowRequested(message)]
        raise self._unexpected(message)

    def _on_draft(self, message: Draft) -> DraftReceived:
        session = self.session
        assert session is not None
        if session.settings.mode is Mode.ROWS:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "Draft in a ROWS session")
        if message.round != self.round:
            raise ProtocolError(
                ErrorCode.OUT_OF_ORDER, f"Draft for round {message.round}, expected {self.round}"
            )
        self._draft, self._s0_owed = message, session.settings.s0_on_device
        self.state = State.WAITING
        return DraftReceived(message)

    def _on_draft_s0(self, message: DraftS0) -> DraftS0Received:
        _check_draft_s0(message.round, len(message.logp_s0), self._draft, self._s0_owed)
        self._s0_owed = False
        return DraftS0Received(message)

    def accept_hello(
        self,
        *,
        companion_version: str,
        generalist_sha256: str,
        specialist_sha256: str,
        vocab_size: int,
    ) -> HelloOk:
        """Queue HelloOk with this side's limits; ids are checked against `vocab_size` from now."""
        self._require(State.HANDSHAKE, action="accept a Hello")
        limits = replace(self.limits, vocab_size=vocab_size)
        reply = HelloOk(
            companion_version,
            generalist_sha256,
            specialist_sha256,
            vocab_size,
            limits.max_draft,
            limits.max_prompt_tokens,
            limits.max_message_bytes,
            limits.max_top_k,
        )
        self.limits = limits
        self._send(reply)
        self.state = State.READY
        return reply

    def session_opened(self, session_id: int, prompt_length: int | None = None,
                       ids: Sequence[int] = (), values: Sequence[float] = ()) -> None:
        """Queue SessionOpened once the prompt is prefilled; the next Draft is round 0 (after a
        Resume, the round it names). `ids`/`values`: the first position's candidates (see
        `SessionOpened`), or none."""
        self._require(State.OPENING, action="confirm a session")
        assert self.session is not None
        length = _held(self.session) if prompt_length is None else prompt_length
        _check_opening_candidates(len(ids), self.session)
        self._send(SessionOpened(session_id, length, tuple(ids), tuple(values)))
        self.session_id, self.round = session_id, _first_round(self.session)
        self.state = State.SESSION

    def send_verdict(self, accepted: int, ids: Sequence[int], values: Sequence[float]) -> Verdict:
        """Queue the Verdict of the outstanding Draft (its round is filled in)."""
        self._require(State.WAITING, action="send a Verdict")
        draft, session = self._draft, self.session
        if draft is None or session is None:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "no Draft is outstanding")
        if self._s0_owed:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "the Draft's DraftS0 has not arrived")
        if not 0 <= accepted <= len(draft.draft_ids):
            raise ProtocolError(
                ErrorCode.BAD_VALUE, f"accepted={accepted} outside 0..{len(draft.draft_ids)}"
            )
        verdict = Verdict(draft.round, accepted, ids, values)
        self._check_reply_ids(verdict.ids, session)
        self._send(verdict)
        self._draft = None
        self.round += 1
        self.state = State.SESSION
        return verdict

    def send_row(
        self, ids: Sequence[int], logp_g: Sequence[float], logp_s0: Sequence[float]
    ) -> RowReply:
        """Queue the RowReply of the outstanding RowRequest."""
        self._require(State.WAITING, action="send a row")
        if not self._row_pending or self.session is None:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "no RowRequest is outstanding")
        row = RowReply(ids, logp_g, logp_s0)
        self._check_reply_ids(row.ids, self.session)
        self._send(row)
        self._row_pending = False
        self.state = State.SESSION
        return row

    def _check_reply_ids(self, ids: tuple[int, ...], session: OpenSession | Resume) -> None:
        _check_candidate_count(len(ids), "reply", session)
        vocab = self.limits.vocab_size
        if vocab is not None and ids and ids[-1] >= vocab:
            raise ProtocolError(ErrorCode.BAD_TOKEN, f"reply holds id {ids[-1]} >= vocab {vocab}")

    def fail(self, code: int, message: str) -> None:
        """Queue an Error frame and move to CLOSED (refusals: auth, model mismatch, limits)."""
        self._fail(code, message)
