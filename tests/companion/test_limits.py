"""Rate bucket arithmetic on a hand-driven clock, and session caps under thread contention."""

from __future__ import annotations

import threading

import pytest
from helpers.manual_clock import ManualClock as FakeClock

from specsteer.errors import CompanionConfigError, CompanionLimitError
from specsteer_companion.limits import (
    DEFAULT_BURST,
    DEFAULT_MAX_SESSIONS_PER_TOKEN,
    DEFAULT_MAX_SESSIONS_TOTAL,
    DEFAULT_RATE_PER_S,
    PrefillBudget,
    SessionCounter,
    TokenBucket,
)


def test_bucket_starts_full_and_refuses_past_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=5, clock=clock)
    assert [bucket.try_acquire() for _ in range(6)] == [True] * 5 + [False]


def test_bucket_refills_at_rate_and_caps_at_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=5, clock=clock)
    assert bucket.try_acquire(5)
    clock.now += 0.49  # 0.98 tokens: not yet one
    assert not bucket.try_acquire()
    clock.now += 0.01
    assert bucket.try_acquire()
    assert not bucket.try_acquire()
    clock.now += 3600  # an hour idle banks only `burst`
    assert bucket.available == pytest.approx(5.0)
    assert bucket.try_acquire(5)
    assert not bucket.try_acquire()


def test_refused_acquire_takes_nothing() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=4, clock=clock)
    assert bucket.try_acquire(3)
    assert not bucket.try_acquire(2)  # only 1 left
    assert bucket.available == pytest.approx(1.0)
    assert bucket.try_acquire(1)


def test_retry_after_says_when_tokens_return() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=4.0, burst=4, clock=clock)
    assert bucket.retry_after() == 0.0
    assert bucket.try_acquire(4)
    assert bucket.retry_after(2) == pytest.approx(0.5)
    clock.now += bucket.retry_after(2)
    assert bucket.try_acquire(2)


def test_clock_stepping_back_does_not_drain_or_fill() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=3, clock=clock)
    assert bucket.try_acquire(2)
    clock.now -= 100
    assert bucket.available == pytest.approx(1.0)
    clock.now += 1
    assert bucket.available == pytest.approx(2.0)


def test_long_run_average_matches_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=10, clock=clock)
    granted = 0
    for _ in range(1000):  # try every 10 ms for 10 s
        clock.now += 0.01
        granted += bucket.try_acquire()
    assert granted == pytest.approx(10 + 10.0 * 10, abs=1)  # initial burst + rate * seconds


@pytest.mark.parametrize(("rate", "burst"), [(0, 5), (-1, 5), (1, 0.5)])
def test_bucket_rejects_nonsense_settings(rate: float, burst: float) -> None:
    with pytest.raises(CompanionConfigError):
        TokenBucket(rate=rate, burst=burst, clock=FakeClock())


@pytest.mark.parametrize("n", [0, -1, 6])
def test_bucket_rejects_requests_that_can_never_fit(n: float) -> None:
    bucket = TokenBucket(rate=1, burst=5, clock=FakeClock())
    with pytest.raises(CompanionConfigError):
        bucket.try_acquire(n)


def test_defaults_are_explicit_and_sane() -> None:
    assert DEFAULT_BURST >= DEFAULT_RATE_PER_S > 0
    assert 1 <= DEFAULT_MAX_SESSIONS_PER_TOKEN <= DEFAULT_MAX_SESSIONS_TOTAL
    bucket, counter = TokenBucket(), SessionCounter()
    assert (bucket.rate, bucket.burst) == (DEFAULT_RATE_PER_S, DEFAULT_BURST)
    assert (counter.max_per_token, counter.max_total) == (
        DEFAULT_MAX_SESSIONS_PER_TOKEN, DEFAULT_MAX_SESSIONS_TOTAL)


def test_session_counter_caps_per_token_and_total() -> None:
    counter = SessionCounter(max_per_token=2, max_total=3)
    assert counter.acquire("a") and counter.acquire("a")
    assert not counter.acquire("a")  # per-token cap
    assert counter.acquire("b")
    assert not counter.acquire("c")  # total cap, though "c" holds none
    assert (counter.active("a"), counter.active("b"), counter.active()) == (2, 1, 3)
    counter.release("a")
    assert counter.acquire("c")
    assert not counter.acquire("a")  # total is full again


def test_release_without_session_is_an_error() -> None:
    counter = SessionCounter(max_per_token=2, max_total=2)
    with pytest.raises(CompanionLimitError):
        counter.release("a")
    assert counter.acquire("a")
    counter.release("a")
    with pytest.raises(CompanionLimitError):
        counter.release("a")
    assert counter.active() == 0


def test_concurrent_acquires_grant_exactly_the_cap() -> None:
    counter = SessionCounter(max_per_token=5, max_total=100)
    threads_n = 32
    barrier = threading.Barrier(threads_n)
    granted: list[bool] = []
    lock = threading.Lock()

    def grab() -> None:
        barrier.wait()
        ok = counter.acquire("same-device")
        with lock:
            granted.append(ok)

    threads = [threading.Thread(target=grab) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sum(granted) == 5 and len(granted) == threads_n
    assert counter.active("same-device") == 5


def test_concurrent_churn_never_exceeds_caps_and_ends_at_zero() -> None:
    counter = SessionCounter(max_per_token=3, max_total=7)
    tokens = [f"t{i}" for i in range(4)]
    over: list[str] = []
    barrier = threading.Barrier(8)

    def churn(token: str) -> None:
        barrier.wait()
        for _ in range(2000):
            if counter.acquire(token):
                if counter.active(token) > 3 or counter.active() > 7:
                    over.append(token)
                counter.release(token)

    threads = [threading.Thread(target=churn, args=(tokens[i % 4],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert over == []
    assert counter.active() == 0
    assert all(counter.active(t) == 0 for t in tokens)


def test_session_counter_rejects_nonsense_settings() -> None:
    with pytest.raises(CompanionConfigError):
        SessionCounter(max_per_token=0)
    with pytest.raises(CompanionConfigError):
        SessionCounter(max_total=0)


def test_prefill_budget_is_per_identity_and_says_when_to_retry() -> None:
    clock = FakeClock()
    budget = PrefillBudget(rate=100, burst=1000, clock=clock)
    assert budget.wait_s("alice", 800) is None
    assert budget.wait_s("alice", 300) == pytest.approx(1.0)  # 200 left, 100 more at 100/s
    assert budget.wait_s("bob", 800) is None  # another device has its own budget
    clock.now += 1.0
    assert budget.wait_s("alice", 300) is None
    assert budget.wait_s("carol", 5000) is None  # longer than the burst: costs the burst
    assert budget.wait_s("carol", 1) is not None


def test_prefill_budget_forgets_only_full_buckets_of_gone_identities() -> None:
    clock = FakeClock()
    budget = PrefillBudget(rate=100, burst=1000, clock=clock)
    for identity in ("alice", "bob", "carol"):
        budget.wait_s(identity, 500)
    budget.forget_full(live={"alice"})
    assert len(budget) == 3  # none has refilled yet: forgetting would refill them
    clock.now += 10
    budget.forget_full(live={"alice"})
    assert len(budget) == 1  # alice still holds a connection
    with pytest.raises(CompanionConfigError):
        PrefillBudget(rate=0)
