"""Continuing the user's draft (`prefix`): both prompts end with it and the output is what comes
after it. The privacy decision it pins: the draft is part of the public request (the user asks
for help with this text; the companion reads it), the history is not — it stays on the device."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.declared import StopsAt, WithTokenizer
from helpers.privacy_audit import assert_canary_not_sent

from specsteer import protocol
from specsteer.client import Client
from specsteer.history import HistoryStore, continuation_prefix, retrieve
from specsteer.runtime.track import common_prefix
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

TITLE = "Bulb planting day"
CANARY = "ZQX-CANARY-4417-larkspur"  # in the history: private
DRAFT = "Tulips along the fence this Saturday. Bring gloves, and"


@pytest.fixture()
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    for n in range(4):
        history.add(kind="note", title=f"Garden day {n}",
                    body=f"Practical bits: gloves, trowels and tea for day {n}. " * 4)
    history.add(kind="note", title="Bulb planting day, last year",
                body=f"The shed code was {CANARY}. Practical bits: bulbs, gloves, tea.")
    return history


def _client(model, generalist, store, frames=None) -> Client:
    verifier = Verifier(generalist, model)
    tap = None if frames is None else (lambda d, f: frames.append((d, f)))
    return Client(model, history=store, companion=lambda: LocalChannel.for_verifier(verifier),
                  tap=tap)


def test_both_prompts_end_with_the_draft(tiny_model, tiny_generalist, store) -> None:
    client = _client(tiny_model, tiny_generalist, store)
    tok = tiny_model.tokenizer
    plain_prompt, plain = client.render(TITLE, task="note")
    prompt, with_draft = client.render(TITLE, task="note", prefix=DRAFT + "  \t")
    draft_ids = tok.encode(DRAFT)
    assert prompt.prefix == DRAFT == continuation_prefix(DRAFT + "  \t")
    assert list(with_draft.private_ids) == [*plain.private_ids, *draft_ids]
    assert list(with_draft.public_ids) == [*plain.public_ids, *draft_ids]
    assert prompt.request == plain_prompt.request and prompt.records == plain_prompt.records
    assert continuation_prefix("A list:\n\n") == "A list:\n\n"  # newlines are the user's text


def test_the_output_is_the_continuation_after_the_draft(tiny_model, tiny_generalist,
                                                        store) -> None:
    """On the device alone (greedy), the pieces are the model's argmax continuation of the
    private prompt that ends with the draft: the draft itself is not written again."""
    client = _client(tiny_model, tiny_generalist, store)
    result = client.generate(TITLE, task="note", prefix=DRAFT, method="slm_rag",
                             temperature=0.0, max_new_tokens=12, user_length=False)
    ids = list(client.render(TITLE, task="note", prefix=DRAFT)[1].private_ids)
    session = tiny_model.new_session()
    expected: list[int] = []
    rows = session.append(ids)
    for _ in range(12):
        token = int(np.argmax(rows[-1]))
        if token in tiny_model.tokenizer.eos_ids:
            break
        expected.append(token)
        rows = session.append([token])
    session.close()
    assert result.tokens == expected
    without = client.generate(TITLE, task="note", method="slm_rag", temperature=0.0,
                              max_new_tokens=12, user_length=False)
    assert without.tokens != result.tokens  # the draft changed what comes next


def test_the_draft_goes_up_and_the_history_does_not(tiny_model, tiny_generalist,
                                                     store) -> None:
    """Steered by a companion: the public request (OpenSession) is the request without a draft
    followed by the draft's ids; a canary of a retrieved record is in no uplink id list or
    byte."""
    frames: list[tuple[str, bytes]] = []
    client = _client(tiny_model, tiny_generalist, store, frames)
    result = client.generate(TITLE, task="note", prefix=DRAFT, max_new_tokens=24,
                             offline="fail")
    assert result.tokens and not result.stats.degraded
    assert any(store.get(i).title == "Bulb planting day, last year" for i in result.stats.records)
    assert_canary_not_sent(tiny_model.tokenizer, frames, CANARY)
    opened = [protocol.decode(f, protocol.Limits()) for d, f in frames if d == "up"]
    [session] = [m for m in opened if isinstance(m, protocol.OpenSession)]
    public = client.render(TITLE, task="note")[1].public_ids
    assert list(session.prompt_ids) == [*public, *tiny_model.tokenizer.encode(DRAFT)]


def test_prepare_with_the_draft_is_reused_as_the_user_types_on(tiny_model, tiny_generalist,
                                                               store) -> None:
    client = _client(tiny_model, tiny_generalist, store)
    assert client.prepare(TITLE, task="note", prefix=DRAFT).wait(timeout=60)
    longer = DRAFT + " the kids bring"
    result = client.generate(TITLE, task="note", prefix=longer, max_new_tokens=8)
    before, after = (client.render(TITLE, task="note", prefix=d)[1].private_ids
                     for d in (DRAFT, longer))
    assert result.stats.prefill_reused == common_prefix(before, after) > len(before) - 3
    cold = _client(tiny_model, tiny_generalist, store).generate(
        TITLE, task="note", prefix=longer, max_new_tokens=8)
    assert (result.tokens, result.provenance) == (cold.tokens, cold.provenance)


def test_the_draft_record_itself_is_not_retrieved(store) -> None:
    own = store.add(kind="note", title="Garden day plan", body=DRAFT)
    assert own.id in [hit.record.id for hit in retrieve(store, "note", "Garden day", k=5)]
    hits = retrieve(store, "note", "Garden day", k=3, exclude=[own.id])
    assert own.id not in [hit.record.id for hit in hits] and len(hits) == 3


def test_the_users_length_counts_the_draft(tiny_model, tiny_generalist, store) -> None:
    """The minimum of new tokens (the user's usual length) is lowered by the draft's length:
    after a draft as long as the user's notes, end-of-text may come at once. As in
    test_min_length, one token the model writes early is declared an end-of-text id."""
    prompt = _client(tiny_model, tiny_generalist, store).render(TITLE, task="note")[0]
    assert prompt.length is not None and prompt.length.min_new_tokens > 8
    long_draft = "Practical bits: gloves and tea. " * prompt.length.median_words
    free = _client(tiny_model, tiny_generalist, store).generate(
        TITLE, task="note", prefix=long_draft, method="slm_rag", temperature=0.0,
        max_new_tokens=12, user_length=False)
    stopper = WithTokenizer(tiny_model, StopsAt(tiny_model.tokenizer, free.tokens[2]))
    first = free.tokens.index(free.tokens[2])
    client = _client(stopper, tiny_generalist, store)
    cont = client.generate(TITLE, task="note", prefix=long_draft, method="slm_rag",
                           temperature=0.0, max_new_tokens=400)
    assert cont.tokens == free.tokens[:first]  # ended where the model ended: no minimum left
    held = client.generate(TITLE, task="note", prefix="Tulips", method="slm_rag",
                           temperature=0.0, max_new_tokens=400)
    assert held.stats.tokens >= prompt.length.min_new_tokens - 2  # a short draft: the minimum
