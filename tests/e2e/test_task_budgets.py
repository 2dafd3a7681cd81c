"""The private prompt budget per task: a Client given none renders each task's prompt to that
task's measured budget (`prompts.Task.max_prompt_tokens`); a budget given to the Client wins for
every task. The device prompt's private ids are what is prefilled, so they are counted too."""

from __future__ import annotations

import pytest

from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer.history.prompts import get_task

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

QUERIES = {"abstract": "Sparse verification for private decoding", "email": "Budget for Q3",
           "tweet": "I enjoy Miley, but everyone has their own taste, right?"}


@pytest.fixture()
def store() -> HistoryStore:
    """A history far larger than any budget, for each task."""
    history = HistoryStore(memory=True)
    sentence = "We measured the decoding of private drafts against a public verifier today. "
    for n in range(6):
        history.add(kind="paper", title=f"Sparse verification study {n}", body=sentence * 80)
        history.add(kind="email", title=f"Budget for Q{n}", body=sentence * 80)
        history.add(kind="tweet", body=f"Miley taste everyone {n}. " + sentence * 6)
    return history


def test_each_task_gets_its_own_budget(tiny_model, store) -> None:
    client = Client(tiny_model, history=store)
    for task, query in QUERIES.items():
        prompt, device = client.render(query, task=task)
        budget = get_task(task).max_prompt_tokens
        assert prompt.budget == budget, task
        assert prompt.tokens <= budget, task
        # the tiny chat template's markup is some tokens a message more than counted
        assert len(device.private_ids) <= budget + 8 * len(prompt.messages()), task
    abstract, email = (client.render(QUERIES[t], task=t)[0] for t in ("abstract", "email"))
    if abstract.budget != email.budget:  # measured apart: the larger one holds more history
        bigger, smaller = sorted((abstract, email), key=lambda p: p.budget, reverse=True)
        assert bigger.tokens > smaller.budget


def test_a_budget_given_wins_for_every_task(tiny_model, store) -> None:
    client = Client(tiny_model, history=store, max_prompt_tokens=300)
    for task, query in QUERIES.items():
        prompt, device = client.render(query, task=task)
        assert prompt.budget == 300, task
        assert prompt.tokens <= 300, task
        assert len(device.private_ids) <= 300 + 8 * len(prompt.messages()), task
