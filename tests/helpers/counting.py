"""Real models and sessions that count what they are asked to run (no mock of a model)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CountingSession:
    """The real session, recording each append's length; sets `cancel` after `after` passes."""

    def __init__(self, session, cancel: threading.Event | None = None, after: int = 1,
                 on_append: Callable[[int], None] | None = None) -> None:
        self.inner, self.cancel, self.after, self.on_append = session, cancel, after, on_append
        self.passes: list[int] = []

    @property
    def length(self) -> int:
        return self.inner.length

    def append(self, ids):
        self.passes.append(len(ids))
        if self.on_append is not None:
            self.on_append(len(ids))
        rows = self.inner.append(ids)
        if self.cancel is not None and len(self.passes) >= self.after:
            self.cancel.set()
        return rows

    def rewind(self, length: int) -> None:
        self.inner.rewind(length)

    def close(self) -> None:
        self.inner.close()


class CountingModel:
    """A loaded model whose sessions count appended tokens (all sessions together)."""

    def __init__(self, model) -> None:
        self.inner = model
        self.appended = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _count(self, n: int) -> None:
        with self._lock:
            self.appended += n

    def new_session(self, max_length: int | None = None) -> CountingSession:
        return CountingSession(self.inner.new_session(max_length=max_length),
                               on_append=self._count)


class SlowModel(CountingModel):
    """A loaded model run at a phone's pace: every pass takes `delay_s` more."""

    def __init__(self, model, delay_s: float = 0.2) -> None:
        super().__init__(model)
        self.delay_s = delay_s

    def _count(self, n: int) -> None:
        super()._count(n)
        time.sleep(self.delay_s)
