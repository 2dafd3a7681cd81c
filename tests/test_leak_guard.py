"""The leak guard's detector: private n-grams and patterns, on the tiny tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from specsteer.device import Params
from specsteer.device.leak_guard import (
    LeakGuard,
    best_allowed,
    ngrams,
    pattern_matches,
    private_host,
    private_ngrams,
)

PUBLIC = "Write an email about: the budget for the next quarter."
PRIVATE = ("Earlier emails: the quarterly budget stays frozen until the board meets in March. "
           + PUBLIC)


@pytest.fixture(scope="module")
def tok(tiny_model):
    return tiny_model.tokenizer


def _guard(tok, n=4, policy="redact", public=PUBLIC, private=PRIVATE) -> LeakGuard:
    return LeakGuard(tok, tok.encode(private), tok.encode(public), policy=policy, n=n)


def test_private_ngrams_leave_out_what_the_public_prompt_holds():
    assert ngrams([1, 2, 3, 4], 3) == {(1, 2, 3), (2, 3, 4)}
    assert private_ngrams([9, 1, 2, 3, 4], [1, 2, 3, 4], 3) == {(9, 1, 2)}


def test_the_token_completing_a_private_window_is_flagged(tok):
    guard = _guard(tok)
    span = tok.encode(" stays frozen until the board meets")
    flag = guard.scan([], span)
    assert flag is not None and flag.kind == "ngram" and flag.index == 3  # n - 1 tokens pass
    # with the start of the window already sent, the very first drafted token completes it
    flag = guard.scan(span[:3], span[3:])
    assert flag is not None and flag.index == 0
    assert guard.blocks(span[:3], span[3]) and not guard.blocks(span[:2], span[2])
    assert guard.allowed(span[:3], [span[3], span[2]]).tolist() == [False, True]


def test_a_window_reaching_back_into_a_short_context_is_flagged(tok):
    guard = _guard(tok, n=6)
    span = tok.encode(" stays frozen until the board meets")
    for sent in range(1, 6):  # fewer ids already sent than the window's n - 1
        flag = guard.scan(span[:sent], span[sent:])
        assert flag is not None and flag.index == 5 - sent, sent


def test_public_text_and_new_text_are_not_flagged(tok):
    guard = _guard(tok)
    assert guard.scan([], tok.encode(" the budget for the next quarter.")) is None
    assert guard.scan([], tok.encode(" I think we should keep the numbers")) is None


@pytest.mark.parametrize("text,kind", [
    ("please write to ann.lee@", "email"),
    ("mail ann.lee@mail.example.com today", "email"),
    ("call me on +44 20 7946 0958 tonight", "phone"),
    ("call 555-123-4567", "phone"),
    ("card 4111 1111 1111 1111 expires", "card"),
    ("IBAN DE89 3704 0044 0532 0130 00 please", "iban"),
    ("see http://wiki.corp/budget", "url"),
    ("see https://192.168.1.10/budget", "url"),
    ("see http://localhost:8080/x", "url"),
])
def test_patterns_flag_personal_data(tok, text, kind):
    assert kind in {m[2] for m in pattern_matches(text)}
    guard = _guard(tok, n=8)
    ids = tok.encode(text)
    flag = guard.scan([], ids)
    assert flag is not None
    start = min(m[0] for m in pattern_matches(text))
    # the first token withheld is the one whose text reaches the match: nothing of it goes up
    assert len(tok.decode(ids[: flag.index])) <= start < len(tok.decode(ids[: flag.index + 1]))


@pytest.mark.parametrize("text", [
    "the meeting is on 2024-01-15 at noon", "see https://example.com/budget", "it costs 1234",
    "we met at 10:30 in room 42",
])
def test_patterns_leave_ordinary_text_alone(tok, text):
    assert _guard(tok, n=8).scan([], tok.encode(text)) is None


def test_a_pattern_already_in_the_public_prompt_is_not_flagged(tok):
    public = "Reply to ann.lee@mail.example.com about the budget."
    guard = _guard(tok, n=8, public=public, private="x " + public)
    assert guard.scan([], tok.encode(" ann.lee@mail.example.com")) is None


def test_a_pattern_across_rounds_is_caught_when_it_completes(tok):
    guard = _guard(tok, n=8)
    sent = tok.encode("write to ann.lee")
    flag = guard.scan(sent, tok.encode("@mail.example.com"))
    assert flag is not None and flag.index == 0 and flag.kind == "email"


def test_private_hosts():
    assert private_host("10.1.2.3") and private_host("[::1]") and private_host("wiki.internal")
    assert not private_host("example.com") and not private_host("8.8.8.8")


def test_best_allowed_skips_what_would_disclose(tok):
    guard = _guard(tok)
    span = tok.encode(" stays frozen until the board meets")
    row = np.zeros(tok.vocab_size, np.float32)
    row[span[3]], row[7] = 5.0, 4.0
    assert best_allowed(guard, span[:3], row) == 7


def test_settings_are_checked(tok):
    with pytest.raises(ValueError, match="leak_guard"):
        Params(leak_guard="block")
    with pytest.raises(ValueError, match="leak_guard_n"):
        Params(leak_guard_n=1)
    with pytest.raises(ValueError, match="policy"):
        _guard(tok, policy="block")


DETAILS = ("Earlier emails: write to marta.kowalczyk@quillfeather.org or call me on "
           "+44 20 7946 0958. " + PUBLIC)


@pytest.mark.parametrize("text,kind", [
    (" @quillfeather.org", "email"),  # turned away from "kowalczyk@", the Specialist spaced it
    (" write to quillfeatherourcompany.com", "email"),  # glued to other text
    (" Marta.Kowalczyk at the office", "email"),  # the local part without "@", other case
    (" call +442079 4 6", "number"),  # 7 digits of the number, respaced
    (" 4 4 2 0 7 9 4", "number"),
    (" 794 6 0 9 5 8", "number"),
])
def test_private_details_are_flagged_in_any_spelling(tok, text, kind):
    guard = _guard(tok, n=8, private=DETAILS)
    ids = tok.encode(text)
    flag = guard.scan([], ids)
    assert flag is not None and flag.kind == kind
    assert not pattern_matches(text) or kind == "email"  # the patterns alone miss most of them


@pytest.mark.parametrize("text", [
    " the example.com office", " we have 2079 members and 46 rooms", " call 0800 111 222 3",
    " Marta will send it",  # a first name is no e-mail local part
])
def test_other_numbers_and_words_are_not_private_details(tok, text):
    guard = _guard(tok, n=8, private=DETAILS)
    flag = guard.scan([], tok.encode(text))
    assert flag is None or flag.kind == "phone"  # a phone pattern of its own, not this user's


def test_a_private_number_split_over_rounds_is_caught_at_its_seventh_digit(tok):
    guard = _guard(tok, n=8, private=DETAILS)
    sent = tok.encode(" call me on +442079")  # six digits went up: not yet a window
    assert guard.scan([], sent) is None
    flag = guard.scan(sent, tok.encode(" 4 6 0958"))
    assert flag is not None and flag.index == 0 and flag.kind == "number"


def test_details_the_public_prompt_holds_are_not_flagged(tok):
    public = "Reply to marta.kowalczyk@quillfeather.org on +44 20 7946 0958."
    guard = _guard(tok, n=8, public=public, private="x " + public)
    assert guard.scan([], tok.encode(" quillfeather and +442079 4 6")) is None


@pytest.mark.parametrize("text", [
    " THE QUARTERLY BUDGET STAYS FROZEN UNTIL THE BOARD",
    " The  Quarterly  Budget,  Stays  Frozen  Until  The  Board",
    "\nthe\nquarterly\nbudget\nstays\nfrozen\nuntil\nthe\nboard",
])
def test_a_copy_with_other_ids_is_flagged_as_private_words(tok, text):
    """Re-cased, re-spaced or re-punctuated, a copy is other ids (the id windows miss it) but the
    same words: the token completing `n` private words in a row is flagged."""
    guard = _guard(tok, n=8)
    ids = tok.encode(text)
    assert guard._ngram([], ids) is None  # not the private prompt's ids
    flag = guard.scan([], ids)
    assert flag is not None and flag.kind == "words"
    sent = tok.decode(ids[: flag.index]).lower()
    assert "the" in sent and not sent.rstrip().endswith("board")  # seven words went up, not 8
    assert tok.decode(ids[: flag.index + 1]).lower().split()[-1].startswith("b")


def test_redact_turns_away_the_same_text_in_other_spacing_or_case(tok):
    """Turned away from " continuous", the real Specialist glued "continuous" on ("discrete
    andcontinuous"): a redacted pick may not be a respelling of a token turned away."""
    by_text: dict[str, list[int]] = {}
    for token in range(tok.vocab_size):
        by_text.setdefault(tok.decode([token]).strip().lower(), []).append(token)
    twin_text, twins = next((text, ids) for text, ids in by_text.items()
                            if len(text) > 1 and text.isalpha() and len(ids) > 1)
    other = next(ids[0] for text, ids in by_text.items() if text.isalpha()
                 and not text.startswith(twin_text) and not twin_text.startswith(text))
    guard = _guard(tok, n=8)
    ids = np.array([*twins, other])
    mask = guard.redact_mask([], ids, withheld=twins[0])
    assert mask.tolist() == [False] * len(twins) + [True]
    assert guard.redact_mask([], ids).all()  # nothing withheld, nothing private: all allowed


@pytest.mark.parametrize(("withheld", "candidates", "expected"), [
    # after " center": "in" would write "centerin", a piece of the copy's "centering"
    ("ing", ["in", "s", ",", " the"], [False, True, True, True]),
    # after " and": "-f" and "f" begin the copy's " for" again ("back and-for forth")
    (" for", ["f", "-", " to", " f"], [False, True, True, False]),
    # after " as": " an" is " a" extended ("as an postprocess")
    (" a", [" and", " the", "\n"], [False, True, True]),
])
def test_redact_turns_away_pieces_and_extensions_of_a_withheld_word(
        tok, withheld, candidates, expected):
    """The respellings a reader saw in run 7 of the leak-guard benchmark: turned away from a
    token, the Specialist wrote a piece of it or it extended, the copy's word damaged."""
    def one(text: str) -> int:
        ids = tok.encode(text)
        assert len(ids) == 1, (text, ids)
        return ids[0]

    guard = _guard(tok, n=8)
    mask = guard.redact_mask([], np.array([one(c) for c in candidates]), withheld=one(withheld))
    assert mask.tolist() == expected


@pytest.mark.parametrize(("text", "index", "floor", "start"), [
    (" centering", 3, 0, 0),  # ' c' 'en' 'ter' 'ing': the word began three tokens back
    (" centering", 3, 2, 2),  # ' c' 'en' already sent: no further back than what is not
    (" centering", 0, 0, 0),
    (" the centering", 4, 0, 1),  # ' the' is a word of its own
    ("-for", 2, 0, 1),  # '-' 'f' 'or': the hyphen ends the word before
])
def test_redact_cuts_at_the_start_of_the_flagged_word(tok, text, index, floor, start):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert _guard(tok).word_start(ids, index, floor) == start
