"""Openings banned at the start of a text: the assistant's are banned only for a user whose
own texts never use them (`meta_answers.unused_openings`, `Params.for_user`)."""

from __future__ import annotations

import pytest

from specsteer.meta_answers import ASSISTANT_OPENINGS, META_OPENINGS, unused_openings
from specsteer.settings import Params


def test_a_phrase_the_user_writes_is_not_banned() -> None:
    texts = ["Sorry for the delay.\nI hope this post finds everyone well, it's been a while.",
             "Here’s the plan for Saturday."]  # a curly apostrophe is the same phrase
    phrases = ("I hope this post finds", "Here's the", "I'm glad you", "Subject:")
    assert unused_openings(phrases, texts) == ("I'm glad you", "Subject:")


def test_phrases_match_as_words_case_and_brackets_as_written() -> None:
    # "Sure" is not in "not sure" or "Surely"; "Dear [" needs the bracket; "Here's a" is not
    # in "Here's all"
    texts = ["I'm not sure. Surely not.", "Dear Anna, thanks.", "Here's all of it."]
    assert unused_openings(("Sure", "Dear [", "Dear Anna", "Here's a"), texts) == (
        "Sure", "Dear [", "Here's a")
    assert unused_openings(("Sure",), ["Sure, I can do Friday."]) == ()


def test_for_user_bans_the_assistant_openings_they_never_write() -> None:
    fitted = Params().for_user(["Dear [name] forms are a pet peeve of mine."])
    assert fitted.meta_openings[:len(META_OPENINGS)] == META_OPENINGS
    added = fitted.meta_openings[len(META_OPENINGS):]
    assert "Dear [" not in added and set(added) == set(ASSISTANT_OPENINGS) - {"Dear ["}
    assert fitted.assistant_openings == ()
    assert fitted.for_user([]) == fitted  # fitted once: a second fit changes nothing
    # off: the meta openings alone, whatever the user writes
    assert Params(assistant_openings=()).for_user([]).meta_openings == META_OPENINGS
    # the app's own phrases (another language)
    assert Params(meta_openings=(), assistant_openings=("Voici",)).for_user(
        ["Bonjour"]).meta_openings == ("Voici",)


@pytest.mark.parametrize("bad", [("",), ["I'm glad you"], (3,)])
def test_assistant_openings_must_be_a_tuple_of_phrases(bad) -> None:
    with pytest.raises(ValueError, match="assistant_openings"):
        Params(assistant_openings=bad)
