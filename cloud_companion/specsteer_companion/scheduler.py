"""Fair scheduling of model work across devices: one queue per identity, served round-robin.

Owns the worker threads that run frames (`CompanionEndpoint.handle`) and the order in which
queued frames run. A plain FIFO pool lets whoever queues the most frames take the most model
time; here each identity (device token, or the peer address before login) has its own queue and
the workers take one job from each identity with work in turn. Must not decide what a job does,
how much a device may send (that is `limits`), or know about websockets.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Future[Any], Callable[[], Any]]


class FairExecutor:
    """Up to `workers` threads running jobs round-robin across keys, FIFO within one key.

    Threads start when jobs need them (as in `ThreadPoolExecutor`), so an executor that is never
    used costs nothing.
    """

    def __init__(self, workers: int, *, name: str = "fair") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.name = name
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()  # keys with work, in turn
        self._cond = threading.Condition()
        self._stopping = False
        self._idle = 0
        self._threads: list[threading.Thread] = []

    def submit(self, key: str, fn: Callable[[], T]) -> Future[T]:
        """Queue `fn` under `key`; the future holds its result or exception."""
        future: Future[T] = Future()
        with self._cond:
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

    def _next(self) -> _Job | None:
        with self._cond:
            while not self._queues and not self._stopping:
                self._idle += 1
                self._cond.wait()
                self._idle -= 1
            if not self._queues:
                return None
            key, queue = next(iter(self._queues.items()))
            job = queue.popleft()
            del self._queues[key]
            if queue:  # back of the line: every other key with work goes first
                self._queues[key] = queue
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            future, fn = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiting coroutine, never lost
                future.set_exception(exc)
