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
    # FIFO would run all twenty attacker jobs first; the attacker has been charged the time it
    # held the worker, so the device's job runs next
    assert order.index("d") == 0
    assert [x for x in order if x != "d"] == [f"a{i}" for i in range(20)]  # FIFO within a key


class FakeClock:
    """Time that tests (and the jobs they queue) move by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run_in_order(pool: FairExecutor, clock: FakeClock, jobs: list[tuple[str, float]],
                  before: list[tuple[str, float]] = ()) -> list[str]:
    """Hold the only worker, queue `jobs` (key, cost), release; the keys in the order run.
    `before` run first, one at a time, to charge keys."""
    order: list[str] = []

    def job(key: str, cost: float) -> None:
        clock.now += cost
        order.append(key)

    for key, cost in before:
        pool.submit(key, lambda k=key, c=cost: job(k, c)).result(5)
    order.clear()
    gate, started = threading.Event(), threading.Event()
    hold = pool.submit("holder", lambda: (started.set(), gate.wait()))
    assert started.wait(5)
    futures = [pool.submit(key, lambda k=key, c=cost: job(k, c)) for key, cost in jobs]
    gate.set()
    hold.result(5)
    for future in futures:
        future.result(5)
    return order


def test_a_device_of_cheap_rounds_waits_for_no_queued_long_prefill() -> None:
    """Round-robin would run one 2 s prefill of each abuser between the device's rounds; fair
    charging runs the device's 1 ms rounds first, then the prefills (charged, they wait)."""
    clock = FakeClock()
    pool = FairExecutor(1, clock=clock)
    try:
        jobs = [(f"abuser{i}", 2.0) for i in range(3) for _ in range(2)]
        jobs += [("device", 0.001)] * 5
        order = _run_in_order(pool, clock, jobs)
    finally:
        pool.shutdown()
    # every key starts at the same charge, so each abuser's first prefill runs (in arrival
    # order); then each is charged 2 s and waits until the device has had as much: all five
    # rounds run before any second prefill (round-robin: a prefill of each between two rounds)
    abusers = ["abuser0", "abuser1", "abuser2"]
    assert order == [*abusers, *["device"] * 5, *abusers]


def test_equal_costs_alternate_and_time_used_alone_is_no_debt_nor_credit() -> None:
    """A key that ran while nobody else waited owes nothing for it, and a key that was idle
    meanwhile has no credit to spend: from then on they take turns."""
    clock = FakeClock()
    pool = FairExecutor(1, clock=clock)
    try:
        order = _run_in_order(pool, clock, [("a", 1.0)] * 3 + [("c", 1.0)] * 3,
                              before=[("c", 1.0), ("a", 5.0), ("a", 5.0)])
    finally:
        pool.shutdown()
    assert order == ["a", "c"] * 3


def test_charges_of_departed_keys_are_not_kept_forever() -> None:
    """Before login every address is its own key: a stream of new ones must not grow memory."""
    clock = FakeClock()
    pool = FairExecutor(2, clock=clock)
    try:
        for i in range(1000):
            pool.submit(f"address:{i}", lambda: setattr(clock, "now", clock.now + 0.01)).result(5)
        assert len(pool._charged) <= 66
    finally:
        pool.shutdown()


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
