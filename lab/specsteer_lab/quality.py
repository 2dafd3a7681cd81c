"""Quality measures a user would feel, and how sure we are of a difference between two methods.

Owns pure functions over texts and per-user scores: the paired bootstrap interval of the mean
difference between two methods evaluated on the same users (for ROUGE-1/L or any score), the
length of an output relative to the user's median history length, and a style similarity: the
cosine between character n-gram frequency profiles of an output and of the user's own history,
against the same cosine with other users' histories (own minus others is the margin). Uses numpy
and rouge-score only; reads no files and loads no models.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from rouge_score import rouge_scorer

DEFAULT_RESAMPLES = 2000
DEFAULT_NGRAMS = (3, 5)  # character n-gram sizes, inclusive
ROUGE_METRICS = ("rouge1", "rougeL")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Interval:
    """A mean difference and its bootstrap confidence interval (same units as the scores)."""

    mean: float
    low: float
    high: float
    confidence: float
    n: int  # paired observations (users)

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True)
class StyleSimilarity:
    """Cosine of an output's n-gram profile with its user's history and with other users'."""

    own: float
    others: float  # mean over the other users
    margin: float  # own - others: > 0 when the output reads more like its user than like others


def paired_bootstrap(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of mean(a - b) over paired observations (same users).

    Users are resampled with replacement `resamples` times (seeded: the same inputs give the
    same interval); the interval holds the central `confidence` share of the resampled means.
    """
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"paired scores need two equal-length lists, got {a.shape} and {b.shape}")
    if len(a) == 0:
        raise ValueError("paired scores are empty: there is no difference to bound")
    if not np.isfinite(a).all() or not np.isfinite(b).all():
        raise ValueError("paired scores must be finite numbers")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, not {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    differences = a - b
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(differences), size=(resamples, len(differences)))
    means = differences[picks].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(differences.mean()), float(low), float(high), confidence, len(a))


@lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(list(ROUGE_METRICS), use_stemmer=True)


def rouge_f1(predictions: Sequence[str], references: Sequence[str]) -> dict[str, list[float]]:
    """ROUGE-1 and ROUGE-L F1 in % per pair (Porter-stemmed, as LaMP/LongLaMP report them)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    scores: dict[str, list[float]] = {metric: [] for metric in ROUGE_METRICS}
    for prediction, reference in zip(predictions, references, strict=True):
        result = _scorer().score(reference, prediction)
        for metric in ROUGE_METRICS:
            scores[metric].append(100 * result[metric].fmeasure)
    return scores


def rouge_difference(
    outputs_a: Sequence[str],
    outputs_b: Sequence[str],
    golds: Sequence[str],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Interval]:
    """Per ROUGE metric, the paired interval of method A minus method B (same users, in %)."""
    if not len(outputs_a) == len(outputs_b) == len(golds):
        raise ValueError("each user needs one output of each method and one gold text")
    a, b = rouge_f1(outputs_a, golds), rouge_f1(outputs_b, golds)
    return {
        metric: paired_bootstrap(a[metric], b[metric], resamples=resamples,
                                 confidence=confidence, seed=seed)
        for metric in ROUGE_METRICS
    }


def median_words(texts: Sequence[str]) -> float:
    """Median length in whitespace words of the non-blank texts."""
    lengths = [len(text.split()) for text in texts if text.strip()]
    if not lengths:
        raise ValueError("no non-blank history texts to take a median length of")
    return float(np.median(lengths))


def length_ratio(output: str, history: Sequence[str]) -> float:
    """Words of `output` over the median words of the user's history texts (1.0 = typical)."""
    return len(output.split()) / median_words(history)


def ngram_profile(text: str, sizes: tuple[int, int] = DEFAULT_NGRAMS) -> Counter[str]:
    """Character n-gram counts (n from sizes[0] to sizes[1]) of `text`, whitespace runs as one
    space; case and punctuation are kept, since they are part of a writer's style."""
    smallest, largest = sizes
    if not 1 <= smallest <= largest:
        raise ValueError(f"n-gram sizes must satisfy 1 <= low <= high, not {sizes}")
    normalized = _SPACES.sub(" ", text).strip()
    return Counter(
        normalized[start : start + n]
        for n in range(smallest, largest + 1)
        for start in range(len(normalized) - n + 1)
    )


def cosine(profile_a: Mapping[str, int], profile_b: Mapping[str, int]) -> float:
    """Cosine similarity of two frequency profiles; 0.0 when either is empty."""
    norm_a = math.sqrt(sum(v * v for v in profile_a.values()))
    norm_b = math.sqrt(sum(v * v for v in profile_b.values()))
    if norm_a == 0 or norm_b == 0:
        return 0.0
    small, large = sorted((profile_a, profile_b), key=len)
    return sum(count * large.get(gram, 0) for gram, count in small.items()) / (norm_a * norm_b)


def history_profile(texts: Sequence[str], sizes: tuple[int, int] = DEFAULT_NGRAMS) -> Counter[str]:
    """One user's profile: the n-gram counts of their history texts added up."""
    total: Counter[str] = Counter()
    for text in texts:
        total.update(ngram_profile(text, sizes))
    return total


def style_similarity(
    output: str,
    own_history: Sequence[str],
    other_histories: Sequence[Sequence[str]],
    sizes: tuple[int, int] = DEFAULT_NGRAMS,
) -> StyleSimilarity:
    """How much more `output` reads like its user's history than like other users' histories."""
    return profile_similarity(
        output,
        history_profile(own_history, sizes),
        [history_profile(history, sizes) for history in other_histories],
        sizes,
    )


def profile_similarity(
    output: str,
    own_profile: Mapping[str, int],
    other_profiles: Sequence[Mapping[str, int]],
    sizes: tuple[int, int] = DEFAULT_NGRAMS,
) -> StyleSimilarity:
    """`style_similarity` over history profiles built once (`history_profile`), for many outputs."""
    if not other_profiles:
        raise ValueError("style similarity needs at least one other user's history")
    profile = ngram_profile(output, sizes)
    own = cosine(profile, own_profile)
    others = float(np.mean([cosine(profile, other) for other in other_profiles]))
    return StyleSimilarity(own=own, others=others, margin=own - others)
