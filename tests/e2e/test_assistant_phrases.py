"""Through `Client`: an assistant phrase is banned anywhere in the output (here from the fourth
token on) for a user whose retrieved texts never use it, and left alone for one whose texts do;
an app's own `banned_phrases` are banned whatever the user writes. In every method that writes
from the device's choice (the tokenizer is declared to write the phrase as tokens 4 to 6 of
what the method writes anyway, so the ban shows as a changed sixth token)."""

from __future__ import annotations

import pytest
from helpers.budget_mail import REQUEST, budget_history
from helpers.declared import WithTokenizer, Writes

from specsteer.client import Client
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

NEVER = "feel free to ask"  # not in the budget mails
THEIRS = "the budget for quarter"  # in every budget mail


@pytest.mark.parametrize("method", ["specsteer", "llm", "slm_rag", "speculative"])
def test_an_assistant_phrase_is_banned_anywhere_unless_the_user_writes_it(
    tiny_model, tiny_generalist, method
) -> None:
    store = budget_history()
    verifier = Verifier(tiny_generalist, tiny_model)

    def generate(model, **phrases: tuple[str, ...]) -> list[int]:
        client = Client(model, history=store,
                        companion=lambda: LocalChannel.for_verifier(verifier))
        options = {"banned_phrases": (), "assistant_phrases": (), **phrases}
        return client.generate(REQUEST, max_new_tokens=12, method=method, meta_openings=(),
                               assistant_openings=(), **options).tokens

    free = generate(tiny_model)
    assert len(free) >= 7

    def writing(phrase: str) -> WithTokenizer:
        return WithTokenizer(tiny_model, Writes(tiny_model.tokenizer, phrase, free[3:6]))

    never = generate(writing(NEVER), assistant_phrases=(NEVER,))
    assert never[:5] == free[:5] and never[5] != free[5]  # only the phrase's last token
    assert generate(writing(THEIRS), assistant_phrases=(THEIRS,)) == free  # theirs to use
    # the app's own list: banned for every user
    own = generate(writing(THEIRS), banned_phrases=(THEIRS,))
    assert own[:5] == free[:5] and own[5] != free[5]
