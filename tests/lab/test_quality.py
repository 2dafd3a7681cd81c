"""Quality measures: paired bootstrap, ROUGE differences, length ratio, n-gram style similarity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specsteer_lab.quality import (
    cosine,
    history_profile,
    length_ratio,
    ngram_profile,
    paired_bootstrap,
    rouge_difference,
    rouge_f1,
    style_similarity,
)


def test_bootstrap_of_a_constant_difference_is_that_constant() -> None:
    interval = paired_bootstrap([3.0, 5.0, 7.0], [1.0, 3.0, 5.0])
    assert (interval.mean, interval.low, interval.high) == (2.0, 2.0, 2.0)
    assert interval.n == 3 and interval.excludes_zero


def test_bootstrap_is_seeded_and_paired() -> None:
    a, b = [10.0, 20.0, 30.0, 40.0], [9.0, 21.0, 28.0, 41.0]
    assert paired_bootstrap(a, b, seed=7) == paired_bootstrap(a, b, seed=7)
    # Pairing matters: the per-user differences are +1, -1, +2, -1 (mean 0.25), far tighter
    # than the spread of either method's scores.
    interval = paired_bootstrap(a, b)
    assert interval.mean == pytest.approx(0.25)
    assert -1.0 <= interval.low <= 0.25 <= interval.high <= 2.0
    assert not interval.excludes_zero


def test_bootstrap_covers_the_true_difference_and_excludes_zero_when_large() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(10, 40, size=30)  # per-user difficulty, shared by both methods
    better = base + 5.0 + rng.normal(0, 2, size=30)
    worse = base + rng.normal(0, 2, size=30)
    interval = paired_bootstrap(better, worse)
    assert interval.low < 5.0 < interval.high
    assert interval.low > 0 and interval.excludes_zero
    noise = paired_bootstrap(base + rng.normal(0, 2, size=30), base + rng.normal(0, 2, size=30))
    assert noise.low < 0 < noise.high


def test_bootstrap_coverage_is_near_nominal() -> None:
    rng = np.random.default_rng(2)
    covered = 0
    for trial in range(100):
        differences = rng.normal(1.0, 3.0, size=25)
        interval = paired_bootstrap(differences, np.zeros(25), resamples=500, seed=trial)
        covered += interval.low <= 1.0 <= interval.high
    assert 85 <= covered <= 99  # 95 % nominal; percentile intervals run a little narrow


def test_bootstrap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap([math.nan], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1.0], [0.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        paired_bootstrap([1.0], [0.0], resamples=0)


def test_rouge_f1_hand_computed() -> None:
    scores = rouge_f1(["the cat sat", "a b"], ["the cat sat", "x y z"])
    assert scores["rouge1"] == [100.0, 0.0] and scores["rougeL"] == [100.0, 0.0]
    # "the cat" vs "the cat sat": precision 1, recall 2/3 -> F1 0.8
    assert rouge_f1(["the cat"], ["the cat sat"])["rouge1"] == [pytest.approx(80.0)]


def test_rouge_difference_between_methods() -> None:
    golds = ["the cat sat on the mat", "dogs bark at night"]
    exact = list(golds)
    empty = ["zzz", "qqq"]
    result = rouge_difference(exact, empty, golds, resamples=200)
    assert set(result) == {"rouge1", "rougeL"}
    assert result["rouge1"].mean == pytest.approx(100.0) and result["rouge1"].low == 100.0
    with pytest.raises(ValueError, match="one output of each method"):
        rouge_difference(exact, empty[:1], golds)


def test_length_ratio() -> None:
    history = ["one two", "one two three four", "a b c d e f"]  # median 4 words
    assert length_ratio("w w w w w w w w", history) == 2.0
    assert length_ratio("w w", [*history, "   "]) == 0.5
    with pytest.raises(ValueError, match="non-blank"):
        length_ratio("w", ["", " "])


def test_ngram_profile_and_cosine_by_hand() -> None:
    assert ngram_profile("abcd", (3, 3)) == {"abc": 1, "bcd": 1}
    assert ngram_profile("ab  \n c", (3, 4)) == {"ab ": 1, "b c": 1, "ab c": 1}
    assert ngram_profile("ab", (3, 5)) == {}
    # {abc:1, bcd:1} . {bcd:1, cde:1} = 1, norms sqrt(2) each -> 0.5
    assert cosine(ngram_profile("abcd", (3, 3)), ngram_profile("bcde", (3, 3))) == pytest.approx(
        0.5
    )
    assert cosine({"x": 2}, {"x": 5}) == pytest.approx(1.0)
    assert cosine({}, {"x": 1}) == 0.0
    assert history_profile(["abc", "abc"], (3, 3)) == {"abc": 2}
    with pytest.raises(ValueError, match="sizes"):
        ngram_profile("abc", (0, 2))


def test_style_similarity_prefers_the_writers_own_history() -> None:
    terse = ["ok. will do. thx.", "ok. done. thx.", "will check. thx."]
    formal = [
        "Dear colleagues, I am pleased to report that the analysis is complete.",
        "Dear colleagues, kindly find attached the revised manuscript for your review.",
    ]
    style = style_similarity("ok. sent it. thx.", terse, [formal])
    assert style.own > style.others and style.margin == pytest.approx(style.own - style.others)
    reverse = style_similarity("ok. sent it. thx.", formal, [terse])
    assert reverse.margin == pytest.approx(-style.margin)
    with pytest.raises(ValueError, match="other user"):
        style_similarity("text", terse, [])
