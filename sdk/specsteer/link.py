"""The device's side of the conversation with a companion, over any frame channel.

`CompanionLink` drives the sans-I/O `DeviceConnection` over a `FrameChannel` (a websocket, or an
in-process endpoint in tests and the evaluation harness): request in, reply out, with byte and
time accounting. It only ever encodes public prompt ids, drafted ids and, when the deployment
places P_S0 on the device, the context-free Specialist's log-probabilities of those drafts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from specsteer.errors import (
    CompanionAuthError,
    CompanionError,
    CompanionModelMismatch,
    CompanionTimedOut,
    CompanionUnavailable,
    CompanionVersionMismatch,
    GenerationCancelled,
    ProtocolError,
)
from specsteer.options import stat
from specsteer.protocol import (
    DeviceConnection,
    ErrorCode,
    ErrorReceived,
    HelloAccepted,
    HelloOk,
    OpenSession,
    RowReceived,
    RowReply,
    SessionReady,
    SessionSettings,
    State,
    Verdict,
    VerdictReceived,
)


class FrameChannel(Protocol):
    """A message-oriented pipe to a companion (one frame = one protocol message)."""

    def send(self, frame: bytes) -> None: ...

    def recv(self, timeout: float) -> bytes:
        """Next frame; raise CompanionUnavailable on timeout or a dropped connection."""
        ...

    def close(self) -> None: ...


class PollableChannel(FrameChannel, Protocol):
    """A channel that can say, without blocking, whether a frame has arrived (optional)."""

    def poll(self) -> bytes | None: ...


# what no retry fixes: raised as `CompanionRefused` types, never handled as "offline"
_REFUSALS: dict[int, type[CompanionError]] = {
    ErrorCode.AUTH_FAILED: CompanionAuthError,
    ErrorCode.MODEL_MISMATCH: CompanionModelMismatch,
    ErrorCode.BAD_VERSION: CompanionVersionMismatch,
}


def companion_error(code: int, message: str) -> CompanionError:
    """The error a companion's `Error` frame (or this side's check of its answer) stands for:
    a typed refusal (`CompanionRefused`) for a wrong token, other models or another protocol
    version, else a plain `CompanionError`."""
    return _REFUSALS.get(code, CompanionError)(code, message)


FrameTap = Callable[[str, bytes], None]  # ("up" | "down", frame): sees every frame, for audits
CANCEL_POLL_S = 0.05  # with a cancel event, a wait for a reply looks at it this often


@dataclass
class LinkStats:
    """Wire cost and waiting time as the device saw them, over every link of a generation."""

    bytes_up: int = stat(0, "bytes sent to the companion (frames as they travel)")
    bytes_down: int = stat(0, "bytes received from the companion")
    frames_up: int = stat(0, "frames sent to the companion")
    frames_down: int = stat(0, "frames received from the companion")
    wait_s: float = stat(0.0, "seconds waited for the companion: its compute and the network, "
                              "as measured on the device")
    requests: int = stat(0, "replies waited for from the companion (hello, session, rounds)")

    def add_bytes(self, other: LinkStats) -> None:
        """Count `other`'s frames and bytes here too (a link opened ahead of the request)."""
        self.bytes_up += other.bytes_up
        self.bytes_down += other.bytes_down
        self.frames_up += other.frames_up
        self.frames_down += other.frames_down


class CompanionLink:
    """Request/response calls to a companion over a FrameChannel.

    cancel: once set, a wait for a reply (hello, session, verdict, row) raises
    `GenerationCancelled` within `CANCEL_POLL_S` instead of waiting for it; the caller then
    closes the link, which ends the companion's session.
    """

    def __init__(
        self,
        channel: FrameChannel,
        *,
        timeout: float = 30.0,
        tap: FrameTap | None = None,
        stats: LinkStats | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.channel = channel
        self.timeout = timeout
        self.cancel = cancel
        self.tap = tap
        self.conn = DeviceConnection()
        self.stats = stats if stats is not None else LinkStats()  # shared across reconnects
        self.hello_ok: HelloOk | None = None
        self._early: list[bytes] = []  # frames taken by `reply_ready` before anyone waited
        self._submitted_at: float | None = None
        self._reply_seen_at: float | None = None

    def _flush(self) -> None:
        for frame in self.conn.data_to_send():
            if self.tap is not None:
                self.tap("up", frame)
            self.stats.bytes_up += len(frame)
            self.stats.frames_up += 1
            self.channel.send(frame)

    def _await(self, wanted: type) -> object:
        self._flush()
        return self._wait(wanted)

    def _wait(self, wanted: type) -> object:
        started = time.perf_counter()
        try:
            while True:
                if self._early:
                    frame = self._early.pop(0)
                else:
                    frame = self._recv()
                    self._reply_seen_at = self._reply_seen_at or time.perf_counter()
                if self.tap is not None:
                    self.tap("down", frame)
                self.stats.bytes_down += len(frame)
                self.stats.frames_down += 1
                try:
                    events = self.conn.receive_frame(frame)
                except ProtocolError as exc:
                    self._flush_quietly()
                    if exc.code in _REFUSALS:  # its answer shows other models or version
                        raise companion_error(exc.code, str(exc)) from exc
                    raise
                for event in events:
                    if isinstance(event, ErrorReceived):
                        raise companion_error(event.code, event.message)
                    if isinstance(event, wanted):
                        return event
        finally:
            self.stats.wait_s += time.perf_counter() - started
            self.stats.requests += 1

    def _recv(self) -> bytes:
        """The next frame within `timeout`, in slices that look at `cancel` between them."""
        if self.cancel is None:
            return self.channel.recv(self.timeout)
        deadline = time.perf_counter() + self.timeout
        while True:
            if self.cancel.is_set():
                raise GenerationCancelled("cancelled while waiting for the companion")
            left = deadline - time.perf_counter()
            try:
                return self.channel.recv(max(0.0, min(left, CANCEL_POLL_S)))
            except CompanionTimedOut as exc:
                if left <= CANCEL_POLL_S:
                    raise CompanionTimedOut(
                        f"no answer from the companion within {self.timeout:.1f} s") from exc

    def _flush_quietly(self) -> None:
        with contextlib.suppress(CompanionUnavailable):
            self._flush()

    def hello(
        self,
        *,
        generalist_sha256: str = "",
        specialist_sha256: str = "",
        auth_token: str = "",
        client_name: str = "specsteer-python",
    ) -> HelloOk:
        self.conn.hello(
            generalist_sha256, specialist_sha256, auth_token=auth_token, client_name=client_name
        )
        event = self._await(HelloAccepted)
        assert isinstance(event, HelloAccepted)
        self.hello_ok = event.hello_ok
        return event.hello_ok

    def open(self, prompt_ids: Sequence[int], settings: SessionSettings) -> int:
        """Open a session over the public prompt; returns the prompt length the companion holds."""
        self.conn.open_session(list(prompt_ids), settings)
        event = self._await(SessionReady)
        assert isinstance(event, SessionReady)
        return event.prompt_length

    def holds(self, prompt_ids: Sequence[int], settings: SessionSettings) -> bool:
        """Whether a session over exactly this prompt with these settings is open and unused
        (opened ahead of the request by `Client.prepare`): no need to open it again."""
        session = self.conn.session
        return (self.conn.state is State.SESSION and self.conn.round == 0
                and isinstance(session, OpenSession) and session.settings == settings
                and list(session.prompt_ids) == list(prompt_ids))

    def resume(
        self,
        prompt_ids: Sequence[int],
        committed_ids: Sequence[int],
        settings: SessionSettings,
        round_: int = 0,
    ) -> int:
        """Rebuild a session from public state (prompt, committed tokens, settings, the next
        round's number); returns the tokens the companion now holds."""
        self.conn.resume_session(list(prompt_ids), list(committed_ids), settings, round_)
        event = self._await(SessionReady)
        assert isinstance(event, SessionReady)
        return event.prompt_length

    def verify(
        self,
        draft: Sequence[int],
        committed: Sequence[int] = (),
        logp_s0: Sequence[float] | None = None,
    ) -> Verdict:
        """One round at once: the draft, its P_S0 values (`s0_on_device`), the verdict."""
        self.submit_draft(draft, committed)
        if logp_s0 is not None:
            self.send_draft_s0(logp_s0)
        return self.wait_verdict()

    def submit_draft(self, draft: Sequence[int], committed: Sequence[int] = ()) -> None:
        """Send a draft without waiting, so the device can work while it is verified."""
        self.conn.send_draft(list(draft), committed_ids=list(committed))
        self._flush()
        self._submitted_at, self._reply_seen_at = time.perf_counter(), None

    def send_draft_s0(self, logp_s0: Sequence[float]) -> None:
        """Send P_S0's values of the submitted draft (`s0_on_device`): the companion scores
        the draft with the Generalist while the device computes them."""
        self.conn.send_draft_s0(list(logp_s0))
        self._flush()

    def reply_ready(self) -> bool:
        """True once a reply has arrived (never blocks; False if the channel cannot tell)."""
        if not self._early:
            poll = getattr(self.channel, "poll", None)
            frame = poll() if poll is not None else None
            if frame is not None:
                self._early.append(frame)
                self._reply_seen_at = self._reply_seen_at or time.perf_counter()
        return bool(self._early)

    @property
    def last_round_s(self) -> float | None:
        """Seconds from the last draft's submission until its reply was first seen.

        Seen: returned by the channel, or noticed by `reply_ready` (so a device busy drafting
        ahead sees it up to one draft step late).
        """
        if self._submitted_at is None or self._reply_seen_at is None:
            return None
        return self._reply_seen_at - self._submitted_at

    def opening_candidates(self) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """The first position's candidates (ids, logp_G) SessionOpened carried, until round
        0's verdict arrives; None if it carried none."""
        return self.conn.opening

    def wait_verdict(self) -> Verdict:
        event = self._wait(VerdictReceived)
        assert isinstance(event, VerdictReceived)
        return event.verdict

    def row(self, committed: Sequence[int] = ()) -> RowReply:
        self.conn.request_row(list(committed))
        event = self._await(RowReceived)
        assert isinstance(event, RowReceived)
        return event.row

    def close(self) -> None:
        try:
            self.conn.close()
            self._flush()
        except (ProtocolError, CompanionUnavailable):
            pass
        finally:
            self.channel.close()
