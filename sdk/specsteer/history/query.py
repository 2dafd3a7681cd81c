"""Turning free text into a safe, selective FTS5 query (pure functions, no SQLite).

Owns the query side of retrieval: splitting text into words, quoting them so that FTS5 syntax in
user text (`"`, `AND`, `*`, `-`, `(`, `NEAR`, `:`) is plain text and can never raise, and choosing
which words to OR together. Must not run SQL: the store supplies document frequencies.

Why choose words at all: FTS5 computes BM25 for every record that matches any OR-ed word (a few
microseconds each), so one common word in a query makes retrieval scan most of the store. Words
in more than half of the records get zero weight from FTS5's BM25 (its IDF is clamped), and stop
words nearly so; dropping them, and then the commonest remaining words once their postings pass a
candidate budget, keeps latency bounded while ranking by the words that carry the signal.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_WORD = re.compile(r"[^\W_]+")
MAX_QUERY_TERMS = 64
DEFAULT_MAX_CANDIDATES = 1000

# A short English stop list (function words only); used only when content words remain.
_STOPWORD_TEXT = """a about above after again against all am an and any are as at be because been
before
being below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its itself
just me more most my myself no nor not now of off on once only or other our ours ourselves out
over own re s same she should so some such t than that the their theirs them themselves then
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


def select_terms(
    terms: Sequence[str],
    doc_freq: Callable[[str], int],
    total_docs: int,
    max_candidates: int | None = DEFAULT_MAX_CANDIDATES,
) -> list[str]:
    """The terms worth searching for, rarest first.

    Prefers content words that some record contains, falling back to stop words only when no
    content word matches (a record of the user's is still better context than none). Then drops
    words in more than half of the records (zero BM25 weight) unless nothing else is left, and
    keeps the rarest words while their summed document frequency fits `max_candidates` (always
    at least one); `max_candidates=None` keeps them all, for exact BM25 over those words.
    """

    def ranked(candidates: Sequence[str]) -> list[tuple[int, str]]:
        return sorted((df, term) for term, df in ((t, doc_freq(t)) for t in candidates) if df > 0)

    present = ranked([t for t in terms if t not in STOPWORDS]) or ranked(
        [t for t in terms if t in STOPWORDS]
    )
    if not present:
        return []
    weighted = [(df, term) for df, term in present if df * 2 <= total_docs] or present[:1]
    if max_candidates is None:
        return [term for _, term in weighted]
    chosen: list[str] = []
    postings = 0
    for df, term in weighted:
        if chosen and postings + df > max_candidates:
            break
        chosen.append(term)
        postings += df
    return chosen
