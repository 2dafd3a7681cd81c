"""Fair scheduling and log throttling, the two pieces that keep one noisy client from the rest."""

from __future__ import annotations

import logging
import threading

import pytest

from specsteer_companion.logthrottle import Throttle
from specsteer_companion.scheduler import FairExecutor


def test_a_flooding_key_does_not_delay_another_beyond_one_job() -> None:
    pool = FairExecutor(1)
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []
    try:
        blocker = pool.submit("attacker", lambda: (started.set(), gate.wait()))
        assert started.wait(5)  # the attacker holds the only worker
        flood = [pool.submit("attacker", lambda i=i: order.append(f"a{i}")) for i in range(20)]
        honest = pool.submit("device", lambda: order.append("d"))
        gate.set()
        blocker.result(5)
        honest.result(5)
        for job in flood:
            job.result(5)
    finally:
        pool.shutdown()
    # FIFO would run all twenty attacker jobs first; round-robin runs the device's job next
    assert order.index("d") == 1
    assert [x for x in order if x != "d"] == [f"a{i}" for i in range(20)]  # FIFO within a key


def test_jobs_return_results_and_exceptions_and_threads_start_lazily() -> None:
    pool = FairExecutor(3)
    assert pool.pending() == 0 and not pool._threads  # nothing runs until there is work
    try:
        assert pool.submit("k", lambda: 41 + 1).result(5) == 42
        with pytest.raises(ZeroDivisionError):
            pool.submit("k", lambda: 1 / 0).result(5)
        barrier = threading.Barrier(3, timeout=5)
        jobs = [pool.submit(f"k{i}", barrier.wait) for i in range(3)]  # needs 3 threads at once
        assert sorted(job.result(5) for job in jobs) == [0, 1, 2]
    finally:
        pool.shutdown()
    assert pool.submit("k", lambda: "again").result(5) == "again"  # restarts after shutdown
    pool.shutdown()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throttle_passes_a_few_per_window_and_counts_the_rest() -> None:
    clock = FakeClock()
    throttle = Throttle(per_window=3, window_s=10, clock=clock)
    logger = logging.getLogger("test.throttle")
    logger.propagate = False
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    logger.addFilter(throttle)
    try:
        for i in range(1000):
            logger.warning("refused a connection from %s", f"10.0.0.{i % 250}")
        logger.warning("another message")  # its own budget
        assert len(records) == 4 and throttle.dropped == 997
        clock.now = 10.0
        logger.warning("refused a connection from %s", "10.0.0.1")
        assert "[997 similar message(s) suppressed]" in records[-1].getMessage()
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(throttle)
