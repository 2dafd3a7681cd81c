"""HistoryStore: records in and out, BM25 search and its filters, erasure, file handling."""

from __future__ import annotations

import os
import re
import sqlite3
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsteer.errors import (
    HistoryCorrupt,
    HistoryError,
    InvalidRecord,
    RecordNotFound,
)
from specsteer.history import HistoryStore, Record, make_record


def test_add_get_roundtrip_normalises_fields(store: HistoryStore) -> None:
    record = store.add(
        kind="note",
        title="Groceries",
        body="oat milk, lemons",
        created_at="2024-05-01T11:30:00+02:00",
        meta={"tags": ["home"]},
        source="test",
    )
    assert record.created_at == "2024-05-01T09:30:00Z"  # converted to UTC
    assert record.id.startswith("note:")
    assert store.get(record.id) == record
    assert len(store) == 1 and record.id in store


def test_same_content_twice_is_one_record(store: HistoryStore) -> None:
    first = store.add(kind="note", body="same words")
    second = store.add({"kind": "note", "body": "same words"})
    assert first.id == second.id
    assert len(store) == 1


def test_add_many_reports_added_updated_unchanged(store: HistoryStore) -> None:
    records = [make_record(kind="note", id=f"n{i}", body=f"note number {i}") for i in range(5)]
    first = store.add_many(records)
    assert (first.added, first.updated, first.unchanged) == (5, 0, 0)
    again = store.add_many(records)
    assert (again.added, again.updated, again.unchanged) == (0, 0, 5)
    changed = [*records[:4], make_record(kind="note", id="n4", body="rewritten zebra text")]
    third = store.add_many(changed, batch_size=2)
    assert (third.added, third.updated, third.unchanged) == (0, 1, 4)
    assert len(store) == 5
    assert [hit.record.id for hit in store.search("zebra")] == ["n4"]
    assert store.search("number 4") and all(h.record.id != "n4" for h in store.search("number"))


def test_add_many_validates_everything_before_writing(store: HistoryStore) -> None:
    with pytest.raises(InvalidRecord):
        store.add_many([{"kind": "note", "body": "fine"}, {"kind": "Bad Kind!", "body": "x"}])
    assert len(store) == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "", "body": "x"},
        {"kind": "note"},  # no title, no body
        {"kind": "note", "body": "x", "created_at": "yesterday"},
        {"kind": "note", "body": "x", "meta": ["not", "a", "dict"]},
        {"kind": "note", "body": "x", "meta": {"when": object()}},
        {"kind": "note", "body": "x", "colour": "red"},  # unknown field
    ],
)
def test_invalid_records_are_refused(store: HistoryStore, fields: dict) -> None:
    with pytest.raises(InvalidRecord):
        store.add(fields)


def test_update_changes_fields_and_reindexes(store: HistoryStore) -> None:
    record = store.add(kind="note", id="n1", title="Plan", body="visit the aquarium")
    updated = store.update("n1", body="visit the planetarium", meta={"done": True})
    assert updated.id == "n1" and updated.title == "Plan" and updated.meta == {"done": True}
    assert store.get("n1") == updated != record
    assert store.search("aquarium") == []
    assert [hit.record.id for hit in store.search("planetarium")] == ["n1"]
    with pytest.raises(RecordNotFound):
        store.update("missing", body="x")
    with pytest.raises(InvalidRecord):
        store.update("n1", colour="red")


def test_delete(store: HistoryStore) -> None:
    store.add(kind="note", id="n1", body="keep me")
    store.add(kind="note", id="n2", body="drop me")
    store.delete("n2")
    assert "n2" not in store and len(store) == 1
    with pytest.raises(RecordNotFound):
        store.get("n2")
    with pytest.raises(RecordNotFound):
        store.delete("n2")


def test_list_newest_first_with_filters(store: HistoryStore) -> None:
    store.add(kind="note", id="old", body="a", created_at="2020-01-01")
    store.add(kind="note", id="new", body="b", created_at="2023-06-01")
    store.add(kind="note", id="undated", body="c")
    store.add(kind="email", id="mail", title="Hi", body="d", created_at="2021-01-01")
    assert [r.id for r in store.list()] == ["new", "mail", "old", "undated"]
    assert [r.id for r in store.list("note")] == ["new", "old", "undated"]
    assert [r.id for r in store.list(["note", "email"], limit=2, offset=1)] == ["mail", "old"]
    assert [r.id for r in store.list(before="2022")] == ["mail", "old"]


def test_search_ranks_by_bm25_and_ors_terms(store: HistoryStore) -> None:
    store.add(kind="note", id="many", body="sourdough sourdough sourdough starter feeding")
    store.add(kind="note", id="once", body="sourdough is one of many breads in this long note")
    store.add(kind="note", id="none", body="a note about bicycles")
    hits = store.search("sourdough")
    assert [hit.record.id for hit in hits] == ["many", "once"]
    assert hits[0].score > hits[1].score > 0
    # A long query whose other words match nothing still finds the record (terms are OR-ed).
    long_query = "tell me everything about my bicycles and unicycles and tandems please"
    assert [hit.record.id for hit in store.search(long_query)] == ["none"]
    assert len(store.search("sourdough bicycles", k=1)) == 1
    assert store.search("sourdough", k=0) == []
    assert store.search("???") == []


def test_search_stems_and_folds_diacritics(store: HistoryStore) -> None:
    store.add(kind="note", id="n", body="We were writing about the café")
    assert [h.record.id for h in store.search("writes cafe")] == ["n"]


def test_search_filters_by_kind_and_time(store: HistoryStore) -> None:
    store.add(kind="paper", id="p2016", title="Parsing", body="neural parsing", created_at=2016)
    store.add(kind="paper", id="p2018", title="Parsing", body="neural parsing", created_at=2018)
    store.add(kind="email", id="e", title="parsing", body="neural parsing question")
    store.add(kind="paper", id="pnone", title="Parsing", body="neural parsing")
    assert {h.record.id for h in store.search("parsing", 10)} == {"p2016", "p2018", "e", "pnone"}
    assert {h.record.id for h in store.search("parsing", 10, kinds=["email"])} == {"e"}
    assert {h.record.id for h in store.search("parsing", 10, kinds=["paper"], before="2018")} == {
        "p2016"
    }
    # before= is strict and drops undated records (they cannot be proven older).
    assert {h.record.id for h in store.search("parsing", 10, before="2018-01-01T00:00:01Z")} == {
        "p2016",
        "p2018",
    }


def test_common_words_do_not_hide_rare_ones(store: HistoryStore) -> None:
    # "the" is in every record, so FTS5's BM25 gives it no weight; the rare word decides.
    for i in range(30):
        store.add(kind="note", id=f"n{i}", body=f"the the the entry {i}")
    store.add(kind="note", id="target", body="the narwhal")
    assert store.search("the narwhal", 1)[0].record.id == "target"
    assert store.search("the narwhal", 1, max_candidates=None)[0].record.id == "target"
    # Only stop words: still returns the user's records rather than nothing.
    assert len(store.search("the", 3)) == 3


def test_candidate_search_matches_exhaustive_bm25(store: HistoryStore) -> None:
    # 60 records share "river"; 3 also have a rare word. With a candidate budget below 60
    # postings only records with a rare word are scored, yet the top 3 are those an
    # exhaustive BM25 over every scoring word returns, scores included.
    for i in range(60):
        extra = ["delta estuary", "delta", "estuary"][i] if i < 3 else "plain"
        store.add(kind="note", id=f"n{i}", body=f"river {extra} walk number {i} " + "x " * i)
    for i in range(60, 200):
        store.add(kind="note", id=f"m{i}", body=f"mountain trail {i}")
    query = "river delta estuary"
    budgeted = store.search(query, 3, max_candidates=10)
    exhaustive = store.search(query, 3, max_candidates=None)
    assert [h.record.id for h in budgeted] == [h.record.id for h in exhaustive]
    assert [h.record.id for h in budgeted][0] == "n0"
    assert [round(h.score, 9) for h in budgeted] == [round(h.score, 9) for h in exhaustive]
    # Too few candidates for k: the search scores everything instead of returning fewer.
    assert len(store.search(query, 10, max_candidates=10)) == 10


FTS_SCAN = re.compile(r"SCAN (f|records_fts) VIRTUAL TABLE")


def test_filtered_searches_walk_the_full_text_index_first(tmp_path: Path) -> None:
    # A plan that starts from the kind/date index re-runs the MATCH per record (100x slower).
    traced: list[tuple[str, object]] = []
    with HistoryStore(tmp_path / "h.db", tracer=lambda sql, p: traced.append((sql, p))) as store:
        store.add_many(
            make_record(
                kind="paper" if i % 2 else "note",
                id=f"p{i}",
                body=f"{'river' if i < 30 else 'lake'} {'rare' if i < 9 else ''}",
                created_at=2000 + i % 20,
            )
            for i in range(100)
        )
        query = {"query": "rare river", "k": 3, "kinds": ["paper"]}
        assert len(store.search(**query, max_candidates=10)) == 3
        assert len(store.search(**query, max_candidates=None)) == 3
        plans = [
            store.db.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
            for sql, params in list(traced)
            if "MATCH" in sql and "JOIN" in sql
        ]
    assert len(plans) == 3  # candidates, their ranking, and the exhaustive search
    for plan in plans:
        steps = [step[3] for step in plan]
        full_text = next(i for i, step in enumerate(steps) if FTS_SCAN.match(step))
        records = next(i for i, step in enumerate(steps) if step.startswith("SEARCH r "))
        assert full_text < records, steps


NASTY_QUERIES = [
    '"',
    '""',
    "'",
    "AND",
    "OR NOT AND",
    "foo AND",
    "*",
    "foo*",
    "-foo",
    "--",
    "(",
    "(foo",
    "foo)",
    "title:foo",
    "NEAR(foo bar, 2)",
    "^foo",
    "{title body}: foo",
    "+",
    "café 東京 🙂",
    "\x00",
    "x" * 5000,
    " ".join(f"w{i}" for i in range(500)),
]


@pytest.mark.parametrize("query", NASTY_QUERIES)
def test_fts_syntax_in_queries_never_raises(store: HistoryStore, query: str) -> None:
    store.add(kind="note", id="n", title="foo", body="foo bar café 東京 title body near")
    assert isinstance(store.search(query), list)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=st.text(max_size=80))
def test_any_text_query_is_safe(store: HistoryStore, query: str) -> None:
    if len(store) == 0:
        store.add(kind="note", id="n", title="foo", body="foo bar café 東京")
    hits = store.search(query)
    assert all(hit.record.id == "n" for hit in hits)


def test_forget_by_kind_and_before(store: HistoryStore) -> None:
    store.add(kind="email", id="e1", title="a", body="x", created_at="2019-01-01")
    store.add(kind="email", id="e2", title="b", body="y", created_at="2022-01-01")
    store.add(kind="note", id="n1", body="z", created_at="2019-01-01")
    store.add(kind="note", id="n2", body="w")
    assert store.forget(kind="email", before="2020") == 1
    assert {r.id for r in store.list()} == {"e2", "n1", "n2"}
    assert store.forget(before="2030") == 2  # e2 and n1; the undated note stays
    assert store.forget(kind="tweet") == 0
    assert [r.id for r in store.list()] == ["n2"]
    with pytest.raises(ValueError, match="wipe"):
        store.forget()


def _file_bytes(db_path: Path) -> bytes:
    data = b""
    for suffix in ("", "-wal", "-journal"):
        part = Path(f"{db_path}{suffix}")
        if part.exists():
            data += part.read_bytes()
    return data


def _secret() -> str:
    # Digits at the end keep the porter stemmer from changing it in the FTS index.
    return "zq" + uuid.uuid4().hex[:12] + "0417"


@pytest.mark.parametrize("erase", ["delete", "forget", "wipe", "update"])
def test_erased_text_is_gone_from_the_files(tmp_path: Path, erase: str) -> None:
    path = tmp_path / "history.db"
    secrets = [_secret() for _ in range(3)]
    store = HistoryStore(path)
    store.add_many(
        make_record(kind="note", id=f"keep{i}", body=f"ordinary shopping list {i}")
        for i in range(50)
    )
    store.add(kind="secret", id="s", title=secrets[0], body=f"my pin is {secrets[1]} {secrets[2]}")
    # The FTS index stores terms prefix-compressed: look for each secret's tail as well.
    needles = [s.encode() for s in secrets] + [s[3:].encode() for s in secrets]
    assert any(needle in _file_bytes(path) for needle in needles)  # the scan can see text
    if erase == "delete":
        store.delete("s")
    elif erase == "forget":
        assert store.forget(kind="secret") == 1
    elif erase == "update":
        store.update("s", title="nothing here", body="nothing to see")
    else:
        store.wipe()
    found = [needle for needle in needles if needle in _file_bytes(path)]
    assert found == []
    if erase == "wipe":
        assert len(store) == 0
    else:
        assert len(store.search("shopping", 100)) == 50
    store.close()
    assert [n for n in needles if n in _file_bytes(path)] == []


def test_wipe_shrinks_the_file(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    with HistoryStore(path) as store:
        store.add_many(
            make_record(kind="note", id=f"n{i}", body=f"words {i} " * 200) for i in range(300)
        )
        full = store.stats()["file_bytes"] + store.stats()["wal_bytes"]
        store.wipe()
        after = store.stats()
    assert after["records"] == 0 and after["wal_bytes"] == 0
    assert after["file_bytes"] < full / 10


def test_memory_store(tmp_path: Path) -> None:
    with HistoryStore(memory=True) as store:
        store.add(kind="note", body="in memory only")
        assert store.search("memory")[0].record.body == "in memory only"
        assert store.stats()["path"] == ":memory:"
        store.wipe()
        assert len(store) == 0
    with pytest.raises(ValueError):
        HistoryStore(tmp_path / "x.db", memory=True)
    with pytest.raises(ValueError):
        HistoryStore()


def test_reopen_keeps_records_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "history.db"
    with HistoryStore(path) as store:
        store.add(kind="note", id="n", body="durable")
        assert store.stats()["journal_mode"] == "wal"
    with HistoryStore(path) as store:
        assert store.get("n").body == "durable"
        assert store.integrity_check() == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_file_is_private_to_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    with HistoryStore(path) as store:
        store.add(kind="note", body="private")
        for suffix in ("", "-wal"):
            assert os.stat(f"{path}{suffix}").st_mode & 0o777 == 0o600


def test_not_a_database_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database" * 200)
    with pytest.raises(HistoryCorrupt, match="not a readable history database"):
        HistoryStore(path)


def test_other_apps_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER)")
    conn.close()
    with pytest.raises(HistoryCorrupt, match="another application"):
        HistoryStore(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    HistoryStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(HistoryCorrupt, match="upgrade specsteer"):
        HistoryStore(path)


def test_closed_store_says_so(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.close()
    store.close()  # idempotent
    with pytest.raises(HistoryError, match="closed"):
        store.add(kind="note", body="late")


def test_tracer_sees_sql(tmp_path: Path) -> None:
    seen: list[str] = []
    with HistoryStore(tmp_path / "h.db", tracer=lambda sql, params: seen.append(sql)) as store:
        store.add(kind="note", body="traced")
        store.search("traced")
    assert any("BEGIN IMMEDIATE" in sql for sql in seen)
    assert any("MATCH" in sql for sql in seen)


def test_record_is_hashable_and_serialisable() -> None:
    record = make_record(kind="note", body="x", meta={"a": 1})
    assert hash(record) == hash(Record(**record.to_dict()))
    assert record.to_dict()["meta"] == {"a": 1}
