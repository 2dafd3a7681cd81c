"""`protocol.codec`: byte-exact frames, every decode error, and fuzzing of the decoder."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
from helpers.protocol import (
    FUZZ,
    G_SHA,
    S_SHA,
    VOCAB,
    WIDE,
    assert_code,
    f16,
    messages_st,
    mutated_frame_st,
)
from helpers.wire_bytes import varint
from hypothesis import given
from hypothesis import strategies as st

from specsteer import protocol as wire
from specsteer.errors import ProtocolError

# ------------------------------------------------------------------------------------------
# Byte-exact frames


def test_hello_bytes() -> None:
    frame = wire.encode(wire.Hello("ab", "", auth_token="tok", client_name="c"))
    assert frame == b"\x02\x01" + b"\x03tok" + b"\x02ab" + b"\x00" + b"\x01c"
    assert wire.decode(frame, wire.Limits()) == wire.Hello("ab", "", "tok", "c")


def test_draft_bytes_and_size() -> None:
    # round 3, one committed id 300 (0xAC 0x02), four drafts
    frame = wire.encode(wire.Draft(3, (300,), (1, 2, 3, 4)))
    assert frame == b"\x02\x05\x03\x01\xac\x02\x04\x01\x02\x03\x04"
    assert wire.decode(frame, wire.Limits()) == wire.Draft(3, (300,), (1, 2, 3, 4))
    # K=4 ids of a 152k vocabulary, nothing committed: 17 bytes at worst; small ids: 9 bytes.
    assert len(wire.encode(wire.Draft(100, (), (1, 2, 3, 4)))) == 9
    assert len(wire.encode(wire.Draft(100, (), (151_000,) * 4))) == 17
    # With P_S0 on the device its values follow in a DraftS0: round, count, 4 float16.
    frame = wire.encode(wire.DraftS0(0, (-1.0, -2.0, -0.5, 0.0)))
    expected = b"\x02\x0c\x00\x04" + b"".join(f16(x) for x in (-1.0, -2.0, -0.5, 0.0))
    assert frame == expected
    assert wire.decode(frame, wire.Limits()) == wire.DraftS0(0, (-1.0, -2.0, -0.5, 0.0))
    # never more values than a Draft may hold ids, checked before they are read
    too_many = wire.encode(wire.DraftS0(0, (-1.0,) * 17))
    assert_code(wire.ErrorCode.LIMIT_EXCEEDED, wire.decode, too_many, wire.Limits())


def test_verdict_bytes_sorted_and_delta_encoded() -> None:
    verdict = wire.Verdict(round=2, accepted=1, ids=(10, 3, 200), values=(-1.0, 0.5, -2.0))
    # Sorted with their values: 3 -> 0.5, 10 -> -1.0, 200 -> -2.0; deltas 3, 10-3-1, 200-10-1.
    assert verdict.ids == (3, 10, 200)
    assert verdict.values == (0.5, -1.0, -2.0)
    frame = wire.encode(verdict)
    assert frame == (
        b"\x02\x06\x02\x01\x03" + b"\x03\x06\xbd\x01" + f16(0.5) + f16(-1.0) + f16(-2.0)
    )
    assert wire.decode(frame, wire.Limits()) == verdict


def test_verdict_with_64_candidates_fits_270_bytes() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = rng.choice(VOCAB, size=64, replace=False)
        frame = wire.encode(wire.Verdict(1000, 4, ids, rng.normal(-5, 3, size=64)))
        assert len(frame) <= 270
    # Worst spread: every gap as large as it can be still stays near the target.
    spread = np.linspace(0, VOCAB - 1, 64).astype(int)
    assert len(wire.encode(wire.Verdict(1000, 4, spread, np.zeros(64)))) <= 275


def test_other_messages_bytes() -> None:
    # session id, prompt length, then no candidates (a count of 0)
    assert wire.encode(wire.SessionOpened(7, 300)) == b"\x02\x04\x07\xac\x02\x00"
    # with the first position's candidates: sorted sparse ids as a Verdict's, then float16s
    opened = wire.SessionOpened(7, 300, (9, 4), (-1.0, -2.0))
    assert opened.ids == (4, 9) and opened.values == (-2.0, -1.0)
    frame = wire.encode(opened)
    assert frame == b"\x02\x04\x07\xac\x02" + b"\x02\x04\x04" + f16(-2.0) + f16(-1.0)
    assert wire.decode(frame, wire.Limits()) == opened
    with pytest.raises(ProtocolError, match="top_k|candidates"):  # more than a verdict may carry
        wire.decode(wire.encode(wire.SessionOpened(7, 300, range(65), [0.0] * 65)),
                    wire.Limits(max_top_k=64))
    with pytest.raises(ProtocolError):  # cut inside the values
        wire.decode(frame[:-1], wire.Limits())
    assert wire.encode(wire.RowRequest((1, 2))) == b"\x02\x07\x02\x01\x02"
    assert wire.encode(wire.Close("bye")) == b"\x02\x09\x03bye"
    assert wire.encode(wire.Error(wire.ErrorCode.BAD_TOKEN, "x")) == b"\x02\x0a\x07\x00\x01x"
    row = wire.RowReply((9, 4), (-1.0, -2.0), (-3.0, -4.0))
    assert wire.encode(row) == b"\x02\x08\x02\x04\x04" + f16(-2.0) + f16(-1.0) + f16(-4.0) + f16(
        -3.0
    )
    settings = wire.SessionSettings(wire.Mode.ROWS, 0.5, 1.0, 64, 0.0, 42, "difference", True)
    request = wire.OpenSession((1, 2), settings)
    assert wire.encode(request) == (
        b"\x02\x03\x02\x01\x01"
        + struct.pack("<fffHQf", 0.5, 1.0, 0.0, 64, 42, 1.0)
        + b"\x02\x01\x02"
    )


def test_resume_bytes() -> None:
    # settings as in wire.OpenSession, then the round, the prompt ids and the committed ids
    settings = wire.SessionSettings(wire.Mode.SPECSTEER, 0.5, 1.0, 64, 0.0, 42, "generalist", False)
    frame = wire.encode(wire.Resume((1, 2), (300,), settings, round=130))
    assert frame == (
        b"\x02\x0b\x00\x00\x00"
        + struct.pack("<fffHQf", 0.5, 1.0, 0.0, 64, 42, 1.0)
        + b"\x82\x01"  # round 130
        + b"\x02\x01\x02"  # prompt
        + b"\x01\xac\x02"  # committed: 300
    )
    assert wire.decode(frame, wire.Limits()) == wire.Resume((1, 2), (300,), settings, 130)
    assert wire.Resume((1, 2), (300,)).held_ids == (1, 2, 300)


# ------------------------------------------------------------------------------------------
# Decode errors

VALID_DRAFT = wire.encode(wire.Draft(1, (300,), (1, 2, 3, 4)))


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"", wire.ErrorCode.BAD_FRAME),
        (b"\x02", wire.ErrorCode.BAD_FRAME),
        (b"\x01\x05", wire.ErrorCode.BAD_VERSION),  # version 1: logp_S0 inside the Draft
        (b"\x00\x05", wire.ErrorCode.BAD_VERSION),
        (b"\x02\x00", wire.ErrorCode.UNKNOWN_TYPE),
        (b"\x02\x63", wire.ErrorCode.UNKNOWN_TYPE),
        (VALID_DRAFT + b"\x00", wire.ErrorCode.BAD_FRAME),  # trailing byte
        (b"\x02\x04\x80\x00\x01", wire.ErrorCode.BAD_FRAME),  # over-long varint (0 in two bytes)
        (b"\x02\x04\x00\xff\xff\xff\xff\x10", wire.ErrorCode.BAD_FRAME),  # 33-bit prompt length
        (b"\x02\x04" + b"\xff" * 10 + b"\x01\x00", wire.ErrorCode.BAD_FRAME),  # > 64-bit session id
        (b"\x02\x04\x00\x80", wire.ErrorCode.BAD_FRAME),  # varint cut by the end of the frame
        (b"\x02\x09\x02\xff\xfe", wire.ErrorCode.BAD_FRAME),  # invalid UTF-8
        (b"\x02\x09\x05ab", wire.ErrorCode.BAD_FRAME),  # string longer than the frame
        (b"\x02\x03\x00\x00\x02" + b"\x00" * 22 + b"\x00", wire.ErrorCode.BAD_FRAME),  # bool byte 2
        (  # mode 7
            b"\x02\x03\x07\x00\x00" + b"\x00" * 22 + b"\x00\x00\x80\x3f" + b"\x00",
            wire.ErrorCode.BAD_VALUE,
        ),
        (b"\x02\x06\x00\x00\x01\x05\x00\x7e", wire.ErrorCode.BAD_VALUE),  # NaN value
        (b"\x02\x0a\x01", wire.ErrorCode.BAD_FRAME),  # error code cut short
    ],
)
def test_decode_rejects(frame: bytes, code: wire.ErrorCode) -> None:
    assert_code(code, wire.decode, frame, wire.Limits())


@pytest.mark.parametrize(
    "message",
    [
        wire.Hello(G_SHA, S_SHA, "token", "client"),
        wire.HelloOk("1.0", G_SHA, S_SHA, VOCAB, 16, 8192, 65536, 1024),
        wire.OpenSession((1, 2, 3), wire.SessionSettings(gamma=0.25, seed=2**63)),
        wire.Resume((1, 2, 3), (4, 5), wire.SessionSettings(top_k=8), 2**31),
        wire.SessionOpened(2**40, 3),
        wire.Draft(5, (7,), (1, 2)),
        wire.DraftS0(5, (-1.0, -2.0)),
        wire.Verdict(5, 2, (1, 50, 70_000), (-1.0, -2.0, -3.0)),
        wire.RowRequest((1,)),
        wire.RowReply((1, 2), (-1.0, -2.0), (-3.0, -4.0)),
        wire.Close("done"),
        wire.Error(wire.ErrorCode.TIMEOUT, "slow"),
    ],
)
def test_every_truncation_is_bad_frame(message: wire.Message) -> None:
    frame = wire.encode(message)
    assert wire.decode(frame, wire.Limits()) == message
    for cut in range(len(frame)):
        assert_code(wire.ErrorCode.BAD_FRAME, wire.decode, frame[:cut], wire.Limits())


def test_frame_above_max_message_bytes_is_too_large() -> None:
    frame = wire.encode(wire.Close("x" * 100))
    assert wire.decode(frame, wire.Limits(max_message_bytes=len(frame))) == wire.Close("x" * 100)
    assert_code(
        wire.ErrorCode.TOO_LARGE, wire.decode, frame, wire.Limits(max_message_bytes=len(frame) - 1)
    )
    # Size is checked before anything else: even garbage reports TOO_LARGE.
    assert_code(wire.ErrorCode.TOO_LARGE, wire.decode, b"\xff" * 70_000, wire.Limits())


def test_counts_over_limits() -> None:
    limits = wire.Limits(max_draft=4, max_prompt_tokens=3, max_top_k=2)
    assert_code(
        wire.ErrorCode.LIMIT_EXCEEDED, wire.decode, wire.encode(wire.Draft(0, (), (1,) * 5)), limits
    )
    assert_code(
        wire.ErrorCode.LIMIT_EXCEEDED, wire.decode, wire.encode(wire.Draft(0, (1,) * 4, ())), limits
    )
    long_prompt = wire.OpenSession((1,) * 4, wire.SessionSettings(top_k=2))
    assert_code(wire.ErrorCode.LIMIT_EXCEEDED, wire.decode, wire.encode(long_prompt), limits)
    wide = wire.OpenSession((1,), wire.SessionSettings(top_k=3))
    assert_code(wire.ErrorCode.LIMIT_EXCEEDED, wire.decode, wire.encode(wide), limits)
    assert_code(
        wire.ErrorCode.LIMIT_EXCEEDED,
        wire.decode,
        wire.encode(wire.Verdict(0, 0, (1, 2, 3), (0,) * 3)),
        limits,
    )
    assert_code(
        wire.ErrorCode.LIMIT_EXCEEDED, wire.decode, wire.encode(wire.RowRequest((1,) * 4)), limits
    )
    rows = wire.RowReply((1, 2, 3), (0,) * 3, (0,) * 3)
    assert_code(wire.ErrorCode.LIMIT_EXCEEDED, wire.decode, wire.encode(rows), limits)
    assert wire.decode(wire.encode(wire.Draft(0, (1,) * 3, (1,) * 4)), limits) == wire.Draft(
        0, (1,) * 3, (1,) * 4
    )


@pytest.mark.parametrize(
    ("limits", "code"),
    [
        (wire.Limits(), wire.ErrorCode.LIMIT_EXCEEDED),  # 10^9 is over every default limit
        # Even with a limit that allows it, the count is compared with the bytes left.
        (
            wire.Limits(max_prompt_tokens=2**31, max_top_k=0xFFFF, max_draft=2**31),
            wire.ErrorCode.BAD_FRAME,
        ),
    ],
)
def test_huge_counts_fail_before_allocating(limits: wire.Limits, code: wire.ErrorCode) -> None:
    huge = varint(10**9)
    frames = [
        b"\x02\x07" + huge + b"\x01" * 11,  # wire.RowRequest
        b"\x02\x05\x00" + huge + b"\x01" * 11,  # wire.Draft committed ids
        b"\x02\x05\x00\x00" + huge + b"\x01" * 11,  # wire.Draft ids
        b"\x02\x0c\x00" + huge + b"\x01" * 11,  # wire.DraftS0 values
        b"\x02\x06\x00\x00" + huge + b"\x01" * 11,  # wire.Verdict candidates
        b"\x02\x08" + huge + b"\x01" * 11,  # wire.RowReply
    ]
    tracemalloc.start()
    try:
        for frame in frames:
            assert len(frame) <= 20
            expected = code
            if frame[1] == 6 or frame[1] == 8:  # top_k is u16: 10^9 always exceeds it
                expected = wire.ErrorCode.LIMIT_EXCEEDED
            assert_code(expected, wire.decode, frame, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200_000  # no list or array sized by the claimed count


def test_ids_at_or_above_vocab_are_bad_token() -> None:
    limits = wire.Limits(vocab_size=1000)
    assert wire.decode(wire.encode(wire.Draft(0, (999,), (0,))), limits) == wire.Draft(
        0, (999,), (0,)
    )
    assert_code(
        wire.ErrorCode.BAD_TOKEN, wire.decode, wire.encode(wire.Draft(0, (), (1000,))), limits
    )
    assert_code(
        wire.ErrorCode.BAD_TOKEN, wire.decode, wire.encode(wire.Draft(0, (1000,), ())), limits
    )
    assert_code(
        wire.ErrorCode.BAD_TOKEN, wire.decode, wire.encode(wire.OpenSession((5, 1000))), limits
    )
    assert_code(
        wire.ErrorCode.BAD_TOKEN,
        wire.decode,
        wire.encode(wire.Verdict(0, 0, (3, 1000), (0, 0))),
        limits,
    )
    assert_code(
        wire.ErrorCode.BAD_TOKEN,
        wire.decode,
        wire.encode(wire.RowReply((1000,), (0,), (0,))),
        limits,
    )
    # Without a vocabulary, ids are still bounded by u32.
    assert_code(
        wire.ErrorCode.BAD_TOKEN,
        wire.decode,
        b"\x02\x06\x00\x00\x02" + varint(2**32 - 1) + b"\x00" + b"\0" * 4,
        wire.Limits(),
    )


# ------------------------------------------------------------------------------------------
# Property tests


@FUZZ
@given(messages_st)
def test_round_trip(message: wire.Message) -> None:
    frame = wire.encode(message)
    assert frame[0] == wire.PROTOCOL_VERSION
    decoded = wire.decode(frame, WIDE)
    assert decoded == message
    assert wire.encode(decoded) == frame


def decodes_canonically_or_raises(frame: bytes, limits: wire.Limits) -> None:
    try:
        message = wire.decode(frame, limits)
    except ProtocolError as exc:
        assert isinstance(exc.code, int) and exc.code != wire.ErrorCode.INTERNAL
    else:
        assert wire.encode(message) == frame  # one valid encoding per message


@FUZZ
@given(st.binary(max_size=64))
def test_random_bytes_only_raise_protocol_error(frame: bytes) -> None:
    decodes_canonically_or_raises(frame, wire.Limits(vocab_size=VOCAB))
    decodes_canonically_or_raises(b"\x01" + frame, wire.Limits())


@FUZZ
@given(mutated_frame_st())
def test_mutated_frames_only_raise_protocol_error(frame: bytes) -> None:
    decodes_canonically_or_raises(frame, wire.Limits(vocab_size=VOCAB))
    decodes_canonically_or_raises(frame, wire.Limits(max_draft=2, max_prompt_tokens=3, max_top_k=2))
