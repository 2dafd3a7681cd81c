"""The tiny test models' cache under parallel test workers: one builder at a time."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from specsteer.models.tiny import _built_once


def _build_slowly(folder: Path, log: Path) -> None:
    with log.open("a") as f:
        f.write("built\n")
    time.sleep(0.5)  # long enough for the other worker to arrive while this one builds
    folder.mkdir()
    (folder / "specsteer.json").write_text("{}")


def _worker(folder: Path, log: Path, out: multiprocessing.Queue) -> None:
    found = _built_once(folder / "specsteer.json", lambda: _build_slowly(folder, log))
    out.put((str(found), (found / "specsteer.json").exists()))


def test_two_workers_asking_at_once_build_the_folder_once(tmp_path):
    """Without the lock both build, and the second replaces the folder the first one's tests
    are reading (here: `mkdir` of an existing folder fails in the second builder)."""
    folder, log = tmp_path / "models" / "tiny-x", tmp_path / "builds.log"
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_worker, args=(folder, log, out)) for _ in range(2)]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert results == [(str(folder), True)] * 2
    assert log.read_text() == "built\n"
