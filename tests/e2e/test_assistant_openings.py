"""Through `Client`: an assistant opening is banned at the start of the output for a user whose
retrieved texts never use it, and left alone for one whose texts do, in every method that
writes from the device's choice (the tokenizer is declared to write the phrase as the first
tokens the method writes anyway, so the ban shows as a changed third token)."""

from __future__ import annotations

import pytest
from helpers.budget_mail import REQUEST, budget_history
from helpers.declared import WithTokenizer, Writes

from specsteer.client import Client
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

NEVER = "I hope this post finds"  # not in the budget mails
THEIRS = "Dear team"  # how every budget mail opens


@pytest.mark.parametrize("method", ["specsteer", "llm", "slm_rag", "speculative"])
def test_an_assistant_opening_is_banned_unless_the_user_writes_it(tiny_model, tiny_generalist,
                                                                  method) -> None:
    store = budget_history()
    verifier = Verifier(tiny_generalist, tiny_model)

    def generate(model, phrases: tuple[str, ...]) -> list[int]:
        client = Client(model, history=store,
                        companion=lambda: LocalChannel.for_verifier(verifier))
        return client.generate(REQUEST, max_new_tokens=12, method=method, meta_openings=(),
                               assistant_openings=phrases).tokens

    free = generate(tiny_model, ())
    assert len(free) >= 3

    def writing(phrase: str) -> WithTokenizer:
        return WithTokenizer(tiny_model, Writes(tiny_model.tokenizer, phrase, free[:3]))

    never = generate(writing(NEVER), (NEVER,))
    assert never[:2] == free[:2] and never[2] != free[2]  # only the phrase's last token
    assert generate(writing(THEIRS), (THEIRS,)) == free  # the user writes it: theirs to use
