"""Evaluation examples: one user's query item, the gold text they wrote, and their history.

Owns turning the three shared data sets (via `history.shared`) and any LaMP/LongLaMP-format file
(`{id | user id, input, output, profile: [...]}`, JSON list or JSONL) into `Example`s whose
profile is already a list of history `Record`s. Must never put the gold text into the query or
the profile: the harness hands `query` to the prompt builder and `records` to the store.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsteer.errors import IngestError, InvalidRecord, SpecSteerError
from specsteer.history.ingest import json_items
from specsteer.history.records import Record, make_record
from specsteer.history.shared import DATASET_TASKS, detect_dataset, load_shared_user, read_shared

# Which shared file serves each task when no --data is given.
SHARED_FILES: dict[str, str] = {
    "email": "newsgroups_top100_senders.json",
    "abstract": "acl_abstracts_top100_authors.json",
    "title": "acl_abstracts_top100_authors.json",
    "tweet": "lamp7_dev_top100_users.json",
}
# Keys LaMP/LongLaMP files use for the user (first match wins).
_USER_KEYS = ("user_id", "user", "reviewerId", "author", "name", "id")


class EvalError(SpecSteerError, ValueError):
    """An evaluation input (data file, task, models, results folder) the harness cannot use;
    the message says which and what to do."""


@dataclass(frozen=True)
class Example:
    """One evaluation item: what to write for `user`, their real text, and their history."""

    user: str
    task: str  # a `history.prompts` task name
    query: dict[str, str]  # task inputs only, never the gold text
    gold: str
    records: tuple[Record, ...]  # the private profile, query item excluded
    before: str | None = None  # temporal split: retrieve only records created before this


def shared_data_dir() -> Path:
    """Where the shared data sets live: $SPECSTEER_DATA_DIR, else `../shared/data` of the repo."""
    env = os.environ.get("SPECSTEER_DATA_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path.cwd().parent / "shared" / "data",
                   Path(__file__).resolve().parents[3].parent / "shared" / "data"]
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise EvalError(
        "cannot find the shared data sets; set SPECSTEER_DATA_DIR or pass --data PATH "
        f"(looked in {', '.join(map(str, candidates))})"
    )


def shared_file(task: str) -> Path:
    """The shared data set that serves `task` (EvalError when none does or it is not there)."""
    if task not in SHARED_FILES:
        raise EvalError(f"no shared data set serves task {task!r} (shared: "
                        f"{sorted(SHARED_FILES)}); pass --data PATH in LaMP format")
    return shared_data_dir() / SHARED_FILES[task]


# ----------------------------------------------------------------------- LaMP / LongLaMP inputs

def _after(prefix: str) -> Callable[[str], dict[str, str] | None]:
    pattern = re.compile(re.escape(prefix) + r"\s*(.+)", re.S | re.I)

    def parse(text: str) -> dict[str, str] | None:
        match = pattern.search(text)
        return {"value": match.group(1).strip()} if match else None

    return parse


def _review_fields(text: str) -> dict[str, str] | None:
    description = re.search(r'product with description\s*"(.*?)"\s*\.(?:\s|$)', text, re.S)
    if description is None:
        return None
    fields = {"description": description.group(1)}
    rating = re.search(r'overall rating of\s*"(.*?)"', text, re.S)
    summary = re.search(r'summary of the review text is\s*"(.*)"', text, re.S)
    if rating:
        fields["rating"] = rating.group(1)
    if summary:
        fields["summary"] = summary.group(1)
    return fields


def _quoted_after(word: str, field: str) -> Callable[[str], dict[str, str] | None]:
    # LongLaMP-2 appends "using the following items: 1. ..." after the quoted title; dropped.
    pattern = re.compile(word + r'\s*"(.+?)"(?:\s*(?:using the following items|$))', re.S | re.I)

    def parse(text: str) -> dict[str, str] | None:
        match = pattern.search(text)
        return {field: match.group(1).strip()} if match else None

    return parse


def _renamed(parse: Callable[[str], dict[str, str] | None],
             field: str) -> Callable[[str], dict[str, str] | None]:
    def rename(text: str) -> dict[str, str] | None:
        found = parse(text)
        return {field: found["value"]} if found else None

    return rename


@dataclass(frozen=True)
class _LampTask:
    """How a LaMP-format item's `input` becomes query fields and its profile items records."""

    first_field: str  # what the whole input fills when no pattern matches
    parse: Callable[[str], dict[str, str] | None]
    kind: str
    title_keys: tuple[str, ...]
    body_keys: tuple[str, ...]
    meta_keys: tuple[str, ...] = ()


_LAMP_TASKS: dict[str, _LampTask] = {
    "review": _LampTask("description", _review_fields, "review",
                        ("description",), ("reviewText",), ("overall", "summary")),
    "topic": _LampTask("summary", _quoted_after("post", "summary"), "post",
                       ("summary",), ("content",)),
    "abstract": _LampTask("title", _quoted_after("title", "title"), "paper",
                          ("title",), ("abstract",), ("year",)),
    "title": _LampTask("abstract", _renamed(_after("abstract of a paper:"), "abstract"), "paper",
                       ("title",), ("abstract",), ("year",)),
    "tweet": _LampTask("tweet", lambda text: None, "tweet", (), ("text",)),
    "email": _LampTask("subject", lambda text: None, "email", ("subject", "title"),
                       ("body", "text")),
}


def lamp_tasks() -> list[str]:
    """Tasks a LaMP/LongLaMP-format `--data` file can be evaluated on."""
    return list(_LAMP_TASKS)


def _first(item: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = item.get(key)
        if value not in (None, ""):
            return str(value)
    return ""


def _lamp_example(item: Mapping[str, Any], task: str, position: int) -> Example:
    spec = _LAMP_TASKS[task]
    missing = [key for key in ("input", "output", "profile") if key not in item]
    if missing:
        raise EvalError(f"item {position} lacks {missing}; LaMP items need input, output, "
                            "profile")
    text = str(item["input"])
    query = spec.parse(text) or {spec.first_field: text.strip()}
    user = _first(item, _USER_KEYS) or str(position)
    records: list[Record] = []
    for index, entry in enumerate(item["profile"]):
        if not isinstance(entry, Mapping):
            raise EvalError(f"item {position}: profile entry {index} is not an object")
        title, body = _first(entry, spec.title_keys), _first(entry, spec.body_keys)
        if not body.strip():
            continue  # LaMP profiles hold a few items with no text: nothing of the user's style
        meta = {key: entry[key] for key in spec.meta_keys if entry.get(key) not in (None, "")}
        try:
            records.append(make_record(
                kind=spec.kind, id=f"{task}:{user}:{entry.get('id', index)}", title=title,
                body=body, meta=meta, source="eval",
            ))
        except InvalidRecord as exc:
            raise EvalError(f"item {position}: profile entry {index}: {exc}") from exc
    return Example(user=user, task=task, query=query, gold=str(item["output"]),
                   records=tuple(records))


def load_lamp(path: str | os.PathLike[str], task: str, users: int | None = None) -> list[Example]:
    """The first `users` items of a LaMP/LongLaMP-format JSON list or JSONL file."""
    if task not in _LAMP_TASKS:
        raise EvalError(f"task {task!r} is not supported for LaMP-format files; "
                            f"choose one of {lamp_tasks()}")
    examples: list[Example] = []
    try:
        for position, (_, item) in enumerate(json_items(Path(path))):
            if users is not None and len(examples) >= users:
                break
            if not isinstance(item, Mapping):
                raise EvalError(f"{path}: item {position} is not a JSON object")
            examples.append(_lamp_example(item, task, position))
    except IngestError as exc:  # the file itself: unreadable, or not JSON / JSONL
        raise EvalError(str(exc)) from exc
    return examples


def _load_shared(path: Path, task: str, users: int | None) -> list[Example]:
    _, items = read_shared(path)
    count = len(items) if users is None else min(users, len(items))
    examples = []
    for index in range(count):
        try:
            user = load_shared_user(path, index, task=task)
        except IngestError as exc:
            raise EvalError(str(exc)) from exc
        examples.append(Example(
            user=user.user, task=task, query={k: str(v) for k, v in user.query.items()},
            gold=user.gold, records=user.records, before=user.query_created_at,
        ))
    return examples


def load_examples(task: str, data: str | os.PathLike[str] | None = None,
                  users: int | None = None) -> list[Example]:
    """Examples for `task`: from the shared data set serving it, or from the file `data`.

    A `data` file in one of the shared formats (ACL, newsgroups) goes through their loader;
    anything else (LaMP-7's own format included) is read as LaMP/LongLaMP items.
    """
    if users is not None and users < 1:
        raise EvalError("users must be >= 1")
    if data is None:
        return _load_shared(shared_file(task), task, users)
    path = Path(data)
    if not path.is_file():
        raise EvalError(f"{path} does not exist")
    if path.suffix.lower() == ".json":
        try:
            parsed = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            parsed = None
        dataset = detect_dataset(parsed) if isinstance(parsed, list) else None
        if dataset in ("acl", "newsgroups"):
            if task not in DATASET_TASKS[dataset]:
                raise EvalError(f"{path} is the {dataset} data set: tasks "
                                    f"{list(DATASET_TASKS[dataset])}, not {task!r}")
            return _load_shared(path, task, users)
    return load_lamp(path, task, users)
