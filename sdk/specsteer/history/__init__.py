"""The personal history: the private context c that only the on-device Specialist reads.

One SQLite file per user/app (`HistoryStore`), FTS5 BM25 retrieval, importers for notes, mail,
JSON and the shared data sets, and the task prompts built from retrieved records. Nothing in this
package sends data anywhere; `Prompt.request` is the only part meant to leave the device.
"""

from __future__ import annotations

from specsteer.history.ingest import (
    ingest_eml,
    ingest_json,
    ingest_mbox,
    ingest_notes,
    ingest_path,
    ingest_shared,
)
from specsteer.history.prompts import (
    Prompt,
    Task,
    build_prompt,
    continuation_prefix,
    get_task,
    query_text,
    request_text,
    retrieve,
    task_names,
    whitespace_tokens,
)
from specsteer.history.records import Hit, IngestReport, Record, make_record
from specsteer.history.shared import SharedUser, load_shared_user, shared_user_count
from specsteer.history.store import HistoryStore

__all__ = [
    "HistoryStore",
    "Hit",
    "IngestReport",
    "Prompt",
    "Record",
    "SharedUser",
    "Task",
    "build_prompt",
    "continuation_prefix",
    "get_task",
    "ingest_eml",
    "ingest_json",
    "ingest_mbox",
    "ingest_notes",
    "ingest_path",
    "ingest_shared",
    "load_shared_user",
    "make_record",
    "query_text",
    "request_text",
    "retrieve",
    "shared_user_count",
    "task_names",
    "whitespace_tokens",
]
