"""Importers: JSON/JSONL, notes folders, mbox/.eml mail, the shared data sets; all idempotent."""

from __future__ import annotations

import json
import mailbox
import os
import time
from email.message import EmailMessage
from pathlib import Path

import pytest

from specsteer.errors import IngestError
from specsteer.history import (
    HistoryStore,
    ingest_eml,
    ingest_json,
    ingest_mbox,
    ingest_notes,
    ingest_path,
    ingest_shared,
    load_shared_user,
    retrieve,
    shared_user_count,
)

DATASETS = {
    "acl": "acl_abstracts_top100_authors.json",
    "newsgroups": "newsgroups_top100_senders.json",
    "lamp7": "lamp7_dev_top100_users.json",
}


def test_json_list_with_aliases_and_extra_keys(store: HistoryStore, tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    items = [
        {"id": "r1", "kind": "review", "name": "Kettle", "text": "Boils fast.", "stars": 5},
        {"subject": "Lunch?", "content": "Noon at the usual place", "date": "2023-04-01"},
        {"title": "Dated by epoch", "body": "x", "timestamp": 1_700_000_000},
    ]
    path.write_text(json.dumps(items), encoding="utf-8")
    report = ingest_json(store, path, kind="email")
    assert (report.added, report.unchanged) == (3, 0)
    review = store.get("r1")
    assert (review.kind, review.title, review.body) == ("review", "Kettle", "Boils fast.")
    assert review.meta == {"stars": 5}
    assert review.source.startswith("file:")
    lunch = store.search("lunch")[0].record
    assert (lunch.kind, lunch.created_at) == ("email", "2023-04-01T00:00:00Z")
    assert store.search("epoch")[0].record.created_at == "2023-11-14T22:13:20Z"
    again = ingest_json(store, path, kind="email")
    assert (again.added, again.updated, again.unchanged) == (0, 0, 3)
    assert len(store) == 3


def test_jsonl_and_single_object(store: HistoryStore, tmp_path: Path) -> None:
    lines = tmp_path / "notes.jsonl"
    lines.write_text('{"kind": "note", "body": "one"}\n\n{"kind": "note", "body": "two"}\n')
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"kind": "post", "title": "Hello", "body": "world"}, indent=2))
    assert ingest_json(store, lines).added == 2
    assert ingest_json(store, single).added == 1
    assert sorted(r.body for r in store.list()) == ["one", "two", "world"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"kind": "note", "body": "ok"}\n{"kind": "note", "body": \n', ":2: not valid JSON"),
        ('[{"body": "no kind"}]', ":1: item has no 'kind'"),
        ("[1, 2]", ":1: expected a JSON object"),
        ('"just a string"', "expected a JSON list"),
    ],
)
def test_bad_json_names_file_and_line(
    store: HistoryStore, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(IngestError, match=message) as info:
        ingest_json(store, path)
    assert str(path) in str(info.value)
    assert len(store) == 0


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_notes_folder(store: HistoryStore, tmp_path: Path) -> None:
    root = tmp_path / "vault"
    _write(root / "ideas.md", "# Garden plans\n\nPlant tulips in October.\n")
    _write(root / "work" / "standup.txt", "Yesterday: fixed the flaky test.\n")
    _write(root / ".obsidian" / "config.md", "# hidden\n")
    _write(root / "image.png", "not a note")
    report = ingest_notes(store, root)
    assert report.added == 2
    garden = store.get("note:ideas.md")
    assert (garden.title, garden.body) == ("Garden plans", "Plant tulips in October.")
    assert garden.created_at is not None
    standup = store.get("note:work/standup.txt")
    assert (standup.title, standup.body) == ("standup", "Yesterday: fixed the flaky test.")
    assert ingest_notes(store, root).unchanged == 2
    # Editing a note updates its record (same id) instead of adding a second one.
    _write(root / "ideas.md", "# Garden plans\n\nPlant tulips and crocuses.\n")
    stamp = time.time() + 5
    os.utime(root / "ideas.md", (stamp, stamp))
    again = ingest_notes(store, root)
    assert (again.added, again.updated, again.unchanged) == (0, 1, 1)
    assert store.get("note:ideas.md").body == "Plant tulips and crocuses."
    with pytest.raises(IngestError, match="not a folder"):
        ingest_notes(store, root / "ideas.md")


def _mail(subject: str, body: str, *, message_id: str | None, html: bool = False) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "Ada <ada@example.org>"
    message["To"] = "bob@example.org"
    message["Subject"] = subject
    message["Date"] = "Tue, 02 Apr 2024 10:00:00 +0200"
    if message_id:
        message["Message-ID"] = message_id
    if html:
        message.set_content(f"<html><body><p>{body}</p></body></html>", subtype="html")
    else:
        message.set_content(body)
    return message


def test_mbox(store: HistoryStore, tmp_path: Path) -> None:
    path = tmp_path / "sent.mbox"
    box = mailbox.mbox(path)
    box.add(_mail("Quarterly numbers", "Revenue is up. Ünïcode stays intact.", message_id="<a@x>"))
    box.add(_mail("Party", "Bring snacks &amp; drinks", message_id=None, html=True))
    multipart = _mail("Photos", "See the attached photos.", message_id="<c@x>")
    multipart.add_attachment(b"\x89PNG...", maintype="image", subtype="png", filename="p.png")
    box.add(multipart)
    box.flush()
    box.close()
    report = ingest_mbox(store, path)
    assert report.added == 3
    quarterly = store.search("revenue")[0].record
    assert quarterly.title == "Quarterly numbers"
    assert "Ünïcode stays intact." in quarterly.body
    assert quarterly.created_at == "2024-04-02T08:00:00Z"
    assert quarterly.meta["from"] == "Ada <ada@example.org>"
    party = store.search("snacks")[0].record
    assert "<p>" not in party.body and "snacks & drinks" in party.body
    assert store.search("photos")[0].record.body == "See the attached photos."
    assert ingest_mbox(store, path).unchanged == 3
    with pytest.raises(IngestError, match="does not exist"):
        ingest_mbox(store, tmp_path / "missing.mbox")


def test_eml_files_and_folder_dispatch(store: HistoryStore, tmp_path: Path) -> None:
    folder = tmp_path / "mail"
    folder.mkdir()
    for number in range(3):
        message = _mail(f"Note {number}", f"body number {number}", message_id=f"<{number}@x>")
        (folder / f"{number}.eml").write_bytes(message.as_bytes())
    _write(folder / "readme.md", "# Mail export\n\nExported from my client.")
    report = ingest_path(store, folder)
    assert (report.added, report.total) == (4, 4)
    assert {r.kind for r in store.list()} == {"email", "note"}
    assert ingest_eml(store, [folder / "0.eml"]).unchanged == 1
    with pytest.raises(IngestError, match="cannot read mail"):
        ingest_eml(store, [folder / "missing.eml"])


def test_ingest_path_refuses_unknown_things(store: HistoryStore, tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="does not exist"):
        ingest_path(store, tmp_path / "nope.json")
    with pytest.raises(IngestError, match="don't know how"):
        ingest_path(store, _write(tmp_path / "table.csv", "a,b"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match="no notes"):
        ingest_path(store, tmp_path / "empty")


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_shared_user_excludes_query_and_gold(data_dir: Path, dataset: str) -> None:
    path = data_dir / DATASETS[dataset]
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert shared_user_count(path) == len(raw) == 100
    for index in (0, 57, 99):
        user = load_shared_user(path, index)
        assert user.dataset == dataset
        assert len(user.records) == len(raw[index]["profile"])
        assert user.query_id not in {record.id for record in user.records}
        assert user.gold and all(user.gold not in str(value) for value in user.query.values())
        assert len({record.id for record in user.records}) == len(user.records)


def test_acl_tasks_and_temporal_split(data_dir: Path) -> None:
    path = data_dir / DATASETS["acl"]
    abstract = load_shared_user(path, 0)
    title = load_shared_user(path, 0, task="title")
    assert (abstract.task, title.task) == ("abstract", "title")
    assert set(abstract.query) == {"title"} and abstract.gold == title.query["abstract"]
    assert set(title.query) == {"abstract"} and title.gold == abstract.query["title"]
    assert abstract.query_created_at is not None
    with pytest.raises(IngestError, match="supports tasks"):
        load_shared_user(path, 0, task="tweet")
    with pytest.raises(IngestError, match="no user 100"):
        load_shared_user(path, 100)


def test_lamp7_query_is_the_tweet_without_instruction(data_dir: Path) -> None:
    user = load_shared_user(data_dir / DATASETS["lamp7"], 0)
    assert not user.query["tweet"].startswith("Paraphrase")
    assert all(record.id.startswith(f"lamp7:{user.user}:") for record in user.records)


def test_ingest_shared_is_idempotent_and_retrievable(store: HistoryStore, data_dir: Path) -> None:
    path = data_dir / DATASETS["acl"]
    user = ingest_shared(store, path, 0)
    assert len(store) == len(user.records)
    again = ingest_path(store, path, user=0)
    assert (again.added, again.updated, again.unchanged) == (0, 0, len(user.records))
    hits = retrieve(store, user.task, user.query, 5, before=user.query_created_at)
    assert hits and all(hit.record.kind == "paper" for hit in hits)
    assert all(hit.record.created_at < user.query_created_at for hit in hits)


def test_shared_file_through_plain_json_import_is_refused(
    store: HistoryStore, data_dir: Path
) -> None:
    with pytest.raises(IngestError, match="--user"):
        ingest_path(store, data_dir / DATASETS["newsgroups"])


def test_shared_items_as_jsonl_are_refused_too(store: HistoryStore, tmp_path: Path) -> None:
    item = {"id": "u1", "input": "Paraphrase: hi", "output": "hello", "profile": []}
    path = tmp_path / "lamp.jsonl"
    path.write_text(json.dumps(item) + "\n")
    with pytest.raises(IngestError, match="shared per-user data set"):
        ingest_json(store, path, kind="tweet")
    assert store.stats()["records"] == 0
