"""ROUGE-1 / ROUGE-L F1 against values computed by hand on fixed strings."""

from __future__ import annotations

import pytest

from specsteer_lab.eval.metrics import rouge


def test_identical_texts_score_one():
    scores = rouge("The kettle boils water fast.", "The kettle boils water fast.")
    assert scores.rouge1 == pytest.approx(1.0)
    assert scores.rougeL == pytest.approx(1.0)


def test_word_order_matters_for_rouge_l_only():
    # Same four unigrams; the longest common subsequence is one word: P = R = 1/4.
    scores = rouge("fox brown quick the", "the quick brown fox")
    assert scores.rouge1 == pytest.approx(1.0)
    assert scores.rougeL == pytest.approx(0.25)


def test_partial_overlap_by_hand():
    # reference: the cat sat on the mat (6 tokens); prediction: mat on the cat (4 tokens)
    # unigram overlap 4 -> P = 4/4, R = 4/6 -> F1 = 2 * 1 * 2/3 / (1 + 2/3) = 0.8
    # LCS ("on the" or "the cat") = 2 -> P = 2/4, R = 2/6 -> F1 = 2 * 1/2 * 1/3 / (5/6) = 0.4
    scores = rouge("mat on the cat", "the cat sat on the mat")
    assert scores.rouge1 == pytest.approx(0.8)
    assert scores.rougeL == pytest.approx(0.4)


def test_clipped_counts_by_hand():
    # prediction repeats "the" three times; the reference has it twice: overlap the=2, cat=1
    # P = 3/4, R = 3/6 -> F1 = 2 * 3/4 * 1/2 / (5/4) = 0.6
    # LCS: "the the" or "the cat" = 2 -> P = 2/4, R = 2/6 -> F1 = 0.4
    scores = rouge("the the the cat", "the cat sat on the mat")
    assert scores.rouge1 == pytest.approx(0.6)
    assert scores.rougeL == pytest.approx(0.4)


def test_stemming_case_and_punctuation():
    # Porter stemming (running -> run, dogs -> dog), lower-casing, punctuation dropped.
    scores = rouge("Running DOGS!", "run, dog.")
    assert scores.rouge1 == pytest.approx(1.0)
    assert scores.rougeL == pytest.approx(1.0)


def test_empty_prediction_scores_zero():
    scores = rouge("", "the cat sat on the mat")
    assert scores.rouge1 == 0.0
    assert scores.rougeL == 0.0


def test_short_prediction_by_hand():
    # prediction "alpha beta" vs reference "alpha beta gamma delta": P = 1, R = 1/2 -> F1 = 2/3
    scores = rouge("alpha beta", "alpha beta gamma delta")
    assert scores.rouge1 == pytest.approx(2 / 3)
    assert scores.rougeL == pytest.approx(2 / 3)
