"""`device.rules`: the text rules as processors, composed once per generation, and the key of a
draft made ahead, derived from the settings (no model, no network)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from specsteer.device.rounds import first_draft_key
from specsteer.device.rules import (
    Rules,
    end_probability,
    forbid,
    hold_end,
    loops,
    make_rules,
    opening_bans,
    phrase_bans,
    repeated_ngram_bans,
    without,
)
from specsteer.options import COMPANION, entries, option
from specsteer.settings import Params
from specsteer.steer import SparseSteer

EOS = frozenset({0})


class _Letters:
    """A tokenizer of single letters (id = position in the alphabet + 1), 0 = end-of-text:
    enough to spell phrases and tell a sentence end, and no model."""

    eos_ids = EOS
    alphabet = " abcdefghijklmnopqrstuvwxyz."

    def encode(self, text: str) -> list[int]:
        return [self.alphabet.index(c) + 1 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i - 1] for i in ids if i)


LETTERS = _Letters()
ROW = np.zeros(len(_Letters.alphabet) + 1)  # logits: every token equally likely


def test_repeated_ngram_bans_names_the_tokens_that_would_repeat_an_ngram():
    out = [5, 6, 7, 5, 6]  # "5 6" was followed by 7 once: 7 now repeats the 3-gram 5 6 7
    assert repeated_ngram_bans(out, 3) == {7}
    assert repeated_ngram_bans(out, 2) == {7}  # after 6 came 7
    assert repeated_ngram_bans([1, 2, 1, 3, 1], 2) == {2, 3}
    assert repeated_ngram_bans(out, 4) == frozenset()  # "7 5 6" never occurred before
    assert repeated_ngram_bans(out, 0) == frozenset()
    assert repeated_ngram_bans([9], 2) == frozenset()


def test_a_loop_rule_lets_an_ngram_come_back_once_and_not_twice():
    twice = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]  # "1 2 3" then 9 once, then 8 once
    assert repeated_ngram_bans(twice, 4, times=2) == frozenset()
    thrice = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3]  # "1 2 3 9" twice: no third time
    assert repeated_ngram_bans(thrice, 4, times=2) == {9}
    assert repeated_ngram_bans(thrice, 4) == {9}
    assert repeated_ngram_bans(thrice, 0, times=2) == frozenset()


def test_end_probability_of_a_full_row_and_of_the_companion_s_top_k() -> None:
    eos = frozenset({3, 4})
    probs = np.array([0.1, 0.2, 0.1, 0.35, 0.25])
    logits = np.log(probs) + 7.0  # unnormalised, as a model's row
    assert end_probability(logits, eos) == pytest.approx(0.6, abs=1e-6)
    ids = np.array([1, 3, 0])  # the companion's top-k: log-probabilities of these ids only
    assert end_probability(np.log(probs[ids]), eos, ids) == pytest.approx(0.35, abs=1e-6)
    # an end-of-text id outside the top-k counts as nothing
    assert end_probability(np.log(probs[[1, 0]]), eos, np.array([1, 0])) == 0.0
    # a log-probability rounded above 0 is still certainty, so end_release 1 always holds
    assert end_probability(np.array([1e-6, -20.0]), frozenset({0}), np.array([0, 1])) == 1.0


def test_opening_bans_only_the_token_that_completes_an_opening_at_the_start() -> None:
    openings = [(5, 6, 7), (5, 9), (4,)]
    assert opening_bans([], openings) == {4}  # a one-token opening: banned at the start
    assert opening_bans([5], openings) == {9}  # "I'm" may open a text, "I'm sorry" may not
    assert opening_bans([5, 6], openings) == {7}
    assert opening_bans([5, 6, 7], openings) == frozenset()  # past every opening
    assert opening_bans([1, 5, 6], openings) == frozenset()  # not at the start: free
    assert opening_bans([5, 6], []) == frozenset()


def test_phrase_bans_the_token_that_completes_a_phrase_anywhere() -> None:
    phrases = [(5, 6, 7), (6, 9), (4,)]
    assert phrase_bans([], phrases) == {4}  # a one-token phrase: never written
    assert phrase_bans([1, 2, 5, 6], phrases) == {4, 7, 9}  # mid-text, after the rest of each
    assert phrase_bans([5, 6, 7, 6], phrases) == {4, 9}  # a second phrase after the first
    assert phrase_bans([6], phrases) == {4, 9}  # a phrase from the first token
    assert phrase_bans([5, 8, 6], phrases[:1]) == frozenset()  # only the phrase's own tail
    assert phrase_bans([5, 6], []) == frozenset()


def test_loops_marks_the_third_time_of_the_last_ngram():
    sentence = [5, 6, 7, 8, 9]
    assert not loops(sentence * 2, 4)  # a sentence said twice is not yet a loop
    assert not loops(sentence * 2 + [5, 6, 7], 4)
    assert loops(sentence * 2 + [5, 6, 7, 8], 4)  # "5 6 7 8" the third time
    assert not loops(sentence * 3 + [1], 4)  # only the last n-gram counts
    assert not loops(sentence * 3, 0) and not loops([1, 1], 4)
    assert loops(sentence * 2 + [5, 6, 7, 8], 4, times=2)


def test_the_release_threshold_is_the_deciding_row_s_end_probability():
    row = np.log(np.array([0.6, 0.3, 0.1]))  # end-of-text at 0.6
    params = Params(min_new_tokens=5)  # the default threshold, 0.5
    ban = hold_end(EOS, params.min_new_tokens, params.release_after, params.end_release)
    assert ban([1, 1, 1, 1], row, None) == frozenset()  # sure enough: let through
    assert hold_end(EOS, 5, 3, 0.6)([1] * 4, row, None) == EOS  # not above it
    assert ban([1] * 4, np.log(np.array([0.4, 0.5, 0.1])), None) == EOS
    assert ban([1] * 5, np.log(np.array([0.0001, 0.9, 0.0999])), None) == frozenset()
    assert params.release_after == 3  # half the minimum, rounded up
    assert ban([1, 1], row, None) == EOS  # before it: held, however sure
    anywhere = replace(params, end_release_from=0.0)
    assert anywhere.release_after == 0
    assert hold_end(EOS, 5, anywhere.release_after, 0.5)([1, 1], row, None) == frozenset()
    with pytest.raises(ValueError, match="end_release"):
        Params(end_release=0.0)
    with pytest.raises(ValueError, match="end_release_from"):
        Params(end_release_from=-0.1)


def test_a_generation_s_rules_are_the_ones_its_settings_turn_on():
    assert make_rules(Params(no_repeat_ngram=0, meta_openings=()), LETTERS).bans == ()
    rules = make_rules(Params(min_new_tokens=3, end_release=1.0, no_repeat_ngram=2,
                              meta_openings=("as",), banned_phrases=("xy",)), LETTERS)
    assert len(rules.bans) == 4 and rules.end is None
    a, s, x, y = (LETTERS.encode(c)[0] for c in "asxy")
    # before the minimum (3): end-of-text; at the start the opening's "s" after "a"; "y"
    # after "x" anywhere; once "a x" was written, no second one
    assert rules.banned([a], ROW) == EOS | {s}
    assert rules.banned([a, x], ROW) == EOS | {y}
    assert rules.banned([a, x, a], ROW) == {x}
    masked = rules.forbid([a], ROW)
    assert np.isneginf(masked[[0, s]]).all() and np.isfinite(np.delete(masked, [0, s])).all()


def test_a_looping_text_ends_at_the_next_sentence_end():
    rules = make_rules(Params(loop_end_ngram=2, no_repeat_ngram=0, meta_openings=()), LETTERS)
    text = LETTERS.encode("ab ab ab c.")
    ends = [rules.ends(text[:n]) for n in range(1, len(text) + 1)]
    assert ends == [False] * (len(text) - 1) + [True]  # "ab" a third time, then the "."
    assert not make_rules(Params(meta_openings=()), LETTERS).ends(text)


def test_bans_apply_to_a_full_row_a_candidate_sub_row_and_the_companion_s_candidates():
    assert forbid(ROW, frozenset()) is ROW
    ids = np.array([4, 7, 9])
    scores = np.array([0.1, 0.2, 0.3], np.float32)
    assert forbid(scores, frozenset({7}), ids).tolist() == [np.float32(0.1), -np.inf,
                                                           np.float32(0.3)]
    steer = SparseSteer(ids, scores)
    kept = without(steer, frozenset({4, 9}))
    assert kept is not None and kept.ids.tolist() == [7]
    assert without(steer, frozenset({4, 7, 9})) is None


def test_no_rule_is_a_processor_that_bans_nothing():
    assert Rules().banned([1, 2, 3], ROW) == frozenset() and not Rules().ends([1, 2])


@dataclass(frozen=True)
class _WithARule(Params):
    """`Params` with one more device rule, as a developer adds one: a field, nothing else."""

    no_letter_q: bool = option(False, "never write a q")


def test_a_new_rule_never_reuses_a_draft_made_without_it():
    """The draft `prepare` makes ahead is keyed by the settings the device reads, not by a
    hand list of rule fields: a rule added to `Params` counts without being named anywhere."""
    plain = first_draft_key(_WithARule())
    assert plain is not None and first_draft_key(_WithARule(no_letter_q=True)) != plain
    # only what the companion alone reads may differ and still reuse it
    for entry in entries(Params):
        if entry.option.scope != COMPANION:
            continue
        other = {"gamma": 0.1, "top_k": 8, "top_p": 0.5, "select": "difference"}[entry.name]
        assert first_draft_key(replace(Params(), **{entry.name: other})) == \
            first_draft_key(Params())
    assert first_draft_key(Params(k=3)) != first_draft_key(Params(k=4))
    assert first_draft_key(Params(temperature=0.5)) is None
    assert first_draft_key(Params(method="llm")) is None
