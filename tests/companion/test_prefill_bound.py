"""Every way to make the companion prefill is charged: whatever frames a token holder sends, over
however many connections, the tokens the Generalist runs for it stay within its prompt budget
(burst + rate x time) plus what rounds themselves carry (one committed id and at most
`max_draft` drafted ids each, bounded in number by the request rate). Hypothesis drives the
admission gate and real endpoints over the tiny pair, on a clock it moves by hand; the
Generalist counts what it runs. Issue 28 found `Draft.committed_ids` of 2,039 ids prefilled
5.7-7.2 times a second per abuser, never charged."""

from __future__ import annotations

from helpers.counting import CountingModel
from helpers.manual_clock import ManualClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsteer import protocol
from specsteer.protocol import Limits
from specsteer_companion.admission import AdmissionGate, Refusal, ServerConfig
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.limits import FREE_COMMITTED_IDS
from specsteer_companion.verifier import Verifier

RATE, BURST = 100.0, 600  # prompt tokens per second and burst (small, to be hit often)
SPECSTEER = protocol.SessionSettings(top_k=8)
MODES = [SPECSTEER, SPECSTEER, protocol.SessionSettings(mode=protocol.Mode.ROWS, top_k=8)]
KINDS = ("open", "resume", "draft", "row", "close")
# (connection, kind, mode, a, b, drafted, seconds to wait after)
SIZES = st.sampled_from([0, 1, 2, 17, 300, 599, 600, 601, 1200])
steps = st.lists(st.tuples(st.integers(0, 1), st.sampled_from(KINDS), st.sampled_from(MODES),
                           SIZES, SIZES, st.integers(0, 16),
                           st.sampled_from([0.0, 0.0, 0.05, 1.0, 10.0])),
                 min_size=1, max_size=30)


def message(kind: str, settings, a: int, b: int, drafted: int,  # type: ignore[no-untyped-def]
            round_: int) -> protocol.Message:
    """A frame of `kind` with `a`/`b` ids where it takes them, numbered `round_` as the
    connection expects (so that most frames are served, not refused as out of order)."""
    first, second = (tuple(1 + i % 400 for i in range(n)) for n in (a + 1, b))  # < vocab
    return {"open": lambda: protocol.OpenSession(first, settings),
            "resume": lambda: protocol.Resume(first, second, settings, round_),
            "draft": lambda: protocol.Draft(round_, second, (5,) * drafted),
            "row": lambda: protocol.RowRequest(second),
            "close": lambda: protocol.Close("bye")}[kind]()


class Holder:
    """One token holder's connections through the gate to real endpoints; a refused or closed
    connection is replaced by a new one (it logs in again), as an abuser reconnects."""

    def __init__(self, gate: AdmissionGate, verifier: Verifier) -> None:
        self.gate, self.verifier = gate, verifier
        self.rounds = 0  # Drafts and RowRequests the endpoints ran

    def connect(self):  # type: ignore[no-untyped-def]
        entry = self.gate.connect("127.0.0.2").entry
        endpoint = CompanionEndpoint(self.verifier, authenticate=lambda _secret: "holder")
        hello = protocol.encode(protocol.Hello(self.verifier.generalist.sha256, auth_token="t"))
        self.send(entry, endpoint, hello)
        return entry, endpoint

    def send(self, entry, endpoint, frame: bytes) -> bool:  # type: ignore[no-untyped-def]
        """Through the gate to the endpoint; whether the gate let it through."""
        checked = self.gate.check(entry, frame, endpoint.conn.limits)
        if isinstance(checked, Refusal):
            endpoint.fail(*checked)
        else:
            endpoint.handle_message(checked, len(frame))
            self.rounds += isinstance(checked, protocol.Draft | protocol.RowRequest)
        if entry.identity is None and endpoint.identity is not None and not endpoint.closed:
            self.gate.logged_in(entry, endpoint.identity)
        if endpoint.closed:
            endpoint.release()
            self.gate.disconnect(entry)
        return not isinstance(checked, Refusal)


def _prefill(message: protocol.Message) -> int:
    """The ids `message` asks the companion to prefill (counted here, not by the gate)."""
    if isinstance(message, protocol.OpenSession):
        return len(message.prompt_ids)
    if isinstance(message, protocol.Resume):
        return len(message.prompt_ids) + len(message.committed_ids)
    return len(getattr(message, "committed_ids", ()))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps)
def test_a_token_holder_s_prefill_is_bounded_by_its_budget(tiny_model, tiny_generalist, steps):
    generalist = CountingModel(tiny_generalist)
    verifier = Verifier(generalist, tiny_model)
    clock = ManualClock()
    gate = AdmissionGate(ServerConfig(prefill_tokens_per_second=RATE, prefill_burst=BURST),
                         clock=clock)
    holder = Holder(gate, verifier)
    connections = [holder.connect() for _ in range(2)]
    started, largest = clock(), 0
    for index, kind, mode, a, b, drafted, wait in steps:
        entry, endpoint = connections[index]
        if endpoint.closed:
            connections[index] = entry, endpoint = holder.connect()
        sent = message(kind, mode, a, b, drafted, endpoint.conn.round)
        if holder.send(entry, endpoint, protocol.encode(sent)):
            largest = max(largest, _prefill(sent))
        clock.advance(wait)
    per_round = FREE_COMMITTED_IDS + Limits().max_draft
    # one request longer than the burst is served from a full budget, which then owes the rest
    budget = BURST + RATE * (clock() - started) + max(0, largest - BURST)
    assert generalist.appended <= budget + per_round * holder.rounds, \
        (generalist.appended, budget, holder.rounds)
    for _, endpoint in connections:
        endpoint.release()
