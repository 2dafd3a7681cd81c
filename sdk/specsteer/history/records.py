"""The record and hit value types of the personal history, and how their fields are normalised.

Owns: `Record`, `Hit`, `make_record` (validation, stable content ids), `normalize_time` (the one
timestamp format the store compares with `before=`). Must not touch SQLite or files: the store and
the importers build on these types, never the other way round.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from specsteer.errors import InvalidRecord
from specsteer.tokenizer import check_text

# Kinds are short names an app chooses ("note", "email", "paper", ...); keep them filter-friendly.
_KIND = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_YEAR = re.compile(r"^\d{4}$")
_YEAR_MONTH = re.compile(r"^\d{4}-\d{2}$")
FIELDS = ("id", "kind", "title", "body", "created_at", "meta", "source")

TABLE = "records"  # the SQLite table of the history store
FTS_TABLE = "records_fts"  # its FTS5 index


@dataclass(frozen=True)
class Record:
    """One piece of the user's own writing; `created_at` is UTC ISO-8601 (`...Z`) or None."""

    id: str
    kind: str
    title: str
    body: str
    created_at: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, hash=False)
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the CLI's `--json` output and JSONL export use it)."""
        return {name: getattr(self, name) for name in FIELDS}

    @property
    def digest(self) -> str:
        """Content hash: lets re-imports skip records that did not change."""
        payload = json.dumps(
            [self.kind, self.title, self.body, self.created_at, self.meta, self.source],
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Hit:
    """A retrieved record and its BM25 score (higher is more relevant; FTS5 `rank` negated)."""

    record: Record
    score: float


def normalize_time(value: str | int | date | datetime | None) -> str | None:
    """Turn a year, date, datetime or ISO string into `YYYY-MM-DDTHH:MM:SSZ` (UTC).

    One fixed-width format makes `created_at < before` a correct string comparison in SQL.
    Naive datetimes are taken as UTC; a bare year or year-month means its first day.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidRecord(f"created_at must be a date, got {value!r}")
    if isinstance(value, int):
        value = str(value)
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        text = value.strip()
        if _YEAR.match(text):
            text += "-01-01"
        elif _YEAR_MONTH.match(text):
            text += "-01"
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError as exc:
            raise InvalidRecord(
                f"created_at {value!r} is not an ISO-8601 date (e.g. 2024-05-01T09:30:00Z)"
            ) from exc
    else:
        raise InvalidRecord(f"created_at must be a string or date, got {type(value).__name__}")
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def stable_id(kind: str, title: str, body: str, created_at: str | None) -> str:
    """Id derived from the content, so adding the same text twice stores it once."""
    payload = json.dumps([kind, title, body, created_at], ensure_ascii=False)
    return f"{kind}:{hashlib.sha256(payload.encode('utf-8')).hexdigest()[:20]}"


def make_record(
    *,
    kind: str,
    body: str = "",
    title: str = "",
    created_at: str | int | date | datetime | None = None,
    meta: Mapping[str, Any] | None = None,
    source: str = "",
    id: str | None = None,
) -> Record:
    """Validate and normalise fields into a `Record`; an absent id becomes a content id."""
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise InvalidRecord(
            f"kind {kind!r} must be 1-64 lowercase letters, digits, '_', '-' or '.' "
            "(e.g. 'note', 'email')"
        )
    for name, value in (("title", title), ("body", body), ("source", source)):
        try:
            check_text(value, name)
        except ValueError as exc:
            raise InvalidRecord(str(exc)) from None
    if not title.strip() and not body.strip():
        raise InvalidRecord("a record needs a title or a body")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        raise InvalidRecord(f"meta must be a JSON object, got {type(meta).__name__}")
    try:
        meta_dict = json.loads(json.dumps(dict(meta), ensure_ascii=False))
        check_text(json.dumps(meta_dict, ensure_ascii=False), "meta")
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"meta must be JSON-serialisable text: {exc}") from exc
    when = normalize_time(created_at)
    if id is None:
        id = stable_id(kind, title, body, when)
    elif not isinstance(id, str) or not id.strip():
        raise InvalidRecord(f"id must be a non-empty string, got {id!r}")
    else:
        try:
            check_text(id, "id")
        except ValueError as exc:
            raise InvalidRecord(str(exc)) from None
    return Record(
        id=id, kind=kind, title=title, body=body, created_at=when, meta=meta_dict, source=source
    )


def coerce_record(item: Record | Mapping[str, Any]) -> Record:
    """Accept a `Record` or a dict of its fields (unknown keys are an error, not silently lost)."""
    if isinstance(item, Record):
        return make_record(
            kind=item.kind,
            body=item.body,
            title=item.title,
            created_at=item.created_at,
            meta=item.meta,
            source=item.source,
            id=item.id,
        )
    if not isinstance(item, Mapping):
        raise InvalidRecord(f"expected a Record or a dict, got {type(item).__name__}")
    unknown = set(item) - set(FIELDS)
    if unknown:
        raise InvalidRecord(f"unknown record fields {sorted(unknown)}; allowed: {list(FIELDS)}")
    if "kind" not in item:
        raise InvalidRecord("a record needs a kind (e.g. 'note', 'email')")
    return make_record(**{name: item[name] for name in FIELDS if name in item})


@dataclass(frozen=True)
class IngestReport:
    """What a write of many records did; `ids` lists every record written or already present."""

    added: int
    updated: int
    unchanged: int
    ids: tuple[str, ...]

    @property
    def total(self) -> int:
        """Records seen (added + updated + unchanged)."""
        return self.added + self.updated + self.unchanged

    def __add__(self, other: IngestReport) -> IngestReport:
        return IngestReport(
            self.added + other.added,
            self.updated + other.updated,
            self.unchanged + other.unchanged,
            self.ids + other.ids,
        )


EMPTY_REPORT = IngestReport(0, 0, 0, ())
