"""`specsteer history`: add, import, search, list, delete, forget and inspect a personal history.

A thin mapping of commands onto `specsteer.history` (store, ingest): no storage or retrieval
logic lives here. Results go to stdout (`--json` for machines), errors to stderr; any
`SpecSteerError` becomes one red line and exit code 1, never a traceback. An erase that another
connection's read keeps from completing says so and exits with `ERASE_PENDING_EXIT`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from specsteer.errors import HistoryError, SpecSteerError
from specsteer.history import HistoryStore, Hit, IngestReport, Record, ingest_path
from specsteer.history.query import DEFAULT_MAX_CANDIDATES

app = typer.Typer(
    help="Keep the private writing history the on-device Specialist retrieves from.",
    no_args_is_help=True,
)

DbOption = Annotated[
    Path,
    typer.Option(
        "--db",
        envvar="SPECSTEER_HISTORY_DB",
        help="History file (created if missing); or set SPECSTEER_HISTORY_DB.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
KindsOption = Annotated[
    list[str] | None, typer.Option("--kind", help="Only this kind (repeat for several).")
]
BeforeOption = Annotated[
    str | None, typer.Option(help="Only records created before this date (ISO-8601 or a year).")
]


# delete/forget removed the records, but old copies of their text are still in the file or its
# WAL because another connection is reading; the erase completes when it closes (next open).
ERASE_PENDING_EXIT = 3


def _erase_outcome(count: int, pending: bool, as_json: bool, payload: dict[str, Any]) -> None:
    """Print what an erase did; exit with ERASE_PENDING_EXIT when it is not complete."""
    if as_json:
        _emit({**payload, "erase_pending": pending})
    else:
        typer.echo(f"deleted {count} record(s)")
    if pending:
        Console(stderr=True, soft_wrap=True, highlight=False).print(
            "erase pending: another connection (an app or process) is reading the history, so "
            "old copies of the deleted text are still in the file or its write-ahead log; they "
            "are overwritten when that reader closes and the history is opened again (or run "
            "this command again then)", style="yellow", markup=False)
        raise typer.Exit(ERASE_PENDING_EXIT)


def _fail(message: str) -> int:
    """Print one red error line to stderr; returns the exit code to use."""
    Console(stderr=True, soft_wrap=True, highlight=False).print(
        f"error: {message}", style="red", markup=False
    )
    return 1


@contextmanager
def _open(db: Path) -> Iterator[HistoryStore]:
    """Open the store; an error the user can act on becomes a red message and exit code 1."""
    try:
        with HistoryStore(db) as store:
            yield store
    except SpecSteerError as exc:
        raise typer.Exit(_fail(str(exc))) from None


def _emit(payload: Any) -> None:
    typer.echo(json.dumps(payload, ensure_ascii=False, indent=2))


def _preview(record: Record, width: int = 70) -> str:
    text = " ".join((record.title or record.body).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _report_line(report: IngestReport) -> str:
    return f"{report.added} added, {report.updated} updated, {report.unchanged} unchanged"


def _report_json(report: IngestReport) -> dict[str, Any]:
    return {"added": report.added, "updated": report.updated, "unchanged": report.unchanged}


@app.command()
def add(
    db: DbOption,
    body: Annotated[
        str | None, typer.Option(help="The text; '-' or omitted reads it from stdin.")
    ] = None,
    kind: Annotated[str, typer.Option(help="Record kind: note, email, post, review...")] = "note",
    title: Annotated[str, typer.Option(help="Title or subject.")] = "",
    created_at: Annotated[
        str | None, typer.Option(help="When it was written (ISO-8601); default: unknown.")
    ] = None,
    meta: Annotated[str | None, typer.Option(help="Extra fields as a JSON object.")] = None,
    record_id: Annotated[
        str | None, typer.Option("--id", help="Stable id (default: derived from the content).")
    ] = None,
    source: Annotated[str, typer.Option(help="Where the record came from.")] = "cli",
    as_json: JsonOption = False,
) -> None:
    """Add one record (adding the same content again changes nothing)."""
    text = sys.stdin.read().rstrip("\n") if body in (None, "-") else body
    with _open(db) as store:
        try:
            extra = json.loads(meta) if meta else {}
        except ValueError as exc:
            raise HistoryError(f"--meta is not valid JSON: {exc}") from exc
        record = store.add(
            kind=kind,
            title=title,
            body=text,
            created_at=created_at,
            meta=extra,
            source=source,
            id=record_id,
        )
    if as_json:
        _emit(record.to_dict())
    else:
        typer.echo(record.id)


@app.command("import")
def import_command(
    db: DbOption,
    paths: Annotated[
        list[Path], typer.Argument(help="Files or folders: .json, .jsonl, .mbox, .eml, notes.")
    ],
    kind: Annotated[
        str | None, typer.Option(help="Kind for items that have none (JSON), or notes/mail kind.")
    ] = None,
    user: Annotated[
        int | None, typer.Option(help="For a shared data set: import this user's history.")
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="For a shared data set: its task (e.g. abstract, title).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Import files; importing them again adds no duplicates."""
    results: dict[str, dict[str, Any]] = {}
    with _open(db) as store:
        for path in paths:
            report = ingest_path(store, path, kind=kind, user=user, task=task)
            results[str(path)] = _report_json(report)
            if not as_json:
                typer.echo(f"{path}: {_report_line(report)}")
    if as_json:
        _emit(results)


@app.command()
def search(
    db: DbOption,
    query: Annotated[str, typer.Argument(help="Free text; FTS syntax characters are safe.")],
    k: Annotated[int, typer.Option("-k", "--k", help="How many records.")] = 5,
    kinds: KindsOption = None,
    before: BeforeOption = None,
    all_terms: Annotated[
        bool, typer.Option(help="Score every record sharing a query word (exhaustive, slower).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Top-k records by BM25 for a query."""
    with _open(db) as store:
        budget = None if all_terms else DEFAULT_MAX_CANDIDATES
        hits: list[Hit] = store.search(query, k, kinds=kinds, before=before, max_candidates=budget)
    if as_json:
        _emit([{"score": hit.score, **hit.record.to_dict()} for hit in hits])
        return
    for hit in hits:
        record = hit.record
        typer.echo(f"{hit.score:8.3f}  {record.id}  [{record.kind}]  {_preview(record)}")


@app.command("list")
def list_command(
    db: DbOption,
    kinds: KindsOption = None,
    before: BeforeOption = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).")] = 20,
    as_json: JsonOption = False,
) -> None:
    """List records, newest first."""
    with _open(db) as store:
        records = store.list(kinds, limit, before=before)
    if as_json:
        _emit([record.to_dict() for record in records])
        return
    for record in records:
        when = (record.created_at or "-")[:10]
        typer.echo(f"{record.id}  [{record.kind}]  {when}  {_preview(record)}")


@app.command()
def delete(
    db: DbOption,
    ids: Annotated[list[str], typer.Argument(help="Record ids (see `list` or `search`).")],
    as_json: JsonOption = False,
) -> None:
    """Delete records by id and scrub their text from the file."""
    with _open(db) as store:
        missing = [record_id for record_id in ids if record_id not in store]
        if missing:
            raise typer.Exit(_fail(f"no records with ids {missing}; nothing deleted"))
        pending = False
        for record_id in ids:
            store.delete(record_id)
            pending = store.erase_pending
    _erase_outcome(len(ids), pending, as_json, {"deleted": ids})


@app.command()
def forget(
    db: DbOption,
    kinds: KindsOption = None,
    before: BeforeOption = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Erase every record and vacuum the file.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Delete records by kind and/or date (or --all), scrubbing them from the file."""
    if everything == bool(kinds or before):
        raise typer.Exit(_fail("give --kind and/or --before, or --all (not both)"))
    scope = "ALL records" if everything else "the matching records"
    if not yes and not typer.confirm(f"Permanently delete {scope} from {db}?"):
        raise typer.Exit(1)
    with _open(db) as store:
        if everything:
            count = len(store)
            store.wipe()
        else:
            count = store.forget(kind=kinds or None, before=before)
        pending = store.erase_pending
    _erase_outcome(count, pending, as_json, {"deleted": count})


@app.command()
def stats(db: DbOption, as_json: JsonOption = False) -> None:
    """Record counts per kind, date range and file size."""
    with _open(db) as store:
        found = store.stats()
    if as_json:
        _emit(found)
        return
    typer.echo(f"{found['path']}: {found['records']} records, {found['file_bytes']} bytes")
    for kind, count in found["kinds"].items():
        typer.echo(f"  {kind}: {count}")
    if found["oldest"]:
        typer.echo(f"  from {found['oldest']} to {found['newest']}")
