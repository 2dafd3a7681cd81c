"""Secure erasure of the history file: deleted text gone from the database, index and WAL.

Owns the erase steps `HistoryStore` runs after a delete, forget, update or wipe: `secure_delete`
zeroes freed rows and pages (set when the store opens), FTS5 `optimize` merges away deleted terms,
a TRUNCATE checkpoint drops old page images from the write-ahead log, and `VACUUM` rewrites the
file on wipe. A reader elsewhere can block the checkpoint: the erase is then reported as pending
(`erase_pending`) and finished by `finish_erase` or the next open. A mixin of `HistoryStore`: it
uses the store's connection and its busy handling, and holds no state of its own but that flag.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import sqlite_utils

from specsteer.errors import HistoryLocked
from specsteer.history.records import FTS_TABLE, TABLE

T = TypeVar("T")


class SecureErase:
    """The erase steps of `HistoryStore` (see the module docstring)."""

    db: sqlite_utils.Database
    path: Path | None
    busy_timeout_s: float
    erase_pending: bool
    _busy_ms: int

    if TYPE_CHECKING:  # provided by HistoryStore
        location: str

        def _run(self, op: Callable[[], T], *, write: bool) -> T: ...

    def _finish_pending_erase(self) -> None:
        """At open: if the WAL holds pages (perhaps an erase that a reader blocked last time),
        checkpoint and truncate it now, without waiting for anyone."""
        wal = Path(f"{self.path}-wal")
        if not wal.exists() or wal.stat().st_size == 0:
            return
        self.db.execute("PRAGMA busy_timeout = 0")  # never make an app's open wait on a reader
        try:
            self._run(lambda: self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone(),
                      write=False)
        except HistoryLocked:
            pass  # a writer holds the file: the next erase or open tries again
        finally:
            self.db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

    def _scrub(self, *, require: bool) -> bool:
        """Purge deleted text from the FTS index and the WAL; True when the WAL was truncated.

        `secure_delete` zeroes freed rows and pages; FTS5 keeps deleted terms in old segments
        until `optimize` merges them away; the WAL keeps old page images until a TRUNCATE
        checkpoint, which an open reader elsewhere can block (for up to `busy_timeout_s`; then
        `erase_pending` is set and the erase finishes in `finish_erase` or at the next open).
        """
        self._run(
            lambda: self.db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('optimize')"),
            write=True,
        )
        self.erase_pending = True
        self.erase_pending = not self._truncate_wal(self.busy_timeout_s, require=require)
        return not self.erase_pending

    def finish_erase(self, wait_s: float = 0.0) -> bool:
        """Complete an erase a reader blocked: checkpoint and truncate the WAL, waiting up to
        `wait_s` for readers to finish. True when nothing is pending any more."""
        if self.erase_pending:
            self.erase_pending = not self._truncate_wal(wait_s, require=False)
        return not self.erase_pending

    def _truncate_wal(self, wait_s: float, *, require: bool) -> bool:
        """`wal_checkpoint(TRUNCATE)`, retried for `wait_s`; True when it completed."""
        if self.path is None:
            return True
        start = time.monotonic()
        while True:
            busy, _, _ = self._run(
                lambda: self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone(), write=False
            )
            if not busy:
                return True
            waited = time.monotonic() - start
            if waited >= wait_s:
                if require:
                    raise HistoryLocked(
                        self.location,
                        waited,
                        "records were erased but another connection is still reading, so the "
                        "write-ahead log could not be truncated; close it and call wipe() again",
                    )
                return False
            time.sleep(0.05)

    def wipe(self) -> None:
        """Erase every record, then VACUUM and truncate the WAL so no text stays in the files."""

        def op() -> None:
            self.db.execute(f"DELETE FROM {TABLE}")
            self.db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('delete-all')")

        self._run(op, write=True)
        self._run(self.db.vacuum, write=False)
        self._scrub(require=True)
