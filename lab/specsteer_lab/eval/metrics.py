"""Text-quality metrics of the papers: ROUGE-1 and ROUGE-L F1 (rouge-score, Porter stemming).

LaMP and LongLaMP report these two with stemming on; using Google's `rouge-score` package keeps
our numbers comparable with theirs. Owns nothing else: no model or data access.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from rouge_score import rouge_scorer


@dataclass(frozen=True)
class Rouge:
    """F1 scores in [0, 1]."""

    rouge1: float
    rougeL: float  # noqa: N815 - the metric's own name


@lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def rouge(prediction: str, reference: str) -> Rouge:
    """ROUGE-1 / ROUGE-L F1 of `prediction` against the gold `reference`."""
    scores = _scorer().score(reference, prediction)
    return Rouge(scores["rouge1"].fmeasure, scores["rougeL"].fmeasure)
