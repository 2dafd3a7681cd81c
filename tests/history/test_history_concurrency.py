"""Concurrency and crash safety: locked files, two writer processes, readers during writes,
and writers killed with SIGKILL mid-ingest."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from specsteer.errors import HistoryLocked
from specsteer.history import HistoryStore

pytestmark = pytest.mark.slow  # writer processes and SIGKILL: not in ./dev test --fast

WRITER = """
import sys
from specsteer.history.store import HistoryStore
path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with HistoryStore(path, busy_timeout_s=20) as store:
    for i in range(count):
        store.add(kind="note", id=f"{tag}-{i}", body=f"record {i} written by {tag}")
    print(store.lock_retries)
"""

BATCH_WRITER = """
import hashlib, sys
from specsteer.history.records import make_record
from specsteer.history.store import HistoryStore
path, batches, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with HistoryStore(path, busy_timeout_s=20) as store:
    for b in range(batches):
        records = []
        for j in range(size):
            body = f"batchtag{b} item {j} " + "filler text " * 300
            sha = hashlib.sha256(body.encode()).hexdigest()
            records.append(make_record(kind="note", id=f"b{b}-{j}", body=body, meta={"sha": sha}))
        store.add_many(records)
"""

# Batches of 1..7 records, sizes fixed by the first id so the parent can rebuild them.
CRASH_WRITER = """
import sys
from specsteer.history.records import make_record
from specsteer.history.store import HistoryStore
path, first = sys.argv[1], int(sys.argv[2])
store = HistoryStore(path, busy_timeout_s=20)
i = first
while True:
    size = 1 + i % 7
    batch = [make_record(kind="note", id=f"r{n}", body=f"payload{n} " * 400)
             for n in range(i, i + size)]
    store.add_many(batch)
    print(" ".join(record.id for record in batch), flush=True)
    i += size
"""


def _spawn(python: str, env: dict[str, str], script: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [python, "-c", script, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_locked_file_raises_history_locked_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    with HistoryStore(path) as store:
        store.add(kind="note", id="before", body="written before the lock")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the file
    try:
        with HistoryStore(path, busy_timeout_s=0.3) as store:
            start = time.monotonic()
            with pytest.raises(HistoryLocked) as info:
                store.add(kind="note", body="blocked")
            waited = time.monotonic() - start
            # WAL: reading goes on while someone else writes.
            assert [hit.record.id for hit in store.search("written")] == ["before"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert info.value.path == str(path)
    assert str(path) in str(info.value) and "locked" in str(info.value)
    assert 0.3 <= waited < 3.0


def test_wipe_refuses_to_claim_success_while_a_reader_pins_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    secret = "zq" + "8f3e1d2c4b5a" + "0417"
    with HistoryStore(path, busy_timeout_s=0.3) as store:
        store.add(kind="note", id="s", body=f"secret {secret}")
        reader = sqlite3.connect(path)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM records").fetchone()  # holds a WAL snapshot
        with pytest.raises(HistoryLocked, match="write-ahead log could not be truncated"):
            store.wipe()
        assert len(store) == 0  # the records themselves are gone
        reader.rollback()
        reader.close()
        store.wipe()  # now the WAL can be truncated
        assert store.stats()["wal_bytes"] == 0
    leftovers = b"".join(
        Path(f"{path}{s}").read_bytes() for s in ("", "-wal") if Path(f"{path}{s}").exists()
    )
    assert secret[3:].encode() not in leftovers


def test_retry_with_backoff_outlasts_a_short_lock(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    HistoryStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.0, lambda: holder.execute("ROLLBACK"))
    release.start()
    try:
        # SQLite's own busy wait gets a quarter of the budget (0.5 s): the retry loop must
        # carry the write past the 1 s lock.
        with HistoryStore(path, busy_timeout_s=2.0) as store:
            store.add(kind="note", id="late", body="written after the lock")
            assert store.lock_retries >= 1
            assert "late" in store
    finally:
        release.join()
        holder.close()


@pytest.mark.timeout(60)
def test_two_processes_write_one_new_file(
    tmp_path: Path, python: str, child_env: dict[str, str]
) -> None:
    path = tmp_path / "shared.db"  # not created yet: both children race to create the schema
    children = [_spawn(python, child_env, WRITER, path, tag, 150) for tag in ("a", "b")]
    for child in children:
        out, err = child.communicate(timeout=50)
        assert child.returncode == 0, err
    with HistoryStore(path) as store:
        assert len(store) == 300
        assert {r.id for r in store.list(limit=None)} == {
            f"{tag}-{i}" for tag in ("a", "b") for i in range(150)
        }
        assert store.integrity_check() == []


def test_threads_share_one_store(store: HistoryStore) -> None:
    errors: list[BaseException] = []

    def write(tag: str) -> None:
        try:
            for i in range(40):
                store.add(kind="note", id=f"{tag}{i}", body=f"thread note {i}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(40):
                store.search("thread note", 5)
                store.list(limit=5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f, args=a) for f, a in [(write, ("x",)), (write, ("y",))]]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store) == 80


@pytest.mark.timeout(60)
def test_reader_never_sees_a_half_written_batch(
    tmp_path: Path, python: str, child_env: dict[str, str]
) -> None:
    path = tmp_path / "history.db"
    size = 25
    with HistoryStore(path) as reader:
        writer = _spawn(python, child_env, BATCH_WRITER, path, 60, size)
        counts: set[int] = set()
        while writer.poll() is None:
            count = len(reader)
            counts.add(count)
            assert count % size == 0, f"saw {count} records: a batch was half visible"
            batch = count // size - 1
            if batch >= 0:
                hits = reader.search(f"batchtag{batch}", k=100)
                assert len(hits) == size
                for hit in hits:
                    digest = hashlib.sha256(hit.record.body.encode()).hexdigest()
                    assert hit.record.meta["sha"] == digest, "record body half written"
        _, err = writer.communicate(timeout=30)
        assert writer.returncode == 0, err
        assert len(reader) == 60 * size
        assert len(counts) > 2, "the reader never observed the store mid-ingest"


def _batches(first: int, last_id: int) -> list[list[str]]:
    """The crash writer's batches from `first` up to (and including) record number last_id."""
    batches, i = [], first
    while i <= last_id:
        size = 1 + i % 7
        batches.append([f"r{n}" for n in range(i, i + size)])
        i += size
    return batches


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_mid_ingest_keeps_every_committed_record(
    tmp_path: Path, python: str, child_env: dict[str, str]
) -> None:
    path = tmp_path / "history.db"
    rng = random.Random(1234)
    committed: set[str] = set()
    firsts: list[int] = []
    deadline = time.monotonic() + 15
    rounds = 0
    while rounds < 12 and (rounds < 4 or time.monotonic() < deadline):
        first = rounds * 1_000_000
        firsts.append(first)
        child = _spawn(python, child_env, CRASH_WRITER, path, first)
        assert child.stdout is not None
        for _ in range(rng.randint(1, 12)):
            line = child.stdout.readline()
            assert line, f"writer died on its own: {child.stderr.read() if child.stderr else ''}"
            committed.update(line.split())
        time.sleep(rng.uniform(0, 0.02))  # land somewhere inside the next transaction
        os.kill(child.pid, signal.SIGKILL)
        rest, _ = child.communicate(timeout=10)
        assert child.returncode == -signal.SIGKILL
        committed.update(rest.split())  # printed before the kill, so committed
        rounds += 1
    with HistoryStore(path) as store:
        assert store.integrity_check() == []
        present = {record.id for record in store.list(limit=None)}
        assert committed <= present, f"lost committed records: {sorted(committed - present)[:5]}"
        for first in firsts:
            numbers = [int(i[1:]) for i in present if first <= int(i[1:]) < first + 1_000_000]
            for batch in _batches(first, max(numbers, default=first - 1)):
                assert set(batch) <= present or not set(batch) & present, f"torn batch {batch}"
        for record_id in rng.sample(sorted(present), 30):
            number = int(record_id[1:])
            assert store.get(record_id).body == f"payload{number} " * 400
            assert store.search(f"payload{number}", 1)[0].record.id == record_id
