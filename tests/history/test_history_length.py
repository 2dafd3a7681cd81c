"""The length policy: the user's typical length and the new-token bounds derived from it."""

from __future__ import annotations

import pytest

from specsteer.history.length import length_policy
from specsteer.history.prompts import whitespace_tokens


def _texts(*lengths: int) -> list[str]:
    return [" ".join(["w"] * n) for n in lengths]


def test_bounds_from_median_and_upper_quartile() -> None:
    policy = length_policy(_texts(100, 20, 60, 200), whitespace_tokens)
    assert policy is not None
    # median of 20, 60, 100, 200 = 80; nearest-rank upper quartile = 100
    assert (policy.samples, policy.median_tokens, policy.median_words) == (4, 80, 80)
    assert (policy.min_new_tokens, policy.max_new_tokens) == (48, 150)


def test_single_text_and_blank_texts() -> None:
    policy = length_policy([*_texts(10), "", "   "], whitespace_tokens)
    assert policy is not None and policy.samples == 1
    assert (policy.min_new_tokens, policy.max_new_tokens) == (6, 15)
    assert length_policy(["", " "], whitespace_tokens) is None
    assert length_policy([], whitespace_tokens) is None


def test_token_counter_is_the_callers() -> None:
    def chars(text: str) -> int:
        return len(text)

    policy = length_policy(["abcd efgh"], chars)  # 9 characters, 2 words
    assert policy is not None and (policy.median_tokens, policy.median_words) == (9, 2)


def test_clamp_to_a_hard_cap() -> None:
    policy = length_policy(_texts(100), whitespace_tokens)
    assert policy is not None
    assert policy.clamp(256) == (60, 150)
    assert policy.clamp(100) == (60, 100)
    assert policy.clamp(40) == (40, 40)  # the minimum never exceeds the maximum
    with pytest.raises(ValueError, match=">= 0"):
        policy.clamp(-1)


def test_invalid_shares() -> None:
    with pytest.raises(ValueError, match="min_share"):
        length_policy(_texts(5), whitespace_tokens, min_share=1.5)
    with pytest.raises(ValueError, match="max_multiple"):
        length_policy(_texts(5), whitespace_tokens, max_multiple=0.5)
