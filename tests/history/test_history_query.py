"""history.query: words, quoting, and which words a search keeps (pure functions)."""

from __future__ import annotations

import sqlite3

from hypothesis import given
from hypothesis import strategies as st

from specsteer.history.query import (
    STOPWORDS,
    fts_query,
    match_expression,
    phrase,
    scoring_terms,
    seed_terms,
    words,
)
from specsteer.history.store import TOKENIZER


def test_words_are_distinct_lowercase_in_order() -> None:
    assert words('The "cat" AND the dog* -- (cat)') == ["the", "cat", "and", "dog"]
    assert words("snake_case x2 東京 café") == ["snake", "case", "x2", "東京", "café"]
    assert words("a b c d", max_terms=2) == ["a", "b"]
    assert words("!!! ??? ---") == []


def test_phrase_quotes_everything() -> None:
    assert phrase("and") == '"and"'
    assert phrase('a"b') == '"a""b"'
    assert match_expression(["x", "y"]) == '"x" OR "y"'
    assert fts_query("") == ""


@given(st.text(max_size=60))
def test_any_text_is_a_valid_fts5_query(text: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize='{TOKENIZER}')")
    conn.execute("INSERT INTO t(body) VALUES ('some body text café 東京')")
    expression = fts_query(text)
    if expression:
        conn.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank", [expression]).fetchall()


def _freqs(table: dict[str, int]):
    return lambda term: table.get(term, 0)


def test_scoring_terms_are_content_words_rarest_first() -> None:
    freq = _freqs({"the": 900, "neural": 300, "parsing": 40, "zebra": 1, "model": 450})
    terms = ["the", "neural", "parsing", "zebra", "model", "absent"]
    scoring = scoring_terms(terms, freq, 1000)
    assert scoring == [(1, "zebra"), (40, "parsing"), (300, "neural"), (450, "model")]
    assert seed_terms(scoring, None) == ["zebra", "parsing", "neural", "model"]
    assert seed_terms(scoring, 350) == ["zebra", "parsing", "neural"]
    assert seed_terms(scoring, 10) == ["zebra"]
    assert seed_terms(scoring, 0) == ["zebra"]  # always at least one


def test_words_in_most_records_do_not_score_unless_alone() -> None:
    freq = _freqs({"common": 800, "rare": 5})
    assert scoring_terms(["common", "rare"], freq, 1000) == [(5, "rare")]
    assert scoring_terms(["common"], freq, 1000) == [(800, "common")]


def test_stop_words_score_only_when_no_content_word_matches() -> None:
    assert "the" in STOPWORDS and "is" in STOPWORDS
    freq = _freqs({"the": 30, "is": 90, "zebra": 2})
    assert scoring_terms(["the", "is", "unmatched"], freq, 100) == [(30, "the")]
    assert scoring_terms(["the", "zebra"], freq, 100) == [(2, "zebra")]
    assert scoring_terms(["unmatched"], freq, 100) == []
