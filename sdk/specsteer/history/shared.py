"""Loader for the three shared per-user data sets (ACL abstracts, 20 Newsgroups, LaMP-7).

Owns their formats: which field is the query, which is the gold text, how a profile item becomes a
`Record` (stable ids namespaced by data set, so re-imports are idempotent), and that the query
item never enters the history. Must not write to a store (that is `ingest.ingest_shared`) and must
never put the gold text into the query it returns.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsteer.errors import IngestError
from specsteer.history.records import Record, make_record, normalize_time

# LaMP-7 inputs start with this instruction; the tweet itself follows the colon.
LAMP7_INSTRUCTION = "Paraphrase the following tweet without any explanation before or after it:"
DATASET_TASKS: dict[str, tuple[str, ...]] = {
    "acl": ("abstract", "title"),
    "newsgroups": ("email",),
    "lamp7": ("tweet",),
}


@dataclass(frozen=True)
class SharedUser:
    """One user of a shared data set: what to write, the real answer, and the private history."""

    dataset: str  # "acl" | "newsgroups" | "lamp7"
    index: int
    user: str
    task: str  # a `prompts` task name
    query: dict[str, Any]  # the task inputs only (never the gold text)
    gold: str
    query_id: str
    query_created_at: str | None  # for temporal splits: search(before=...) of the query's time
    records: tuple[Record, ...]


def detect_dataset(items: Sequence[Any]) -> str | None:
    """Which shared data set a parsed JSON list is, or None when it is none of them."""
    if not items or not isinstance(items[0], Mapping):
        return None
    first = items[0]
    if "query_paper" in first and "profile" in first:
        return "acl"
    if isinstance(first.get("query"), Mapping) and "subject" in first["query"]:
        return "newsgroups"
    if {"input", "output", "profile"} <= set(first):
        return "lamp7"
    return None


@functools.lru_cache(maxsize=4)
def _read(path: str, mtime_ns: int) -> tuple[str, list[dict[str, Any]]]:
    try:
        with open(path, encoding="utf-8") as handle:
            items = json.load(handle)
    except (OSError, ValueError) as exc:
        raise IngestError(f"cannot read shared data set {path}: {exc}") from exc
    dataset = detect_dataset(items) if isinstance(items, list) else None
    if dataset is None:
        raise IngestError(
            f"{path} is not one of the shared data sets (ACL abstracts, newsgroups, LaMP-7)"
        )
    return dataset, items


def read_shared(path: str | os.PathLike[str]) -> tuple[str, list[dict[str, Any]]]:
    """(data set name, users) of a shared data set file; parsed once per file version."""
    target = Path(path)
    try:
        mtime = target.stat().st_mtime_ns
    except OSError as exc:
        raise IngestError(f"cannot read shared data set {target}: {exc}") from exc
    return _read(str(target), mtime)


def shared_user_count(path: str | os.PathLike[str]) -> int:
    """How many users the data set holds."""
    return len(read_shared(path)[1])


@dataclass(frozen=True)
class _Parsed:
    query: dict[str, Any]
    gold: str
    query_id: str
    query_created_at: str | None
    records: list[Record]


def _acl(user: Mapping[str, Any], task: str, source: str) -> _Parsed:
    paper = user["query_paper"]
    if task == "abstract":
        query, gold = {"title": paper["title"]}, paper["abstract"]
    else:
        query, gold = {"abstract": paper["abstract"]}, paper["title"]
    records = [
        make_record(
            kind="paper",
            id=f"acl:{item['id']}",
            title=item["title"],
            body=item["abstract"],
            created_at=str(item["year"]),
            meta={"dataset": "acl", "year": int(item["year"])},
            source=source,
        )
        for item in user["profile"]
    ]
    when = normalize_time(str(paper["year"]))
    return _Parsed(query, gold, f"acl:{paper['id']}", when, records)


def _newsgroups(user: Mapping[str, Any], task: str, source: str) -> _Parsed:
    post = user["query"]
    query = {"subject": post["subject"], "newsgroup": post["newsgroup"]}
    records = [
        make_record(
            kind="email",
            id=f"newsgroups:{item['id']}",
            title=item["subject"],
            body=item["body"],
            meta={"dataset": "newsgroups", "newsgroup": item["newsgroup"], "split": item["split"]},
            source=source,
        )
        for item in user["profile"]
    ]
    return _Parsed(query, post["body"], f"newsgroups:{post['id']}", None, records)


def _lamp7(user: Mapping[str, Any], task: str, source: str) -> _Parsed:
    prompt = user["input"]
    tweet = prompt[len(LAMP7_INSTRUCTION) :] if prompt.startswith(LAMP7_INSTRUCTION) else prompt
    # LaMP's "<qid><index>" item ids collide across users, so the user's id is part of ours.
    records = [
        make_record(
            kind="tweet",
            id=f"lamp7:{user['id']}:{item['id']}",
            body=item["text"],
            meta={"dataset": "lamp7"},
            source=source,
        )
        for item in user["profile"]
    ]
    return _Parsed({"tweet": tweet.strip()}, user["output"], f"lamp7:{user['id']}", None, records)


_LOADERS = {"acl": _acl, "newsgroups": _newsgroups, "lamp7": _lamp7}
_USER_NAME = {"acl": "user", "newsgroups": "user", "lamp7": "id"}


def load_shared_user(
    path: str | os.PathLike[str], index: int, *, task: str | None = None
) -> SharedUser:
    """User `index` of a shared data set: query item, gold text and history records.

    `task` defaults to the data set's first task (ACL: "abstract"; "title" also works).
    """
    dataset, users = read_shared(path)
    tasks = DATASET_TASKS[dataset]
    chosen = task or tasks[0]
    if chosen not in tasks:
        raise IngestError(f"the {dataset} data set supports tasks {list(tasks)}, not {chosen!r}")
    if not 0 <= index < len(users):
        raise IngestError(f"{path} has users 0..{len(users) - 1}; there is no user {index}")
    user = users[index]
    source = f"shared:{Path(path).name}"
    try:
        parsed = _LOADERS[dataset](user, chosen, source)
    except (KeyError, TypeError, ValueError) as exc:
        raise IngestError(f"{path}: user {index} is malformed: {exc!r}") from exc
    return SharedUser(
        dataset=dataset,
        index=index,
        user=str(user[_USER_NAME[dataset]]),
        task=chosen,
        query=parsed.query,
        gold=parsed.gold,
        query_id=parsed.query_id,
        query_created_at=parsed.query_created_at,
        records=tuple(record for record in parsed.records if record.id != parsed.query_id),
    )
