"""The leak guard in a generation, on tiny models: what goes up under allow, redact and hold.

The tiny Specialist's random weights never copy their prompt, so the guard here is built over
the private prompt plus the very text this Specialist writes without a guard: as if the history
held it word for word, which is what a real Specialist does with a user's history (the
real-model test and bench/leak_guard.py measure that).
"""

from __future__ import annotations

import threading
import time

import pytest
from test_privacy_e2e import _check_drafts_are_public_functions

from specsteer import protocol
from specsteer.client import Client
from specsteer.device import DecodeStats, OfflinePolicy, Params, decode
from specsteer.device.leak_guard import LeakGuard
from specsteer.errors import CompanionUnavailable
from specsteer.history import HistoryStore
from specsteer.link import CompanionLink
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

SUBJECT = "Budget for the next quarter"
N = 4


@pytest.fixture(scope="module")
def setup(tiny_model, tiny_generalist):
    history = HistoryStore(memory=True)
    history.add(kind="email", title=SUBJECT, body="Dear team, the budget stays as it is.")
    _, prompt = Client(tiny_model, history=history).render(SUBJECT)
    return prompt, Verifier(tiny_generalist, tiny_model)


def _generate(tiny_model, setup, policy, guard_text=None, **extra):
    prompt, verifier = setup
    params = Params(max_new_tokens=40, leak_guard=policy, leak_guard_n=N, **extra)
    frames: list[tuple[str, bytes]] = []

    def connect() -> CompanionLink:
        link = CompanionLink(LocalChannel.for_verifier(verifier),
                             tap=lambda d, f: frames.append((d, f)))
        link.hello(specialist_sha256=tiny_model.sha256)
        return link

    guard = None if guard_text is None else LeakGuard(
        tiny_model.tokenizer, [*prompt.private_ids, *guard_text], prompt.public_ids,
        policy=policy, n=N)
    stats, changes = DecodeStats(), []
    events = list(decode(tiny_model, prompt, params, None, stats, connect=connect,
                         offline="fail", on_mode=changes.append, guard=guard))
    return [e.token for e in events], [e.provenance for e in events], stats, frames, changes


def _leaks(tiny_model, setup, guard_text, frames) -> int:
    """Ids that went up completing a window of `guard_text` (beyond the public prompt)."""
    prompt, _ = setup
    guard = LeakGuard(tiny_model.tokenizer, [*prompt.private_ids, *guard_text],
                      prompt.public_ids, n=N)
    guard.patterns = False
    up = [protocol.decode(f, protocol.Limits()) for d, f in frames if d == "up"]
    down = iter(m for m in (protocol.decode(f, protocol.Limits()) for d, f in frames
                            if d == "down") if isinstance(m, protocol.Verdict))
    held, leaks = [], 0  # output only, as the guard sees it
    for msg in up:
        if isinstance(msg, protocol.Draft):
            sent = [*msg.committed_ids, *msg.draft_ids]
            leaks += sum(guard.blocks([*held, *sent[:j]], t) for j, t in enumerate(sent))
            held += [*msg.committed_ids, *msg.draft_ids[: next(down).accepted]]
    return leaks


@pytest.mark.parametrize("extra", [dict(), dict(s0_on_device=True), dict(pipeline=False, k=6),
                                   dict(temperature=0.8, seed=2)])
def test_redact_sends_no_private_window_and_keeps_the_tracks_right(tiny_model, setup, extra):
    copy, _, plain, frames, _ = _generate(tiny_model, setup, "allow", **extra)
    _, _, counted, allowed_frames, _ = _generate(tiny_model, setup, "allow", copy, **extra)
    assert counted.leak_flagged > 0 and counted.leak_redacted == 0  # allow counts, sends
    assert _leaks(tiny_model, setup, copy, allowed_frames) > 0
    tokens, provenance, stats, frames, _ = _generate(tiny_model, setup, "redact", copy, **extra)
    assert stats.leak_flagged > 0 and stats.leak_redacted > 0 and stats.leak_held == 0
    assert _leaks(tiny_model, setup, copy, frames) == 0
    assert tokens != copy and "local" not in provenance
    # P_S0 sent after cut drafts (and cut bets) is still P_S0 of exactly what was sent
    assert _check_drafts_are_public_functions(tiny_model, frames, extra.get("temperature", 0.0)) \
        >= (1 if extra.get("s0_on_device") else 0)
    if "temperature" not in extra:  # greedy: every accepted draft is the Specialist's argmax
        _follow_the_private_prompt(tiny_model, setup[0], tokens, provenance, "draft")


def _follow_the_private_prompt(model, prompt, tokens, provenance, kind) -> None:
    """After cut drafts and rewinds the device's track still held exactly the private prompt
    plus the output: each token of `kind` is the argmax of a fresh pass over that text."""
    session = model.new_session()
    rows = session.append([*prompt.private_ids, *tokens])
    session.close()
    base = len(prompt.private_ids) - 1
    drafts = [i for i, p in enumerate(provenance) if p == kind]
    assert drafts and all(int(rows[base + i].argmax()) == tokens[i] for i in drafts)


def test_hold_finishes_on_the_device_and_sends_nothing_more(tiny_model, setup):
    copy, _, _, _, _ = _generate(tiny_model, setup, "allow")
    tokens, provenance, stats, frames, changes = _generate(tiny_model, setup, "hold", copy)
    assert _leaks(tiny_model, setup, copy, frames) == 0
    first_local = provenance.index("local")
    assert set(provenance[first_local:]) == {"local"} and first_local < len(copy)
    assert stats.leak_flagged == 1 and stats.leak_held == len(tokens) - first_local
    assert [c.mode for c in changes] == ["local"] and "leak guard" in changes[0].reason
    # the rest is the Specialist's own text after the output so far, the held span included
    _follow_the_private_prompt(tiny_model, setup[0], tokens, provenance, "local")
    closes = [m for d, f in frames if d == "up"
              for m in [protocol.decode(f, protocol.Limits())] if isinstance(m, protocol.Close)]
    assert len(closes) == 1  # the session was closed; nothing followed it



@pytest.mark.parametrize("policy", ["allow", "redact", "hold"])
def test_a_reconnect_never_resends_private_text_written_offline(tiny_model, setup, policy):
    """Offline, the Specialist writes alone and unguarded; a reconnect would put that text in
    the new session's prompt. Under redact and hold the device stays local instead."""
    prompt, verifier = setup
    local_text = [e.token for e in decode(tiny_model, prompt, Params(
        method="slm_rag", max_new_tokens=60))]
    attempts, back = {"n": 0}, threading.Event()

    def connect() -> CompanionLink:
        attempts["n"] += 1
        if not back.is_set():
            raise CompanionUnavailable("down for a moment")
        link = CompanionLink(LocalChannel.for_verifier(verifier))
        link.hello(specialist_sha256=tiny_model.sha256)
        return link

    guard = LeakGuard(tiny_model.tokenizer, [*prompt.private_ids, *local_text],
                      prompt.public_ids, policy=policy, n=N)
    stats = DecodeStats()
    events = []
    for event in decode(tiny_model, prompt, Params(max_new_tokens=60, leak_guard=policy,
                                                   leak_guard_n=N), None, stats,
                        connect=connect, offline=OfflinePolicy("degrade", first_retry_s=0.0),
                        guard=guard):
        events.append(event)
        if len(events) == 8:  # back after 8 local tokens: give the next probe time to land
            back.set()
            time.sleep(0.5)
    provenance = [e.provenance for e in events]
    assert provenance[0] == "local" and attempts["n"] >= 2
    if policy == "allow":
        assert stats.reconnects == 1 and provenance[-1] != "local"
    else:
        assert stats.reconnects == 0 and set(provenance) == {"local"}
        assert stats.leak_flagged == 1 and stats.leak_held > 0
