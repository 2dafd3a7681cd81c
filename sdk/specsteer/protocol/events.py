"""Events: what a state machine in `connections` reports after it handles a received frame.

Each side's `receive_frame` returns a list of these frozen dataclasses; the adapter acts on them
(reply, hand a verdict to the decoding loop, close). They carry decoded messages or their
fields, never bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from specsteer.protocol.messages import (
    Draft,
    DraftS0,
    Hello,
    HelloOk,
    OpenSession,
    Resume,
    RowReply,
    RowRequest,
    Verdict,
)


@dataclass(frozen=True)
class HelloAccepted:
    """Device: the companion accepted the Hello; its limits now bound what the device sends."""

    hello_ok: HelloOk


@dataclass(frozen=True)
class SessionReady:
    """Device: the session is open; drafts (or row requests) may follow."""

    session_id: int
    prompt_length: int


@dataclass(frozen=True)
class VerdictReceived:
    """Device: the verdict of the outstanding draft."""

    verdict: Verdict


@dataclass(frozen=True)
class RowReceived:
    """Device: the row asked for by the outstanding RowRequest."""

    row: RowReply


@dataclass(frozen=True)
class Closed:
    """Device: the companion closed the connection."""

    reason: str


@dataclass(frozen=True)
class ErrorReceived:
    """Either side: the peer sent an Error; the connection is closed. `code` may be a code this
    version does not know, hence a plain int."""

    code: int
    message: str


@dataclass(frozen=True)
class HelloReceived:
    """Companion: a device said Hello; check its token and hashes, then accept_hello or fail."""

    hello: Hello


@dataclass(frozen=True)
class SessionRequested:
    """Companion: the device asks for a session; prefill, then session_opened or fail."""

    request: OpenSession


@dataclass(frozen=True)
class ResumeRequested:
    """Companion: the device asks to rebuild a session from its public state; prefill prompt
    and committed tokens, then session_opened or fail."""

    request: Resume


@dataclass(frozen=True)
class DraftReceived:
    """Companion: a draft to verify; answer with send_verdict (with `s0_on_device`, once its
    `DraftS0Received` is in: score it with the Generalist meanwhile)."""

    draft: Draft


@dataclass(frozen=True)
class DraftS0Received:
    """Companion: P_S0's values of the outstanding draft (`s0_on_device`); send_verdict now."""

    s0: DraftS0


@dataclass(frozen=True)
class RowRequested:
    """Companion: a row to compute; answer with send_row."""

    request: RowRequest


@dataclass(frozen=True)
class CloseRequested:
    """Companion: the device closed the connection."""

    reason: str


@dataclass(frozen=True)
class ConnectionFailed:
    """Companion: the device sent something invalid. An Error frame is queued and the state is
    CLOSED: the adapter sends `data_to_send()` and closes the socket."""

    code: int
    message: str


Event: TypeAlias = (
    HelloAccepted
    | SessionReady
    | VerdictReceived
    | RowReceived
    | Closed
    | ErrorReceived
    | HelloReceived
    | SessionRequested
    | ResumeRequested
    | DraftReceived
    | DraftS0Received
    | RowRequested
    | CloseRequested
    | ConnectionFailed
)
