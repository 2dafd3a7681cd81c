"""What goes up does not depend on the private history, except through the drafted ids.

Two generations of one request, with and without a canary record in the history: every uplink
frame is decoded and compared field by field. Hello, OpenSession and Close are byte-identical;
each Draft holds its round number and ids, and (P_S0 on the device) the DraftS0 after it holds
`logp_s0`, which must be the context-free Specialist's log-probabilities of those ids after the
public prompt and the text the companion holds, recomputed here in a fresh session. A device
that let the private prompt into anything else (P_S0 on the private prompt, a settings field,
the prompt) fails.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers.privacy_audit import assert_canary_not_sent, check_logp_s0

from specsteer import protocol
from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer.runtime.base import LanguageModel
from specsteer.settings import Params
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

CANARY = "ZQX-CANARY-7731-plover"
SUBJECT = "Budget for the next quarter"
RECORDS = [
    ("Budget for the next quarter", "Dear team, the budget for the next quarter stays as it is."),
    ("Meeting notes", "Thank you for the meeting notes, I will send the revised draft by Friday."),
]


def _store(canary: bool) -> HistoryStore:
    history = HistoryStore(memory=True)
    for title, body in RECORDS:
        history.add(kind="email", title=title, body=body)
    if canary:
        history.add(kind="email", title=SUBJECT, body=f"The budget code is {CANARY}.")
    return history


def _run(tiny_model, verifier, canary: bool, **params):
    frames: list[tuple[str, bytes]] = []
    client = Client(tiny_model, history=_store(canary),
                    companion=lambda: LocalChannel.for_verifier(verifier),
                    tap=lambda d, f: frames.append((d, f)))
    result = client.generate(SUBJECT, max_new_tokens=32, offline="fail", **params)
    return result, frames


def _messages(frames, direction):
    return [(f, protocol.decode(f, protocol.Limits())) for d, f in frames if d == direction]


def _check_drafts_are_public_functions(model: LanguageModel, frames, temperature: float) -> int:
    """Each Draft's fields other than its ids are what public data gives: its round number,
    and its DraftS0's logp_s0 = log P_S0(draft | public prompt + text the companion holds),
    recomputed."""
    up, down = _messages(frames, "up"), _messages(frames, "down")
    opened = [m for _, m in up if isinstance(m, protocol.OpenSession)]
    drafts = [m for _, m in up if isinstance(m, protocol.Draft)]
    s0s = {m.round: m for _, m in up if isinstance(m, protocol.DraftS0)}
    verdicts = [m for _, m in down if isinstance(m, protocol.Verdict)]
    assert len(opened) == 1 and len(drafts) == len(verdicts) > 0
    assert not s0s or len(s0s) == len(drafts)  # one DraftS0 per Draft, or none at all
    held = list(opened[0].prompt_ids)
    s0_values = 0
    for index, (draft, verdict) in enumerate(zip(drafts, verdicts, strict=True)):
        assert {f.name for f in dataclasses.fields(draft)} == {
            "round", "committed_ids", "draft_ids"}, "a new Draft field: audit it"
        assert draft.round == index
        held += draft.committed_ids
        if s0s:
            s0 = s0s[index]
            assert {f.name for f in dataclasses.fields(s0)} == {"round", "logp_s0"}, \
                "a new DraftS0 field: audit it"
            s0_values += check_logp_s0(model, held, draft.draft_ids, s0.logp_s0, temperature)
        held += draft.draft_ids[: verdict.accepted]
    return s0_values


@pytest.fixture()
def verifier(tiny_model, tiny_generalist) -> Verifier:
    return Verifier(tiny_generalist, tiny_model)


@pytest.mark.parametrize("params", [
    dict(s0_on_device=True),
    dict(s0_on_device=True, pipeline=False, k=6, gamma=0.1),
    dict(s0_on_device=True, temperature=0.8, seed=3),
    dict(),  # the default: P_S0 on the device
    dict(s0_on_device=False),
    dict(method="speculative"),
])
def test_uplink_depends_on_the_history_only_through_the_drafted_ids(tiny_model, verifier, params):
    with_canary, frames_with = _run(tiny_model, verifier, True, **params)
    without, frames_without = _run(tiny_model, verifier, False, **params)
    assert CANARY in with_canary.prompt.with_context
    assert CANARY not in without.prompt.with_context
    assert_canary_not_sent(tiny_model.tokenizer, frames_with, CANARY)

    up_with, up_without = _messages(frames_with, "up"), _messages(frames_without, "up")
    drafted = [[m.draft_ids for _, m in up if isinstance(m, protocol.Draft)]
               for up in (up_with, up_without)]
    assert drafted[0] != drafted[1]  # the history did change what was drafted
    kinds = (protocol.Hello, protocol.OpenSession, protocol.Draft, protocol.DraftS0,
             protocol.Close)
    assert all(isinstance(m, kinds) for _, m in [*up_with, *up_without])
    for kind in (protocol.Hello, protocol.OpenSession, protocol.Close):
        frames_a = [f for f, m in up_with if isinstance(m, kind)]
        frames_b = [f for f, m in up_without if isinstance(m, kind)]
        assert frames_a == frames_b and frames_a, kind.__name__  # prompt and settings included
    temperature = params.get("temperature", 0.0)
    checked = [_check_drafts_are_public_functions(tiny_model, f, temperature)
               for f in (frames_with, frames_without)]
    if params.get("s0_on_device", Params().s0_on_device) and "method" not in params:
        assert min(checked) > 0  # logp_s0 went up and was recomputed from public data
    else:
        assert checked == [0, 0]  # the companion computes P_S0: no values go up


@pytest.mark.parametrize("params", [
    dict(), dict(s0_on_device=True), dict(method="costeer"), dict(method="light_costeer"),
    dict(method="llm"), dict(leak_guard="redact"), dict(leak_guard="hold"),
])
def test_canary_token_runs_never_go_up(tiny_model, verifier, params):
    result, frames = _run(tiny_model, verifier, True, **params)
    assert CANARY in result.prompt.with_context and not result.stats.degraded
    assert_canary_not_sent(tiny_model.tokenizer, frames, CANARY)
