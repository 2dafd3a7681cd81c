"""`Workers`: the background threads one owner starts, kept so that it can wait for them.

An embeddable SDK must not leave threads running behind the app that closed it: every
background job of a `Client` (a prepared prefill, a companion session opening, a link closed
off the caller's time, a reconnect probe, a warm start's prefill) is started through its
`Workers`, and `Client.close()` joins them all. Each such job ends on its own within its bound
(a cancel, a stop event, a connect or reply timeout); the threads are daemons only so that a
process whose app never closes its Client can still exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Workers:
    """Threads started for one owner, joined together."""

    def __init__(self, name: str = "specsteer") -> None:
        self.name = name
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def thread(self, target: Callable[[], object], name: str) -> threading.Thread:
        """A new thread for `target`, kept here; the caller starts it (after publishing it,
        when others must see it first)."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        return thread

    def start(self, target: Callable[[], object], name: str) -> threading.Thread:
        """Start `target` on a thread kept here."""
        thread = self.thread(target, name)
        thread.start()
        return thread

    def alive(self) -> list[threading.Thread]:
        """The threads still running (one that started another is waited for with it)."""
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive() or t.ident is None]
            return [t for t in self._threads if t.is_alive()]

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every thread started here, those they start included; True when none is
        left (False: `timeout` passed first). The calling thread is never waited for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        while True:
            running = [t for t in self.alive() if t is not me]
            if not running:
                return True
            for thread in running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                thread.join(left)
