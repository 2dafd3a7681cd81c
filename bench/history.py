"""Benchmark of the personal history store: ingest speed, BM25 retrieval latency, file size.

Imports every user of the three shared data sets into one store (one `add_many` per user, as an
app importing a history would), pads it with re-imported real records under synthetic ids and
kinds up to `--target` records when the data sets hold fewer, then times top-5 searches for every
query item of the data sets. Owns no library logic; prints one table of numbers measured in this
run.

    python bench/history.py            # from the repository root, with PYTHONPATH=sdk or installed
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from specsteer.history import HistoryStore, get_task, ingest_shared, query_text, shared_user_count
from specsteer.history.query import DEFAULT_MAX_CANDIDATES
from specsteer.history.records import Record, make_record

DATASETS = (
    "acl_abstracts_top100_authors.json",
    "newsgroups_top100_senders.json",
    "lamp7_dev_top100_users.json",
)
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclass(frozen=True)
class Latency:
    """Search latency percentiles over one pass of queries, in milliseconds.

    Wall-clock is what a caller waits; CPU time (this thread's) is the work done, which stays
    meaningful when other processes compete for the cores.
    """

    name: str
    queries: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    cpu_p50_ms: float
    cpu_p95_ms: float


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation: a value that was really measured)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def time_searches(name: str, queries: Sequence[Callable[[], object]]) -> Latency:
    """Run each search once and summarise the wall-clock and CPU latencies."""
    wall, cpu = [], []
    for search in queries:
        start, start_cpu = time.perf_counter(), time.thread_time()
        search()
        cpu.append((time.thread_time() - start_cpu) * 1000)
        wall.append((time.perf_counter() - start) * 1000)
    return Latency(
        name,
        len(wall),
        percentile(wall, 0.5),
        percentile(wall, 0.95),
        max(wall),
        percentile(cpu, 0.5),
        percentile(cpu, 0.95),
    )


def padding(store: HistoryStore, missing: int) -> list[Record]:
    """Real records again, under synthetic ids (`padN:`) and kinds (`<kind>-pad`)."""
    real = store.list(limit=None)
    return [
        make_record(
            kind=f"{record.kind}-pad",
            id=f"pad{number}:{record.id}",
            title=record.title,
            body=record.body,
            created_at=record.created_at,
            meta={**record.meta, "padding": True},
            source="bench-padding",
        )
        for number, record in ((n // len(real), real[n % len(real)]) for n in range(missing))
    ]


def main(
    data: Annotated[Path, typer.Option(help="Folder with the three shared data sets.")] = (
        DEFAULT_DATA
    ),
    target: Annotated[int, typer.Option(help="Pad the store to this many records.")] = 10_000,
    k: Annotated[int, typer.Option(help="Records per search.")] = 5,
    db: Annotated[
        Path | None, typer.Option(help="Store file (default: a temporary folder).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the numbers to this JSON file.")
    ] = None,
) -> None:
    """Measure ingest, retrieval and size of a history store built from the shared data."""
    console = Console()
    with tempfile.TemporaryDirectory() as scratch:
        path = db or Path(scratch) / "bench-history.db"
        if path.exists():
            raise typer.BadParameter(f"{path} exists; give a new file")
        results = run(data, path, target, k)
        size_bytes = path.stat().st_size  # after close: WAL checkpointed and removed
    results["file_bytes"] = size_bytes
    results["environment"] = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    show(console, results)
    if json_out:
        json_out.write_text(json.dumps(results, indent=2), encoding="utf-8")


def run(data: Path, path: Path, target: int, k: int) -> dict[str, Any]:
    """Build the store and time it; returns the numbers `show` prints."""
    users = []
    with HistoryStore(path) as store:
        start = time.perf_counter()
        seen = 0
        for name in DATASETS:
            for index in range(shared_user_count(data / name)):
                user = ingest_shared(store, data / name, index)
                users.append(user)
                seen += len(user.records)
        ingest_s = time.perf_counter() - start
        unique = len(store)
        start = time.perf_counter()
        again = sum(
            len(ingest_shared(store, data / name, index).records)
            for name in DATASETS
            for index in range(shared_user_count(data / name))
        )
        reimport_s = time.perf_counter() - start
        padded = max(0, target - unique)
        start = time.perf_counter()
        if padded:
            store.add_many(padding(store, padded))
        pad_s = time.perf_counter() - start
        total = len(store)

        short = [(query_text(u.task, u.query), get_task(u.task).kinds) for u in users]
        long = [(query_text("title", {"abstract": a}), ("paper",)) for a in _abstracts(users)]
        passes = [
            ("task queries, whole store (first pass)", short, False, DEFAULT_MAX_CANDIDATES),
            ("task queries, whole store (again)", short, False, DEFAULT_MAX_CANDIDATES),
            ("task queries, task kinds only", short, True, DEFAULT_MAX_CANDIDATES),
            ("abstracts as queries (LaMP-5 style)", long, False, DEFAULT_MAX_CANDIDATES),
            ("task queries, exhaustive (max_candidates=None)", short, False, None),
            ("abstracts, exhaustive (max_candidates=None)", long, False, None),
        ]
        latencies = []
        for label, queries, use_kinds, budget in passes:
            searches = [
                functools.partial(
                    store.search, q, k, kinds=kinds if use_kinds else None, max_candidates=budget
                )
                for q, kinds in queries
            ]
            latencies.append(time_searches(label, searches))
        datasets = [u.dataset for u in users] + ["acl (abstract queries)"] * len(long)
        overlap: dict[str, list[float]] = {}
        for dataset, (q, _) in zip(datasets, short + long, strict=True):
            exhaustive = {h.record.id for h in store.search(q, k, max_candidates=None)}
            bounded = {h.record.id for h in store.search(q, k)}
            overlap.setdefault(dataset, []).append(
                len(bounded & exhaustive) / len(exhaustive) if exhaustive else 1.0
            )
        integrity = store.integrity_check()
    return {
        "k": k,
        "records_ingested": seen,
        "records_unique": unique,
        "ingest_s": ingest_s,
        "ingest_records_per_s": seen / ingest_s,
        "reimport_records_per_s": again / reimport_s,
        "padding_records": padded,
        "padding_records_per_s": padded / pad_s if padded else None,
        "records_total": total,
        "latency": [latency.__dict__ for latency in latencies],
        "top_k_overlap_with_exhaustive": {
            name: statistics.mean(values) for name, values in overlap.items()
        },
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "integrity_problems": integrity,
    }


def _abstracts(users: Sequence[Any]) -> list[str]:
    """The ACL query abstracts: the long queries of the LaMP-5 title task."""
    return [u.gold for u in users if u.dataset == "acl" and u.task == "abstract"]


def show(console: Console, results: dict[str, Any]) -> None:
    """Print the numbers as two rich tables."""
    store = Table(title="History store: ingest and size")
    store.add_column("measure")
    store.add_column("value", justify="right")
    store.add_row("records in the three data sets", f"{results['records_ingested']:,}")
    store.add_row("unique records (ids shared by users merge)", f"{results['records_unique']:,}")
    store.add_row(
        "ingest, records/s (one add_many per user)", f"{results['ingest_records_per_s']:,.0f}"
    )
    store.add_row(
        "re-import, records/s (all unchanged)", f"{results['reimport_records_per_s']:,.0f}"
    )
    if results["padding_records"]:
        store.add_row(
            "padding: real records re-imported, synthetic ids/kinds",
            f"{results['padding_records']:,}",
        )
        store.add_row(
            "padding ingest, records/s (one add_many)", f"{results['padding_records_per_s']:,.0f}"
        )
    store.add_row("records in the store", f"{results['records_total']:,}")
    store.add_row("file size (after close)", f"{results['file_bytes'] / 2**20:.1f} MiB")
    store.add_row("integrity problems", str(len(results["integrity_problems"])))
    console.print(store)
    search = Table(title=f"Retrieval latency over {results['records_total']:,} records (ms)")
    for column in ("search", "queries", "p50", "p95", "max", "CPU p50", "CPU p95"):
        search.add_column(column, justify="left" if column == "search" else "right")
    for latency in results["latency"]:
        search.add_row(
            latency["name"],
            str(latency["queries"]),
            *(
                f"{latency[key]:.2f}"
                for key in ("p50_ms", "p95_ms", "max_ms", "cpu_p50_ms", "cpu_p95_ms")
            ),
        )
    console.print(search)
    shares = ", ".join(
        f"{name} {value:.0%}" for name, value in results["top_k_overlap_with_exhaustive"].items()
    )
    console.print(f"same top-{results['k']} as the exhaustive search: {shares}")
    env = results["environment"]
    console.print(
        f"Python {env['python']}, SQLite {env['sqlite']}, {env['cpus']} CPUs ({env['machine']}), "
        f"1-min load average at the end: {results['load_average_1min']}"
    )


if __name__ == "__main__":
    typer.run(main)
