"""The SpecSteer wire protocol: versioned binary messages and sans-I/O state machines.

This module owns the bytes that cross the network between the device and the companion and the
order in which they may cross: message dataclasses, `encode`/`decode`, `Limits`, `ErrorCode`,
and one state machine per side (`DeviceConnection`, `CompanionConnection`). It does no I/O
(adapters move frames; one websocket message carries exactly one protocol frame), no model work
and no decoding maths. It never encodes anything derived from the private context other than
drafted token ids: every field is either public (prompt, committed text, hashes, settings), a
drafted id, or a value computed from public data only (logp_S0 of the drafts, the companion's
sparse verdict). Nothing here accepts a logit row, a history record or a P_Sc value.

Frame layout: byte 0 is the protocol version, byte 1 the message type, then a compact body:
unsigned LEB128 varints for counts, ids, rounds and lengths (minimal encoding only, so every
valid frame has exactly one encoding), fixed little-endian u8/u16/u64/f32 for typed settings,
raw little-endian float16 arrays for values, and UTF-8 strings prefixed by their byte length.
Sparse id sets are sorted; the first id is absolute and each next one is `gap - 1`, so
duplicates cannot be expressed; their values are reordered with them.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

import numpy as np

from specsteer.errors import ProtocolError

__all__ = [
    "PROTOCOL_VERSION",
    "Close",
    "Closed",
    "CloseRequested",
    "CompanionConnection",
    "ConnectionFailed",
    "DeviceConnection",
    "Draft",
    "DraftReceived",
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
    "RowReceived",
    "RowReply",
    "RowRequest",
    "RowRequested",
    "Select",
    "SessionOpened",
    "SessionReady",
    "SessionRequested",
    "State",
    "Verdict",
    "VerdictReceived",
    "decode",
    "encode",
]

PROTOCOL_VERSION = 1
"""Byte 0 of every frame. A peer speaking another version gets `ErrorCode.BAD_VERSION`."""

_MAX_ID = 2**32 - 1  # token ids are u32 on both sides; no tokenizer comes near this.
_MAX_U64 = 2**64 - 1


class MessageType(enum.IntEnum):
    """Byte 1 of every frame."""

    HELLO = 1
    HELLO_OK = 2
    OPEN_SESSION = 3
    SESSION_OPENED = 4
    DRAFT = 5
    VERDICT = 6
    ROW_REQUEST = 7
    ROW_REPLY = 8
    CLOSE = 9
    ERROR = 10


class ErrorCode(enum.IntEnum):
    """Codes carried by `Error` frames and by `ProtocolError.code`.

    Codes are u16 on the wire; a peer may send a code this version does not know, so received
    codes stay plain ints (see `ErrorReceived`).
    """

    BAD_FRAME = 1  # malformed: empty, truncated, trailing bytes, bad varint/UTF-8/bool byte
    UNKNOWN_TYPE = 2  # byte 1 names no message type
    BAD_VERSION = 3  # byte 0 is not PROTOCOL_VERSION
    OUT_OF_ORDER = 4  # a well-formed message this side does not expect in its current state
    TOO_LARGE = 5  # frame longer than Limits.max_message_bytes
    LIMIT_EXCEEDED = 6  # a count or top_k above the advertised limits
    BAD_TOKEN = 7  # a token id >= the vocabulary size (or beyond u32)
    BAD_VALUE = 8  # well-formed, but a value is invalid (NaN, accepted > K, missing logp_S0...)
    AUTH_FAILED = 9
    MODEL_MISMATCH = 10  # the peers do not hold the models they expect (sha256 differ)
    INTERNAL = 11  # a bug on the sending side; the message says no more than its type
    RATE_LIMITED = 12
    SESSION_LIMIT = 13  # the companion holds as many sessions as it can
    TIMEOUT = 14
    UNSUPPORTED = 15  # a valid request this companion does not serve (e.g. no hosted P_S0)


class Mode(enum.IntEnum):
    """What a session computes, chosen by the device in `OpenSession`."""

    SPECSTEER = 0  # Draft-Verify-Recover: ratio test, sparse fused candidates
    SPECULATIVE = 1  # classic speculative decoding: one correction/bonus id per verdict
    ROWS = 2  # one top-k row of logp_G and logp_S0 per token (LLM alone, CoSteer baselines)


class Select(enum.IntEnum):
    """How the companion picks the k candidate ids of a recovery/bonus position."""

    TOP_LOGP_G = 0  # top-k of logp_G: the measured default (see docs/METHOD.md, Recover)
    TOP_DIFFERENCE = 1  # top-k of logp_G - alpha*logp_S0: kept to report the difference


class State(enum.Enum):
    """Where a connection stands; the same phases on both sides."""

    START = "start"  # nothing exchanged yet
    HANDSHAKE = "handshake"  # Hello sent/received, HelloOk pending
    READY = "ready"  # handshake done, no session open
    OPENING = "opening"  # OpenSession sent/received, SessionOpened pending
    SESSION = "session"  # a session is open and no request is outstanding
    WAITING = "waiting"  # a Draft or RowRequest is outstanding
    CLOSED = "closed"  # Close or Error sent or received: nothing more is accepted


@dataclass(frozen=True)
class Limits:
    """Bounds a receiver enforces before it allocates anything.

    The companion advertises its limits in `HelloOk`, and the device checks its own outgoing
    messages against them, so a well-behaved device never trips them.
    """

    # A k=64 verdict is ~270 bytes and a 4k-token prompt ~12 KB (ids take <= 3 bytes for a
    # 152k vocabulary), so 64 KiB holds any legal message with room and caps what one frame
    # can make a receiver parse. Keep websockets' own max_size at least this large.
    max_message_bytes: int = 2**16
    # Speculative gains flatten past K~8 at useful acceptance rates; 16 leaves room to
    # experiment while bounding the companion's per-round verify pass.
    max_draft: int = 16
    # The public prompt is the request plus chat template; 8k tokens covers it and bounds the
    # companion's prefill per session. Also bounds committed ids per message.
    max_prompt_tokens: int = 8192
    # The method uses k=64; 1024 is enough for any recovery/baseline experiment and keeps a
    # ROWS reply near 6 KB instead of a 600 KB full fp32 row.
    max_top_k: int = 1024
    # Unknown until the handshake: the state machines fill it in from HelloOk/accept_hello.
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_draft", "max_prompt_tokens", "max_top_k"):
            _check_uint(name, getattr(self, name), _MAX_ID, minimum=1)
        if self.max_top_k > 0xFFFF:
            raise ProtocolError(ErrorCode.BAD_VALUE, "max_top_k must fit in u16 (top_k is u16)")
        if self.vocab_size is not None:
            _check_uint("vocab_size", self.vocab_size, _MAX_ID + 1, minimum=1)


# --------------------------------------------------------------------------------------------
# Value normalisation: a message object holds exactly what its frame carries, so that
# decode(encode(m)) == m and a reader of the dataclass sees the wire precision.


def _check_uint(name: str, value: object, maximum: int, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name} must be an int, got {value!r}")
    value = int(value)
    if not minimum <= value <= maximum:
        raise ProtocolError(
            ErrorCode.BAD_VALUE, f"{name}={value} is outside [{minimum}, {maximum}]"
        )
    return value


def _check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name} must be a str, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates cannot go on the wire
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name} is not encodable as UTF-8") from exc
    return value


def _ids(name: str, values: Iterable[int]) -> tuple[int, ...]:
    if isinstance(values, np.ndarray):
        values = values.reshape(-1).tolist()
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ProtocolError(ErrorCode.BAD_TOKEN, f"{name} holds a non-integer id {value!r}")
        value = int(value)
        if not 0 <= value <= _MAX_ID:
            raise ProtocolError(ErrorCode.BAD_TOKEN, f"{name} holds id {value} outside u32")
        out.append(value)
    return tuple(out)


def _f16s(name: str, values: Iterable[float]) -> tuple[float, ...]:
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name} must be a sequence of floats") from exc
    # Finite values beyond float16's range saturate to +-inf: a logp below -65504 is -inf.
    with np.errstate(over="ignore"):
        half = array.astype("<f2")
    if np.isnan(half).any():
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name} holds NaN")
    return tuple(half.astype(np.float64).tolist())


def _f32(name: str, value: object, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name} must be a float, got {value!r}")
    try:
        rounded: float = struct.unpack("<f", struct.pack("<f", float(value)))[0]
    except OverflowError as exc:
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name}={value} does not fit f32") from exc
    if not math.isfinite(rounded) or (minimum is not None and rounded < minimum):
        bound = "" if minimum is None else f" and >= {minimum}"
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name}={value} must be finite{bound}")
    return rounded


def _sorted_sparse(
    name: str, ids: tuple[int, ...], *columns: tuple[float, ...]
) -> tuple[tuple[int, ...], ...]:
    for column in columns:
        if len(column) != len(ids):
            raise ProtocolError(
                ErrorCode.BAD_VALUE, f"{name}: {len(ids)} ids but {len(column)} values"
            )
    order = sorted(range(len(ids)), key=ids.__getitem__)
    sorted_ids = tuple(ids[i] for i in order)
    if any(a == b for a, b in zip(sorted_ids, sorted_ids[1:], strict=False)):
        raise ProtocolError(ErrorCode.BAD_VALUE, f"{name} holds a duplicate id")
    return (sorted_ids, *(tuple(column[i] for i in order) for column in columns))


# --------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Hello:
    """Device -> companion, first frame: who is asking and for which models.

    The protocol version is byte 0 of the frame itself. `specialist_sha256` is empty when the
    deployment computes logp_S0 on the device (the companion then needs no Specialist).
    """

    generalist_sha256: str
    specialist_sha256: str = ""
    auth_token: str = ""
    client_name: str = ""

    def __post_init__(self) -> None:
        for name in ("generalist_sha256", "specialist_sha256", "auth_token", "client_name"):
            _check_str(name, getattr(self, name))


@dataclass(frozen=True)
class HelloOk:
    """Companion -> device: what it serves and the limits the device must respect."""

    companion_version: str
    generalist_sha256: str
    specialist_sha256: str
    vocab_size: int
    max_draft: int
    max_prompt_tokens: int
    max_message_bytes: int
    max_top_k: int

    def __post_init__(self) -> None:
        for name in ("companion_version", "generalist_sha256", "specialist_sha256"):
            _check_str(name, getattr(self, name))
        self.limits()  # validates the numbers with Limits' own rules

    def limits(self) -> Limits:
        """The advertised limits, with the vocabulary size, as a `Limits`."""
        return Limits(
            max_message_bytes=self.max_message_bytes,
            max_draft=self.max_draft,
            max_prompt_tokens=self.max_prompt_tokens,
            max_top_k=self.max_top_k,
            vocab_size=self.vocab_size,
        )


@dataclass(frozen=True)
class OpenSession:
    """Device -> companion: start one generation over a public, context-free prompt.

    Floats are stored rounded to f32, the precision that crosses the wire.
    """

    prompt_ids: tuple[int, ...]
    mode: Mode = Mode.SPECSTEER
    gamma: float = 0.5  # the method's default verification threshold
    alpha: float = 1.0  # steering strength; 1.0 is the derivation's value
    top_k: int = 64  # candidates per recovery position, the method's default
    temperature: float = 0.0  # 0 = greedy, as in the paper's experiments
    seed: int = 0
    select: Select = Select.TOP_LOGP_G  # measured better than top-k of the difference
    s0_on_device: bool = False  # the paper's placement: the companion hosts P_S0
    # nucleus cut inside the top-k: fewer candidates where P_G is confident (1.0 = exact top-k)
    top_p: float = 1.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "prompt_ids", _ids("prompt_ids", self.prompt_ids))
        set_(self, "top_p", _f32("top_p", self.top_p, minimum=0.0))
        if not 0.0 < self.top_p <= 1.0:
            raise ProtocolError(ErrorCode.BAD_VALUE, f"top_p must be in (0, 1], got {self.top_p}")
        try:
            set_(self, "mode", Mode(self.mode))
            set_(self, "select", Select(self.select))
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_VALUE, f"unknown mode or select: {exc}") from exc
        set_(self, "gamma", _f32("gamma", self.gamma, minimum=0.0))
        set_(self, "alpha", _f32("alpha", self.alpha))
        set_(self, "temperature", _f32("temperature", self.temperature, minimum=0.0))
        set_(self, "top_k", _check_uint("top_k", self.top_k, 0xFFFF, minimum=1))
        set_(self, "seed", _check_uint("seed", self.seed, _MAX_U64))
        if not isinstance(self.s0_on_device, (bool, np.bool_)):
            raise ProtocolError(ErrorCode.BAD_VALUE, "s0_on_device must be a bool")
        set_(self, "s0_on_device", bool(self.s0_on_device))


@dataclass(frozen=True)
class SessionOpened:
    """Companion -> device: the session exists and its caches hold the prompt."""

    session_id: int
    prompt_length: int

    def __post_init__(self) -> None:
        _check_uint("session_id", self.session_id, _MAX_U64)
        _check_uint("prompt_length", self.prompt_length, _MAX_ID)


@dataclass(frozen=True)
class Draft:
    """Device -> companion: one round's drafted ids, and the ids committed since last time.

    `committed_ids` are tokens the device appended that the companion has not seen (typically
    the token it chose from the previous verdict). `logp_s0` holds the context-free Specialist's
    log-probabilities of the drafts, present only when the session has `s0_on_device`.
    """

    round: int
    committed_ids: tuple[int, ...]
    draft_ids: tuple[int, ...]
    logp_s0: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _check_uint("round", self.round, _MAX_ID)
        object.__setattr__(self, "committed_ids", _ids("committed_ids", self.committed_ids))
        object.__setattr__(self, "draft_ids", _ids("draft_ids", self.draft_ids))
        if self.logp_s0 is not None:
            values = _f16s("logp_s0", self.logp_s0)
            if len(values) != len(self.draft_ids):
                raise ProtocolError(
                    ErrorCode.BAD_VALUE,
                    f"logp_s0 has {len(values)} values for {len(self.draft_ids)} drafts",
                )
            object.__setattr__(self, "logp_s0", values)


@dataclass(frozen=True)
class Verdict:
    """Companion -> device: how many drafts were accepted, and the sparse candidates for the
    position right after the accepted prefix (recovery if one was rejected, bonus otherwise).

    `values` are `logp_G - alpha*logp_S0` at `ids` (SPECSTEER) or 0 for the single correction
    id (SPECULATIVE). Ids are kept sorted, values reordered with them, as on the wire.
    """

    round: int
    accepted: int
    ids: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_uint("round", self.round, _MAX_ID)
        _check_uint("accepted", self.accepted, _MAX_ID)
        ids, values = _sorted_sparse("verdict", _ids("ids", self.ids), _f16s("values", self.values))
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "values", values)


@dataclass(frozen=True)
class RowRequest:
    """Device -> companion (ROWS mode): commit these ids and send the next position's row."""

    committed_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "committed_ids", _ids("committed_ids", self.committed_ids))


@dataclass(frozen=True)
class RowReply:
    """Companion -> device (ROWS mode): top-k of logp_G, with logp_G and logp_S0 at those ids."""

    ids: tuple[int, ...]
    logp_g: tuple[float, ...]
    logp_s0: tuple[float, ...]

    def __post_init__(self) -> None:
        ids, logp_g, logp_s0 = _sorted_sparse(
            "row",
            _ids("ids", self.ids),
            _f16s("logp_g", self.logp_g),
            _f16s("logp_s0", self.logp_s0),
        )
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "logp_g", logp_g)
        object.__setattr__(self, "logp_s0", logp_s0)


@dataclass(frozen=True)
class Close:
    """Either side: the sender is done; no reply is expected (websockets closes the socket)."""

    reason: str = ""

    def __post_init__(self) -> None:
        _check_str("reason", self.reason)


@dataclass(frozen=True)
class Error:
    """Either side: the sender failed or refused; the connection is over."""

    code: int
    message: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _check_uint("code", self.code, 0xFFFF))
        _check_str("message", self.message)


Message: TypeAlias = (
    Hello
    | HelloOk
    | OpenSession
    | SessionOpened
    | Draft
    | Verdict
    | RowRequest
    | RowReply
    | Close
    | Error
)


# --------------------------------------------------------------------------------------------
# Encoding


def _put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_str(out: bytearray, value: str) -> None:
    data = value.encode("utf-8")
    _put_varint(out, len(data))
    out += data


def _put_ids(out: bytearray, ids: Sequence[int]) -> None:
    _put_varint(out, len(ids))
    for token in ids:
        _put_varint(out, token)


def _put_sparse_ids(out: bytearray, ids: Sequence[int]) -> None:
    """Count, then sorted ids as first id and `gap - 1` deltas (ids are sorted and unique)."""
    _put_varint(out, len(ids))
    previous = -1
    for token in ids:
        _put_varint(out, token - previous - 1)
        previous = token


def _put_f16(out: bytearray, values: Sequence[float]) -> None:
    out += np.asarray(values, dtype="<f2").tobytes()


def _encode_hello(out: bytearray, m: Hello) -> None:
    for text in (m.auth_token, m.generalist_sha256, m.specialist_sha256, m.client_name):
        _put_str(out, text)


def _encode_hello_ok(out: bytearray, m: HelloOk) -> None:
    for text in (m.companion_version, m.generalist_sha256, m.specialist_sha256):
        _put_str(out, text)
    for number in (
        m.vocab_size,
        m.max_draft,
        m.max_prompt_tokens,
        m.max_message_bytes,
        m.max_top_k,
    ):
        _put_varint(out, number)


def _encode_open_session(out: bytearray, m: OpenSession) -> None:
    out += struct.pack(
        "<BBBfffHQf",
        m.mode,
        m.select,
        m.s0_on_device,
        m.gamma,
        m.alpha,
        m.temperature,
        m.top_k,
        m.seed,
        m.top_p,
    )
    _put_ids(out, m.prompt_ids)


def _encode_session_opened(out: bytearray, m: SessionOpened) -> None:
    _put_varint(out, m.session_id)
    _put_varint(out, m.prompt_length)


def _encode_draft(out: bytearray, m: Draft) -> None:
    _put_varint(out, m.round)
    _put_ids(out, m.committed_ids)
    # The draft count carries the "logp_S0 follows" flag in its low bit: one byte for both.
    _put_varint(out, len(m.draft_ids) << 1 | (m.logp_s0 is not None))
    for token in m.draft_ids:
        _put_varint(out, token)
    if m.logp_s0 is not None:
        _put_f16(out, m.logp_s0)


def _encode_verdict(out: bytearray, m: Verdict) -> None:
    _put_varint(out, m.round)
    _put_varint(out, m.accepted)
    _put_sparse_ids(out, m.ids)
    _put_f16(out, m.values)


def _encode_row_request(out: bytearray, m: RowRequest) -> None:
    _put_ids(out, m.committed_ids)


def _encode_row_reply(out: bytearray, m: RowReply) -> None:
    _put_sparse_ids(out, m.ids)
    _put_f16(out, m.logp_g)
    _put_f16(out, m.logp_s0)


def _encode_close(out: bytearray, m: Close) -> None:
    _put_str(out, m.reason)


def _encode_error(out: bytearray, m: Error) -> None:
    out += struct.pack("<H", m.code)
    _put_str(out, m.message)


_ENCODERS: dict[type, tuple[MessageType, Callable[[bytearray, Any], None]]] = {
    Hello: (MessageType.HELLO, _encode_hello),
    HelloOk: (MessageType.HELLO_OK, _encode_hello_ok),
    OpenSession: (MessageType.OPEN_SESSION, _encode_open_session),
    SessionOpened: (MessageType.SESSION_OPENED, _encode_session_opened),
    Draft: (MessageType.DRAFT, _encode_draft),
    Verdict: (MessageType.VERDICT, _encode_verdict),
    RowRequest: (MessageType.ROW_REQUEST, _encode_row_request),
    RowReply: (MessageType.ROW_REPLY, _encode_row_reply),
    Close: (MessageType.CLOSE, _encode_close),
    Error: (MessageType.ERROR, _encode_error),
}


def encode(message: Message) -> bytes:
    """One frame for `message`: version byte, type byte, body. Values were checked at
    construction, so encoding cannot fail for a message built through its dataclass."""
    try:
        kind, encoder = _ENCODERS[type(message)]
    except KeyError:
        raise TypeError(f"not a protocol message: {type(message).__name__}") from None
    out = bytearray((PROTOCOL_VERSION, kind))
    encoder(out, message)
    return bytes(out)


# --------------------------------------------------------------------------------------------
# Decoding


class _Reader:
    """A cursor over one frame's body; every read checks the bytes it needs are there."""

    __slots__ = ("_buf", "_pos", "_limits")

    def __init__(self, buf: bytes, pos: int, limits: Limits) -> None:
        self._buf = buf
        self._pos = pos
        self._limits = limits

    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def _take(self, size: int, what: str) -> int:
        if size > self.remaining():
            raise ProtocolError(ErrorCode.BAD_FRAME, f"frame truncated in {what}")
        start = self._pos
        self._pos += size
        return start

    def varint(self, what: str, bits: int = 32) -> int:
        buf, pos, result, shift = self._buf, self._pos, 0, 0
        for index in range((bits + 6) // 7):
            if pos >= len(buf):
                raise ProtocolError(ErrorCode.BAD_FRAME, f"frame truncated in {what}")
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and index > 0:
                    raise ProtocolError(ErrorCode.BAD_FRAME, f"over-long varint in {what}")
                if result >> bits:
                    raise ProtocolError(
                        ErrorCode.BAD_FRAME, f"varint overflow in {what} (more than {bits} bits)"
                    )
                self._pos = pos
                return result
            shift += 7
        raise ProtocolError(ErrorCode.BAD_FRAME, f"varint overflow in {what} (too many bytes)")

    def fixed(self, fmt: str, what: str) -> tuple:
        start = self._take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self._buf, start)

    def flag(self, what: str) -> bool:
        (value,) = self.fixed("<B", what)
        if value > 1:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"{what} must be 0 or 1, got {value}")
        return bool(value)

    def string(self, what: str) -> str:
        size = self.varint(f"{what} length")
        start = self._take(size, what)
        try:
            return self._buf[start : start + size].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"{what} is not valid UTF-8") from exc

    def count(self, what: str, limit: int, bytes_each: int = 1) -> int:
        """A count, checked against its limit and the bytes left before anything is built."""
        n = self.varint(f"{what} count")
        if n > limit:
            raise ProtocolError(ErrorCode.LIMIT_EXCEEDED, f"{n} {what} exceed the limit of {limit}")
        if n * bytes_each > self.remaining():
            raise ProtocolError(ErrorCode.BAD_FRAME, f"frame truncated in {what}")
        return n

    def _check_token(self, token: int, what: str) -> int:
        vocab = self._limits.vocab_size
        if vocab is not None and token >= vocab:
            raise ProtocolError(
                ErrorCode.BAD_TOKEN, f"{what} holds id {token}, not below vocab size {vocab}"
            )
        return token

    def ids(self, n: int, what: str) -> tuple[int, ...]:
        return tuple(self._check_token(self.varint(what), what) for _ in range(n))

    def sparse_ids(self, n: int, what: str) -> tuple[int, ...]:
        out: list[int] = []
        previous = -1
        for _ in range(n):
            previous = previous + 1 + self.varint(what)
            if previous > _MAX_ID:
                raise ProtocolError(ErrorCode.BAD_TOKEN, f"{what} holds an id beyond u32")
            out.append(self._check_token(previous, what))
        return tuple(out)

    def f16(self, n: int, what: str) -> tuple[float, ...]:
        start = self._take(2 * n, what)
        half = np.frombuffer(self._buf, dtype="<f2", count=n, offset=start)
        if np.isnan(half).any():
            raise ProtocolError(ErrorCode.BAD_VALUE, f"{what} holds NaN")
        return tuple(half.astype(np.float64).tolist())


def _decode_hello(r: _Reader) -> Hello:
    auth = r.string("auth_token")
    generalist = r.string("generalist_sha256")
    specialist = r.string("specialist_sha256")
    return Hello(generalist, specialist, auth, r.string("client_name"))


def _decode_hello_ok(r: _Reader) -> HelloOk:
    texts = [r.string(name) for name in ("companion_version", "generalist", "specialist")]
    names = ("vocab_size", "max_draft", "max_prompt_tokens", "max_message_bytes", "max_top_k")
    numbers = [r.varint(name) for name in names]
    return HelloOk(*texts, *numbers)


def _decode_open_session(r: _Reader) -> OpenSession:
    mode, select = r.fixed("<BB", "mode")
    s0_on_device = r.flag("s0_on_device")
    gamma, alpha, temperature, top_k, seed, top_p = r.fixed("<fffHQf", "settings")
    if top_k > r._limits.max_top_k:
        raise ProtocolError(
            ErrorCode.LIMIT_EXCEEDED, f"top_k={top_k} exceeds the limit of {r._limits.max_top_k}"
        )
    prompt = r.ids(r.count("prompt ids", r._limits.max_prompt_tokens), "prompt ids")
    return OpenSession(
        prompt, mode, gamma, alpha, top_k, temperature, seed, select, s0_on_device, top_p
    )


def _decode_session_opened(r: _Reader) -> SessionOpened:
    return SessionOpened(r.varint("session_id", 64), r.varint("prompt_length"))


def _decode_draft(r: _Reader) -> Draft:
    round_ = r.varint("round")
    committed = r.ids(r.count("committed ids", r._limits.max_prompt_tokens), "committed ids")
    packed = r.varint("draft count")
    n, has_s0 = packed >> 1, bool(packed & 1)
    if n > r._limits.max_draft:
        raise ProtocolError(
            ErrorCode.LIMIT_EXCEEDED, f"{n} draft ids exceed the limit of {r._limits.max_draft}"
        )
    if n * (3 if has_s0 else 1) > r.remaining():
        raise ProtocolError(ErrorCode.BAD_FRAME, "frame truncated in draft ids")
    draft = r.ids(n, "draft ids")
    return Draft(round_, committed, draft, r.f16(n, "logp_s0") if has_s0 else None)


def _decode_verdict(r: _Reader) -> Verdict:
    round_ = r.varint("round")
    accepted = r.varint("accepted")
    n = r.count("candidates", r._limits.max_top_k, bytes_each=3)
    return Verdict(round_, accepted, r.sparse_ids(n, "candidate ids"), r.f16(n, "values"))


def _decode_row_request(r: _Reader) -> RowRequest:
    return RowRequest(r.ids(r.count("committed ids", r._limits.max_prompt_tokens), "committed ids"))


def _decode_row_reply(r: _Reader) -> RowReply:
    n = r.count("row ids", r._limits.max_top_k, bytes_each=5)
    ids = r.sparse_ids(n, "row ids")
    return RowReply(ids, r.f16(n, "logp_g"), r.f16(n, "logp_s0"))


def _decode_close(r: _Reader) -> Close:
    return Close(r.string("reason"))


def _decode_error(r: _Reader) -> Error:
    (code,) = r.fixed("<H", "error code")
    return Error(code, r.string("error message"))


_DECODERS: dict[int, Callable[[_Reader], Message]] = {
    MessageType.HELLO: _decode_hello,
    MessageType.HELLO_OK: _decode_hello_ok,
    MessageType.OPEN_SESSION: _decode_open_session,
    MessageType.SESSION_OPENED: _decode_session_opened,
    MessageType.DRAFT: _decode_draft,
    MessageType.VERDICT: _decode_verdict,
    MessageType.ROW_REQUEST: _decode_row_request,
    MessageType.ROW_REPLY: _decode_row_reply,
    MessageType.CLOSE: _decode_close,
    MessageType.ERROR: _decode_error,
}


def decode(frame: bytes, limits: Limits) -> Message:
    """Parse one frame; raise `ProtocolError` (and nothing else) if it is not a valid message.

    Size, version and type are checked first, every count before anything is built for it,
    and the whole frame must be consumed: the encoding is canonical, so
    `encode(decode(frame)) == frame` for every frame this accepts.
    """
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ProtocolError(ErrorCode.BAD_FRAME, f"a frame is bytes, got {type(frame).__name__}")
    if len(frame) > limits.max_message_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"frame of {len(frame)} bytes exceeds the limit of {limits.max_message_bytes}",
        )
    frame = bytes(frame)
    if not frame:
        raise ProtocolError(ErrorCode.BAD_FRAME, "empty frame")
    if frame[0] != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.BAD_VERSION,
            f"protocol version {frame[0]} is not supported (this side speaks {PROTOCOL_VERSION})",
        )
    if len(frame) < 2:
        raise ProtocolError(ErrorCode.BAD_FRAME, "frame truncated before the message type")
    decoder = _DECODERS.get(frame[1])
    if decoder is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {frame[1]}")
    reader = _Reader(frame, 2, limits)
    message = decoder(reader)
    if reader.remaining():
        raise ProtocolError(
            ErrorCode.BAD_FRAME,
            f"{reader.remaining()} trailing bytes after {type(message).__name__}",
        )
    return message


# --------------------------------------------------------------------------------------------
# Events


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
class DraftReceived:
    """Companion: a draft to verify; answer with send_verdict."""

    draft: Draft


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
    | DraftReceived
    | RowRequested
    | CloseRequested
    | ConnectionFailed
)


# --------------------------------------------------------------------------------------------
# State machines


def _check_candidate_count(n: int, what: str, session: OpenSession) -> None:
    """A reply must give the device something to choose from, and no more than it asked."""
    if session.mode is Mode.SPECULATIVE:
        if n != 1:
            raise ProtocolError(ErrorCode.BAD_VALUE, f"a speculative {what} carries 1 id, got {n}")
    elif not 1 <= n <= session.top_k:
        raise ProtocolError(
            ErrorCode.BAD_VALUE,
            f"{what} carries {n} candidates, the session asked for 1..{session.top_k}",
        )


class _Connection:
    """What both sides share: state, outgoing queue, byte accounting, decoding limits."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits: Limits = limits if limits is not None else Limits()
        self.state: State = State.START
        self.session: OpenSession | None = None
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
        self._row_pending = False

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
        *,
        mode: Mode = Mode.SPECSTEER,
        gamma: float = 0.5,
        alpha: float = 1.0,
        top_k: int = 64,
        temperature: float = 0.0,
        seed: int = 0,
        select: Select = Select.TOP_LOGP_G,
        s0_on_device: bool = False,
        top_p: float = 1.0,
    ) -> OpenSession:
        """Queue an OpenSession; an open session (with nothing outstanding) is replaced."""
        self._require(State.READY, State.SESSION, action="open a session")
        prompt = self._check_ids("prompt ids", prompt_ids, self.peer_limits.max_prompt_tokens)
        request = OpenSession(
            prompt, mode, gamma, alpha, top_k, temperature, seed, select, s0_on_device, top_p
        )
        if request.top_k > self.peer_limits.max_top_k:
            raise ProtocolError(
                ErrorCode.LIMIT_EXCEEDED,
                f"top_k={top_k} exceeds the companion's limit of {self.peer_limits.max_top_k}",
            )
        self._send_checked(request, self.peer_limits)
        self.session = request
        self.session_id = None
        self.state = State.OPENING
        return request

    def send_draft(
        self,
        draft_ids: Sequence[int],
        *,
        committed_ids: Sequence[int] = (),
        logp_s0: Sequence[float] | None = None,
    ) -> int:
        """Queue this round's Draft; return its round number (the Verdict must echo it).

        `logp_s0` is required exactly when the session was opened with `s0_on_device`.
        """
        self._require(State.SESSION, action="send a Draft")
        assert self.session is not None
        if self.session.mode is Mode.ROWS:
            raise ProtocolError(
                ErrorCode.OUT_OF_ORDER, "a ROWS session takes request_row, not drafts"
            )
        if (logp_s0 is not None) != self.session.s0_on_device:
            raise ProtocolError(
                ErrorCode.BAD_VALUE,
                "logp_s0 must be sent exactly when the session was opened with s0_on_device",
            )
        peer = self.peer_limits
        draft = Draft(
            self.round,
            self._check_ids("committed ids", committed_ids, peer.max_prompt_tokens),
            self._check_ids("draft ids", draft_ids, peer.max_draft),
            logp_s0,
        )
        self._send_checked(draft, peer)
        self._draft = draft
        self.state = State.WAITING
        return draft.round

    def request_row(self, committed_ids: Sequence[int] = ()) -> None:
        """Queue a RowRequest (ROWS sessions): commit these ids, ask for the next row."""
        self._require(State.SESSION, action="request a row")
        assert self.session is not None
        if self.session.mode is not Mode.ROWS:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "only a ROWS session takes request_row")
        peer = self.peer_limits
        ids = self._check_ids("committed ids", committed_ids, peer.max_prompt_tokens)
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
        if isinstance(message, Close):
            self.state = State.CLOSED
            return [Closed(message.reason)]
        if isinstance(message, Error):
            self.state = State.CLOSED
            return [ErrorReceived(message.code, message.message)]
        if isinstance(message, HelloOk) and self.state is State.HANDSHAKE:
            return [self._on_hello_ok(message)]
        if isinstance(message, SessionOpened) and self.state is State.OPENING:
            assert self.session is not None
            if message.prompt_length != len(self.session.prompt_ids):
                raise ProtocolError(
                    ErrorCode.BAD_VALUE,
                    f"companion holds {message.prompt_length} prompt tokens, "
                    f"device sent {len(self.session.prompt_ids)}",
                )
            self.session_id, self.round = message.session_id, 0
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
        if message.accepted > len(draft.draft_ids):
            raise ProtocolError(
                ErrorCode.BAD_VALUE,
                f"verdict accepts {message.accepted} of {len(draft.draft_ids)} drafts",
            )
        _check_candidate_count(len(message.ids), "verdict", session)
        self._draft = None
        self.round += 1
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
        self._row_pending = False

    def receive_frame(self, data: bytes) -> list[Event]:
        """Handle one frame from the device; never raises (see the class docstring)."""
        self._count_received(data)
        if self.state is State.CLOSED:
            return []
        try:
            return self._handle(decode(data, self.limits))
        except ProtocolError as exc:
            code, text = exc.code, str(exc)
        except Exception as exc:  # a bug here must not take the server loop down
            code, text = ErrorCode.INTERNAL, f"internal error ({type(exc).__name__})"
        self.fail(code, text)
        return [ConnectionFailed(code, text)]

    def _handle(self, message: Message) -> list[Event]:
        if isinstance(message, Close):
            self.state = State.CLOSED
            return [CloseRequested(message.reason)]
        if isinstance(message, Error):
            self.state = State.CLOSED
            return [ErrorReceived(message.code, message.message)]
        if isinstance(message, Hello) and self.state is State.START:
            self.hello = message
            self.state = State.HANDSHAKE
            return [HelloReceived(message)]
        if isinstance(message, OpenSession) and self.state in (State.READY, State.SESSION):
            self.session = message
            self.session_id = None
            self.state = State.OPENING
            return [SessionRequested(message)]
        if isinstance(message, Draft) and self.state is State.SESSION:
            return [self._on_draft(message)]
        if isinstance(message, RowRequest) and self.state is State.SESSION:
            assert self.session is not None
            if self.session.mode is not Mode.ROWS:
                raise ProtocolError(
                    ErrorCode.OUT_OF_ORDER, f"RowRequest in a {self.session.mode.name} session"
                )
            self._row_pending = True
            self.state = State.WAITING
            return [RowRequested(message)]
        raise self._unexpected(message)

    def _on_draft(self, message: Draft) -> DraftReceived:
        session = self.session
        assert session is not None
        if session.mode is Mode.ROWS:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "Draft in a ROWS session")
        if message.round != self.round:
            raise ProtocolError(
                ErrorCode.OUT_OF_ORDER, f"Draft for round {message.round}, expected {self.round}"
            )
        if (message.logp_s0 is not None) != session.s0_on_device:
            raise ProtocolError(
                ErrorCode.BAD_VALUE,
                "Draft must carry logp_s0 exactly when the session has s0_on_device",
            )
        self._draft = message
        self.state = State.WAITING
        return DraftReceived(message)

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

    def session_opened(self, session_id: int, prompt_length: int | None = None) -> None:
        """Queue SessionOpened once the prompt is prefilled; the next Draft is round 0."""
        self._require(State.OPENING, action="confirm a session")
        assert self.session is not None
        length = len(self.session.prompt_ids) if prompt_length is None else prompt_length
        self._send(SessionOpened(session_id, length))
        self.session_id, self.round = session_id, 0
        self.state = State.SESSION

    def send_verdict(self, accepted: int, ids: Sequence[int], values: Sequence[float]) -> Verdict:
        """Queue the Verdict of the outstanding Draft (its round is filled in)."""
        self._require(State.WAITING, action="send a Verdict")
        draft, session = self._draft, self.session
        if draft is None or session is None:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, "no Draft is outstanding")
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

    def _check_reply_ids(self, ids: tuple[int, ...], session: OpenSession) -> None:
        _check_candidate_count(len(ids), "reply", session)
        vocab = self.limits.vocab_size
        if vocab is not None and ids and ids[-1] >= vocab:
            raise ProtocolError(ErrorCode.BAD_TOKEN, f"reply holds id {ids[-1]} >= vocab {vocab}")

    def fail(self, code: int, message: str) -> None:
        """Queue an Error frame and move to CLOSED (refusals: auth, model mismatch, limits)."""
        self._fail(code, message)
