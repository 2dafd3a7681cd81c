"""SDK + companion end to end on tiny models: equivalence, privacy, accounting, degradation."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.dying_channel import DyingChannel
from helpers.privacy_audit import assert_canary_not_sent

from specsteer import protocol
from specsteer.client import Client
from specsteer.device import METHODS, rounds
from specsteer.errors import CompanionError, CompanionUnavailable
from specsteer.history import HistoryStore
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

CANARY = "ZQX-CANARY-7731-plover"
SUBJECT = "Budget for the next quarter"


@pytest.fixture()
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    history.add(
        kind="email",
        title="Budget for the next quarter",
        body=f"Dear team, the budget for the next quarter stays as it is. {CANARY}",
    )
    history.add(
        kind="email",
        title="Meeting notes",
        body="Thank you for the meeting notes, I will send the revised draft by Friday.",
    )
    return history


@pytest.fixture()
def verifier(tiny_model, tiny_generalist) -> Verifier:
    return Verifier(tiny_generalist, tiny_model)


def _local(verifier: Verifier):
    return lambda: LocalChannel.for_verifier(verifier)


def _last_settings(frames: list[bytes]) -> protocol.SessionSettings:
    """The settings of the last OpenSession among captured uplink frames."""
    return _last_open(frames).settings


def _last_open(frames: list[bytes]) -> protocol.OpenSession:
    """The last OpenSession among captured uplink frames."""
    return [m for m in (protocol.decode(f, protocol.Limits()) for f in frames)
            if isinstance(m, protocol.OpenSession)][-1]


@pytest.mark.parametrize("method", [m for m in METHODS])
def test_in_process_equals_networked(tiny_model, verifier, store, method):
    # pipeline=False: whether a pipelined device's bet (and so its P_S0 frames and timings) was
    # placed depends on when the verdict lands, so bytes are compared without it (tokens and
    # rounds are the same either way: test_a_verdict_arriving_early_never_changes_the_output)
    local = Client(tiny_model, history=store, companion=_local(verifier))
    expected = local.generate(SUBJECT, method=method, max_new_tokens=24, pipeline=False)
    with CompanionServer(verifier).running() as url:
        remote = Client(tiny_model, history=store, companion=url).generate(
            SUBJECT, method=method, max_new_tokens=24, pipeline=False
        )
        piped = Client(tiny_model, history=store, companion=url).generate(
            SUBJECT, method=method, max_new_tokens=24
        )
    assert piped.tokens == expected.tokens
    assert remote.tokens == expected.tokens
    assert remote.provenance == expected.provenance
    assert (remote.stats.bytes_up, remote.stats.bytes_down) == (
        expected.stats.bytes_up,
        expected.stats.bytes_down,
    )
    assert not remote.stats.degraded


@pytest.mark.parametrize(
    "params",
    [
        dict(method="specsteer"),
        dict(method="specsteer", s0_on_device=True),
        dict(method="specsteer", temperature=0.8, seed=3),
        dict(method="speculative"),
        dict(method="costeer"),
        dict(method="light_costeer"),
    ],
)
def test_privacy_canary_never_crosses_the_wire(tiny_model, verifier, store, params):
    frames: list[tuple[str, bytes]] = []
    client = Client(
        tiny_model,
        history=store,
        companion=_local(verifier),
        tap=lambda direction, frame: frames.append((direction, frame)),
    )
    result = client.generate(SUBJECT, max_new_tokens=32, **params)
    # the canary really was retrieved and given to the Specialist
    assert CANARY in result.prompt.with_context
    assert CANARY not in result.prompt.request
    # no uplink id list holds any tokenization of it, nor spells its bytes
    assert_canary_not_sent(tiny_model.tokenizer, frames, CANARY)


def test_bytes_accounting_equals_captured_frames(tiny_model, verifier, store):
    frames: list[tuple[str, bytes]] = []
    client = Client(
        tiny_model,
        history=store,
        companion=_local(verifier),
        tap=lambda d, f: frames.append((d, f)),
    )
    result = client.generate(SUBJECT, max_new_tokens=40)
    assert result.stats.bytes_up == sum(len(f) for d, f in frames if d == "up")
    assert result.stats.bytes_down == sum(len(f) for d, f in frames if d == "down")
    assert result.stats.bytes_up > 0 and result.stats.bytes_down > 0


def test_identical_models_without_context_accept_every_draft(tiny_model):
    same = Verifier(tiny_model, tiny_model)
    client = Client(tiny_model, history=None, companion=_local(same))
    # P_S0 on the companion: the same float row as P_G's, so the ratio is exactly 1 (from the
    # device, logp_S0 crosses the wire as fp16, and equal rows would tie only to its rounding)
    result = client.generate("Meeting notes", max_new_tokens=40, k=4, gamma=1.0,
                             s0_on_device=False)
    assert result.stats.drafted > 0
    assert result.stats.accepted == result.stats.drafted
    assert "recovered" not in result.provenance
    # every bet of the pipeline (all accepted, bonus = own argmax) is won but the last round's
    assert result.stats.pipelined >= result.stats.rounds - 2 > 0


def test_alpha_zero_specsteer_with_gamma_zero_keeps_every_draft(tiny_model, verifier, store):
    client = Client(tiny_model, history=store, companion=_local(verifier))
    slm = client.generate(SUBJECT, method="slm_rag", max_new_tokens=30)
    steered = client.generate(SUBJECT, gamma=0.0, k=4, max_new_tokens=30)
    assert steered.stats.acceptance_rate == 1.0
    # drafts equal the local greedy output; only bonus tokens may differ
    first_bonus = steered.provenance.index("bonus")
    assert steered.tokens[:first_bonus] == slm.tokens[:first_bonus]


def test_speculative_equals_generalist_greedy(tiny_model, verifier, store):
    client = Client(tiny_model, history=store, companion=_local(verifier))
    llm = client.generate(SUBJECT, method="llm", max_new_tokens=30)
    spec = client.generate(SUBJECT, method="speculative", max_new_tokens=30)
    assert spec.tokens == llm.tokens


def test_device_placed_s0_gives_the_same_tokens(tiny_model, verifier, store):
    client = Client(tiny_model, history=store, companion=_local(verifier))
    a = client.generate(SUBJECT, max_new_tokens=30, s0_on_device=False)
    b = client.generate(SUBJECT, max_new_tokens=30)  # the default: on the device
    assert a.tokens == b.tokens


@pytest.mark.parametrize("params, on_device", [
    ({}, True), ({"s0_on_device": False}, False),
    ({"s0_on_device": None}, False),  # the companion hosts the Specialist: there
    ({"select": "difference"}, False),  # only a companion holding P_S0 ranks by the difference
    ({"select": "difference", "s0_on_device": True}, False),
])
def test_where_p_s0_is_computed(tiny_model, verifier, store, params, on_device):
    """P_S0 on the device by default: the OpenSession says so and every Draft is followed by
    its DraftS0 (logp_S0 of its ids); on the companion, none goes up."""
    frames: list[bytes] = []
    client = Client(tiny_model, history=store, companion=_local(verifier),
                    tap=lambda d, f: d == "up" and frames.append(f))
    client.generate(SUBJECT, max_new_tokens=16, **params)
    assert _last_settings(frames).s0_on_device is on_device
    up = [protocol.decode(f, protocol.Limits()) for f in frames]
    drafts = [(i, m) for i, m in enumerate(up) if isinstance(m, protocol.Draft)]
    assert drafts
    for i, draft in drafts:  # right behind its Draft, for its ids
        follows = up[i + 1] if i + 1 < len(up) else None
        assert isinstance(follows, protocol.DraftS0) is on_device
        if on_device:
            assert follows.round == draft.round and len(follows.logp_s0) == len(draft.draft_ids)
    assert sum(isinstance(m, protocol.DraftS0) for m in up) == (len(drafts) if on_device else 0)


def test_the_draft_leaves_before_p_s0s_pass_over_it(tiny_model, verifier, store, monkeypatch):
    """The ids go up first and P_S0's pass over them runs while the companion scores them: no
    P_S0 pass between a verdict and the next Draft, and each DraftS0 right after its pass."""
    log: list[str] = []
    made = rounds.s0_track

    def logged_s0_track(*args, **kwargs):  # type: ignore[no-untyped-def]
        track = made(*args, **kwargs)
        extend = track.extend

        def logged_extend(ids):  # type: ignore[no-untyped-def]
            log.append("s0 pass")
            return extend(ids)

        track.extend = logged_extend
        return track

    monkeypatch.setattr(rounds, "s0_track", logged_s0_track)
    tap = lambda d, f: log.append(type(protocol.decode(f, protocol.Limits())).__name__)  # noqa: E731
    client = Client(tiny_model, history=store, companion=_local(verifier), tap=tap)
    result = client.generate(SUBJECT, max_new_tokens=24, pipeline=False, warm_start=False)
    assert result.stats.rounds >= 3 and not result.stats.degraded
    assert log.count("Draft") == log.count("DraftS0") == log.count("Verdict") > 0
    for at, name in enumerate(log):
        if name == "DraftS0":
            assert log[at - 1] in ("Draft", "s0 pass"), log[: at + 1]
        if name == "Verdict" and "Draft" in log[at:]:  # until the next round's Draft leaves
            between = log[at + 1 : log.index("Draft", at)]
            assert "s0 pass" not in between, log[: at + len(between) + 2]
    assert log.count("s0 pass") == log.count("Draft")  # one pass a draft, after its ids left


def test_unreachable_companion_degrades_to_local(tiny_model, store):
    def unreachable():
        raise CompanionUnavailable("no route")

    client = Client(tiny_model, history=store, companion=unreachable)
    result = client.generate(SUBJECT, max_new_tokens=16)
    assert result.stats.degraded and set(result.provenance) == {"local"}
    local = client.generate(SUBJECT, method="slm_rag", max_new_tokens=16)
    assert result.tokens == local.tokens
    with pytest.raises(CompanionUnavailable):
        client.generate(SUBJECT, max_new_tokens=16, offline="fail")


def test_companion_dying_mid_generation_completes_locally(tiny_model, verifier, store):
    connections = []

    def dies_then_gone() -> DyingChannel:
        connections.append(1)
        if len(connections) > 1:  # the immediate resync and every later probe are refused
            raise CompanionUnavailable("connection refused")
        return DyingChannel(CompanionEndpoint(verifier), frames=5)

    client = Client(tiny_model, history=store, companion=dies_then_gone)
    result = client.generate(SUBJECT, max_new_tokens=40, k=2)
    assert result.stats.degraded and result.stats.resyncs == 0 and len(connections) >= 2
    assert result.provenance[0] != "local" and result.provenance[-1] == "local"
    # the local continuation is exactly what the Specialist would write after that prefix
    session = tiny_model.new_session()
    _, device_prompt = client.render(SUBJECT)
    first_local = result.provenance.index("local")
    row = session.append([*device_prompt.private_ids, *result.tokens[:first_local]])[-1]
    assert result.tokens[first_local] == int(np.argmax(row))


def test_model_mismatch_is_refused(tiny_model, tiny_generalist, store):
    wrong = Verifier(tiny_generalist, tiny_generalist)  # generic Specialist is not the device's
    client = Client(tiny_model, history=store, companion=_local(wrong))
    with pytest.raises(CompanionError, match="same artifact"):
        client.generate(SUBJECT, max_new_tokens=8, offline="fail")


@pytest.mark.parametrize(
    "extra",
    [
        dict(),
        dict(method="speculative"),
        dict(s0_on_device=True),
        dict(s0_on_device=True, gamma=0.0),
        dict(s0_on_device=True, k=2, gamma=0.1),
        dict(s0_on_device=True, k=6, gamma=0.5),
        dict(gamma=0.0),
        dict(k=1),
        dict(k=6, gamma=0.1),
    ],
)
def test_pipelining_never_changes_the_output(tiny_model, verifier, store, extra):
    client = Client(tiny_model, history=store, companion=_local(verifier))
    plain = client.generate(SUBJECT, max_new_tokens=40, pipeline=False, **extra)
    piped = client.generate(SUBJECT, max_new_tokens=40, pipeline=True, **extra)
    assert piped.tokens == plain.tokens
    assert piped.provenance == plain.provenance
    assert piped.stats.rounds == plain.stats.rounds


def test_a_draft_leaves_before_the_pass_after_its_last_token(tiny_model, verifier, store,
                                                            monkeypatch):
    """The row after a draft's last token (the bonus position's) is computed while the
    companion verifies, not before the draft is sent: between a verdict and the next Draft
    the device runs one pass for the committed token and one per drafted token but the last.
    Same text as without pipelining either way (`test_pipelining_never_changes_the_output`)."""
    from specsteer.runtime.onnx import OnnxSession

    events: list[tuple[str, object]] = []
    append = OnnxSession.append

    def counted(self, ids):
        events.append(("pass", len(ids)))
        return append(self, ids)

    monkeypatch.setattr(OnnxSession, "append", counted)
    limits = protocol.Limits()

    def tap(direction: str, frame: bytes) -> None:
        message = protocol.decode(frame, limits)
        if isinstance(message, protocol.Draft):
            events.append(("draft", len(message.draft_ids)))
        elif direction == "down" and isinstance(message, protocol.Verdict):
            events.append(("verdict", message.accepted))

    client = Client(tiny_model, history=store, companion=_local(verifier), tap=tap)
    result = client.generate(SUBJECT, max_new_tokens=40, k=4, pipeline=False, gamma=0.0,
                             s0_on_device=False, leak_guard="allow", offline="fail")
    assert result.stats.rounds >= 4
    checked = 0
    for i, (kind, n) in enumerate(events):
        if kind != "draft" or n != 4:
            continue
        before = events[:i]
        last_verdict = max((j for j, e in enumerate(before) if e[0] == "verdict"), default=None)
        if last_verdict is None:
            continue  # the first draft: made beside the opening
        passes = [e for e in before[last_verdict + 1:] if e[0] == "pass"]
        assert passes == [("pass", 1)] * 4  # the committed token and 3 drafts, not the 4th
        checked += 1
    assert checked >= 3


class EagerChannel(LocalChannel):
    """An in-process companion whose verdict is in by the first poll: a pipelined device then
    stops drafting ahead after one token, as on a fast link."""

    def poll(self) -> bytes | None:
        while not self._inbox and self._outbox:
            self._inbox.extend(self.endpoint.handle(self._outbox.popleft()))
        return super().poll()


@pytest.mark.parametrize("extra", [dict(), dict(s0_on_device=True), dict(k=6)])
def test_a_verdict_arriving_early_never_changes_the_output(tiny_model, store, extra):
    """A bet drafted while waiting is cut short when the verdict lands; a won bet is then drafted
    to full length, so each round's draft (and so the text) never depends on timing.

    Generalist == generic Specialist: every draft passes the ratio test and the bonus (fused at
    alpha 0.5) is mostly the device's own argmax, so bets are won, and sometimes not, so a
    bonus placed one position earlier would change the text."""
    same = Verifier(tiny_model, tiny_model)
    params = dict(max_new_tokens=40, alpha=0.5, **extra)
    plain = Client(tiny_model, history=store, companion=_local(same))
    expected = plain.generate(SUBJECT, pipeline=False, **params)
    eager = Client(tiny_model, history=store,
                   companion=lambda: EagerChannel(CompanionEndpoint(same)))
    got = eager.generate(SUBJECT, pipeline=True, **params)
    assert got.stats.pipelined > 0  # bets were placed, cut short and won
    assert got.tokens == expected.tokens
    assert got.provenance == expected.provenance
    assert got.stats.rounds == expected.stats.rounds


@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.filterwarnings("ignore::specsteer.errors.PrivateDraftsWarning")
def test_adaptive_k_varies_the_draft_length_and_keeps_the_protocol(
    tiny_model, verifier, store, pipeline
):
    frames: list[bytes] = []
    client = Client(tiny_model, history=store, companion=_local(verifier),
                    tap=lambda d, f: d == "up" and frames.append(f))
    limits = protocol.Limits()
    long_runs = 0
    for subject in (SUBJECT, "Meeting notes", "Questions about the slides"):
        frames.clear()
        # "allow": the tiny model's drafts copy the history, and the draft protocol is the point
        result = client.generate(subject, max_new_tokens=80, gamma=0.0, adaptive_k=True, k=2,
                                 k_max=6, pipeline=pipeline, offline="fail",
                                 leak_guard="allow")
        drafts = [m for m in (protocol.decode(f, limits) for f in frames)
                  if isinstance(m, protocol.Draft)]
        assert result.stats.drafted == sum(len(m.draft_ids) for m in drafts)
        assert result.stats.rounds == len(drafts)
        if len(drafts) >= 6:  # which K wins depends on timings (and an early end-of-text on K)
            long_runs += 1
            assert len({len(m.draft_ids) for m in drafts}) >= 2  # it moves, or at least probes
    assert long_runs
    with pytest.raises(ValueError):
        client.generate(SUBJECT, adaptive_k=True, k=0)


def test_presets(tiny_model, verifier, store):
    frames: list[bytes] = []
    client = Client(tiny_model, history=store, companion=_local(verifier),
                    tap=lambda d, f: d == "up" and frames.append(f))
    fast = client.generate(SUBJECT, preset="fast", max_new_tokens=24)
    assert _last_settings(frames).gamma == pytest.approx(0.1) and _last_settings(frames).top_k == 32
    assert _last_settings(frames).s0_on_device  # the default placement: the device
    assert fast.tokens == client.generate(SUBJECT, gamma=0.1, top_k=32, max_new_tokens=24).tokens
    # placing P_S0 on the companion changes where it is computed, never the tokens
    there = client.generate(SUBJECT, preset="fast", s0_on_device=False, max_new_tokens=24)
    assert not _last_settings(frames).s0_on_device and there.tokens == fast.tokens
    strict = client.generate(SUBJECT, preset="strict", max_new_tokens=24)
    assert strict.tokens == client.generate(SUBJECT, gamma=1.0, max_new_tokens=24).tokens
    client.generate(SUBJECT, preset="fast", gamma=0.3, max_new_tokens=4)  # explicit wins
    assert _last_settings(frames).gamma == pytest.approx(0.3) and _last_settings(frames).top_k == 32
    with pytest.raises(ValueError, match="unknown preset"):
        client.generate(SUBJECT, preset="turbo")


def test_a_companion_without_generic_specialist_serves_device_placed_p_s0(
    tiny_model, tiny_generalist, verifier, store
):
    """`serve --specialist none`: the device sees no generic Specialist in the companion's hello
    and computes P_S0 itself (same tokens as the companion's P_S0); a session that insists on
    the companion's P_S0 is refused with a clear error."""
    bare = Verifier(tiny_generalist, None)
    expected = Client(tiny_model, history=store, companion=_local(verifier)).generate(
        SUBJECT, gamma=0.1, max_new_tokens=24
    )
    frames: list[bytes] = []
    with CompanionServer(bare).running() as url:
        client = Client(tiny_model, history=store, companion=url,
                        tap=lambda d, f: d == "up" and frames.append(f))
        got = client.generate(SUBJECT, gamma=0.1, max_new_tokens=24, offline="fail")
        assert got.tokens == expected.tokens and not got.stats.degraded
        assert _last_settings(frames).s0_on_device
        with pytest.raises(CompanionError, match="send logp_S0 from the device"):
            client.generate(SUBJECT, max_new_tokens=8, s0_on_device=False, offline="fail")
