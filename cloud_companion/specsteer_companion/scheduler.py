"""Fair scheduling of model work across devices: each identity gets an equal share of worker time.

Owns the worker threads that run frames (`CompanionEndpoint.handle`) and the order in which
queued frames run. A plain FIFO pool lets whoever queues the most frames take the most model
time, and plain round-robin still makes a device's 1 ms round wait behind one 2,000-token prefill
of every other busy device. Here each identity (device token, or the peer address before login)
has its own queue and is charged the worker time its jobs took; a free worker runs the next job
of the identity with work that has been charged least (start-time fair queuing). An identity
that becomes busy starts at the least charge among the busy ones, so idling banks no credit.
Must not decide what a job does, how much a device may send (that is `limits`), or know about
websockets.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Future[Any], Callable[[], Any]]


class FairExecutor:
    """Up to `workers` threads; the next job is the oldest of the identity charged least.

    Threads start when jobs need them (as in `ThreadPoolExecutor`), so an executor that is never
    used costs nothing. `clock` (seconds) measures what each job is charged; tests inject one.
    """

    def __init__(self, workers: int, *, name: str = "fair",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.name = name
        self._clock = clock
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()  # keys with queued work
        self._charged: dict[str, float] = {}  # worker seconds, for keys busy or in debt
        self._running: dict[str, int] = {}  # jobs of each key on a worker now
        self._floor = 0.0  # the charge a key that becomes busy starts from
        self._cond = threading.Condition()
        self._stopping = False
        self._idle = 0
        self._threads: list[threading.Thread] = []

    def submit(self, key: str, fn: Callable[[], T]) -> Future[T]:
        """Queue `fn` under `key`; the future holds its result or exception."""
        future: Future[T] = Future()
        with self._cond:
            if key not in self._queues and not self._running.get(key):
                self._charged[key] = max(self._charged.get(key, 0.0), self._floor)
            self._queues.setdefault(key, deque()).append((future, fn))
            queued = sum(len(queue) for queue in self._queues.values())
            if queued > self._idle and len(self._threads) < self.workers:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self.name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
            self._cond.notify()
        return future

    def pending(self, key: str | None = None) -> int:
        """Jobs queued (not yet started) under `key`, or under every key when None."""
        with self._cond:
            if key is not None:
                return len(self._queues.get(key, ()))
            return sum(len(queue) for queue in self._queues.values())

    def shutdown(self) -> None:
        """Finish queued jobs, then stop the threads; a later `submit` starts new ones."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()
        with self._cond:
            self._stopping = False

    def _next(self) -> tuple[str, _Job] | None:
        with self._cond:
            while not self._queues and not self._stopping:
                self._idle += 1
                self._cond.wait()
                self._idle -= 1
            if not self._queues:
                return None
            # least charged first; ties go to the key that has waited longest (dict order)
            key = min(self._queues, key=self._charged.__getitem__)
            self._floor = max(self._floor, self._charged[key])
            queue = self._queues.pop(key)
            job = queue.popleft()
            if queue:  # behind every key with work that is charged as little
                self._queues[key] = queue
            self._running[key] = self._running.get(key, 0) + 1
            return key, job

    def _finished(self, key: str, seconds: float) -> None:
        with self._cond:
            self._charged[key] += seconds
            self._running[key] -= 1
            if not self._queues and self._running.keys() == {key}:  # nobody else waited
                self._floor = max(self._floor, self._charged[key])
            if not self._running[key]:
                del self._running[key]
                if key not in self._queues and self._charged[key] <= self._floor:
                    del self._charged[key]  # it would restart from the floor anyway
            if len(self._charged) > 2 * (len(self._queues) + len(self._running)) + 64:
                for idle in [k for k, c in self._charged.items() if c <= self._floor
                             and k not in self._queues and k not in self._running]:
                    del self._charged[idle]

    def _work(self) -> None:
        while (picked := self._next()) is not None:
            key, (future, fn) = picked
            if not future.set_running_or_notify_cancel():
                self._finished(key, 0.0)
                continue
            started = self._clock()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiting coroutine, never lost
                future.set_exception(exc)
            finally:
                self._finished(key, self._clock() - started)
