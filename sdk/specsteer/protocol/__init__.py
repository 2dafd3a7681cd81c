"""The SpecSteer wire protocol: versioned binary messages and sans-I/O state machines.

This package owns the bytes that cross the network between the device and the companion and the
order in which they may cross, in the layout of python-websockets: `messages` (the wire enums,
`Limits` and the message dataclasses with their validation), `codec` (`encode`/`decode`),
`events` (what a state machine reports) and `connections` (`State`, `DeviceConnection`,
`CompanionConnection`), and `audit` (`describe_frame`: frames made readable for people).
It does no I/O, no model work and no decoding maths, and never encodes
anything derived from the private context other than drafted token ids. Import from here: the
public names below are the package's interface; its modules' layout is not.
"""

from __future__ import annotations

from specsteer.protocol.audit import describe_frame
from specsteer.protocol.codec import decode, encode
from specsteer.protocol.connections import (
    CompanionConnection,
    DeviceConnection,
    State,
    takes_opening_candidates,
)
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
    PROTOCOL_VERSION,
    Close,
    Draft,
    DraftS0,
    Error,
    ErrorCode,
    Hello,
    HelloOk,
    Limits,
    Message,
    MessageType,
    Mode,
    OpenSession,
    Resume,
    RowReply,
    RowRequest,
    SessionOpened,
    SessionSettings,
    Verdict,
)

__all__ = [
    "describe_frame",
    "PROTOCOL_VERSION",
    "Close",
    "Closed",
    "CloseRequested",
    "CompanionConnection",
    "ConnectionFailed",
    "DeviceConnection",
    "Draft",
    "DraftReceived",
    "DraftS0",
    "DraftS0Received",
    "Error",
    "ErrorCode",
    "ErrorReceived",
    "Event",
    "Hello",
    "HelloAccepted",
    "HelloOk",
    "HelloReceived",
    "Limits",
    "Message",
    "MessageType",
    "Mode",
    "OpenSession",
    "Resume",
    "ResumeRequested",
    "RowReceived",
    "RowReply",
    "RowRequest",
    "RowRequested",
    "SessionSettings",
    "SessionOpened",
    "SessionReady",
    "SessionRequested",
    "State",
    "Verdict",
    "VerdictReceived",
    "decode",
    "encode",
    "takes_opening_candidates",
]
