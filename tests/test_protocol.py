"""Tests of the wire protocol: byte-exact frames, decode errors, both state machines, fuzzing.

Everything runs without sockets: frames go from one sans-I/O machine to the other by hand, as in
python-websockets' own protocol tests.
"""

from __future__ import annotations

import math
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_bytes import varint

from specsteer.errors import ProtocolError
from specsteer.protocol import (
    PROTOCOL_VERSION,
    Close,
    Closed,
    CloseRequested,
    CompanionConnection,
    ConnectionFailed,
    DeviceConnection,
    Draft,
    DraftReceived,
    Error,
    ErrorCode,
    ErrorReceived,
    Hello,
    HelloAccepted,
    HelloOk,
    HelloReceived,
    Limits,
    Message,
    Mode,
    OpenSession,
    Resume,
    ResumeRequested,
    RowReceived,
    RowReply,
    RowRequest,
    RowRequested,
    SessionOpened,
    SessionReady,
    SessionRequested,
    SessionSettings,
    State,
    Verdict,
    VerdictReceived,
    decode,
    encode,
)
from specsteer.steer import SELECTS

VOCAB = 151_936  # Qwen2.5's vocabulary: ids above 16383 take 3 varint bytes
G_SHA = "a" * 64
S_SHA = "b" * 64
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_code(code: ErrorCode, func, *args, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        func(*args, **kwargs)
    assert info.value.code == code, f"{info.value.code!r} != {code!r}: {info.value}"
    return info.value


def f16(x: float) -> bytes:
    return struct.pack("<e", x)


# ------------------------------------------------------------------------------------------
# Byte-exact frames


def test_hello_bytes() -> None:
    frame = encode(Hello("ab", "", auth_token="tok", client_name="c"))
    assert frame == b"\x01\x01" + b"\x03tok" + b"\x02ab" + b"\x00" + b"\x01c"
    assert decode(frame, Limits()) == Hello("ab", "", "tok", "c")


def test_draft_bytes_and_size() -> None:
    # round 3, one committed id 300 (0xAC 0x02), four drafts, no logp_S0 (low bit of count 0)
    frame = encode(Draft(3, (300,), (1, 2, 3, 4)))
    assert frame == b"\x01\x05\x03\x01\xac\x02\x08\x01\x02\x03\x04"
    assert decode(frame, Limits()) == Draft(3, (300,), (1, 2, 3, 4))
    # K=4 ids of a 152k vocabulary, nothing committed: 17 bytes at worst; small ids: 9 bytes.
    assert len(encode(Draft(100, (), (1, 2, 3, 4)))) == 9
    assert len(encode(Draft(100, (), (151_000,) * 4))) == 17
    # With logp_S0 on the device: the count's low bit is set and 4 float16 follow.
    frame = encode(Draft(0, (), (5, 6, 7, 8), logp_s0=(-1.0, -2.0, -0.5, 0.0)))
    expected = b"\x01\x05\x00\x00\x09\x05\x06\x07\x08" + b"".join(
        f16(x) for x in (-1.0, -2.0, -0.5, 0.0)
    )
    assert frame == expected


def test_verdict_bytes_sorted_and_delta_encoded() -> None:
    verdict = Verdict(round=2, accepted=1, ids=(10, 3, 200), values=(-1.0, 0.5, -2.0))
    # Sorted with their values: 3 -> 0.5, 10 -> -1.0, 200 -> -2.0; deltas 3, 10-3-1, 200-10-1.
    assert verdict.ids == (3, 10, 200)
    assert verdict.values == (0.5, -1.0, -2.0)
    frame = encode(verdict)
    assert frame == (
        b"\x01\x06\x02\x01\x03" + b"\x03\x06\xbd\x01" + f16(0.5) + f16(-1.0) + f16(-2.0)
    )
    assert decode(frame, Limits()) == verdict


def test_verdict_with_64_candidates_fits_270_bytes() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = rng.choice(VOCAB, size=64, replace=False)
        frame = encode(Verdict(1000, 4, ids, rng.normal(-5, 3, size=64)))
        assert len(frame) <= 270
    # Worst spread: every gap as large as it can be still stays near the target.
    spread = np.linspace(0, VOCAB - 1, 64).astype(int)
    assert len(encode(Verdict(1000, 4, spread, np.zeros(64)))) <= 275


def test_other_messages_bytes() -> None:
    assert encode(SessionOpened(7, 300)) == b"\x01\x04\x07\xac\x02"
    assert encode(RowRequest((1, 2))) == b"\x01\x07\x02\x01\x02"
    assert encode(Close("bye")) == b"\x01\x09\x03bye"
    assert encode(Error(ErrorCode.BAD_TOKEN, "x")) == b"\x01\x0a\x07\x00\x01x"
    row = RowReply((9, 4), (-1.0, -2.0), (-3.0, -4.0))
    assert encode(row) == b"\x01\x08\x02\x04\x04" + f16(-2.0) + f16(-1.0) + f16(-4.0) + f16(-3.0)
    settings = SessionSettings(Mode.ROWS, 0.5, 1.0, 64, 0.0, 42, "difference", True)
    request = OpenSession((1, 2), settings)
    assert encode(request) == (
        b"\x01\x03\x02\x01\x01"
        + struct.pack("<fffHQf", 0.5, 1.0, 0.0, 64, 42, 1.0)
        + b"\x02\x01\x02"
    )


def test_resume_bytes() -> None:
    # settings as in OpenSession, then the round, the prompt ids and the committed ids
    settings = SessionSettings(Mode.SPECSTEER, 0.5, 1.0, 64, 0.0, 42, "generalist", False)
    frame = encode(Resume((1, 2), (300,), settings, round=130))
    assert frame == (
        b"\x01\x0b\x00\x00\x00"
        + struct.pack("<fffHQf", 0.5, 1.0, 0.0, 64, 42, 1.0)
        + b"\x82\x01"  # round 130
        + b"\x02\x01\x02"  # prompt
        + b"\x01\xac\x02"  # committed: 300
    )
    assert decode(frame, Limits()) == Resume((1, 2), (300,), settings, 130)
    assert Resume((1, 2), (300,)).held_ids == (1, 2, 300)


def test_float_fields_hold_wire_precision() -> None:
    # What a dataclass shows is what the peer will see: f32 settings, f16 values.
    wire_gamma = struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert OpenSession((1,), SessionSettings(gamma=0.1)).settings.gamma == wire_gamma
    assert Verdict(0, 0, (1,), (0.1,)).values == (struct.unpack("<e", f16(0.1))[0],)
    # Finite values beyond float16 saturate to -inf: a logp of -1e5 is impossible, not NaN.
    assert Verdict(0, 0, (1,), (-1e5,)).values == (-math.inf,)


# ------------------------------------------------------------------------------------------
# Decode errors

VALID_DRAFT = encode(Draft(1, (300,), (1, 2, 3, 4)))


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"", ErrorCode.BAD_FRAME),
        (b"\x01", ErrorCode.BAD_FRAME),
        (b"\x02\x05", ErrorCode.BAD_VERSION),
        (b"\x00\x05", ErrorCode.BAD_VERSION),
        (b"\x01\x00", ErrorCode.UNKNOWN_TYPE),
        (b"\x01\x63", ErrorCode.UNKNOWN_TYPE),
        (VALID_DRAFT + b"\x00", ErrorCode.BAD_FRAME),  # trailing byte
        (b"\x01\x04\x80\x00\x01", ErrorCode.BAD_FRAME),  # over-long varint (0 in two bytes)
        (b"\x01\x04\x00\xff\xff\xff\xff\x10", ErrorCode.BAD_FRAME),  # 33-bit prompt length
        (b"\x01\x04" + b"\xff" * 10 + b"\x01\x00", ErrorCode.BAD_FRAME),  # > 64-bit session id
        (b"\x01\x04\x00\x80", ErrorCode.BAD_FRAME),  # varint cut by the end of the frame
        (b"\x01\x09\x02\xff\xfe", ErrorCode.BAD_FRAME),  # invalid UTF-8
        (b"\x01\x09\x05ab", ErrorCode.BAD_FRAME),  # string longer than the frame
        (b"\x01\x03\x00\x00\x02" + b"\x00" * 22 + b"\x00", ErrorCode.BAD_FRAME),  # bool byte 2
        (  # mode 7
            b"\x01\x03\x07\x00\x00" + b"\x00" * 22 + b"\x00\x00\x80\x3f" + b"\x00",
            ErrorCode.BAD_VALUE,
        ),
        (b"\x01\x06\x00\x00\x01\x05\x00\x7e", ErrorCode.BAD_VALUE),  # NaN value
        (b"\x01\x0a\x01", ErrorCode.BAD_FRAME),  # error code cut short
    ],
)
def test_decode_rejects(frame: bytes, code: ErrorCode) -> None:
    assert_code(code, decode, frame, Limits())


@pytest.mark.parametrize(
    "message",
    [
        Hello(G_SHA, S_SHA, "token", "client"),
        HelloOk("1.0", G_SHA, S_SHA, VOCAB, 16, 8192, 65536, 1024),
        OpenSession((1, 2, 3), SessionSettings(gamma=0.25, seed=2**63)),
        Resume((1, 2, 3), (4, 5), SessionSettings(top_k=8), 2**31),
        SessionOpened(2**40, 3),
        Draft(5, (7,), (1, 2), logp_s0=(-1.0, -2.0)),
        Verdict(5, 2, (1, 50, 70_000), (-1.0, -2.0, -3.0)),
        RowRequest((1,)),
        RowReply((1, 2), (-1.0, -2.0), (-3.0, -4.0)),
        Close("done"),
        Error(ErrorCode.TIMEOUT, "slow"),
    ],
)
def test_every_truncation_is_bad_frame(message: Message) -> None:
    frame = encode(message)
    assert decode(frame, Limits()) == message
    for cut in range(len(frame)):
        assert_code(ErrorCode.BAD_FRAME, decode, frame[:cut], Limits())


def test_frame_above_max_message_bytes_is_too_large() -> None:
    frame = encode(Close("x" * 100))
    assert decode(frame, Limits(max_message_bytes=len(frame))) == Close("x" * 100)
    assert_code(ErrorCode.TOO_LARGE, decode, frame, Limits(max_message_bytes=len(frame) - 1))
    # Size is checked before anything else: even garbage reports TOO_LARGE.
    assert_code(ErrorCode.TOO_LARGE, decode, b"\xff" * 70_000, Limits())


def test_counts_over_limits() -> None:
    limits = Limits(max_draft=4, max_prompt_tokens=3, max_top_k=2)
    assert_code(ErrorCode.LIMIT_EXCEEDED, decode, encode(Draft(0, (), (1,) * 5)), limits)
    assert_code(ErrorCode.LIMIT_EXCEEDED, decode, encode(Draft(0, (1,) * 4, ())), limits)
    long_prompt = OpenSession((1,) * 4, SessionSettings(top_k=2))
    assert_code(ErrorCode.LIMIT_EXCEEDED, decode, encode(long_prompt), limits)
    wide = OpenSession((1,), SessionSettings(top_k=3))
    assert_code(ErrorCode.LIMIT_EXCEEDED, decode, encode(wide), limits)
    assert_code(
        ErrorCode.LIMIT_EXCEEDED, decode, encode(Verdict(0, 0, (1, 2, 3), (0,) * 3)), limits
    )
    assert_code(ErrorCode.LIMIT_EXCEEDED, decode, encode(RowRequest((1,) * 4)), limits)
    rows = RowReply((1, 2, 3), (0,) * 3, (0,) * 3)
    assert_code(ErrorCode.LIMIT_EXCEEDED, decode, encode(rows), limits)
    assert decode(encode(Draft(0, (1,) * 3, (1,) * 4)), limits) == Draft(0, (1,) * 3, (1,) * 4)


@pytest.mark.parametrize(
    ("limits", "code"),
    [
        (Limits(), ErrorCode.LIMIT_EXCEEDED),  # 10^9 is over every default limit
        # Even with a limit that allows it, the count is compared with the bytes left.
        (Limits(max_prompt_tokens=2**31, max_top_k=0xFFFF, max_draft=2**31), ErrorCode.BAD_FRAME),
    ],
)
def test_huge_counts_fail_before_allocating(limits: Limits, code: ErrorCode) -> None:
    huge = varint(10**9)
    frames = [
        b"\x01\x07" + huge + b"\x01" * 11,  # RowRequest
        b"\x01\x05\x00" + huge + b"\x01" * 11,  # Draft committed ids
        b"\x01\x05\x00\x00" + varint(2 * 10**9 + 1) + b"\x01" * 11,  # Draft ids + logp_S0
        b"\x01\x06\x00\x00" + huge + b"\x01" * 11,  # Verdict candidates
        b"\x01\x08" + huge + b"\x01" * 11,  # RowReply
    ]
    tracemalloc.start()
    try:
        for frame in frames:
            assert len(frame) <= 20
            expected = code
            if frame[1] == 6 or frame[1] == 8:  # top_k is u16: 10^9 always exceeds it
                expected = ErrorCode.LIMIT_EXCEEDED
            assert_code(expected, decode, frame, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200_000  # no list or array sized by the claimed count


def test_ids_at_or_above_vocab_are_bad_token() -> None:
    limits = Limits(vocab_size=1000)
    assert decode(encode(Draft(0, (999,), (0,))), limits) == Draft(0, (999,), (0,))
    assert_code(ErrorCode.BAD_TOKEN, decode, encode(Draft(0, (), (1000,))), limits)
    assert_code(ErrorCode.BAD_TOKEN, decode, encode(Draft(0, (1000,), ())), limits)
    assert_code(ErrorCode.BAD_TOKEN, decode, encode(OpenSession((5, 1000))), limits)
    assert_code(ErrorCode.BAD_TOKEN, decode, encode(Verdict(0, 0, (3, 1000), (0, 0))), limits)
    assert_code(ErrorCode.BAD_TOKEN, decode, encode(RowReply((1000,), (0,), (0,))), limits)
    # Without a vocabulary, ids are still bounded by u32.
    assert_code(
        ErrorCode.BAD_TOKEN,
        decode,
        b"\x01\x06\x00\x00\x02" + varint(2**32 - 1) + b"\x00" + b"\0" * 4,
        Limits(),
    )


def test_messages_reject_invalid_values_at_construction() -> None:
    assert_code(ErrorCode.BAD_VALUE, Verdict, 0, 0, (1, 1), (0.0, 0.0))  # duplicate id
    assert_code(ErrorCode.BAD_VALUE, Verdict, 0, 0, (1, 2), (0.0,))  # lengths differ
    assert_code(ErrorCode.BAD_VALUE, Verdict, 0, 0, (1,), (math.nan,))
    assert_code(ErrorCode.BAD_TOKEN, Draft, 0, (), (-1,))
    assert_code(ErrorCode.BAD_TOKEN, Draft, 0, (), (2**32,))
    assert_code(ErrorCode.BAD_VALUE, Draft, 0, (), (1, 2), logp_s0=(0.0,))
    assert_code(ErrorCode.BAD_VALUE, SessionSettings, gamma=-0.5)
    assert_code(ErrorCode.BAD_VALUE, SessionSettings, gamma=math.inf)
    assert_code(ErrorCode.BAD_VALUE, SessionSettings, alpha=1e300)
    assert_code(ErrorCode.BAD_VALUE, SessionSettings, top_k=0)
    assert_code(ErrorCode.BAD_VALUE, SessionSettings, mode=9)
    assert_code(ErrorCode.BAD_VALUE, Error, 70_000, "")
    assert_code(ErrorCode.BAD_VALUE, Close, "\ud800")
    assert_code(ErrorCode.BAD_VALUE, Limits, max_top_k=70_000)
    with pytest.raises(TypeError):
        encode("not a message")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# State machines driven against each other


def transfer(sender, receiver) -> list:
    """Move every queued frame from one machine to the other; return the receiver's events."""
    events = []
    for frame in sender.data_to_send():
        events += receiver.receive_frame(frame)
    return events


def handshake(
    device: DeviceConnection | None = None,
    companion: CompanionConnection | None = None,
    **session,
) -> tuple[DeviceConnection, CompanionConnection]:
    device = device or DeviceConnection()
    companion = companion or CompanionConnection()
    device.hello(G_SHA, S_SHA, auth_token="secret", client_name="test")
    [event] = transfer(device, companion)
    assert event == HelloReceived(Hello(G_SHA, S_SHA, "secret", "test"))
    companion.accept_hello(
        companion_version="0.1", generalist_sha256=G_SHA, specialist_sha256=S_SHA, vocab_size=VOCAB
    )
    [event] = transfer(companion, device)
    assert isinstance(event, HelloAccepted) and event.hello_ok.vocab_size == VOCAB
    device.open_session((10, 11, 12), SessionSettings(**session))
    [event] = transfer(device, companion)
    assert isinstance(event, SessionRequested) and event.request.prompt_ids == (10, 11, 12)
    companion.session_opened(session_id=77)
    assert transfer(companion, device) == [SessionReady(77, 3)]
    assert device.state is companion.state is State.SESSION
    return device, companion


def test_specsteer_rounds_and_byte_accounting() -> None:
    device, companion = handshake()
    captured_up: list[bytes] = []
    captured_down: list[bytes] = []
    for round_number, committed in enumerate([(), (500,), (150_000,)]):
        assert device.send_draft((1, 2, 3, 4), committed_ids=committed) == round_number
        assert device.state is State.WAITING
        frames = device.data_to_send()
        captured_up += frames
        [event] = [e for f in frames for e in companion.receive_frame(f)]
        assert event == DraftReceived(Draft(round_number, committed, (1, 2, 3, 4)))
        assert companion.state is State.WAITING
        companion.send_verdict(2, ids=(9, 8, 7), values=(-1.0, -2.0, -3.0))
        frames = companion.data_to_send()
        captured_down += frames
        [event] = [e for f in frames for e in device.receive_frame(f)]
        assert event == VerdictReceived(Verdict(round_number, 2, (7, 8, 9), (-3.0, -2.0, -1.0)))
        assert device.state is companion.state is State.SESSION
    # Byte accounting equals the frames on the wire, handshake included.
    device.close("done")
    [event] = transfer(device, companion)
    assert event == CloseRequested("done")
    assert device.state is companion.state is State.CLOSED
    assert device.bytes_sent == companion.bytes_received
    assert companion.bytes_sent == device.bytes_received
    assert (
        device.frames_sent == companion.frames_received == 2 + 3 + 1
    )  # hello, open, drafts, close
    assert device.bytes_received - sum(map(len, captured_down)) == len(
        encode(HelloOk("0.1", G_SHA, S_SHA, VOCAB, 16, 8192, 2**16, 1024))
    ) + len(encode(SessionOpened(77, 3)))
    # 9 bytes for 4 small ids, +2 and +3 for a committed id of 2 and 3 varint bytes.
    assert [len(f) for f in captured_up] == [9, 11, 12]


def test_byte_accounting_matches_captured_frames_exactly() -> None:
    device = DeviceConnection()
    companion = CompanionConnection()
    up: list[bytes] = []
    down: list[bytes] = []

    def pump() -> None:
        for frame in device.data_to_send():
            up.append(frame)
            companion.receive_frame(frame)
        for frame in companion.data_to_send():
            down.append(frame)
            device.receive_frame(frame)

    device.hello(G_SHA)
    pump()
    companion.accept_hello(
        companion_version="0.1", generalist_sha256=G_SHA, specialist_sha256="", vocab_size=VOCAB
    )
    pump()
    device.open_session(list(range(100)), SessionSettings(s0_on_device=True))
    pump()
    companion.session_opened(1)
    pump()
    device.send_draft([5, 6, 7, 8], logp_s0=[-1, -2, -3, -4])
    pump()
    companion.send_verdict(4, list(range(64)), np.linspace(-10, 0, 64))
    pump()
    assert device.bytes_sent == sum(map(len, up)) == companion.bytes_received
    assert device.bytes_received == sum(map(len, down)) == companion.bytes_sent
    assert device.frames_received == len(down) == 3


def test_speculative_mode_single_id_verdicts() -> None:
    device, companion = handshake(mode=Mode.SPECULATIVE)
    device.send_draft((1, 2, 3, 4))
    transfer(device, companion)
    assert_code(ErrorCode.BAD_VALUE, companion.send_verdict, 1, (5, 6), (0.0, 0.0))
    assert companion.state is State.WAITING  # misuse leaves the state alone
    companion.send_verdict(1, (5,), (0.0,))
    [event] = transfer(companion, device)
    assert event.verdict.ids == (5,) and event.verdict.accepted == 1


def test_rows_mode() -> None:
    device, companion = handshake(mode=Mode.ROWS, top_k=4)
    assert_code(ErrorCode.OUT_OF_ORDER, device.send_draft, (1,))
    device.request_row(committed_ids=(42,))
    [event] = transfer(device, companion)
    assert event == RowRequested(RowRequest((42,)))
    companion.send_row((3, 1), (-0.5, -1.5), (-2.0, -3.0))
    [event] = transfer(companion, device)
    assert event == RowReceived(RowReply((1, 3), (-1.5, -0.5), (-3.0, -2.0)))
    device.request_row()
    transfer(device, companion)
    assert_code(ErrorCode.BAD_VALUE, companion.send_row, range(5), [0] * 5, [0] * 5)  # > top_k


def test_reopening_a_session_resets_rounds() -> None:
    device, companion = handshake()
    device.send_draft((1,))
    transfer(device, companion)
    companion.send_verdict(1, (2,), (0.0,))
    transfer(companion, device)
    assert device.round == companion.round == 1
    device.open_session((1, 2))
    transfer(device, companion)
    companion.session_opened(78)
    assert transfer(companion, device) == [SessionReady(78, 2)]
    assert device.send_draft((3,)) == 0
    [event] = transfer(device, companion)
    assert event.draft.round == 0


def test_resume_rebuilds_a_session_that_continues_the_round_count() -> None:
    settings = SessionSettings(gamma=0.25, top_k=8)
    # a fresh connection after a drop: the public prompt, the committed tokens, round 5
    device, companion = DeviceConnection(), CompanionConnection()
    device.hello(G_SHA)
    transfer(device, companion)
    companion.accept_hello(companion_version="0.1", generalist_sha256=G_SHA,
                           specialist_sha256="", vocab_size=VOCAB)
    transfer(companion, device)
    device.resume_session((10, 11, 12), (40, 41), settings, 5)
    [event] = transfer(device, companion)
    assert event == ResumeRequested(Resume((10, 11, 12), (40, 41), settings, 5))
    companion.session_opened(9)
    assert transfer(companion, device) == [SessionReady(9, 5)]  # prompt and committed held
    assert device.send_draft((1, 2)) == 5
    [event] = transfer(device, companion)
    assert event.draft.round == 5
    companion.send_verdict(1, (3,), (0.0,))
    [event] = transfer(companion, device)
    assert event.verdict.round == 5 and device.round == companion.round == 6


def test_resume_is_checked_like_an_open() -> None:
    device = DeviceConnection()
    assert_code(ErrorCode.OUT_OF_ORDER, device.resume_session, (1,), (2,), SessionSettings())
    device, companion = handshake()
    device.send_draft((1,))
    assert_code(ErrorCode.OUT_OF_ORDER, device.resume_session, (1,), (), SessionSettings())
    transfer(device, companion)
    companion.send_verdict(0, (2,), (0.0,))
    transfer(companion, device)
    assert_code(ErrorCode.BAD_TOKEN, device.resume_session, (1,), (VOCAB,), SessionSettings())
    too_many = (1,) * (device.peer_limits.max_prompt_tokens + 1)
    assert_code(ErrorCode.LIMIT_EXCEEDED, device.resume_session, (1,), too_many,
                SessionSettings())
    # a SessionOpened that does not count the committed tokens is refused
    device.resume_session((1, 2), (3,), SessionSettings())
    transfer(device, companion)
    assert_code(ErrorCode.BAD_VALUE, device.receive_frame, encode(SessionOpened(1, 2)))


# Device-side checks


def test_device_rejects_verdict_for_wrong_round() -> None:
    device, _ = handshake()
    device.send_draft((1, 2))
    device.data_to_send()
    frame = encode(Verdict(5, 1, (3,), (0.0,)))
    assert_code(ErrorCode.OUT_OF_ORDER, device.receive_frame, frame)
    assert device.state is State.CLOSED
    [error] = device.data_to_send()
    assert decode(error, Limits()).code == ErrorCode.OUT_OF_ORDER
    assert device.receive_frame(encode(Verdict(0, 1, (3,), (0.0,)))) == []  # closed: ignored


def test_device_rejects_verdict_before_any_draft() -> None:
    device, _ = handshake()
    assert_code(ErrorCode.OUT_OF_ORDER, device.receive_frame, encode(Verdict(0, 0, (1,), (0.0,))))


@pytest.mark.parametrize(
    ("verdict", "code"),
    [
        (Verdict(0, 3, (1,), (0.0,)), ErrorCode.BAD_VALUE),  # accepts more than drafted
        (Verdict(0, 1, (), ()), ErrorCode.BAD_VALUE),  # nothing to recover from
        (Verdict(0, 1, range(65), [0.0] * 65), ErrorCode.BAD_VALUE),  # more than top_k=64
        (Verdict(0, 1, (VOCAB,), (0.0,)), ErrorCode.BAD_TOKEN),  # vocab from HelloOk
    ],
)
def test_device_validates_verdicts(verdict: Verdict, code: ErrorCode) -> None:
    device, _ = handshake()
    device.send_draft((1, 2))
    assert_code(code, device.receive_frame, encode(verdict))
    assert device.state is State.CLOSED


def test_device_checks_model_hashes_in_hello_ok() -> None:
    device = DeviceConnection()
    device.hello(G_SHA, S_SHA)
    device.data_to_send()
    reply = HelloOk("0.1", G_SHA, "c" * 64, VOCAB, 16, 8192, 2**16, 1024)
    assert_code(ErrorCode.MODEL_MISMATCH, device.receive_frame, encode(reply))
    device = DeviceConnection()
    device.hello(G_SHA, S_SHA)
    device.data_to_send()
    wrong_g = HelloOk("0.1", "d" * 64, S_SHA, VOCAB, 16, 8192, 2**16, 1024)
    assert_code(ErrorCode.MODEL_MISMATCH, device.receive_frame, encode(wrong_g))
    # A companion hosting no generic Specialist (empty hash) is accepted: sessions that need
    # its P_S0 are refused when they open, the others send P_S0 themselves.
    device = DeviceConnection()
    device.hello(G_SHA, S_SHA)
    device.data_to_send()
    device.receive_frame(encode(HelloOk("0.1", G_SHA, "", VOCAB, 16, 8192, 2**16, 1024)))
    assert device.state is State.READY
    # An empty expected Specialist hash (P_S0 on the device) accepts whatever is served.
    device = DeviceConnection()
    device.hello(G_SHA, "")
    [event] = device.receive_frame(encode(reply))
    assert isinstance(event, HelloAccepted) and device.state is State.READY


def test_device_checks_its_own_requests_against_companion_limits() -> None:
    device, _ = handshake(s0_on_device=False)
    assert_code(ErrorCode.LIMIT_EXCEEDED, device.send_draft, range(17))
    assert_code(ErrorCode.BAD_TOKEN, device.send_draft, (VOCAB,))
    assert_code(ErrorCode.BAD_VALUE, device.send_draft, (1,), logp_s0=(0.0,))
    assert_code(ErrorCode.OUT_OF_ORDER, device.request_row)
    assert device.state is State.SESSION and device.data_to_send() == []
    device2 = DeviceConnection()
    assert_code(ErrorCode.OUT_OF_ORDER, device2.send_draft, (1,))
    assert_code(ErrorCode.OUT_OF_ORDER, device2.open_session, (1,))
    device3, _ = handshake()
    assert_code(ErrorCode.LIMIT_EXCEEDED, device3.open_session, range(8193))
    assert_code(ErrorCode.LIMIT_EXCEEDED, device3.open_session, (1,), SessionSettings(top_k=1025))
    device3.send_draft((1,))
    assert_code(ErrorCode.OUT_OF_ORDER, device3.send_draft, (1,))  # one draft outstanding


def test_device_rejects_wrong_prompt_length() -> None:
    device = DeviceConnection()
    device.hello(G_SHA)
    device.receive_frame(encode(HelloOk("0.1", G_SHA, "", VOCAB, 16, 8192, 2**16, 1024)))
    device.open_session((1, 2, 3))
    assert_code(ErrorCode.BAD_VALUE, device.receive_frame, encode(SessionOpened(1, 2)))


def test_device_receives_error_and_close() -> None:
    device, _ = handshake()
    assert device.receive_frame(encode(Error(ErrorCode.RATE_LIMITED, "slow down"))) == [
        ErrorReceived(ErrorCode.RATE_LIMITED, "slow down")
    ]
    assert device.state is State.CLOSED and device.data_to_send() == []
    assert_code(ErrorCode.OUT_OF_ORDER, device.send_draft, (1,))
    device.close()  # idempotent: nothing more is queued
    assert device.data_to_send() == []
    other, _ = handshake()
    assert other.receive_frame(b"\x01\x09\x00") == [Closed("")]
    # Unknown error codes from a newer peer still arrive, as ints.
    third = DeviceConnection()
    assert third.receive_frame(encode(Error(999, "?"))) == [ErrorReceived(999, "?")]


# Companion-side checks


def failed(companion: CompanionConnection, frame: bytes, code: ErrorCode) -> None:
    """The companion must answer `frame` with one Error(code) frame and close, raising nothing."""
    events = companion.receive_frame(frame)
    assert len(events) == 1 and isinstance(events[0], ConnectionFailed), events
    assert events[0].code == code, events[0]
    assert companion.state is State.CLOSED
    [reply] = companion.data_to_send()
    error = decode(reply, Limits())
    assert isinstance(error, Error) and error.code == code
    assert companion.receive_frame(encode(Close())) == []  # nothing more is accepted
    assert companion.data_to_send() == []


def test_companion_requires_hello_first() -> None:
    failed(CompanionConnection(), encode(Draft(0, (), (1,))), ErrorCode.OUT_OF_ORDER)
    failed(CompanionConnection(), encode(OpenSession((1,))), ErrorCode.OUT_OF_ORDER)


def test_companion_rejects_garbage_with_its_code() -> None:
    failed(CompanionConnection(), b"", ErrorCode.BAD_FRAME)
    failed(CompanionConnection(), b"\x07\x01", ErrorCode.BAD_VERSION)
    failed(CompanionConnection(), b"\x01\xee", ErrorCode.UNKNOWN_TYPE)
    failed(CompanionConnection(), b"\x01\x01" + b"\x00" * 70_000, ErrorCode.TOO_LARGE)


def test_companion_rejects_hello_twice_and_draft_during_handshake() -> None:
    companion = CompanionConnection()
    companion.receive_frame(encode(Hello(G_SHA)))
    failed(companion, encode(Hello(G_SHA)), ErrorCode.OUT_OF_ORDER)
    companion = CompanionConnection()
    companion.receive_frame(encode(Hello(G_SHA)))
    failed(companion, encode(Draft(0, (), (1,))), ErrorCode.OUT_OF_ORDER)


def test_companion_rejects_second_draft_before_verdict() -> None:
    device, companion = handshake()
    device.send_draft((1,))
    transfer(device, companion)
    failed(companion, encode(Draft(1, (), (2,))), ErrorCode.OUT_OF_ORDER)


def test_companion_rejects_draft_for_wrong_round() -> None:
    _, companion = handshake()
    failed(companion, encode(Draft(1, (), (2,))), ErrorCode.OUT_OF_ORDER)


def test_companion_rejects_requests_of_the_wrong_mode() -> None:
    _, companion = handshake(mode=Mode.ROWS)
    failed(companion, encode(Draft(0, (), (1,))), ErrorCode.OUT_OF_ORDER)
    _, companion = handshake()
    failed(companion, encode(RowRequest((1,))), ErrorCode.OUT_OF_ORDER)


def test_companion_checks_tokens_against_its_vocab() -> None:
    _, companion = handshake()
    failed(companion, encode(Draft(0, (), (VOCAB,))), ErrorCode.BAD_TOKEN)
    _, companion = handshake()
    failed(companion, encode(Draft(0, (VOCAB + 5,), (1,))), ErrorCode.BAD_TOKEN)


def test_companion_checks_logp_s0_matches_placement() -> None:
    _, companion = handshake(s0_on_device=False)
    failed(companion, encode(Draft(0, (), (1,), logp_s0=(-1.0,))), ErrorCode.BAD_VALUE)
    _, companion = handshake(s0_on_device=True)
    failed(companion, encode(Draft(0, (), (1,))), ErrorCode.BAD_VALUE)


def test_companion_fail_and_close() -> None:
    companion = CompanionConnection()
    [event] = companion.receive_frame(encode(Hello(G_SHA, auth_token="wrong")))
    assert isinstance(event, HelloReceived)
    companion.fail(ErrorCode.AUTH_FAILED, "bad token")
    [frame] = companion.data_to_send()
    assert decode(frame, Limits()) == Error(ErrorCode.AUTH_FAILED, "bad token")
    assert companion.state is State.CLOSED
    companion.fail(ErrorCode.INTERNAL, "again")  # after close nothing more is sent
    assert companion.data_to_send() == []
    assert_code(ErrorCode.OUT_OF_ORDER, companion.session_opened, 1)
    _, companion = handshake()
    assert companion.receive_frame(encode(Error(ErrorCode.TIMEOUT, "bye"))) == [
        ErrorReceived(ErrorCode.TIMEOUT, "bye")
    ]
    assert companion.state is State.CLOSED


def test_companion_reply_misuse_raises_without_state_change() -> None:
    device, companion = handshake()
    assert_code(ErrorCode.OUT_OF_ORDER, companion.send_verdict, 0, (1,), (0.0,))
    device.send_draft((1, 2))
    transfer(device, companion)
    assert_code(ErrorCode.BAD_VALUE, companion.send_verdict, 3, (1,), (0.0,))
    assert_code(ErrorCode.BAD_TOKEN, companion.send_verdict, 0, (VOCAB,), (0.0,))
    assert_code(ErrorCode.OUT_OF_ORDER, companion.send_row, (1,), (0.0,), (0.0,))
    assert companion.state is State.WAITING and companion.data_to_send() == []


def test_companion_turns_internal_bugs_into_internal_error(monkeypatch) -> None:
    companion = CompanionConnection()

    def broken(message):
        raise RuntimeError("secret detail")

    monkeypatch.setattr(companion, "_handle", broken)
    [event] = companion.receive_frame(encode(Hello(G_SHA)))
    assert event.code == ErrorCode.INTERNAL and "secret" not in event.message
    [frame] = companion.data_to_send()
    assert decode(frame, Limits()).code == ErrorCode.INTERNAL


# ------------------------------------------------------------------------------------------
# Property tests

ids_st = st.lists(st.integers(0, 2**32 - 1), max_size=20)
f16_st = st.floats(width=16, allow_nan=False)
text_st = st.text(max_size=30)
f32_pos = st.floats(min_value=0, width=32, allow_infinity=False)
f32_any = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def sparse_st(draw, columns: int):
    ids = draw(st.lists(st.integers(0, 2**32 - 1), unique=True, max_size=20))
    return (
        ids,
        *(draw(st.lists(f16_st, min_size=len(ids), max_size=len(ids))) for _ in range(columns)),
    )


@st.composite
def draft_st(draw):
    drafts = draw(st.lists(st.integers(0, 2**32 - 1), max_size=16))
    values = draw(st.none() | st.lists(f16_st, min_size=len(drafts), max_size=len(drafts)))
    return Draft(draw(st.integers(0, 2**32 - 1)), draw(ids_st), drafts, values)


messages_st = st.one_of(
    st.builds(Hello, text_st, text_st, text_st, text_st),
    st.builds(
        HelloOk,
        text_st,
        text_st,
        text_st,
        *(st.integers(1, 2**32 - 1) for _ in range(4)),
        st.integers(1, 0xFFFF),
    ),
    st.builds(
        OpenSession,
        ids_st,
        st.builds(
            SessionSettings,
            st.sampled_from(Mode),
            f32_pos,
            f32_any,
            st.integers(1, 0xFFFF),
            f32_pos,
            st.integers(0, 2**64 - 1),
            st.sampled_from(SELECTS),
            st.booleans(),
        ),
    ),
    st.builds(
        Resume,
        ids_st,
        ids_st,
        st.builds(SessionSettings, st.sampled_from(Mode), f32_pos, top_k=st.integers(1, 0xFFFF)),
        st.integers(0, 2**32 - 1),
    ),
    st.builds(SessionOpened, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)),
    draft_st(),
    sparse_st(1).flatmap(
        lambda s: st.builds(
            Verdict,
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**32 - 1),
            st.just(s[0]),
            st.just(s[1]),
        )
    ),
    st.builds(RowRequest, ids_st),
    sparse_st(2).map(lambda s: RowReply(*s)),
    st.builds(Close, text_st),
    st.builds(Error, st.integers(0, 0xFFFF), text_st),
)

WIDE = Limits(max_message_bytes=2**20, max_prompt_tokens=2**20, max_top_k=0xFFFF, max_draft=64)


@FUZZ
@given(messages_st)
def test_round_trip(message: Message) -> None:
    frame = encode(message)
    assert frame[0] == PROTOCOL_VERSION
    decoded = decode(frame, WIDE)
    assert decoded == message
    assert encode(decoded) == frame


def decodes_canonically_or_raises(frame: bytes, limits: Limits) -> None:
    try:
        message = decode(frame, limits)
    except ProtocolError as exc:
        assert isinstance(exc.code, int) and exc.code != ErrorCode.INTERNAL
    else:
        assert encode(message) == frame  # one valid encoding per message


@FUZZ
@given(st.binary(max_size=64))
def test_random_bytes_only_raise_protocol_error(frame: bytes) -> None:
    decodes_canonically_or_raises(frame, Limits(vocab_size=VOCAB))
    decodes_canonically_or_raises(b"\x01" + frame, Limits())


@st.composite
def mutated_frame_st(draw) -> bytes:
    frame = bytearray(encode(draw(messages_st)))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        if action == "cut":
            del frame[draw(st.integers(0, len(frame))) :]
        elif action == "insert":
            frame.insert(draw(st.integers(0, len(frame))), draw(st.integers(0, 255)))
        elif frame:
            at = draw(st.integers(0, len(frame) - 1))
            if action == "flip":
                frame[at] ^= 1 << draw(st.integers(0, 7))
            elif action == "set":
                frame[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
            else:
                del frame[at]
    return bytes(frame)


@FUZZ
@given(mutated_frame_st())
def test_mutated_frames_only_raise_protocol_error(frame: bytes) -> None:
    decodes_canonically_or_raises(frame, Limits(vocab_size=VOCAB))
    decodes_canonically_or_raises(frame, Limits(max_draft=2, max_prompt_tokens=3, max_top_k=2))


def companion_in(state: str) -> CompanionConnection:
    if state == "start":
        return CompanionConnection()
    device, companion = handshake(mode=Mode.SPECSTEER if state != "rows" else Mode.ROWS)
    if state == "waiting":
        device.send_draft((1, 2, 3))
        transfer(device, companion)
    return companion


@FUZZ
@given(
    st.sampled_from(["start", "session", "waiting", "rows"]),
    st.one_of(st.binary(max_size=40), mutated_frame_st(), messages_st.map(encode)),
)
def test_companion_never_raises_on_any_frame(state: str, frame: bytes) -> None:
    companion = companion_in(state)
    before = companion.bytes_received
    events = companion.receive_frame(frame)  # must not raise
    failures = [e for e in events if isinstance(e, ConnectionFailed)]
    sent = companion.data_to_send()
    assert companion.bytes_received == before + len(frame)
    assert len(events) == 1
    if failures:
        assert companion.state is State.CLOSED
        [reply] = sent
        error = decode(reply, Limits())
        assert isinstance(error, Error) and error.code == failures[0].code
        assert error.code != ErrorCode.INTERNAL  # a crash would show up here
        assert companion.receive_frame(frame) == [] and companion.data_to_send() == []
    else:
        # A valid, expected frame: nothing is sent until the server answers it.
        assert sent == []
        peer_closed = isinstance(events[0], (CloseRequested, ErrorReceived))
        assert (companion.state is State.CLOSED) == peer_closed


@FUZZ
@given(
    st.sampled_from(["start", "handshake", "session", "waiting"]),
    st.one_of(st.binary(max_size=40), mutated_frame_st(), messages_st.map(encode)),
)
def test_device_raises_only_protocol_error_and_closes(state: str, frame: bytes) -> None:
    device = DeviceConnection()
    if state == "handshake":
        device.hello(G_SHA)
    elif state in ("session", "waiting"):
        device, _ = handshake()
        if state == "waiting":
            device.send_draft((1, 2))
    device.data_to_send()
    before = device.bytes_received
    try:
        device.receive_frame(frame)
    except ProtocolError as exc:
        assert device.state is State.CLOSED
        [reply] = device.data_to_send()
        assert decode(reply, Limits()) == Error(exc.code, str(exc))
    assert device.bytes_received == before + len(frame)
