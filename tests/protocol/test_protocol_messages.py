"""`protocol.messages`: values are checked when a message is built and hold wire precision."""

from __future__ import annotations

import math
import struct

import pytest
from helpers.protocol import assert_code, f16

from specsteer.protocol import (
    Close,
    Draft,
    DraftS0,
    Error,
    ErrorCode,
    Limits,
    OpenSession,
    SessionSettings,
    Verdict,
    encode,
)


def test_float_fields_hold_wire_precision() -> None:
    # What a dataclass shows is what the peer will see: f32 settings, f16 values.
    wire_gamma = struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert OpenSession((1,), SessionSettings(gamma=0.1)).settings.gamma == wire_gamma
    assert Verdict(0, 0, (1,), (0.1,)).values == (struct.unpack("<e", f16(0.1))[0],)
    # Finite values beyond float16 saturate to -inf: a logp of -1e5 is impossible, not NaN.
    assert Verdict(0, 0, (1,), (-1e5,)).values == (-math.inf,)


def test_messages_reject_invalid_values_at_construction() -> None:
    assert_code(ErrorCode.BAD_VALUE, Verdict, 0, 0, (1, 1), (0.0, 0.0))  # duplicate id
    assert_code(ErrorCode.BAD_VALUE, Verdict, 0, 0, (1, 2), (0.0,))  # lengths differ
    assert_code(ErrorCode.BAD_VALUE, Verdict, 0, 0, (1,), (math.nan,))
    assert_code(ErrorCode.BAD_TOKEN, Draft, 0, (), (-1,))
    assert_code(ErrorCode.BAD_TOKEN, Draft, 0, (), (2**32,))
    assert_code(ErrorCode.BAD_VALUE, DraftS0, 0, (math.nan,))
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
