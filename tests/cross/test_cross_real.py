"""Cross-tokenizer SpecSteer on real models, through an in-process companion.

SmolLM2-135M drafts on the device; the companion verifies with Qwen2.5-1.5B (151,936 tokens)
or Gemma-3-270M (262,144 tokens, a base model without a chat template) over text. Slow (marked
`real_model`); models are fetched and compiled on first use, one Generalist loaded at a time.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from helpers.real_models import real_model

from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer.runtime import OnnxModel
from specsteer.tokenizer import Message
from specsteer_companion.cross import CrossVerifierSession, generalist_prompt
from specsteer_companion.cross import alignment as al
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

pytestmark = pytest.mark.real_model

REQUESTS = [
    "Write a short reply to Anna: the budget meeting moves to Friday at 10:30.",
    "Reply to Zoë about the trip to Zürich and 東京 next month; keep it friendly.",
]


class _Capturing(Verifier):
    """Keeps the last session so the test can read its span statistics."""

    last: CrossVerifierSession | None = None

    def open(self, request, committed=(), owner=""):  # type: ignore[override]
        session = super().open(request, committed, owner=owner)
        if isinstance(session, CrossVerifierSession):
            type(self).last = session
        return session


@pytest.fixture(scope="module")
def smollm() -> OnnxModel:
    return real_model("smollm2-135m")


@pytest.fixture(scope="module")
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    history.add(kind="email", title="Budget meeting",
                body="Hi Anna, thanks for the notes. The budget stays as it is. Best, Sam")
    history.add(kind="email", title="Trip", body="Dear Zoë, the flights are booked. Cheers, Sam")
    return history


def _generate_and_check(smollm: OnnxModel, generalist: OnnxModel, store: HistoryStore,
                        min_acceptance: float) -> list:
    verifier = _Capturing(generalist, smollm)
    client = Client(smollm, history=store, companion=lambda: LocalChannel.for_verifier(verifier))
    table = al.token_table(smollm.tokenizer)
    results = []
    for request in REQUESTS:
        result = client.generate(request, gamma=0.1, max_new_tokens=48, offline="fail")
        session = _Capturing.last
        assert session is not None and not result.stats.degraded
        assert result.stats.tokens > 8
        data = table.bytes_of(result.tokens)
        data.decode("utf-8")  # raises on invalid UTF-8 (a cut character is only allowed at the end)
        assert result.text.strip()
        assert min_acceptance <= result.stats.acceptance_rate <= 1.0
        assert session.stats.spans > 0 and session.stats.spans_accepted > 0
        assert session.stats.coverage > 0.99  # recovery mass the walk assigned
        results.append((result, session.stats))
    return results


def test_smollm_drafts_for_qwen_15b(smollm, store):
    qwen = real_model("qwen2.5-1.5b")
    try:
        results = _generate_and_check(smollm, qwen, store, min_acceptance=0.3)
        # the prompt Qwen reads is its own ChatML rendering of the public request
        messages = [Message("user", REQUESTS[0])]
        ids = generalist_prompt(al.token_table(smollm.tokenizer), qwen.tokenizer,
                                smollm.tokenizer.chat_ids(messages))
        assert ids == qwen.tokenizer.chat_ids(messages)
        assert any(r.stats.accepted > 0 for r, _ in results)
    finally:
        del qwen
        gc.collect()


def test_smollm_drafts_for_gemma3_270m(smollm, store):
    gemma = real_model("gemma3-270m")
    try:
        _generate_and_check(smollm, gemma, store, min_acceptance=0.1)
    finally:
        del gemma
        gc.collect()


def test_short_sessions_work_on_a_sliding_window_model():
    """Gemma-3's local layers need a KV cache of at least their window (512 tokens)."""
    gemma = real_model("gemma3-270m")
    try:
        assert gemma.info.sliding_window == 512
        session = gemma.new_session(max_length=16)
        ids = gemma.tokenizer.encode("Dear team, thank you")
        rows = session.append(ids)
        session.rewind(2)
        again = session.append(ids[2:])
        np.testing.assert_allclose(again, rows[2:], rtol=1e-4, atol=1e-4)
    finally:
        del gemma
        gc.collect()


def test_identical_models_accept_almost_everything_through_the_text_path(smollm):
    """SmolLM2 verifying itself over text: spans pass while tokenizations agree.

    gamma 0.99, not 1: the two sides are float32 rows of two sessions fed in different chunks.
    Before the tail was tokenized in context ("\\n", "\\n" rather than "\\n\\n"), this was 84 %.
    Whether a whole output stays canonical hangs on near-ties (it differed between machines), so
    the claim is checked on the prefix where the tokens equal the text's canonical tokenization:
    there the companion rejects nothing. Warm start is off: this is about the verification path.
    """

    class Forced(Verifier):
        def open(self, request, committed=(), owner=""):  # type: ignore[override]
            return CrossVerifierSession(self, request, committed=committed)

    client = Client(smollm, history=None,
                    companion=lambda: LocalChannel.for_verifier(Forced(smollm, smollm)))
    canonical_tokens = 0
    for request in REQUESTS:
        result = client.generate(request, gamma=0.99, max_new_tokens=48, offline="fail",
                                 warm_start=False)
        canonical = smollm.tokenizer.encode(result.text)
        pairs = zip(canonical, result.tokens, strict=False)
        agree = next((i for i, (a, b) in enumerate(pairs) if a != b),
                     min(len(canonical), len(result.tokens)))
        assert "recovered" not in result.provenance[:agree], (result.text, result.provenance)
        canonical_tokens += agree
        # past a spelling its own tokenizer would not produce ("I", "t" for "It") the Generalist
        # conditions on the canonical tokens, so even an identical model drifts
        # (docs/cross-tokenizer.md, measured 54 %)
        assert result.stats.acceptance_rate > 0.4, result.text
    assert canonical_tokens >= 16
