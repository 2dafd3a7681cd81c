"""The admission gate on its own (no sockets, a hand-driven clock): the pre-login pool and what
it sheds, the reserve kept for logged-in devices, deadlines, the request rate, the prompt
budget (prompts, resumes and committed ids), the session slots, and the config's checks."""

from __future__ import annotations

import pytest
from helpers.manual_clock import ManualClock

from specsteer import protocol
from specsteer.errors import CompanionConfigError
from specsteer.protocol import ErrorCode, Limits
from specsteer_companion.admission import AdmissionGate, Refusal, ServerConfig
from specsteer_companion.limits import FD_RESERVE
from specsteer_companion.ray_config import IngressSection, parse_config

SETTINGS = protocol.SessionSettings(top_k=8)
LIMITS = Limits(vocab_size=512)
HELLO = protocol.encode(protocol.Hello("", client_name="device"))


def _gate(clock: ManualClock | None = None, **config) -> AdmissionGate:
    return AdmissionGate(ServerConfig(**config), clock=clock or ManualClock())


def _login(gate: AdmissionGate, peer: str, identity: str):  # type: ignore[no-untyped-def]
    entry = gate.connect(peer).entry
    assert entry is not None
    gate.logged_in(entry, identity)
    return entry


def _frame(message: protocol.Message) -> bytes:
    return protocol.encode(message)


def test_the_pre_login_pool_is_half_the_total_and_sheds_its_oldest():
    gate = _gate(max_connections=8)
    assert gate.max_unauthenticated == 4
    waiting = [gate.connect(f"127.0.0.{n}").entry for n in range(2, 6)]
    assert gate.unauthenticated == 4 and gate.shed == 0
    newcomer = gate.connect("127.0.0.9")
    assert newcomer.entry is not None and newcomer.shed == [waiting[0]]  # the oldest went
    assert gate.unauthenticated == 4 and gate.open_connections() == 4 and gate.shed == 1
    gate.disconnect(waiting[0])  # the adapter's close of the shed one changes nothing more
    assert gate.open_connections() == 4


def test_the_busiest_address_gives_way_first_so_a_lone_device_keeps_its_slot():
    gate = _gate(max_connections=8)
    device = gate.connect("127.0.0.1").entry  # the oldest of all
    flood = [gate.connect("127.0.0.2").entry for _ in range(3)]
    for _ in range(20):  # a newcomer from the busiest address is refused, the device stays
        refused = gate.connect("127.0.0.2")
        assert refused.entry is None and refused.shed == []
        assert refused.refused == "4 waiting to log in, 3 of them from this address"
    for n in range(2):  # one from a quieter address takes the busiest one's oldest slot
        admission = gate.connect(f"127.0.0.{10 + n}")
        assert admission.entry is not None and admission.shed == [flood[n]]
    assert device.counted and gate.shed == 2 and gate.refused == 20
    gate.logged_in(device, "token-a")
    assert gate.unauthenticated == 3


def test_a_device_connecting_during_a_distributed_flood_is_never_shed():
    """13 addresses (issue 28's attack) reconnecting whenever dropped, pool of 64 (the pool
    under a 256-descriptor limit): the device's one waiting connection is never the busiest
    address's, so it is never shed, and the flood keeps the pool full."""
    gate = AdmissionGate(ServerConfig(), descriptor_limit=256, clock=ManualClock())
    assert gate.max_connections == 256 - FD_RESERVE and gate.max_unauthenticated == 64
    attackers = [f"127.0.1.{n}" for n in range(13)]
    for turn in range(13 * 32):
        gate.connect(attackers[turn % 13])
    device = gate.connect("127.0.0.1").entry
    assert device is not None
    for turn in range(5000):
        gate.connect(attackers[turn % 13])
        assert gate.unauthenticated == 64
    assert device.counted
    gate.logged_in(device, "device")
    assert gate.open_connections("127.0.0.1") == 1


def test_room_is_kept_for_logged_in_devices_and_refused_only_when_all_are_in():
    gate = _gate(max_connections=4)
    devices = [_login(gate, "127.0.0.1", f"d{n}") for n in range(3)]
    flood = gate.connect("127.0.0.2").entry
    assert gate.open_connections() == 4
    fourth = gate.connect("127.0.0.1")  # total full: the one waiting connection makes room
    assert fourth.shed == [flood] and fourth.entry is not None
    gate.logged_in(fourth.entry, "d3")
    refused = gate.connect("127.0.0.3")
    assert refused.entry is None and refused.shed == []
    assert refused.refused == "4 open in total, all logged in" and gate.refused == 1
    gate.disconnect(devices[0])
    assert gate.connect("127.0.0.3").entry is not None


def test_the_per_address_cap_refuses_even_with_room():
    gate = _gate(max_connections_per_address=2)
    for _ in range(2):
        assert gate.connect("127.0.0.2").entry is not None
    refused = gate.connect("127.0.0.2")
    assert refused.entry is None and refused.refused == "2 open from this address"
    assert gate.connect("127.0.0.3").entry is not None


def test_hello_deadline_and_idle_timeout():
    clock = ManualClock()
    gate = _gate(clock, hello_timeout_s=5, idle_timeout_s=120)
    entry = gate.connect("127.0.0.2").entry
    clock.advance(2)
    assert gate.wait_s(entry) == pytest.approx(3)
    clock.advance(10)
    assert gate.wait_s(entry) == 0
    assert gate.timed_out(entry) == Refusal(ErrorCode.TIMEOUT, "no Hello within 5 s")
    gate.logged_in(entry, "token")
    assert gate.wait_s(entry) == 120
    assert gate.timed_out(entry) == Refusal(ErrorCode.TIMEOUT, "idle timeout")


def test_requests_past_the_burst_are_refused_until_the_bucket_refills():
    clock = ManualClock()
    gate = _gate(clock, requests_per_second=5, burst=10)
    entry = gate.connect("127.0.0.2").entry
    assert all(isinstance(gate.check(entry, HELLO, LIMITS), protocol.Hello) for _ in range(10))
    assert gate.check(entry, HELLO, LIMITS) == Refusal(ErrorCode.RATE_LIMITED, "too many requests")
    clock.advance(1.0)
    assert sum(isinstance(gate.check(entry, HELLO, LIMITS), protocol.Hello)
               for _ in range(10)) == 5


def test_text_invalid_and_revoked_frames_are_refused_with_their_code():
    gate = _gate()
    entry = gate.connect("127.0.0.2").entry
    assert gate.check(entry, "hello", LIMITS).code == ErrorCode.BAD_FRAME
    assert gate.check(entry, b"\x02\xff", LIMITS).code == ErrorCode.UNKNOWN_TYPE
    assert gate.check(entry, b"\x02", LIMITS).code == ErrorCode.BAD_FRAME
    big = _frame(protocol.OpenSession((1,) * 600, SETTINGS))
    assert gate.check(entry, big, Limits(max_prompt_tokens=512)).code == ErrorCode.LIMIT_EXCEEDED
    entry.revoked = True
    assert gate.check(entry, HELLO, LIMITS) == Refusal(ErrorCode.AUTH_FAILED,
                                                       "device token revoked")


@pytest.mark.parametrize(("message", "charged"), [
    (protocol.OpenSession((1,) * 300, SETTINGS), 300),
    (protocol.Resume((1,) * 200, (2,) * 100, SETTINGS, 5), 300),
    (protocol.Draft(0, (2,) * 301, (3, 4)), 300),  # one committed id a round is free
    (protocol.RowRequest((2,) * 301), 300),
])
def test_every_way_to_make_the_companion_prefill_is_charged(message, charged):
    # drafts of up to 300, so that a Draft may commit 301 ids (`Limits.max_committed`): the
    # charge of what a round carries beyond its own id, whatever the protocol's bound on it
    limits = Limits(vocab_size=512, max_draft=300)
    clock = ManualClock()
    gate = _gate(clock, prefill_tokens_per_second=10, prefill_burst=500)
    entry = _login(gate, "127.0.0.2", "token")
    assert gate.check(entry, _frame(message), limits) == message
    refused = gate.check(entry, _frame(message), limits)
    assert isinstance(refused, Refusal) and refused.code == ErrorCode.RATE_LIMITED
    assert refused.message.startswith(f"prompt budget exhausted: {charged} ")
    clock.advance((charged - 200) / 10)  # 200 left + what refilled: exactly enough
    assert gate.check(entry, _frame(message), limits) == message


def test_a_prefill_longer_than_the_burst_is_served_from_a_full_budget_and_owed():
    clock = ManualClock()
    gate = _gate(clock, prefill_tokens_per_second=10, prefill_burst=500)
    entry = _login(gate, "127.0.0.2", "token")
    long, short = (_frame(protocol.OpenSession((1,) * n, SETTINGS)) for n in (800, 1))
    assert isinstance(gate.check(entry, long, LIMITS), protocol.OpenSession)
    refused = gate.check(entry, short, LIMITS)  # the budget owes 300: 30.1 s to one token
    assert refused.message == "prompt budget exhausted: 1 prompt tokens, retry in 30.1 s"
    clock.advance(30.0)
    assert isinstance(gate.check(entry, short, LIMITS), Refusal)
    clock.advance(0.2)
    assert isinstance(gate.check(entry, short, LIMITS), protocol.OpenSession)
    clock.advance(1000)  # a full budget again: the next long one is served, not refused forever
    assert isinstance(gate.check(entry, long, LIMITS), protocol.OpenSession)


def test_a_round_s_own_committed_id_and_drafts_cost_no_budget():
    gate = _gate(prefill_tokens_per_second=0.001, prefill_burst=1)
    entry = _login(gate, "127.0.0.2", "token")
    draft = protocol.Draft(0, (7,), (3,) * 16)
    assert all(gate.check(entry, _frame(draft), LIMITS) == draft for _ in range(100))


def test_the_budget_is_the_identity_s_across_its_connections():
    gate = _gate(prefill_tokens_per_second=1, prefill_burst=500)
    opening = _frame(protocol.OpenSession((1,) * 300, SETTINGS))
    first, second = (_login(gate, "127.0.0.2", "token") for _ in range(2))
    other = _login(gate, "127.0.0.3", "other")
    assert isinstance(gate.check(first, opening, LIMITS), protocol.OpenSession)
    assert isinstance(gate.check(second, opening, LIMITS), Refusal)
    assert isinstance(gate.check(other, opening, LIMITS), protocol.OpenSession)


def test_a_connection_holds_one_session_slot_until_it_ends():
    gate = _gate(max_sessions_per_identity=1, max_sessions=2)
    opening = _frame(protocol.OpenSession((1, 2), SETTINGS))
    first = _login(gate, "127.0.0.2", "alice")
    assert isinstance(gate.check(first, opening, LIMITS), protocol.OpenSession)
    assert isinstance(gate.check(first, opening, LIMITS), protocol.OpenSession)  # replaces it
    second = _login(gate, "127.0.0.2", "alice")
    assert gate.check(second, opening, LIMITS) == Refusal(ErrorCode.SESSION_LIMIT,
                                                          "too many open sessions")
    bob = _login(gate, "127.0.0.3", "bob")
    assert isinstance(gate.check(bob, opening, LIMITS), protocol.OpenSession)
    carol = _login(gate, "127.0.0.4", "carol")
    assert gate.check(carol, opening, LIMITS).code == ErrorCode.SESSION_LIMIT  # 2 in all
    gate.release_session(first)
    gate.disconnect(first)  # idempotent: the slot is not given back twice
    assert gate.open_sessions() == 1
    assert isinstance(gate.check(second, opening, LIMITS), protocol.OpenSession)


def test_before_login_only_the_hello_is_decoded_and_nothing_is_charged():
    gate = _gate(prefill_tokens_per_second=0.001, prefill_burst=1)
    entry = gate.connect("127.0.0.2").entry
    opening = protocol.OpenSession((1,) * 50, SETTINGS)
    assert gate.check(entry, _frame(opening), LIMITS) == opening  # the endpoint refuses it
    assert gate.open_sessions() == 0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_unauthenticated", 0, "max_unauthenticated must be an integer >= 1, got 0"),
    ("hello_timeout_s", 0, "hello_timeout_s must be a number > 0, got 0"),
    ("idle_timeout_s", float("nan"), "idle_timeout_s must be a number > 0, got nan"),
    ("burst", 2.5, "burst must be an integer >= 1, got 2.5"),
    ("requests_per_second", True, "requests_per_second must be a number > 0, got True"),
    ("port", 70000, "port must be 0..65535, got 70000"),
])
def test_a_bad_limit_is_an_error_naming_it(field, value, message):
    with pytest.raises(CompanionConfigError, match=message):
        ServerConfig(**{field: value})
    with pytest.raises(CompanionConfigError, match=f"ingress: {message}"):
        parse_config({"open_access": True, "ingress": {field: value}})


def test_the_ray_ingress_section_is_the_server_config_with_its_own_additions():
    ingress, server = IngressSection(), ServerConfig()
    for name in ServerConfig.__dataclass_fields__:
        assert getattr(ingress, name) == getattr(server, name), name
    assert parse_config({"open_access": True, "ingress": {"max_unauthenticated": 8}}
                        ).ingress.max_unauthenticated == 8
    for only_in_process in ("workers", "limits"):
        with pytest.raises(CompanionConfigError, match="unknown key"):
            parse_config({"open_access": True, "ingress": {only_in_process: 2}})
