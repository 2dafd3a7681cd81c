"""A clock tests move by hand, for everything that takes `clock=` (buckets, the admission gate,
a server): what a test measures then does not depend on how fast the machine runs it."""

from __future__ import annotations

import threading


class ManualClock:
    """Monotonic seconds that change only when `advance` is called; safe across threads."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
