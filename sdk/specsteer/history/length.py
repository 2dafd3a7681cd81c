"""How long a text should be, from the lengths of the user's own earlier texts of the same task.

Owns the length policy of a request: the typical (median) length of the user's texts, and the
minimum and maximum number of new tokens a decoder should generate for this user. It is derived
from the private history, so it stays on the device: a decoder applies it locally (it may hold
back end-of-text before the minimum and stop at the maximum) and never sends it to the companion.
Must not load models or tokenizers: token counting is a callable the caller passes in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# The minimum is this share of the median: below half the user's typical length a text reads
# as cut short, and the median user text is itself a middle value, so leave room below it.
MIN_SHARE_OF_MEDIAN = 0.6
# The maximum is this multiple of the upper quartile: long texts stay possible, run-ons do not.
MAX_MULTIPLE_OF_UPPER_QUARTILE = 1.5


@dataclass(frozen=True)
class LengthPolicy:
    """The user's typical length for one task and the new-token bounds derived from it."""

    samples: int  # how many of the user's texts it was measured on
    median_tokens: int  # median length of those texts, as counted by the caller's counter
    median_words: int  # the same in whitespace words (what a prompt can state)
    min_new_tokens: int  # generate at least this many tokens (end-of-text held back before)
    max_new_tokens: int  # and at most this many

    def clamp(self, cap: int) -> tuple[int, int]:
        """(minimum, maximum) new tokens under a caller's hard cap (e.g. a request's budget)."""
        if cap < 0:
            raise ValueError(f"the cap on new tokens must be >= 0, not {cap}")
        maximum = min(self.max_new_tokens, cap)
        return min(self.min_new_tokens, maximum), maximum


def _median(values: Sequence[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2


def _upper_quartile(values: Sequence[int]) -> int:
    """Nearest-rank 75th percentile: the smallest value with at least 75 % of them at or below."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.75 * len(ordered)) - 1, 0)]


def length_policy(
    texts: Sequence[str],
    count_tokens: Callable[[str], int],
    *,
    min_share: float = MIN_SHARE_OF_MEDIAN,
    max_multiple: float = MAX_MULTIPLE_OF_UPPER_QUARTILE,
) -> LengthPolicy | None:
    """The length policy measured on the user's earlier texts, or None when there are none.

    Blank texts are ignored. min_new_tokens = ceil(min_share x median), at least 1;
    max_new_tokens = ceil(max_multiple x upper quartile), at least min_new_tokens.
    """
    if not 0 <= min_share <= 1:
        raise ValueError(f"min_share must be in [0, 1], not {min_share}")
    if max_multiple < 1:
        raise ValueError(f"max_multiple must be >= 1, not {max_multiple}")
    kept = [text for text in texts if text.strip()]
    if not kept:
        return None
    tokens = [count_tokens(text) for text in kept]
    median = _median(tokens)
    minimum = max(1, math.ceil(min_share * median))
    maximum = max(minimum, math.ceil(max_multiple * _upper_quartile(tokens)))
    return LengthPolicy(
        samples=len(kept),
        median_tokens=round(median),
        median_words=round(_median([len(text.split()) for text in kept])),
        min_new_tokens=minimum,
        max_new_tokens=maximum,
    )
