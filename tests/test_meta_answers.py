"""Openings banned at the start of a text and phrases banned anywhere: the assistant's are
banned only for a user whose own texts never use them (`meta_answers.unused_phrases`,
`Params.for_user`)."""

from __future__ import annotations

import pytest

from specsteer.meta_answers import (
    ASSISTANT_OPENINGS,
    ASSISTANT_PHRASES,
    META_OPENINGS,
    phrase_ids,
    unused_phrases,
)
from specsteer.settings import Params


def test_a_phrase_the_user_writes_is_not_banned() -> None:
    texts = ["Sorry for the delay.\nI hope this post finds everyone well, it's been a while.",
             "Here’s the plan for Saturday."]  # a curly apostrophe is the same phrase
    phrases = ("I hope this post finds", "Here's the", "I'm glad you", "Subject:")
    assert unused_phrases(phrases, texts) == ("I'm glad you", "Subject:")


def test_phrases_match_as_words_case_and_brackets_as_written() -> None:
    # "Sure" is not in "not sure" or "Surely"; "Dear [" needs the bracket; "Here's a" is not
    # in "Here's all"
    texts = ["I'm not sure. Surely not.", "Dear Anna, thanks.", "Here's all of it."]
    assert unused_phrases(("Sure", "Dear [", "Dear Anna", "Here's a"), texts) == (
        "Sure", "Dear [", "Here's a")
    assert unused_phrases(("Sure",), ["Sure, I can do Friday."]) == ()


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


def test_for_user_bans_the_assistant_phrases_they_never_write_anywhere() -> None:
    theirs = ["As an AI researcher I put the **key** terms in bold; feel free to ask."]
    fitted = Params().for_user(theirs)
    assert set(fitted.banned_phrases) == set(ASSISTANT_PHRASES) - {
        "As an AI", "**", "feel free to ask"}
    assert fitted.assistant_phrases == () and fitted.for_user([]) == fitted
    assert Params(assistant_phrases=()).for_user([]).banned_phrases == ()  # off
    # the app's own phrases stay banned whatever the user writes, and come first
    own = Params(banned_phrases=("Best regards",), assistant_phrases=("**",))
    assert own.for_user(["Best regards, Ann"]).banned_phrases == ("Best regards", "**")
    assert own.for_user(["**Ann**"]).banned_phrases == ("Best regards",)


def test_phrases_banned_anywhere_are_written_at_a_line_start_and_after_a_space(
    tiny_model,
) -> None:
    """Mid-text the same words are other tokens ("As" vs " As"): both spellings are banned;
    an opening is banned as a text starts."""
    tok = tiny_model.tokenizer
    ids = phrase_ids(tok, ("Dear [",), ("feel free to ask", "**"))
    assert ids.openings == (tuple(tok.encode("Dear [")),)
    assert set(ids.anywhere) == {tuple(tok.encode(p)) for p in (
        "feel free to ask", " feel free to ask", "**", " **")}
    assert tuple(tok.encode(" feel free to ask")) != tuple(tok.encode("feel free to ask"))
    assert phrase_ids(tok, (), ()).anywhere == ()


@pytest.mark.parametrize("name", ["assistant_openings", "banned_phrases", "assistant_phrases"])
@pytest.mark.parametrize("bad", [("",), ["I'm glad you"], (3,)])
def test_phrase_lists_must_be_tuples_of_phrases(name, bad) -> None:
    with pytest.raises(ValueError, match=name):
        Params(**{name: bad})
