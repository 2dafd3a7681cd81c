"""`Client.prepare`: retrieval and prefill ahead of the request, reused by exact rewind."""

from __future__ import annotations

import pytest
from helpers.budget_mail import CHANGED, REQUEST, budget_history
from helpers.counting import CountingModel

from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer.runtime.track import common_prefix
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow


@pytest.fixture()
def store() -> HistoryStore:
    return budget_history()


def _client(model, generalist, store) -> Client:
    verifier = Verifier(generalist, model)
    return Client(model, history=store, companion=lambda: LocalChannel.for_verifier(verifier))


@pytest.mark.parametrize("method", ["specsteer", "llm", "slm_rag", "slm"])
def test_a_prepared_generation_equals_a_cold_one(tiny_model, tiny_generalist, store, method):
    cold = _client(tiny_model, tiny_generalist, store).generate(
        REQUEST, max_new_tokens=30, method=method)
    client = _client(tiny_model, tiny_generalist, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    warm = client.generate(REQUEST, max_new_tokens=30, method=method)
    assert (warm.tokens, warm.provenance) == (cold.tokens, cold.provenance)
    if method != "slm":
        prompt = client.render(REQUEST)[1].private_ids
        # the prepared prompt is used as it is: not even its last token runs again
        assert warm.stats.prefill_reused == len(prompt) and warm.stats.prefill_tokens == 0
        assert cold.stats.prefill_reused == 0 and cold.stats.prefill_tokens == len(prompt)


def test_a_changed_request_runs_only_what_changed(tiny_model, tiny_generalist, store):
    counted = CountingModel(tiny_model)
    client = _client(counted, tiny_generalist, store)
    before, after = (client.render(q)[1].private_ids for q in (REQUEST, CHANGED))
    common = common_prefix(before, after)
    assert 0 < common < len(before) - 1  # the prompts share a prefix and then differ

    cold_client = _client(CountingModel(tiny_model), tiny_generalist, store)
    cold = cold_client.generate(CHANGED, max_new_tokens=20)
    cold_appended = cold_client.specialist.appended

    assert client.prepare(REQUEST).wait(timeout=60)
    counted.appended = 0
    warm = client.generate(CHANGED, max_new_tokens=20)
    assert (warm.tokens, warm.provenance) == (cold.tokens, cold.provenance)
    assert warm.stats.prefill_reused == common
    assert cold_appended - counted.appended == common  # the shared prefix ran once, in prepare


def test_the_task_prefix_is_kept_between_generations(tiny_model, tiny_generalist, store):
    client = _client(tiny_model, tiny_generalist, store)
    first = client.generate(REQUEST, max_new_tokens=10, method="slm_rag")
    second = client.generate("Meeting notes", max_new_tokens=10, method="slm_rag")
    ids = [client.render(q)[1].private_ids for q in (REQUEST, "Meeting notes")]
    assert first.stats.prefill_reused == 0
    assert second.stats.prefill_reused == common_prefix(*ids) > 20  # the task's system part
    cold = _client(tiny_model, tiny_generalist, store).generate(
        "Meeting notes", max_new_tokens=10, method="slm_rag")
    assert second.tokens == cold.tokens
