"""Rate-limited logging: a flood of the same message becomes a few lines and a count.

Owns `Throttle`, a `logging.Filter` that lets through at most `per_window` records of one kind
(logger name and the first line of the message template) per `window_s` seconds and notes on
the next one let through how many were dropped. An attacker who makes the companion fail the
same way thousands of times a second (refused connections, failed handshakes, descriptor
exhaustion) must not be able to fill the disk or bury other messages. Must not change what is
logged otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

DEFAULT_PER_WINDOW = 5
DEFAULT_WINDOW_S = 10.0
# Loggers the companion's own failures and those of the libraries under it arrive through.
COMPANION_LOGGERS = (
    "specsteer_companion", "specsteer_companion.auth", "specsteer_companion.ray",
    "websockets.server", "asyncio",
)


class Throttle(logging.Filter):
    """Passes at most `per_window` records per (logger, message template) per `window_s`."""

    def __init__(self, per_window: int = DEFAULT_PER_WINDOW,
                 window_s: float = DEFAULT_WINDOW_S, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if per_window < 1 or window_s <= 0:
            raise ValueError(f"need per_window >= 1 and window_s > 0, got {per_window}, {window_s}")
        self.per_window = per_window
        self.window_s = window_s
        self._clock = clock
        self._windows: dict[tuple[str, str], tuple[float, int, int]] = {}  # start, seen, dropped
        self._lock = threading.Lock()
        self.dropped = 0  # records dropped in total, for tests and stats

    def filter(self, record: logging.LogRecord) -> bool:
        # the first line of the template: asyncio puts object reprs (fds, ids) on later lines
        key = (record.name, str(record.msg).split("\n", 1)[0][:120])
        now = self._clock()
        with self._lock:
            start, seen, dropped = self._windows.get(key, (now, 0, 0))
            if now - start >= self.window_s:
                start, seen = now, 0
            if seen >= self.per_window:
                self._windows[key] = (start, seen, dropped + 1)
                self.dropped += 1
                return False
            self._windows[key] = (start, seen + 1, 0)
            if len(self._windows) > 10_000:  # many distinct messages: forget the old windows
                self._windows = {key: self._windows[key]}
        if dropped:
            record.msg = f"{record.msg} [{dropped} similar message(s) suppressed]"
        return True


def install(throttle: Throttle, names: Iterable[str] = COMPANION_LOGGERS) -> None:
    """Attach `throttle` to these loggers (once each); records they emit pass through it."""
    for name in names:
        logger = logging.getLogger(name)
        if throttle not in logger.filters:
            logger.addFilter(throttle)
