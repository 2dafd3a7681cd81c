"""Protocol messages: the enums, `Limits`, and one frozen dataclass per message type.

This module owns what a message may hold. Each dataclass checks and normalises its fields at
construction (ids to u32 ints, values to the float16 or f32 precision that crosses the wire,
sparse ids sorted and unique), so a message object holds exactly what its frame carries. No
field is derived from the private context other than drafted token ids: every field is either
public (prompt, committed text, hashes, settings), a drafted id, or a value computed from public
data only (logp_S0 of the drafts, the companion's sparse verdict). Nothing here accepts a logit
row, a history record or a P_Sc value. The bytes are `codec`'s; the order they cross in is
`connections`'.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from specsteer.errors import ProtocolError
from specsteer.steer import SELECTS

PROTOCOL_VERSION = 2
"""Byte 0 of every frame. A peer speaking another version gets `ErrorCode.BAD_VERSION`.
Version 2: a Draft carries ids only; P_S0's values follow in their own `DraftS0` frame."""

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
    RESUME = 11
    DRAFT_S0 = 12


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
    # companion's prefill per session. Also bounds a Resume's committed ids.
    max_prompt_tokens: int = 8192
    # The method uses k=64; 1024 is enough for any recovery/baseline experiment and keeps a
    # ROWS reply near 6 KB instead of a 600 KB full fp32 row.
    max_top_k: int = 1024
    # Unknown until the handshake: the state machines fill it in from HelloOk/accept_hello.
    vocab_size: int | None = None

    @property
    def max_committed(self) -> int:
        """Ids one Draft or RowRequest may commit: what a round can settle (the accepted drafts
        and one more). A device with more to catch up on sends a Resume, whose prompt the
        companion charges as such; a Draft is never a way to make it prefill a long text."""
        return min(self.max_draft + 1, self.max_prompt_tokens)

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
class SessionSettings:
    """What the companion must know of a generation's settings; the defaults of the method.

    This is the only place these defaults are written: `specsteer.settings.Params` takes its
    own from here, and every layer in between passes the object whole. Floats are stored
    rounded to f32, the precision that crosses the wire; `select` travels as a one-byte code
    (its index in `SELECTS`).
    """

    mode: Mode = Mode.SPECSTEER
    gamma: float = 0.5  # the method's default verification threshold
    alpha: float = 1.0  # steering strength; 1.0 is the derivation's value
    top_k: int = 64  # candidates per recovery position, the method's default
    temperature: float = 0.0  # 0 = greedy, as in the paper's experiments
    seed: int = 0
    select: str = "generalist"  # top-k of logp_G: measured better than top-k of the difference
    s0_on_device: bool = False  # the paper's placement: the companion hosts P_S0
    # nucleus cut inside the top-k: fewer candidates where P_G is confident (1.0 = exact top-k)
    top_p: float = 1.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "top_p", _f32("top_p", self.top_p, minimum=0.0))
        if not 0.0 < self.top_p <= 1.0:
            raise ProtocolError(ErrorCode.BAD_VALUE, f"top_p must be in (0, 1], got {self.top_p}")
        try:
            set_(self, "mode", Mode(self.mode))
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_VALUE, f"unknown mode: {exc}") from exc
        if self.select not in SELECTS:
            raise ProtocolError(
                ErrorCode.BAD_VALUE, f"select must be one of {SELECTS}, got {self.select!r}"
            )
        set_(self, "gamma", _f32("gamma", self.gamma, minimum=0.0))
        set_(self, "alpha", _f32("alpha", self.alpha))
        set_(self, "temperature", _f32("temperature", self.temperature, minimum=0.0))
        set_(self, "top_k", _check_uint("top_k", self.top_k, 0xFFFF, minimum=1))
        set_(self, "seed", _check_uint("seed", self.seed, _MAX_U64))
        if not isinstance(self.s0_on_device, (bool, np.bool_)):
            raise ProtocolError(ErrorCode.BAD_VALUE, "s0_on_device must be a bool")
        set_(self, "s0_on_device", bool(self.s0_on_device))

    @property
    def companion_s0(self) -> bool:
        """Whether the companion must run P_S0: SpecSteer with P_S0 not on the device, or the
        per-token baselines, which steer by logp_Sc - logp_S0 (alpha != 0)."""
        if self.mode is Mode.SPECSTEER:
            return not self.s0_on_device
        return self.mode is Mode.ROWS and self.alpha != 0.0


@dataclass(frozen=True)
class OpenSession:
    """Device -> companion: start one generation over a public, context-free prompt."""

    prompt_ids: tuple[int, ...]
    settings: SessionSettings = SessionSettings()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", _ids("prompt_ids", self.prompt_ids))
        if not isinstance(self.settings, SessionSettings):
            raise ProtocolError(ErrorCode.BAD_VALUE, "settings must be SessionSettings")


@dataclass(frozen=True)
class Resume:
    """Device -> companion: rebuild a generation's session from public state and continue.

    Any companion serving the same models can take it: the public prompt, every token
    committed so far and the settings are the whole of a session's state, so the companion
    prefills `prompt_ids + committed_ids` in one pass and expects Draft number `round` next.
    The device sends it on a fresh connection when its link dropped mid-generation.
    """

    prompt_ids: tuple[int, ...]
    committed_ids: tuple[int, ...]
    settings: SessionSettings = SessionSettings()
    round: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", _ids("prompt_ids", self.prompt_ids))
        object.__setattr__(self, "committed_ids", _ids("committed_ids", self.committed_ids))
        if not isinstance(self.settings, SessionSettings):
            raise ProtocolError(ErrorCode.BAD_VALUE, "settings must be SessionSettings")
        _check_uint("round", self.round, _MAX_ID)

    @property
    def held_ids(self) -> tuple[int, ...]:
        """What the rebuilt session holds: the public prompt, then the committed tokens."""
        return self.prompt_ids + self.committed_ids


@dataclass(frozen=True)
class SessionOpened:
    """Companion -> device: the session exists and its caches hold the prompt (after a
    `Resume`, the prompt and the committed tokens: `prompt_length` counts both).

    `ids`/`values`: the first position's candidates, exactly as a first-round Verdict that
    rejects its first draft would carry them (logp_G over the top-k), or none. Sent for an
    OpenSession in SPECSTEER mode with `s0_on_device` and greedy decoding, where the device
    holds P_S0 and can run the ratio test of its first drafted id itself: its first token
    comes as the opening ends, not one verification later (the round still runs and must
    agree). Ids sorted, as on the wire.
    """

    session_id: int
    prompt_length: int
    ids: tuple[int, ...] = ()
    values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _check_uint("session_id", self.session_id, _MAX_U64)
        _check_uint("prompt_length", self.prompt_length, _MAX_ID)
        ids, values = _sorted_sparse("opening", _ids("ids", self.ids), _f16s("values", self.values))
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "values", values)


@dataclass(frozen=True)
class Draft:
    """Device -> companion: one round's drafted ids, and the ids committed since last time.

    `committed_ids` are tokens the device appended that the companion has not seen (the token
    it chose from the previous verdict; at most `Limits.max_committed`). In a session with
    `s0_on_device` a `DraftS0` of the same round follows with P_S0's values.
    """

    round: int
    committed_ids: tuple[int, ...]
    draft_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_uint("round", self.round, _MAX_ID)
        object.__setattr__(self, "committed_ids", _ids("committed_ids", self.committed_ids))
        object.__setattr__(self, "draft_ids", _ids("draft_ids", self.draft_ids))


@dataclass(frozen=True)
class DraftS0:
    """Device -> companion: the context-free Specialist's log-probabilities of the drafts of
    Draft `round` (sessions with `s0_on_device`, one per Draft, after it).

    Why a frame of its own: the companion scores the draft with the Generalist while the
    device runs P_S0's pass over it, so that pass is off the round's critical path.
    """

    round: int
    logp_s0: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_uint("round", self.round, _MAX_ID)
        object.__setattr__(self, "logp_s0", _f16s("logp_s0", self.logp_s0))


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
    | DraftS0
    | Verdict
    | RowRequest
    | RowReply
    | Close
    | Error
    | Resume
)
