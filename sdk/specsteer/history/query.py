"""Turning free text into safe FTS5 queries, and planning a bounded BM25 search (no SQLite).

Owns the query side of retrieval: splitting text into words, quoting them so that FTS5 syntax in
user text (`"`, `AND`, `*`, `-`, `(`, `NEAR`, `:`) is plain text and can never raise, choosing
the words that score, and the rarest of them that pick candidates. Must not run SQL: the store
supplies document frequencies and runs the plan.

Why plan at all: FTS5 computes BM25 for every record that matches any OR-ed word, a few
microseconds each, so one common word makes a search score most of the store. The store therefore
(1) scores with the query's content words (stop words only when no content word occurs), leaving
out words in more than half of the records, which FTS5's BM25 weighs zero (its IDF is clamped);
(2) takes as candidates the records matching the rarest of those words, up to `max_candidates`
postings; and (3) ranks the candidates by BM25 over all the scoring words. Only records sharing no
rare word with the query are skipped, and their score is bounded by the common words' small IDF.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_WORD = re.compile(r"[^\W_]+")
MAX_QUERY_TERMS = 64
DEFAULT_MAX_CANDIDATES = 500
# Scoring words may reach this many times the candidate budget in postings.
SCORING_POSTINGS_FACTOR = 8

# A short English stop list (function words only); used only when content words remain.
_STOPWORD_TEXT = """a about above after again against all am an and any are as at be because been
before being below between both but by can could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is it its
itself just me more most my myself no nor not now of off on once only or other our ours ourselves
out over own re s same she should so some such t than that the their theirs them themselves then
there these they this those through to too under until up very was we were what when where
which while who whom why will with would you your yours yourself yourselves"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def words(text: str, max_terms: int = MAX_QUERY_TERMS) -> list[str]:
    """Distinct lowercase words of `text` in order of first appearance, at most `max_terms`."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        seen.setdefault(word, None)
        if len(seen) >= max_terms:
            break
    return list(seen)


def phrase(word: str) -> str:
    """One word as an FTS5 string literal (double quotes, inner quotes doubled)."""
    return '"' + word.replace('"', '""') + '"'


def match_expression(terms: Sequence[str]) -> str:
    """OR of the quoted terms: BM25 then ranks records matching any of them."""
    return " OR ".join(phrase(term) for term in terms)


def fts_query(text: str, max_terms: int = MAX_QUERY_TERMS) -> str:
    """Every word of `text` OR-ed (no selection); "" when the text has no words."""
    return match_expression(words(text, max_terms))


def scoring_terms(
    terms: Sequence[str],
    doc_freq: Callable[[str], int],
    total_docs: int,
    max_postings: int | None = None,
) -> list[tuple[int, str]]:
    """(document frequency, word) of the words a search ranks by, rarest first.

    Content words that some record contains; stop words only when no content word matches (a
    record of the user's is better context than none). Words in more than half of the records
    are left out unless nothing else is left: FTS5's BM25 gives them zero weight. With
    `max_postings`, the commonest words beyond that many summed postings are left out too (a
    long query would otherwise make FTS5 walk most of the index).
    """

    def present(candidates: Sequence[str]) -> list[tuple[int, str]]:
        return sorted((df, term) for term, df in ((t, doc_freq(t)) for t in candidates) if df > 0)

    found = present([t for t in terms if t not in STOPWORDS])
    if not found:
        found = present([t for t in terms if t in STOPWORDS])
    weighted = [(df, term) for df, term in found if df * 2 <= total_docs] or found[:1]
    return _rarest(weighted, max_postings)


def _rarest(scoring: Sequence[tuple[int, str]], limit: int | None) -> list[tuple[int, str]]:
    """The longest rarest-first prefix whose postings fit `limit` (at least one word)."""
    if limit is None:
        return list(scoring)
    chosen: list[tuple[int, str]] = []
    postings = 0
    for df, term in scoring:
        if chosen and postings + df > limit:
            break
        chosen.append((df, term))
        postings += df
    return chosen


def seed_terms(scoring: Sequence[tuple[int, str]], max_candidates: int | None) -> list[str]:
    """The rarest scoring words whose postings fit `max_candidates` (always at least one);
    all of them when `max_candidates` is None or they all fit."""
    return [term for _, term in _rarest(scoring, max_candidates)]
