"""Admission limits of the companion: rate limiters, session and connection quotas, defaults.

Owns the arithmetic, the locking and the default values: `TokenBucket` (events per second with a
burst: requests per connection, prompt tokens per device) and `SessionCounter` (open sessions
per device token, or open connections per address, and in total). Both are pure in-memory objects
with an injectable clock where time matters, so they are tested without sleeping. Must not do I/O,
know about websockets or tokens' secrets, or decide what to tell the client (the server does).
`PrefillBudget` is the prompt-token budget of every device: one bucket per identity.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

from specsteer.errors import CompanionConfigError, CompanionLimitError

# A device sends at most two frames per token it decodes (a Draft and its DraftS0; a round commits
# >= 1 token, and rounds that commit one token are rare), and fast on-device models decode 100+
# tokens/s; 200/s keeps honest devices clear of the limit while stopping a client that floods
# frames. What a request costs in model time is bounded apart from
# this: prompts by the prefill budget below, every frame by fair scheduling across devices.
DEFAULT_RATE_PER_S = 200.0
# Two seconds at the full rate: absorbs a quick run of short rounds without letting a client bank
# minutes of idle time into a flood.
DEFAULT_BURST = 400.0
# Prompt tokens a device may have prefilled per second (all its connections together). An honest
# device opens one session per generation: a 1k-token prompt every few seconds, ~300 tokens/s.
# 2048/s is several times that and keeps one device from filling the accelerator with prefills.
DEFAULT_PREFILL_TOKENS_PER_S = 2048.0
# One maximal prompt (the protocol's 8192 tokens) fits; a fresh device can open a few at once.
DEFAULT_PREFILL_BURST = 8192.0
# A device runs one generation at a time; 4 leaves room for a couple of apps sharing its token
# and for a reconnect that races the old socket's close.
DEFAULT_MAX_SESSIONS_PER_TOKEN = 4
# Each session keeps a KV cache on the Generalist's accelerator: 64 caches of 4k tokens of an
# 8B GQA model are ~32 GB, which fits beside the weights on one 80 GB GPU.
DEFAULT_MAX_SESSIONS_TOTAL = 64
# Open connections from one IP address: a household or office behind one NAT runs a few devices,
# each with one connection (two while reconnecting); 32 leaves room for that and stops one host
# from holding every socket.
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 32
# Open connections in total, further lowered to fit the process's descriptor limit (the server
# keeps FD_RESERVE descriptors free for its own files and one accept batch).
DEFAULT_MAX_CONNECTIONS = 1024
FD_RESERVE = 128
# Connections accepted per turn of the event loop (asyncio takes its listen backlog for this).
# Each new one may shed an older one whose descriptor is freed a turn later, so up to two
# batches are in flight beyond the cap: 2 x 32 fits the reserve with room for the server's own.
ACCEPT_BATCH = 32
# Connections the kernel queues before the server accepts them (capped by net.core.somaxconn).
# A flood keeps hundreds of connects in flight; a short queue would be full of them and drop
# a device's SYN, which it then resends only after 1, 3, 7 s. Queued connections hold no
# descriptor of the server.
LISTEN_BACKLOG = 4096
# Connections that have not logged in yet, at most: half of the total, so that an attacker who
# opens sockets from many addresses and never logs in cannot take the slots of devices that do
# (the other half is kept for logged-in connections), and further lowered to half of a total
# lowered by the descriptor limit. When the pool is full, a newcomer from an address holding
# fewer waiting connections than the busiest address takes the slot of that address's oldest
# (a device connecting during a flood gets in, with its full Hello deadline); a newcomer from
# the busiest address is refused, which costs the server less than admitting it.
DEFAULT_MAX_UNAUTHENTICATED = 512
# Seconds from accepting a TCP connection to an accepted Hello (websocket handshake included):
# a device sends its Hello at once, so only an attacker holding sockets open needs longer.
DEFAULT_HELLO_TIMEOUT_S = 5.0
# Seconds a logged-in device may stay silent before its connection (and KV caches) are freed.
DEFAULT_IDLE_TIMEOUT_S = 120.0
# How often the tokens of live connections are re-checked against the store (revocation).
DEFAULT_REVOCATION_CHECK_S = 2.0
# Ids a Draft or RowRequest may commit for free: the token the device chose from the previous
# reply (the accepted drafts are already held by the companion). Beyond that, committed ids
# are prefill work and are charged to the prompt budget like an OpenSession's prompt.
FREE_COMMITTED_IDS = 1


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

    def try_charge(self, n: float) -> bool:
        """Take `n` tokens, any number: up to the burst as `try_acquire`, and more only from a
        full bucket, which then owes the rest (it refills from below zero). Whatever the sizes,
        what is taken by time t never exceeds burst + rate x t plus one request's excess over
        the burst."""
        if not n > 0:
            raise CompanionConfigError(f"cannot charge {n} tokens")
        with self._lock:
            self._refill()
            if self._tokens >= min(n, self.burst):
                self._tokens -= n
                return True
            return False

    def retry_after(self, n: float = 1) -> float:
        """Seconds until `n` tokens (a full bucket, for more than the burst) will be available
        (0 if they are now), for a retry hint."""
        with self._lock:
            self._refill()
            return max(0.0, (min(n, self.burst) - self._tokens) / self.rate)

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


def connection_cap(max_connections: int, descriptor_limit: int | None) -> int:
    """Connections to admit in total: `max_connections`, lowered to leave `FD_RESERVE`
    descriptors of `descriptor_limit` (None: unlimited) free; at least 1."""
    if descriptor_limit is None:
        return max_connections
    return max(1, min(max_connections, descriptor_limit - FD_RESERVE))


def unauthenticated_cap(max_unauthenticated: int, total: int) -> int:
    """Connections admitted before login: `max_unauthenticated`, at most half of `total` (the
    other half is kept for logged-in devices); at least 1."""
    return max(1, min(max_unauthenticated, total // 2))


class SessionCounter:
    """Counts open sessions (or connections) per key and in total, refusing past either cap;
    thread-safe. Keys are token ids for sessions, peer addresses for connections."""

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


class PrefillBudget:
    """Prompt tokens each identity may have prefilled: one `TokenBucket` per identity (all its
    connections together, so reconnecting does not refill it); thread-safe."""

    def __init__(self, rate: float = DEFAULT_PREFILL_TOKENS_PER_S,
                 burst: float = DEFAULT_PREFILL_BURST, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        TokenBucket(rate, burst)  # a bad rate or burst fails here, not at the first prompt
        self.rate, self.burst, self._clock = rate, burst, clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def wait_s(self, identity: str, tokens: int) -> float | None:
        """None if `identity` may prefill `tokens` more prompt tokens now (they are taken), else
        the seconds until it may. A prompt longer than the burst is served from a full budget
        and leaves it owing the rest (`TokenBucket.try_charge`)."""
        with self._lock:
            bucket = self._buckets.get(identity)
            if bucket is None:
                bucket = self._buckets[identity] = TokenBucket(self.rate, self.burst,
                                                               clock=self._clock)
        if bucket.try_charge(tokens):
            return None
        return bucket.retry_after(tokens)

    def forget_full(self, live: Collection[str]) -> None:
        """Drop the buckets that have refilled (a new one would be the same) of identities not
        in `live`: open mode makes a new identity per connection."""
        with self._lock:
            for identity, bucket in list(self._buckets.items()):
                if identity not in live and bucket.available >= bucket.burst:
                    del self._buckets[identity]

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)
