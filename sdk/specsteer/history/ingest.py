"""Importers: JSON/JSONL files, folders of notes, mbox and .eml mail, and the shared data sets.

Owns turning files into `Record`s with stable ids (a note's path, a mail's Message-ID, a data set
item's id), so importing the same source twice stores nothing new. Must not reach the network or
keep copies of what it reads: the store is the only place history text is written.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import hashlib
import html
import json
import mailbox
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any, cast

from specsteer.errors import IngestError, InvalidRecord
from specsteer.history.records import EMPTY_REPORT, IngestReport, Record, make_record
from specsteer.history.shared import SharedUser, detect_dataset, load_shared_user
from specsteer.history.store import HistoryStore

NOTE_SUFFIXES = (".md", ".markdown", ".txt")
MAIL_SUFFIXES = (".eml",)
MBOX_SUFFIXES = (".mbox", ".mbx")
# Aliases accepted in JSON items, first match wins (apps and exports name these differently).
_TITLE_KEYS = ("title", "subject", "name", "headline")
_BODY_KEYS = ("body", "text", "content", "abstract", "message")
_TIME_KEYS = ("created_at", "date", "time", "timestamp", "year")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_TAG = re.compile(r"<[^>]+>")


def _file_source(path: Path) -> str:
    return f"file:{path.resolve()}"


def record_from_mapping(
    item: Mapping[str, Any], *, kind: str | None = None, source: str = ""
) -> Record:
    """A record from a loosely shaped dict: title/subject, body/text, date aliases; the rest
    of the keys go into `meta` so nothing the user exported is lost."""
    used: set[str] = set()

    def pick(keys: tuple[str, ...]) -> Any:
        for key in keys:
            if key in item and item[key] not in (None, ""):
                used.add(key)
                return item[key]
        return None

    chosen_kind = item.get("kind", kind)
    used.update({"kind", "id", "meta", "source"})
    title, body, when = pick(_TITLE_KEYS), pick(_BODY_KEYS), pick(_TIME_KEYS)
    meta = dict(item.get("meta") or {})
    meta.update({key: value for key, value in item.items() if key not in used})
    if chosen_kind is None:
        raise InvalidRecord("item has no 'kind'; pass kind= (e.g. 'note') for the whole file")
    if isinstance(when, (int, float)) and not isinstance(when, bool) and when > 9999:
        when = datetime.fromtimestamp(when, tz=UTC)  # a Unix timestamp
    record_id = item.get("id")
    return make_record(
        kind=chosen_kind,
        title="" if title is None else str(title),
        body="" if body is None else str(body),
        created_at=when,
        meta=meta,
        source=str(item.get("source") or source),
        id=None if record_id is None else str(record_id),
    )


def json_items(path: Path) -> Iterator[tuple[int, Any]]:
    """(line or position, item) of a JSON list, a single JSON object, or a JSONL file.

    IngestError when the file cannot be read, a JSONL line is not JSON, or the document is
    neither a list nor an object. Shared with the lab's LaMP-format loader.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise IngestError(f"cannot read {path}: {exc}") from exc
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None  # not one JSON document: read it as JSONL below
        if isinstance(data, list):
            yield from enumerate(data, start=1)
            return
        if isinstance(data, Mapping):
            yield 1, data
            return
        if data is not None:
            raise IngestError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except ValueError as exc:
                raise IngestError(f"{path}:{number}: not valid JSON: {exc}") from exc


def ingest_json(
    store: HistoryStore, path: str | os.PathLike[str], *, kind: str | None = None
) -> IngestReport:
    """Import a JSON list or JSONL file of records (`kind` is the default for items without).

    A shared per-user data set is refused: its users are not records (see `ingest_shared`).
    """
    target = Path(path)
    records = []
    for position, (number, item) in enumerate(json_items(target)):
        if position == 0 and detect_dataset([item]) is not None:
            raise IngestError(
                f"{target} is a shared per-user data set; import one user with "
                "ingest_shared(store, path, index) or `specsteer history import PATH --user N`"
            )
        if not isinstance(item, Mapping):
            raise IngestError(f"{target}:{number}: expected a JSON object, got {item!r:.60}")
        try:
            records.append(record_from_mapping(item, kind=kind, source=_file_source(target)))
        except InvalidRecord as exc:
            raise IngestError(f"{target}:{number}: {exc}") from exc
    return store.add_many(records)


def note_record(path: Path, root: Path, *, kind: str = "note") -> Record:
    """A Markdown/text note: title from its first heading (else the file name), id from its path
    inside the folder, so editing a note updates its record instead of adding another."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise IngestError(f"cannot read note {path}: {exc}") from exc
    lines = text.splitlines()
    title, body = path.stem, text.strip()
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        heading = _HEADING.match(line)
        if heading:
            title = heading.group(1)
            body = "\n".join(lines[number + 1 :]).strip()
        break
    relative = path.relative_to(root).as_posix()
    modified = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    return make_record(
        kind=kind,
        id=f"{kind}:{relative}",
        title=title,
        body=body,
        created_at=modified,
        meta={"path": relative},
        source=f"notes:{root.resolve()}",
    )


def _files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.suffix.lower() in suffixes
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )


def ingest_notes(
    store: HistoryStore, folder: str | os.PathLike[str], *, kind: str = "note"
) -> IngestReport:
    """Import every .md/.markdown/.txt file under `folder` (hidden files and folders skipped)."""
    root = Path(folder)
    if not root.is_dir():
        raise IngestError(f"{root} is not a folder of notes")
    notes = [note_record(path, root, kind=kind) for path in _files(root, NOTE_SUFFIXES)]
    return store.add_many(notes)


def _text_of(message: EmailMessage) -> str:
    """The plain-text body (HTML stripped when that is all there is)."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    try:
        content = part.get_content()
    except (LookupError, UnicodeError, AssertionError):  # unknown or lying charset
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else ""
    if not isinstance(content, str):
        return ""
    if part.get_content_subtype() == "html":
        content = html.unescape(_TAG.sub(" ", content))
    return content.strip()


def email_record(message: EmailMessage, *, kind: str = "email", source: str = "") -> Record:
    """A mail as a record: id from Message-ID (else a hash of the raw mail), Date as created_at."""
    message_id = str(message.get("Message-ID") or "").strip()
    key = message_id or hashlib.sha256(message.as_bytes()).hexdigest()
    when = None
    if message.get("Date"):
        try:
            when = email.utils.parsedate_to_datetime(str(message["Date"]))
        except (TypeError, ValueError):
            when = None
    meta = {
        name.lower(): str(message[name])
        for name in ("From", "To", "Cc", "Message-ID", "In-Reply-To")
        if message.get(name)
    }
    subject = str(message.get("Subject") or "")
    body = _text_of(message)
    return make_record(
        kind=kind,
        id=f"{kind}:{hashlib.sha256(key.encode('utf-8')).hexdigest()[:24]}",
        title=subject,
        body=body if body or subject else "(empty message)",
        created_at=when,
        meta=meta,
        source=source,
    )


def _parse_mail(raw: bytes) -> EmailMessage:
    # policy.default makes EmailMessage objects (get_body, decoded headers).
    return cast(EmailMessage, email.message_from_bytes(raw, policy=email.policy.default))


def ingest_mbox(
    store: HistoryStore, path: str | os.PathLike[str], *, kind: str = "email"
) -> IngestReport:
    """Import every message of an mbox file."""
    target = Path(path)
    if not target.is_file():
        raise IngestError(f"mbox file {target} does not exist")
    box = mailbox.mbox(target, create=False)
    try:
        records = [
            email_record(_parse_mail(box.get_bytes(key)), kind=kind, source=_file_source(target))
            for key in box.iterkeys()
        ]
    except (OSError, mailbox.Error) as exc:
        raise IngestError(f"cannot read mbox {target}: {exc}") from exc
    finally:
        box.close()
    return store.add_many(records)


def ingest_eml(
    store: HistoryStore, paths: Iterable[str | os.PathLike[str]], *, kind: str = "email"
) -> IngestReport:
    """Import .eml files (one message each)."""
    records = []
    for path in map(Path, paths):
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise IngestError(f"cannot read mail {path}: {exc}") from exc
        records.append(email_record(_parse_mail(raw), kind=kind, source=_file_source(path)))
    return store.add_many(records)


def ingest_shared(
    store: HistoryStore, path: str | os.PathLike[str], index: int, *, task: str | None = None
) -> SharedUser:
    """Import user `index` of a shared data set (query item excluded) and return that user."""
    user = load_shared_user(path, index, task=task)
    store.add_many(user.records)
    return user


def ingest_path(
    store: HistoryStore,
    path: str | os.PathLike[str],
    *,
    kind: str | None = None,
    user: int | None = None,
    task: str | None = None,
) -> IngestReport:
    """Import whatever `path` is: a folder (notes and .eml files), .mbox, .eml, JSON/JSONL,
    or a shared data set (then `user` picks whose history)."""
    target = Path(path)
    if not target.exists():
        raise IngestError(f"{target} does not exist")
    if user is not None:
        shared = load_shared_user(target, user, task=task)
        return store.add_many(shared.records)
    if target.is_dir():
        report = EMPTY_REPORT
        if _files(target, NOTE_SUFFIXES):
            report = report + ingest_notes(store, target, kind=kind or "note")
        mails = _files(target, MAIL_SUFFIXES)
        if mails:
            report = report + ingest_eml(store, mails, kind=kind or "email")
        if report.total == 0:
            raise IngestError(f"{target} holds no notes ({', '.join(NOTE_SUFFIXES)}) or .eml mail")
        return report
    suffix = target.suffix.lower()
    if suffix in MBOX_SUFFIXES:
        return ingest_mbox(store, target, kind=kind or "email")
    if suffix in MAIL_SUFFIXES:
        return ingest_eml(store, [target], kind=kind or "email")
    if suffix in NOTE_SUFFIXES:
        return store.add_many([note_record(target, target.parent, kind=kind or "note")])
    if suffix in (".json", ".jsonl", ".ndjson"):
        return ingest_json(store, target, kind=kind)
    raise IngestError(
        f"don't know how to import {target}: expected a folder, .json, .jsonl, .mbox, .eml, "
        ".md or .txt"
    )
