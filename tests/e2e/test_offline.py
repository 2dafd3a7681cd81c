"""Offline-degraded mode: local fallback, reconnect with backoff, resume in the same generation."""

from __future__ import annotations

import time

import pytest
from helpers.dying_channel import DyingChannel
from helpers.privacy_audit import assert_canary_not_sent

from specsteer import protocol
from specsteer.client import Client
from specsteer.device import ModeChange, OfflinePolicy
from specsteer.errors import CompanionUnavailable
from specsteer.history import HistoryStore
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

# The tiny random model ends its text wherever its weights say: with this wording (and the task
# prompt of history/prompts.py) it writes past the reconnect instead of stopping right there.
SUBJECT = "Budget for next quarter"
CANARY = "PLV-CANARY-3381-avocet"
NOW = OfflinePolicy("degrade", first_retry_s=0.0, max_retry_s=0.0)


@pytest.fixture()
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    history.add(
        kind="email", title="Budget", body=f"Dear team, the budget for next quarter stays. {CANARY}"
    )
    return history


class _Flaky:
    """First connection dies after a few frames, the next `down` attempts fail, then it works."""

    def __init__(self, verifier: Verifier, down: int) -> None:
        self.verifier = verifier
        self.down = down
        self.calls = 0

    def __call__(self) -> LocalChannel:
        self.calls += 1
        if self.calls == 1:
            return DyingChannel(CompanionEndpoint(self.verifier), frames=6)
        if self.calls <= 1 + self.down:
            raise CompanionUnavailable("connection refused")
        return LocalChannel.for_verifier(self.verifier)


def test_reconnect_resumes_collaboration_in_the_same_generation(tiny_model, tiny_generalist, store):
    verifier = Verifier(tiny_generalist, tiny_model)
    frames: list[tuple[str, bytes]] = []
    changes: list[ModeChange] = []
    client = Client(
        tiny_model,
        history=store,
        companion=_Flaky(verifier, down=2),
        tap=lambda d, f: frames.append((d, f)),
    )
    result = client.generate(SUBJECT, max_new_tokens=60, k=2, offline=NOW, on_mode=changes.append)
    prov = result.provenance
    assert prov[0] != "local" and "local" in prov
    first_local = prov.index("local")
    assert any(p != "local" for p in prov[first_local:]), "collaboration never resumed"
    # the immediate resync found the companion down (one refused connection), so it went local
    assert result.stats.degraded and result.stats.reconnects == 1 and result.stats.resyncs == 0
    assert [c.mode for c in changes] == ["local", "collaborative"]
    # the new session is a Resume: the public prompt, everything committed so far, and the
    # round counter of the dropped session
    sent = [protocol.decode(f, protocol.Limits()) for d, f in frames if d == "up"]
    opens = [m for m in sent if isinstance(m, protocol.OpenSession | protocol.Resume)]
    assert [type(m) for m in opens] == [protocol.OpenSession, protocol.Resume]
    resumed_at = changes[1].tokens
    assert opens[1].prompt_ids == opens[0].prompt_ids
    assert list(opens[1].committed_ids) == result.tokens[:resumed_at]
    # the draft lost with the link (the tap saw it go) keeps its number on the new session
    first_after = sent.index(opens[1]) + 1
    before = [m.round for m in sent[:first_after] if isinstance(m, protocol.Draft)]
    assert opens[1].round == before[-1] > 0
    assert isinstance(sent[first_after], protocol.Draft)
    assert sent[first_after].round == opens[1].round
    assert result.stats.bytes_up == sum(len(f) for d, f in frames if d == "up")
    # the privacy canary holds across the reconnect too
    assert CANARY in result.prompt.with_context
    assert_canary_not_sent(tiny_model.tokenizer, frames, CANARY)  # Resume frames included


def test_wait_policy_blocks_until_the_companion_is_back(tiny_model, tiny_generalist, store):
    verifier = Verifier(tiny_generalist, tiny_model)
    attempts = {"n": 0}

    def slow_start() -> LocalChannel:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise CompanionUnavailable("not up yet")
        return LocalChannel.for_verifier(verifier)

    client = Client(tiny_model, history=store, companion=slow_start)
    result = client.generate(
        SUBJECT, max_new_tokens=16, offline=OfflinePolicy("wait", wait_s=5, first_retry_s=0.01)
    )
    assert not result.stats.degraded and "local" not in result.provenance
    assert attempts["n"] == 3


def test_wait_policy_gives_up_after_its_timeout(tiny_model, store):
    def down() -> LocalChannel:
        raise CompanionUnavailable("refused")

    client = Client(tiny_model, history=store, companion=down)
    started = time.monotonic()
    with pytest.raises(CompanionUnavailable, match="no companion within 0.3 s"):
        client.generate(SUBJECT, max_new_tokens=8, offline="wait(0.3)")
    assert time.monotonic() - started < 3


def test_offline_policy_parsing():
    assert OfflinePolicy.parse("wait(2.5)") == OfflinePolicy("wait", 2.5)
    assert OfflinePolicy.parse("fail").mode == "fail"
    with pytest.raises(ValueError, match="offline must be"):
        OfflinePolicy.parse("sometimes")
