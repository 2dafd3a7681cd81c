"""`protocol.connections`: both sans-I/O state machines driven against each other by hand,
the checks each side makes, and fuzzing of both (no sockets)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.protocol import (
    FUZZ,
    G_SHA,
    S_SHA,
    VOCAB,
    assert_code,
    handshake,
    messages_st,
    mutated_frame_st,
    transfer,
)
from hypothesis import given
from hypothesis import strategies as st

from specsteer.errors import ProtocolError
from specsteer.protocol import (
    Close,
    Closed,
    CloseRequested,
    CompanionConnection,
    ConnectionFailed,
    DeviceConnection,
    Draft,
    DraftReceived,
    DraftS0,
    DraftS0Received,
    Error,
    ErrorCode,
    ErrorReceived,
    Hello,
    HelloAccepted,
    HelloOk,
    HelloReceived,
    Limits,
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
    SessionSettings,
    State,
    Verdict,
    VerdictReceived,
    decode,
    encode,
)

# ------------------------------------------------------------------------------------------
# State machines driven against each other


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
    device.send_draft([5, 6, 7, 8])
    device.send_draft_s0([-1, -2, -3, -4])
    pump()
    companion.send_verdict(4, list(range(64)), np.linspace(-10, 0, 64))
    pump()
    assert device.bytes_sent == sum(map(len, up)) == companion.bytes_received
    assert device.bytes_received == sum(map(len, down)) == companion.bytes_sent
    assert device.frames_received == len(down) == 3
    assert device.frames_sent == len(up) == companion.frames_received == 4


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


GREEDY_S0 = {"s0_on_device": True}  # a session that takes the opening's candidates


@pytest.mark.parametrize(
    ("session", "opened", "code"),
    [
        ({}, SessionOpened(1, 3, (5,), (-1.0,)), ErrorCode.BAD_VALUE),  # P_S0 on the companion
        ({**GREEDY_S0, "temperature": 0.7}, SessionOpened(1, 3, (5,), (-1.0,)),
         ErrorCode.BAD_VALUE),  # sampling: the device cannot settle the test itself
        ({**GREEDY_S0, "mode": Mode.SPECULATIVE}, SessionOpened(1, 3, (5,), (-1.0,)),
         ErrorCode.BAD_VALUE),
        (GREEDY_S0, SessionOpened(1, 3, range(65), [0.0] * 65), ErrorCode.BAD_VALUE),
        (GREEDY_S0, SessionOpened(1, 3, (VOCAB,), (0.0,)), ErrorCode.BAD_TOKEN),
    ],
)
def test_device_checks_the_openings_candidates(session, opened, code) -> None:
    device = DeviceConnection()
    device.hello(G_SHA)
    device.receive_frame(encode(HelloOk("0.1", G_SHA, "", VOCAB, 16, 8192, 2**16, 1024)))
    device.open_session((1, 2, 3), SessionSettings(**session))
    assert_code(code, device.receive_frame, encode(opened))
    assert device.state is State.CLOSED


def test_the_openings_candidates_last_until_the_first_verdict() -> None:
    device, companion = handshake(**GREEDY_S0)  # opened without candidates
    assert device.opening is None
    device.open_session((10, 11, 12), SessionSettings(**GREEDY_S0))
    transfer(device, companion)
    companion.session_opened(78, ids=(9, 4), values=(-1.0, -2.0))
    assert transfer(companion, device) == [SessionReady(78, 3)]
    assert device.opening == ((4, 9), (-2.0, -1.0))
    device.send_draft((4,))
    device.send_draft_s0((-1.5,))
    transfer(device, companion)
    companion.send_verdict(1, (4,), (-2.0,))
    transfer(companion, device)
    assert device.opening is None  # round 0 settled: later rounds have their own verdicts


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
    assert_code(ErrorCode.OUT_OF_ORDER, device.send_draft_s0, (0.0,))  # no Draft outstanding
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
    assert other.receive_frame(b"\x02\x09\x00") == [Closed("")]
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
    failed(CompanionConnection(), b"\x02\xee", ErrorCode.UNKNOWN_TYPE)
    failed(CompanionConnection(), b"\x02\x01" + b"\x00" * 70_000, ErrorCode.TOO_LARGE)


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


@pytest.mark.parametrize("mode", [Mode.SPECSTEER, Mode.ROWS])
def test_a_round_commits_at_most_the_accepted_drafts_and_one(mode: Mode) -> None:
    """A Draft or RowRequest is not a way to make the companion prefill a long text (issue 28:
    2,040 committed ids a Draft): past `max_committed` the device refuses to send it and the
    companion refuses it as a limit; a longer catch-up is a Resume."""
    most = Limits().max_committed
    assert most == Limits().max_draft + 1

    def send(conn: DeviceConnection, n: int) -> None:
        if mode is Mode.ROWS:
            conn.request_row(committed_ids=(1,) * n)
        else:
            conn.send_draft((2,), committed_ids=(1,) * n)

    device, companion = handshake(mode=mode)
    send(device, most)
    [event] = transfer(device, companion)
    assert isinstance(event, RowRequested | DraftReceived)
    device, companion = handshake(mode=mode)
    assert_code(ErrorCode.LIMIT_EXCEEDED, send, device, most + 1)
    request = RowRequest((1,) * (most + 1)) if mode is Mode.ROWS else Draft(0, (1,) * (most + 1),
                                                                             (2,))
    failed(companion, encode(request), ErrorCode.LIMIT_EXCEEDED)


def test_companion_checks_tokens_against_its_vocab() -> None:
    _, companion = handshake()
    failed(companion, encode(Draft(0, (), (VOCAB,))), ErrorCode.BAD_TOKEN)
    _, companion = handshake()
    failed(companion, encode(Draft(0, (VOCAB + 5,), (1,))), ErrorCode.BAD_TOKEN)


def test_p_s0_follows_the_draft_in_a_frame_of_its_own() -> None:
    """With s0_on_device the companion hears of the draft first (to score it meanwhile), its
    P_S0 values next, and only then may it answer; the next round starts over."""
    device, companion = handshake(s0_on_device=True)
    for round_ in range(2):
        device.send_draft((1, 2), committed_ids=(3,) if round_ else ())
        [event] = transfer(device, companion)
        assert isinstance(event, DraftReceived) and event.draft.draft_ids == (1, 2)
        assert_code(ErrorCode.OUT_OF_ORDER, companion.send_verdict, 1, (5,), (0.0,))
        device.send_draft_s0((-1.0, -2.0))
        [event] = transfer(device, companion)
        assert event == DraftS0Received(DraftS0(round_, (-1.0, -2.0)))
        companion.send_verdict(1, (5,), (0.0,))
        [event] = transfer(companion, device)
        assert isinstance(event, VerdictReceived) and event.verdict.round == round_


def test_the_device_sends_p_s0_once_per_draft_of_an_s0_session() -> None:
    device, _ = handshake(s0_on_device=False)
    device.send_draft((1,))
    assert_code(ErrorCode.OUT_OF_ORDER, device.send_draft_s0, (0.0,))  # the companion's P_S0
    device, _ = handshake(s0_on_device=True)
    device.send_draft((1, 2))
    assert_code(ErrorCode.BAD_VALUE, device.send_draft_s0, (0.0,))  # one value per draft
    device.send_draft_s0((0.0, -1.0))
    assert_code(ErrorCode.OUT_OF_ORDER, device.send_draft_s0, (0.0, -1.0))
    assert len(device.data_to_send()) == 2


def test_the_device_refuses_a_verdict_before_it_sent_p_s0() -> None:
    device, companion = handshake(s0_on_device=True)
    device.send_draft((1,))
    transfer(device, companion)
    forged = encode(Verdict(0, 1, (5,), (0.0,)))  # a companion that decided without P_S0
    assert_code(ErrorCode.OUT_OF_ORDER, device.receive_frame, forged)
    assert device.state is State.CLOSED


@pytest.mark.parametrize(
    ("s0_on_device", "frames", "code"),
    [
        (False, [DraftS0(0, (-1.0,))], ErrorCode.OUT_OF_ORDER),  # P_S0 is the companion's
        (False, [Draft(0, (), (1,)), DraftS0(0, (-1.0,))], ErrorCode.OUT_OF_ORDER),
        (True, [DraftS0(0, (-1.0,))], ErrorCode.OUT_OF_ORDER),  # before any Draft
        (True, [Draft(0, (), (1,)), DraftS0(1, (-1.0,))], ErrorCode.OUT_OF_ORDER),  # round
        (True, [Draft(0, (), (1, 2)), DraftS0(0, (-1.0,))], ErrorCode.BAD_VALUE),  # count
        (True, [Draft(0, (), (1,)), DraftS0(0, (-1.0,)), DraftS0(0, (-1.0,))],
         ErrorCode.OUT_OF_ORDER),  # twice
        (True, [Draft(0, (), (1,)), Draft(1, (), (1,))], ErrorCode.OUT_OF_ORDER),  # no P_S0
    ],
)
def test_companion_checks_where_p_s0_comes_from(
        s0_on_device: bool, frames: list[Draft | DraftS0], code: ErrorCode) -> None:
    _, companion = handshake(s0_on_device=s0_on_device)
    *before, last = frames
    for message in before:
        [event] = companion.receive_frame(encode(message))
        assert isinstance(event, DraftReceived | DraftS0Received)
    failed(companion, encode(last), code)


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
