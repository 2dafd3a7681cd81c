"""Admission limits of the companion: a per-connection rate limiter and session quotas.

Owns the arithmetic and the locking: `TokenBucket` (requests per second with a burst) and
`SessionCounter` (open sessions per device token and in total). Both are pure in-memory objects
with an injectable clock where time matters, so they are tested without sleeping. Must not do I/O,
know about websockets or tokens' secrets, or decide what to tell the client (the server does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from specsteer.errors import CompanionConfigError, CompanionLimitError

# A device decoding ~30 tokens/s in 4-token draft blocks sends ~8 verify requests a second;
# 20/s leaves room for recovery rows and faster devices while capping what one runaway client
# can make the Generalist compute.
DEFAULT_RATE_PER_S = 20.0
# Two seconds at the full rate: absorbs the burst of a reconnect or a quick run of short drafts
# without letting a client bank minutes of idle time into a flood.
DEFAULT_BURST = 40.0
# A device runs one generation at a time; 4 leaves room for a couple of apps sharing its token
# and for a reconnect that races the old socket's close.
DEFAULT_MAX_SESSIONS_PER_TOKEN = 4
# Each session keeps a KV cache on the Generalist's accelerator: 64 caches of 4k tokens of an
# 8B GQA model are ~32 GB, which fits beside the weights on one 80 GB GPU.
DEFAULT_MAX_SESSIONS_TOTAL = 64


class TokenBucket:
    """Allows `rate` events per second on average and up to `burst` at once; thread-safe.

    Starts full. Time comes from `clock` (monotonic seconds), so tests drive it by hand.
    """

    def __init__(self, rate: float = DEFAULT_RATE_PER_S, burst: float = DEFAULT_BURST, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0:
            raise CompanionConfigError(f"rate must be > 0 per second, got {rate}")
        if not burst >= 1:
            raise CompanionConfigError(f"burst must be >= 1, got {burst}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def try_acquire(self, n: float = 1) -> bool:
        """Take `n` tokens if all are available now; never blocks, takes nothing on refusal."""
        self._check(n)
        with self._lock:
            self._refill()
            if self._tokens >= n:
                self._tokens -= n
                return True
            return False

    def retry_after(self, n: float = 1) -> float:
        """Seconds until `n` tokens will be available (0 if they are now), for a retry hint."""
        self._check(n)
        with self._lock:
            self._refill()
            return max(0.0, (n - self._tokens) / self.rate)

    @property
    def available(self) -> float:
        """Tokens available now."""
        with self._lock:
            self._refill()
            return self._tokens

    def _check(self, n: float) -> None:
        if not 0 < n <= self.burst:
            raise CompanionConfigError(
                f"cannot take {n} tokens from a bucket of burst {self.burst}: it would never fit"
            )

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._last)  # a clock that steps back must not drain the bucket
        self._last = now
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate)


class SessionCounter:
    """Counts open sessions per token id and in total, refusing past either cap; thread-safe."""

    def __init__(self, max_per_token: int = DEFAULT_MAX_SESSIONS_PER_TOKEN,
                 max_total: int = DEFAULT_MAX_SESSIONS_TOTAL) -> None:
        if max_per_token < 1 or max_total < 1:
            raise CompanionConfigError(
                f"session limits must be >= 1, got per token {max_per_token}, total {max_total}"
            )
        self.max_per_token = max_per_token
        self.max_total = max_total
        self._open: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def acquire(self, token_id: str) -> bool:
        """Open a session for `token_id` if both caps allow; False (and nothing held) if not."""
        with self._lock:
            held = self._open.get(token_id, 0)
            if held >= self.max_per_token or self._total >= self.max_total:
                return False
            self._open[token_id] = held + 1
            self._total += 1
            return True

    def release(self, token_id: str) -> None:
        """Close one session of `token_id`; raises if it holds none (a double release is a bug
        that would otherwise let the caps drift)."""
        with self._lock:
            held = self._open.get(token_id, 0)
            if held == 0:
                raise CompanionLimitError(f"token {token_id!r} has no open session to release")
            if held == 1:
                del self._open[token_id]
            else:
                self._open[token_id] = held - 1
            self._total -= 1

    def active(self, token_id: str | None = None) -> int:
        """Open sessions of `token_id`, or of everyone when None."""
        with self._lock:
            return self._total if token_id is None else self._open.get(token_id, 0)
