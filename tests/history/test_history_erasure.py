"""Erasure with another connection reading: never "done" while text is still in the files.

A reader holding a read transaction keeps SQLite from truncating the write-ahead log, so old
copies of erased text stay in the database file or its WAL. The store must say the erase is
pending, finish it once the reader is gone (`finish_erase`, or the next open), and the CLI must
report it with its own exit code. The checks grep the raw bytes of the .db and -wal files.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specsteer.cli import app
from specsteer.cli.history import ERASE_PENDING_EXIT
from specsteer.errors import HistoryReadOnly
from specsteer.history import HistoryStore, make_record

runner = CliRunner()


def _raw(path: Path) -> bytes:
    return b"".join(Path(f"{path}{suffix}").read_bytes() for suffix in ("", "-wal")
                    if Path(f"{path}{suffix}").exists())


def _seed(path: Path) -> list[bytes]:
    secret = "zq" + uuid.uuid4().hex[:12] + "0417"  # digits at the end: the stemmer keeps it
    with HistoryStore(path) as store:
        store.add_many(make_record(kind="note", id=f"n{i}", body=f"ordinary shopping list {i}")
                       for i in range(50))
        store.add(kind="secret", id="s", title="pin", body=f"my pin is {secret}")
    # FTS5 stores terms prefix-compressed: look for the secret's tail too
    return [secret.encode(), secret[3:].encode()]


def _reader(path: Path) -> sqlite3.Connection:
    """Another connection in the middle of a read, as an app showing the history would be."""
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM records").fetchone()
    return reader


def _found(path: Path, needles: list[bytes]) -> list[bytes]:
    raw = _raw(path)
    return [needle for needle in needles if needle in raw]


@pytest.mark.parametrize("erase", ["delete", "forget"])
def test_an_erase_a_reader_blocks_is_pending_then_finished(tmp_path: Path, erase: str) -> None:
    path = tmp_path / "history.db"
    needles = _seed(path)
    reader = _reader(path)
    store = HistoryStore(path, busy_timeout_s=0.3)
    try:
        if erase == "delete":
            store.delete("s")
        else:
            assert store.forget(kind="secret") == 1
        assert store.erase_pending
        assert _found(path, needles)  # what "pending" means: the text is still in the files
        assert not store.finish_erase(wait_s=0.2)  # the reader still holds the old pages
        reader.execute("COMMIT")  # the read ends; the connection stays open
        assert store.finish_erase()
        assert not store.erase_pending
        assert _found(path, needles) == []
        assert "s" not in store and len(store.search("shopping", 100)) == 50
    finally:
        store.close()
        reader.close()


def test_the_next_open_finishes_a_pending_erase(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    needles = _seed(path)
    reader = _reader(path)
    with HistoryStore(path, busy_timeout_s=0.2) as store:
        store.delete("s")
        assert store.erase_pending
    reader.execute("COMMIT")
    assert _found(path, needles)  # nobody has finished it yet
    with HistoryStore(path) as store:
        assert _found(path, needles) == []
        assert len(store) == 50
    reader.close()


@pytest.mark.slow  # CLI processes
def test_cli_reports_a_pending_erase_with_its_own_exit_code(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    needles = _seed(path)
    reader = _reader(path)
    try:
        result = runner.invoke(app, ["history", "forget", "--db", str(path), "--kind", "secret",
                                     "--yes", "--json"])
        assert result.exit_code == ERASE_PENDING_EXIT, result.output
        assert json.loads(result.stdout) == {"deleted": 1, "erase_pending": True}
        assert "erase pending" in result.stderr
        assert _found(path, needles)
        reader.execute("COMMIT")
        listed = runner.invoke(app, ["history", "list", "--db", str(path), "--limit", "1"])
        assert listed.exit_code == 0
        assert _found(path, needles) == []  # the next open finished it
    finally:
        reader.close()


def test_cli_erase_without_readers_completes(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    needles = _seed(path)
    result = runner.invoke(app, ["history", "delete", "--db", str(path), "s", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"deleted": ["s"], "erase_pending": False}
    assert _found(path, needles) == []


def test_db_that_is_a_folder_is_a_one_line_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["history", "list", "--db", str(tmp_path)])
    assert result.exit_code == 1
    assert "is a folder" in result.stderr and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_read_only_history_can_be_listed_and_searched(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    _seed(path)
    with HistoryStore(path, read_only=True) as store:
        assert store.read_only and len(store) == 51
        assert len(store.search("shopping", 100)) == 50
        with pytest.raises(HistoryReadOnly, match="read-only"):
            store.add(kind="note", body="new")
        with pytest.raises(HistoryReadOnly):
            store.delete("s")
    with HistoryStore(path) as store:
        assert len(store) == 51  # nothing was written


def test_cli_opens_an_unwritable_file_read_only(tmp_path: Path, monkeypatch) -> None:
    """Tests run as root, who may write any file, so the permission check is told the file is
    not writable (os.access); the file itself is then really opened with mode=ro."""
    path = tmp_path / "history.db"
    _seed(path)
    os.chmod(path, 0o444)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode == os.W_OK
                        and Path(p) == path else real_access(p, mode, **kw))
    listed = runner.invoke(app, ["history", "list", "--db", str(path), "--json"])
    assert listed.exit_code == 0, listed.output
    assert len(json.loads(listed.stdout)) == 20
    found = runner.invoke(app, ["history", "search", "--db", str(path), "pin", "--json"])
    assert found.exit_code == 0 and json.loads(found.stdout)[0]["id"] == "s"
    added = runner.invoke(app, ["history", "add", "--db", str(path), "--body", "x"])
    assert added.exit_code == 1 and "read-only" in added.stderr
