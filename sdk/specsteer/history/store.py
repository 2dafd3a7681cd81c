"""The durable personal history store: one SQLite file per user/app, FTS5 BM25 retrieval.

Owns the file: schema, WAL mode, transactions (one `BEGIN IMMEDIATE` per write, so a reader never
sees half a record), busy handling (SQLite busy timeout plus retry with backoff, then
`HistoryLocked`); secure erasure (`secure_delete`, FTS5 `optimize`, `VACUUM`, WAL truncation) is
its mixin `erasure.SecureErase`.
Must not parse files (that is `ingest`), build prompts (`prompts`), or send anything anywhere: the
history is the private context and never leaves the device.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from specsteer.errors import (
    HistoryCorrupt,
    HistoryError,
    HistoryLocked,
    HistoryReadOnly,
    InvalidRecord,
    RecordNotFound,
)
from specsteer.history.erasure import SecureErase
from specsteer.history.query import (
    DEFAULT_MAX_CANDIDATES,
    SCORING_POSTINGS_FACTOR,
    match_expression,
    phrase,
    scoring_terms,
    seed_terms,
    words,
)
from specsteer.history.records import (
    EMPTY_REPORT,
    FIELDS,
    FTS_TABLE,
    TABLE,
    Hit,
    IngestReport,
    Record,
    coerce_record,
    make_record,
    normalize_time,
)

T = TypeVar("T")
Tracer = Callable[[str, Any], None]
TimeLike = str | int | date | datetime

SCHEMA_VERSION = 1
# Porter stemming + diacritic folding: "writes"/"writing" and "café"/"cafe" match, as BM25 expects.
TOKENIZER = "porter unicode61 remove_diacritics 2"
# Written by hand rather than with sqlite-utils' create()/enable_fts(): those run executescript(),
# which commits the open transaction, and two processes creating one file at once need the whole
# schema to appear atomically (IF NOT EXISTS inside one BEGIN IMMEDIATE).
_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        body TEXT NOT NULL DEFAULT '',
        created_at TEXT,
        meta TEXT NOT NULL DEFAULT '{{}}',
        source TEXT NOT NULL DEFAULT '',
        digest TEXT NOT NULL
    )""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_kind_created ON {TABLE}(kind, created_at)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_created ON {TABLE}(created_at)",
    f"""CREATE VIRTUAL TABLE IF NOT EXISTS {FTS_TABLE} USING fts5(
        title, body, content='{TABLE}', content_rowid='rowid', tokenize='{TOKENIZER}'
    )""",
    f"""CREATE TRIGGER IF NOT EXISTS {TABLE}_ai AFTER INSERT ON {TABLE} BEGIN
        INSERT INTO {FTS_TABLE}(rowid, title, body) VALUES (new.rowid, new.title, new.body);
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS {TABLE}_ad AFTER DELETE ON {TABLE} BEGIN
        INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, title, body)
        VALUES ('delete', old.rowid, old.title, old.body);
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS {TABLE}_au AFTER UPDATE OF title, body ON {TABLE} BEGIN
        INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, title, body)
        VALUES ('delete', old.rowid, old.title, old.body);
        INSERT INTO {FTS_TABLE}(rowid, title, body) VALUES (new.rowid, new.title, new.body);
    END""",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
_COLUMNS = "r.id, r.kind, r.title, r.body, r.created_at, r.meta, r.source"
# CROSS JOIN keeps the full-text index as the outer loop: with a plain JOIN, SQLite may walk the
# kind/date index instead and re-run the MATCH once per record (100x slower).
_FTS_JOIN = f"{FTS_TABLE} f CROSS JOIN {TABLE} r ON r.rowid = f.rowid"
DEFAULT_BATCH = 1000


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    message = str(exc).lower()
    return "locked" in message or "busy" in message


def _row(record: Record, digest: str) -> dict[str, Any]:
    row: dict[str, Any] = record.to_dict()
    row["meta"] = json.dumps(record.meta, ensure_ascii=False, sort_keys=True)
    row["digest"] = digest
    return row


def _record(row: Sequence[Any]) -> Record:
    record_id, kind, title, body, created_at, meta, source = row[:7]
    return Record(record_id, kind, title, body, created_at, json.loads(meta), source)


def _not_writable(path: Path) -> bool:
    """An existing file this process cannot write, or whose folder it cannot write (WAL mode
    creates -wal and -shm files beside it)."""
    return path.exists() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def _kinds(kind: str | Sequence[str] | None) -> tuple[str, ...]:
    if kind is None:
        return ()
    return (kind,) if isinstance(kind, str) else tuple(kind)


class HistoryStore(SecureErase):
    """A user's writing history in one SQLite file (or in memory), searchable with BM25.

    Safe to share between threads (one connection behind a lock) and between processes (WAL
    readers never block; writers wait up to `busy_timeout_s`, then raise `HistoryLocked`).
    An existing file that this process cannot write (or `read_only=True`) is opened read-only:
    it can be listed and searched, and every write raises `HistoryReadOnly`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        memory: bool = False,
        busy_timeout_s: float = 5.0,
        tracer: Tracer | None = None,
        read_only: bool = False,
    ) -> None:
        if memory == (path is not None):
            raise ValueError("give HistoryStore a file path, or memory=True (not both)")
        if busy_timeout_s < 0:
            raise ValueError("busy_timeout_s must be >= 0")
        self.path: Path | None = None if path is None else Path(path).expanduser().absolute()
        if self.path is not None and self.path.is_dir():
            raise HistoryError(f"{self.path} is a folder; give the path of a history file in it "
                               "(e.g. history.db)")
        self.read_only = read_only or (self.path is not None and _not_writable(self.path))
        # True after an erase whose old copies another connection's read still holds in the
        # file or its WAL; `finish_erase` (or the next open) completes it.
        self.erase_pending = False
        self.busy_timeout_s = busy_timeout_s
        self.lock_retries = 0  # how often a write found the file locked and backed off
        self._writes = 0  # commits on this connection: with data_version, invalidates _doc_freqs
        self._doc_freqs: dict[str, int] = {}
        self._freq_version: tuple[int, int] | None = None
        self._total_docs = 0
        self._lock = threading.RLock()
        self._closed = False
        # SQLite's own busy wait gets a slice of the budget; the retry loop below spends the rest.
        slice_s = max(0.005, busy_timeout_s / 4)
        self._busy_ms = int(slice_s * 1000)
        try:
            if self.path is None:
                conn = sqlite3.connect(":memory:", check_same_thread=False)
            elif self.read_only:
                if not self.path.exists():
                    raise HistoryError(f"history file {self.path} does not exist")
                uri = f"{self.path.as_uri()}?mode=ro"
                conn = sqlite3.connect(uri, uri=True, timeout=slice_s, check_same_thread=False)
            else:
                self._create_private_file(self.path)
                conn = sqlite3.connect(self.path, timeout=slice_s, check_same_thread=False)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot open history file {self.path}: {exc}") from exc
        self.db = sqlite_utils.Database(conn, tracer=tracer)
        try:
            self._run(self._configure, write=False)
            if self._run(self._schema_version, write=False) != SCHEMA_VERSION:
                if self.read_only:
                    raise HistoryCorrupt(f"{self.location} is not a specsteer history (and is "
                                         "read-only, so none can be created in it)")
                self._run(self._create_schema, write=True)
            if self.path is not None and not self.read_only:
                self._finish_pending_erase()
        except BaseException:
            conn.close()
            raise

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def location(self) -> str:
        """The file path, or ':memory:' (used in error messages)."""
        return ":memory:" if self.path is None else str(self.path)

    @staticmethod
    def _create_private_file(path: Path) -> None:
        """Create the file owner-only (0600) before SQLite does; its -wal/-shm copy the mode."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return
        except OSError as exc:
            raise HistoryError(f"cannot create history file {path}: {exc}") from exc
        os.close(fd)

    def _configure(self) -> None:
        self.db.execute("PRAGMA secure_delete = ON")  # freed pages and cells are zeroed
        self.db.execute("PRAGMA temp_store = MEMORY")  # no history text in temp files
        self.db.execute("PRAGMA synchronous = FULL")  # a returned write survives power loss
        if self.path is not None and not self.read_only:
            self.db.enable_wal()

    def _schema_version(self) -> int:
        version: int = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryCorrupt(
                f"{self.location} has history schema v{version}, newer than this specsteer "
                f"(v{SCHEMA_VERSION}); upgrade specsteer"
            )
        return version

    def _create_schema(self) -> None:
        if self._schema_version() == SCHEMA_VERSION:  # another process created it meanwhile
            return
        if self.db.table_names():
            raise HistoryCorrupt(
                f"{self.location} is a SQLite database of another application, "
                "not a specsteer history; choose a new file"
            )
        for statement in _SCHEMA:
            self.db.execute(statement)

    def _translate(self, exc: sqlite3.Error) -> HistoryError:
        message = str(exc)
        if isinstance(exc, sqlite3.DatabaseError) and any(
            word in message.lower() for word in ("not a database", "malformed", "corrupt")
        ):
            return HistoryCorrupt(f"{self.location} is not a readable history database: {message}")
        if self._closed:
            return HistoryError(f"history store {self.location} is closed")
        return HistoryError(f"history store {self.location}: {message}")

    def _run(self, op: Callable[[], T], *, write: bool) -> T:
        """Run `op` (inside `BEGIN IMMEDIATE ... COMMIT` when writing), retrying while locked."""
        if write and self.read_only:
            raise HistoryReadOnly(
                f"history file {self.location} is read-only (opened with mode=ro because this "
                "process cannot write it or its folder): it can be listed and searched, not "
                "changed"
            )
        with self._lock:
            start = time.monotonic()
            delay = 0.01
            while True:
                try:
                    if not write:
                        return op()
                    self.db.execute("BEGIN IMMEDIATE")
                    try:
                        result = op()
                        self.db.execute("COMMIT")
                        self._writes += 1
                    except BaseException:
                        if self.db.conn.in_transaction:
                            # the original error matters more than a failed rollback
                            with contextlib.suppress(sqlite3.Error):
                                self.db.execute("ROLLBACK")
                        raise
                    return result
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise self._translate(exc) from exc
                    waited = time.monotonic() - start
                    if waited >= self.busy_timeout_s:
                        raise HistoryLocked(self.location, waited, str(exc)) from exc
                    self.lock_retries += 1
                    pause = min(delay * (1 + random.random()), self.busy_timeout_s - waited)
                    time.sleep(max(pause, 0.0))
                    delay = min(delay * 2, 0.5)
                except sqlite3.Error as exc:
                    raise self._translate(exc) from exc

    # -- writing -------------------------------------------------------------------------------

    def add(self, record: Record | Mapping[str, Any] | None = None, /, **fields: Any) -> Record:
        """Store one record (a `Record`, a dict, or keyword fields); same id replaces it."""
        if record is not None and fields:
            raise InvalidRecord("pass either a record or keyword fields, not both")
        stored = coerce_record(fields if record is None else record)
        self.add_many([stored])
        return stored

    def add_many(
        self, records: Iterable[Record | Mapping[str, Any]], *, batch_size: int = DEFAULT_BATCH
    ) -> IngestReport:
        """Store many records, skipping unchanged ones (idempotent re-import).

        Every record is validated before anything is written. Each batch commits atomically; a
        crash mid-call keeps whole batches only. The last of several records with one id wins.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        unique = {record.id: record for record in map(coerce_record, records)}
        batch: list[Record] = list(unique.values())
        report = EMPTY_REPORT
        for start in range(0, len(batch), batch_size):
            chunk = batch[start : start + batch_size]
            report = report + self._run(lambda chunk=chunk: self._write(chunk), write=True)
        return report

    def _write(self, chunk: Sequence[Record]) -> IngestReport:
        marks = ",".join("?" * len(chunk))
        existing = dict(
            self.db.execute(
                f"SELECT id, digest FROM {TABLE} WHERE id IN ({marks})", [r.id for r in chunk]
            ).fetchall()
        )
        rows: list[dict[str, Any]] = []
        added = updated = 0
        for record in chunk:
            digest = record.digest
            if existing.get(record.id) == digest:
                continue
            if record.id in existing:
                updated += 1
            else:
                added += 1
            rows.append(_row(record, digest))
        if rows:
            self.db.table(TABLE).upsert_all(rows, pk="id")
        return IngestReport(added, updated, len(chunk) - len(rows), tuple(r.id for r in chunk))

    def update(self, record_id: str, **fields: Any) -> Record:
        """Change some fields of a stored record; the id stays. Old text is scrubbed."""
        unknown = set(fields) - (set(FIELDS) - {"id"})
        if unknown:
            raise InvalidRecord(f"cannot update {sorted(unknown)}; fields: {list(FIELDS[1:])}")

        def op() -> Record:
            current = self._get(record_id)
            merged = make_record(**{**current.to_dict(), **fields})
            self._write([merged])
            return merged

        updated = self._run(op, write=True)
        if {"title", "body"} & set(fields):
            self._scrub(require=False)
        return updated

    def delete(self, record_id: str) -> None:
        """Remove one record and scrub its text from the index and the WAL."""

        def op() -> None:
            cursor = self.db.execute(f"DELETE FROM {TABLE} WHERE id = ?", [record_id])
            if cursor.rowcount == 0:
                raise RecordNotFound(record_id)

        self._run(op, write=True)
        self._scrub(require=False)

    def forget(
        self, *, kind: str | Sequence[str] | None = None, before: TimeLike | None = None
    ) -> int:
        """Delete every record of these kinds and/or created before a time; returns how many.

        Records without `created_at` are not "before" anything and are kept by `before=`.
        """
        if kind is None and before is None:
            raise ValueError("forget() needs kind= or before=; use wipe() to erase everything")
        where, params = self._filters(_kinds(kind), normalize_time(before), alias="")
        count = self._run(
            lambda: self.db.execute(f"DELETE FROM {TABLE} WHERE {where}", params).rowcount,
            write=True,
        )
        if count:
            self._scrub(require=False)
        return count

    # -- reading -------------------------------------------------------------------------------

    def _get(self, record_id: str) -> Record:
        row = self.db.execute(
            f"SELECT {_COLUMNS} FROM {TABLE} r WHERE r.id = ?", [record_id]
        ).fetchone()
        if row is None:
            raise RecordNotFound(record_id)
        return _record(row)

    def get(self, record_id: str) -> Record:
        """The record with this id; raises `RecordNotFound`."""
        return self._run(lambda: self._get(record_id), write=False)

    def __contains__(self, record_id: object) -> bool:
        if not isinstance(record_id, str):
            return False
        sql = f"SELECT 1 FROM {TABLE} WHERE id = ?"
        row = self._run(lambda: self.db.execute(sql, [record_id]).fetchone(), write=False)
        return row is not None

    def __len__(self) -> int:
        return self._run(
            lambda: self.db.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0], write=False
        )

    @staticmethod
    def _filters(
        kinds: Sequence[str], before: str | None, *, alias: str = "r."
    ) -> tuple[str, list[Any]]:
        clauses: list[str] = ["1"]
        params: list[Any] = []
        if kinds:
            clauses.append(f"{alias}kind IN ({','.join('?' * len(kinds))})")
            params.extend(kinds)
        if before is not None:
            clauses.append(f"{alias}created_at < ?")
            params.append(before)
        return " AND ".join(clauses), params

    def _doc_freq(self, term: str) -> int:
        """Records containing `term` (as FTS5 tokenises it), cached until the file changes."""
        if term not in self._doc_freqs:
            if len(self._doc_freqs) > 50_000:
                self._doc_freqs.clear()
            self._doc_freqs[term] = self.db.execute(
                f"SELECT count(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?", [phrase(term)]
            ).fetchone()[0]
        return self._doc_freqs[term]

    def _refresh_freqs(self) -> None:
        # data_version changes when another connection commits; _writes when this one does.
        version = (self.db.execute("PRAGMA data_version").fetchone()[0], self._writes)
        if version != self._freq_version:
            self._doc_freqs.clear()
            self._total_docs = self.db.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]
            self._freq_version = version

    def search(
        self,
        query: str,
        k: int = 5,
        *,
        kinds: Sequence[str] | None = None,
        before: TimeLike | None = None,
        max_candidates: int | None = DEFAULT_MAX_CANDIDATES,
    ) -> list[Hit]:
        """The top-k records by FTS5 BM25 for the words of `query` (any text is safe).

        `kinds` keeps only those record kinds; `before` keeps records created strictly earlier
        (the temporal split: nothing from the query's own time or later). Ranks by the query's
        content words; candidates are the records sharing its rarest words, up to
        `max_candidates` postings (see `history.query`); `max_candidates=None` scores every
        record that shares any scoring word.
        """
        terms = words(query)
        if not terms or k <= 0:
            return []
        where, params = self._filters(_kinds(kinds), normalize_time(before))

        def op() -> list[Any]:
            self._refresh_freqs()
            cap = None if max_candidates is None else max_candidates * SCORING_POSTINGS_FACTOR
            scoring = scoring_terms(terms, self._doc_freq, self._total_docs, cap)
            if not scoring:
                return []
            seeds = seed_terms(scoring, max_candidates)
            match = match_expression([term for _, term in scoring])
            if len(seeds) < len(scoring):
                if where == "1":
                    sql = f"SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?"
                else:
                    sql = f"SELECT f.rowid FROM {_FTS_JOIN} WHERE {FTS_TABLE} MATCH ? AND {where}"
                seeded = self.db.execute(sql, [match_expression(seeds), *params]).fetchall()
                if len(seeded) >= k:  # else too few: score everything below
                    # `+` keeps FTS5 from re-running the query once per candidate rowid.
                    sql = (
                        f"SELECT {_COLUMNS}, m.score FROM (SELECT rowid, bm25({FTS_TABLE}) AS "
                        f"score FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? AND +rowid IN "
                        "(SELECT value FROM json_each(?)) ORDER BY score LIMIT ?) m "
                        f"JOIN {TABLE} r ON r.rowid = m.rowid ORDER BY m.score"
                    )
                    candidates = json.dumps([row[0] for row in seeded])
                    return self.db.execute(sql, [match, candidates, k]).fetchall()
            if where == "1":  # FTS5 sorts by rank itself; only the top k are joined
                sql = (
                    f"SELECT {_COLUMNS}, m.rank FROM (SELECT rowid, rank FROM {FTS_TABLE} "
                    f"WHERE {FTS_TABLE} MATCH ? ORDER BY rank LIMIT ?) m "
                    f"JOIN {TABLE} r ON r.rowid = m.rowid ORDER BY m.rank"
                )
                return self.db.execute(sql, [match, k]).fetchall()
            sql = (
                f"SELECT {_COLUMNS}, f.rank FROM {_FTS_JOIN} "
                f"WHERE {FTS_TABLE} MATCH ? AND {where} ORDER BY f.rank LIMIT ?"
            )
            return self.db.execute(sql, [match, *params, k]).fetchall()

        return [Hit(_record(row), -float(row[7])) for row in self._run(op, write=False)]

    def stats(self) -> dict[str, Any]:
        """Counts per kind, time range, file sizes: what `specsteer history stats` prints."""

        def op() -> dict[str, Any]:
            kinds = dict(
                self.db.execute(
                    f"SELECT kind, count(*) FROM {TABLE} GROUP BY kind ORDER BY kind"
                ).fetchall()
            )
            oldest, newest = self.db.execute(
                f"SELECT min(created_at), max(created_at) FROM {TABLE}"
            ).fetchone()
            return {"kinds": kinds, "oldest": oldest, "newest": newest}

        found = self._run(op, write=False)

        def size(suffix: str) -> int:
            if self.path is None:
                return 0
            target = Path(f"{self.path}{suffix}")
            return target.stat().st_size if target.exists() else 0

        return {
            "path": self.location,
            "records": sum(found["kinds"].values()),
            "kinds": found["kinds"],
            "oldest": found["oldest"],
            "newest": found["newest"],
            "file_bytes": size(""),
            "wal_bytes": size("-wal"),
            "journal_mode": self._run(lambda: self.db.journal_mode, write=False),
            "schema_version": SCHEMA_VERSION,
            "lock_retries": self.lock_retries,
        }

    def integrity_check(self) -> list[str]:
        """Problems found by `PRAGMA integrity_check` and FTS5's own check; [] when sound."""

        def op() -> list[str]:
            problems = [
                row[0]
                for row in self.db.execute("PRAGMA integrity_check").fetchall()
                if row[0] != "ok"
            ]
            try:
                self.db.execute(
                    f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('integrity-check', 1)"
                )
            except sqlite3.DatabaseError as exc:
                problems.append(f"full-text index: {exc}")
            return problems

        return self._run(op, write=True)

    def close(self) -> None:
        """Close the connection (SQLite checkpoints and removes the WAL on the last close)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def list(
        self,
        kind: str | Sequence[str] | None = None,
        limit: int | None = 100,
        *,
        before: TimeLike | None = None,
        offset: int = 0,
    ) -> list[Record]:
        """Records newest first (undated last), optionally of some kinds / before a time."""
        where, params = self._filters(_kinds(kind), normalize_time(before))
        sql = (
            f"SELECT {_COLUMNS} FROM {TABLE} r WHERE {where} "
            "ORDER BY r.created_at DESC NULLS LAST, r.id LIMIT ? OFFSET ?"
        )
        args = [*params, -1 if limit is None else limit, offset]
        return [
            _record(row)
            for row in self._run(lambda: self.db.execute(sql, args).fetchall(), write=False)
        ]
