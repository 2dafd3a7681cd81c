"""The leak guard's draft cut under "redact", made to fire: the guard is built over the private
prompt plus the tiny Specialist's own greedy text (what it drafts), so the first draft itself
completes a private window. The suite's other redact scenarios guard the fused output, which
the drafts rarely copy, so there only the pick step redacts: with the cut skipped they stayed
green (issue 28). Here the first Draft that goes up must be the unguarded one cut just before the
token completing the window, and no id completing a window may go up."""

from __future__ import annotations

import pytest
from test_leak_guard_e2e import N, _generate, _leaks, setup  # noqa: F401 - the fixture

from specsteer import protocol
from specsteer.device import Params, decode


def _drafts(frames) -> list[protocol.Draft]:
    return [m for d, f in frames if d == "up"
            for m in [protocol.decode(f, protocol.Limits())] if isinstance(m, protocol.Draft)]


@pytest.mark.parametrize("extra", [dict(), dict(s0_on_device=True), dict(pipeline=False, k=6),
                                   dict(k=6)])
def test_the_draft_cut_fires_and_sends_no_private_window(tiny_model, request, extra):
    guarded = request.getfixturevalue("setup")  # test_leak_guard_e2e's: prompt and verifier
    prompt, _ = guarded
    own = [e.token for e in decode(tiny_model, prompt, Params(method="slm_rag",
                                                               max_new_tokens=40))]
    _, _, counted, allowed, _ = _generate(tiny_model, guarded, "allow", own, **extra)
    assert _leaks(tiny_model, guarded, own, allowed) > 0  # unguarded, the draft is the copy
    first = _drafts(allowed)[0].draft_ids
    assert len(first) >= N and list(first[:N]) == own[:N]
    _, _, stats, frames, _ = _generate(tiny_model, guarded, "redact", own, **extra)
    assert _drafts(frames)[0].draft_ids == first[: N - 1]  # cut before the completing token
    assert stats.leak_redacted >= len(first) - (N - 1)
    assert _leaks(tiny_model, guarded, own, frames) == 0


@pytest.mark.parametrize("extra", [dict(pipeline=False, k=10), dict(k=10)])
def test_the_cut_goes_back_to_the_start_of_the_flagged_word(tiny_model, request, extra):
    """A window completed inside a word (the Specialist's "wri" + "re") is cut where the word
    begins, so the pick replaces the whole word: cut at the completing token, the word's
    beginning went up and the real Specialist finished it another way ("centerin")."""
    guarded = request.getfixturevalue("setup")
    prompt, _ = guarded
    own = [e.token for e in decode(tiny_model, prompt, Params(method="slm_rag",
                                                               max_new_tokens=40))]
    text = [tiny_model.tokenizer.decode([t]) for t in own]
    # the first window of own[5:] completes at own[8], which continues the word own[7] begins
    assert text[7][:1].isalnum() and not text[6][-1:].isalnum(), text[5:9]
    assert text[8][:1].isalnum() and text[7][-1:].isalnum(), text[5:9]
    guard_text = own[5:]
    _, _, _, allowed, _ = _generate(tiny_model, guarded, "allow", guard_text, **extra)
    assert list(_drafts(allowed)[0].draft_ids[:9]) == own[:9]  # unguarded, it goes up
    _, _, _, frames, _ = _generate(tiny_model, guarded, "redact", guard_text, **extra)
    assert list(_drafts(frames)[0].draft_ids) == own[:7]  # not own[:8]: the word's start
    assert _leaks(tiny_model, guarded, guard_text, frames) == 0
