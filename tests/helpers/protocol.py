"""What the protocol tests share: constants, an error-code assertion, two machines driven
against each other by hand, and Hypothesis strategies for every message (python-websockets'
protocol tests work the same way: no sockets)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from specsteer import protocol as wire
from specsteer.errors import ProtocolError
from specsteer.steer import SELECTS

VOCAB = 151_936  # Qwen2.5's vocabulary: ids above 16383 take 3 varint bytes
G_SHA = "a" * 64
S_SHA = "b" * 64
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_code(code: wire.ErrorCode, func, *args, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        func(*args, **kwargs)
    assert info.value.code == code, f"{info.value.code!r} != {code!r}: {info.value}"
    return info.value


def f16(x: float) -> bytes:
    return struct.pack("<e", x)



def transfer(sender, receiver) -> list:
    """Move every queued frame from one machine to the other; return the receiver's events."""
    events = []
    for frame in sender.data_to_send():
        events += receiver.receive_frame(frame)
    return events


def handshake(
    device: wire.DeviceConnection | None = None,
    companion: wire.CompanionConnection | None = None,
    **session,
) -> tuple[wire.DeviceConnection, wire.CompanionConnection]:
    device = device or wire.DeviceConnection()
    companion = companion or wire.CompanionConnection()
    device.hello(G_SHA, S_SHA, auth_token="secret", client_name="test")
    [event] = transfer(device, companion)
    assert event == wire.HelloReceived(wire.Hello(G_SHA, S_SHA, "secret", "test"))
    companion.accept_hello(
        companion_version="0.1", generalist_sha256=G_SHA, specialist_sha256=S_SHA, vocab_size=VOCAB
    )
    [event] = transfer(companion, device)
    assert isinstance(event, wire.HelloAccepted) and event.hello_ok.vocab_size == VOCAB
    device.open_session((10, 11, 12), wire.SessionSettings(**session))
    [event] = transfer(device, companion)
    assert isinstance(event, wire.SessionRequested) and event.request.prompt_ids == (10, 11, 12)
    companion.session_opened(session_id=77)
    assert transfer(companion, device) == [wire.SessionReady(77, 3)]
    assert device.state is companion.state is wire.State.SESSION
    return device, companion


# Hypothesis strategies

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


def with_candidates(message: type, first: st.SearchStrategy) -> st.SearchStrategy:
    """`message(first, u32, ids, values)`: a SessionOpened or a Verdict with its candidates."""
    return sparse_st(1).flatmap(lambda s: st.builds(
        message, first, st.integers(0, 2**32 - 1), st.just(s[0]), st.just(s[1])))


@st.composite
def draft_st(draw):
    drafts = draw(st.lists(st.integers(0, 2**32 - 1), max_size=16))
    return wire.Draft(draw(st.integers(0, 2**32 - 1)), draw(ids_st), drafts)


messages_st = st.one_of(
    st.builds(wire.Hello, text_st, text_st, text_st, text_st),
    st.builds(
        wire.HelloOk,
        text_st,
        text_st,
        text_st,
        *(st.integers(1, 2**32 - 1) for _ in range(4)),
        st.integers(1, 0xFFFF),
    ),
    st.builds(
        wire.OpenSession,
        ids_st,
        st.builds(
            wire.SessionSettings,
            st.sampled_from(wire.Mode),
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
        wire.Resume,
        ids_st,
        ids_st,
        st.builds(wire.SessionSettings, st.sampled_from(wire.Mode), f32_pos,
                  top_k=st.integers(1, 0xFFFF)),
        st.integers(0, 2**32 - 1),
    ),
    with_candidates(wire.SessionOpened, st.integers(0, 2**64 - 1)),
    draft_st(),
    st.builds(wire.DraftS0, st.integers(0, 2**32 - 1), st.lists(f16_st, max_size=16)),
    with_candidates(wire.Verdict, st.integers(0, 2**32 - 1)),
    st.builds(wire.RowRequest, ids_st),
    sparse_st(2).map(lambda s: wire.RowReply(*s)),
    st.builds(wire.Close, text_st),
    st.builds(wire.Error, st.integers(0, 0xFFFF), text_st),
)

WIDE = wire.Limits(max_message_bytes=2**20, max_prompt_tokens=2**20, max_top_k=0xFFFF, max_draft=64)


@st.composite
def mutated_frame_st(draw) -> bytes:
    frame = bytearray(wire.encode(draw(messages_st)))
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
