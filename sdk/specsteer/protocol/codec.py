"""The codec: `encode` a message into one frame and `decode` a frame back into a message.

This module owns the bytes. Byte 0 of a frame is the protocol version, byte 1 the message type,
then a compact body: unsigned LEB128 varints for counts, ids, rounds and lengths (minimal
encoding only, so every valid frame has exactly one encoding), fixed little-endian
u8/u16/u64/f32 for typed settings, raw little-endian float16 arrays for values, and UTF-8
strings prefixed by their byte length. Sparse id sets are sorted; the first id is absolute and
each next one is `gap - 1`, so duplicates cannot be expressed; their values are reordered with
them. `decode` checks every count against `Limits` before it builds anything.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specsteer.errors import ProtocolError
from specsteer.protocol.messages import (
    _MAX_ID,
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
    OpenSession,
    Resume,
    RowReply,
    RowRequest,
    SessionOpened,
    SessionSettings,
    Verdict,
)
from specsteer.steer import SELECTS

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


def _put_settings(out: bytearray, s: SessionSettings) -> None:
    out += struct.pack(
        "<BBBfffHQf",
        s.mode,
        SELECTS.index(s.select),
        s.s0_on_device,
        s.gamma,
        s.alpha,
        s.temperature,
        s.top_k,
        s.seed,
        s.top_p,
    )


def _encode_open_session(out: bytearray, m: OpenSession) -> None:
    _put_settings(out, m.settings)
    _put_ids(out, m.prompt_ids)


def _encode_resume(out: bytearray, m: Resume) -> None:
    _put_settings(out, m.settings)
    _put_varint(out, m.round)
    _put_ids(out, m.prompt_ids)
    _put_ids(out, m.committed_ids)


def _encode_session_opened(out: bytearray, m: SessionOpened) -> None:
    _put_varint(out, m.session_id)
    _put_varint(out, m.prompt_length)
    _put_sparse_ids(out, m.ids)
    _put_f16(out, m.values)


def _encode_draft(out: bytearray, m: Draft) -> None:
    _put_varint(out, m.round)
    _put_ids(out, m.committed_ids)
    _put_ids(out, m.draft_ids)


def _encode_draft_s0(out: bytearray, m: DraftS0) -> None:
    _put_varint(out, m.round)
    _put_varint(out, len(m.logp_s0))
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
    DraftS0: (MessageType.DRAFT_S0, _encode_draft_s0),
    Verdict: (MessageType.VERDICT, _encode_verdict),
    RowRequest: (MessageType.ROW_REQUEST, _encode_row_request),
    RowReply: (MessageType.ROW_REPLY, _encode_row_reply),
    Close: (MessageType.CLOSE, _encode_close),
    Error: (MessageType.ERROR, _encode_error),
    Resume: (MessageType.RESUME, _encode_resume),
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


def _read_settings(r: _Reader) -> SessionSettings:
    mode, select = r.fixed("<BB", "mode")
    s0_on_device = r.flag("s0_on_device")
    gamma, alpha, temperature, top_k, seed, top_p = r.fixed("<fffHQf", "settings")
    if top_k > r._limits.max_top_k:
        raise ProtocolError(
            ErrorCode.LIMIT_EXCEEDED, f"top_k={top_k} exceeds the limit of {r._limits.max_top_k}"
        )
    if select >= len(SELECTS):
        raise ProtocolError(ErrorCode.BAD_VALUE, f"unknown select code {select}")
    return SessionSettings(
        mode, gamma, alpha, top_k, temperature, seed, SELECTS[select], s0_on_device, top_p
    )


def _decode_open_session(r: _Reader) -> OpenSession:
    settings = _read_settings(r)
    prompt = r.ids(r.count("prompt ids", r._limits.max_prompt_tokens), "prompt ids")
    return OpenSession(prompt, settings)


def _decode_resume(r: _Reader) -> Resume:
    settings = _read_settings(r)
    round_ = r.varint("round")
    prompt = r.ids(r.count("prompt ids", r._limits.max_prompt_tokens), "prompt ids")
    committed = r.ids(r.count("committed ids", r._limits.max_prompt_tokens), "committed ids")
    return Resume(prompt, committed, settings, round_)


def _decode_session_opened(r: _Reader) -> SessionOpened:
    session_id, length = r.varint("session_id", 64), r.varint("prompt_length")
    n = r.count("opening candidates", r._limits.max_top_k, bytes_each=3)
    return SessionOpened(session_id, length, r.sparse_ids(n, "opening ids"),
                         r.f16(n, "opening values"))


def _decode_draft(r: _Reader) -> Draft:
    round_ = r.varint("round")
    committed = r.ids(r.count("committed ids", r._limits.max_committed), "committed ids")
    draft = r.ids(r.count("draft ids", r._limits.max_draft), "draft ids")
    return Draft(round_, committed, draft)


def _decode_draft_s0(r: _Reader) -> DraftS0:
    round_ = r.varint("round")
    return DraftS0(round_, r.f16(r.count("logp_s0", r._limits.max_draft, bytes_each=2),
                                 "logp_s0"))


def _decode_verdict(r: _Reader) -> Verdict:
    round_ = r.varint("round")
    accepted = r.varint("accepted")
    n = r.count("candidates", r._limits.max_top_k, bytes_each=3)
    return Verdict(round_, accepted, r.sparse_ids(n, "candidate ids"), r.f16(n, "values"))


def _decode_row_request(r: _Reader) -> RowRequest:
    return RowRequest(r.ids(r.count("committed ids", r._limits.max_committed), "committed ids"))


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
    MessageType.DRAFT_S0: _decode_draft_s0,
    MessageType.VERDICT: _decode_verdict,
    MessageType.ROW_REQUEST: _decode_row_request,
    MessageType.ROW_REPLY: _decode_row_reply,
    MessageType.CLOSE: _decode_close,
    MessageType.ERROR: _decode_error,
    MessageType.RESUME: _decode_resume,
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
