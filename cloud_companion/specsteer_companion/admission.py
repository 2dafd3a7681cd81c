"""The admission gate of every companion server: what a connection may do before a frame of it
reaches a model. Sans-I/O, like `endpoint`: adapters report what happened (a connection
accepted, a frame received, a login, a close) and do what it answers (refuse, close the
connections it sheds, pass the decoded message on).

Owns, for the single-process server (`server`) and the Ray ingress (`ray_app`) alike:
`ServerConfig` (where a server listens and every limit it enforces, with the defaults of
`limits`); connections per address and in total; the pool of connections that have not logged
in (at most half of the total, so that devices that log in always find room) and which of them
is shed when a new one needs its slot; the Hello deadline and the idle timeout; requests per
connection; the prompt budget of each device (OpenSession and Resume prompts, and committed ids
beyond one a round: every way to make the companion prefill); sessions per device and in total.
Each frame is decoded here, once, and handed on as a message. Must not do I/O, touch a model or
know websockets. Called from one event loop; the counts may be read from any thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from specsteer import protocol
from specsteer.errors import CompanionConfigError, ProtocolError
from specsteer.protocol import ErrorCode, Limits
from specsteer_companion.cli_flags import flag
from specsteer_companion.limits import (
    DEFAULT_BURST,
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    DEFAULT_MAX_SESSIONS_PER_TOKEN,
    DEFAULT_MAX_SESSIONS_TOTAL,
    DEFAULT_MAX_UNAUTHENTICATED,
    DEFAULT_PREFILL_BURST,
    DEFAULT_PREFILL_TOKENS_PER_S,
    DEFAULT_RATE_PER_S,
    DEFAULT_REVOCATION_CHECK_S,
    FREE_COMMITTED_IDS,
    PrefillBudget,
    SessionCounter,
    TokenBucket,
    connection_cap,
    unauthenticated_cap,
)
from specsteer_companion.revocation import REVOKED_MESSAGE

_COUNTS = ("workers", "max_connections", "max_connections_per_address", "max_unauthenticated",
           "max_sessions", "max_sessions_per_identity", "burst", "prefill_burst")
_DURATIONS = ("hello_timeout_s", "idle_timeout_s", "requests_per_second",
              "prefill_tokens_per_second", "revocation_check_s")


@dataclass(frozen=True)
class ServerConfig:
    """Where a companion server listens and what it admits; the reason for each default is
    next to it in `limits`. The Ray ingress's section extends it (`ray_config`)."""

    host: str = field(default="127.0.0.1", metadata=flag(  # loopback unless asked
        "--host", "Address to listen on"))
    port: int = field(default=8765, metadata=flag("--port", "0 picks a free port"))
    workers: int = 2  # model threads of the single-process server; one per core on a small box
    hello_timeout_s: float = field(default=DEFAULT_HELLO_TIMEOUT_S, metadata=flag(
        "--hello-timeout", "Seconds from connecting to an accepted Hello", min=0.1))
    idle_timeout_s: float = field(default=DEFAULT_IDLE_TIMEOUT_S, metadata=flag(
        "--idle-timeout", "Seconds before an idle device is dropped"))
    max_connections: int = field(default=DEFAULT_MAX_CONNECTIONS, metadata=flag(
        "--max-connections", "Open connections in total (lowered to fit ulimit -n)", min=1))
    max_connections_per_address: int = field(
        default=DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, metadata=flag(
            "--max-connections-per-address", "Open connections from one IP address", min=1))
    max_unauthenticated: int = field(default=DEFAULT_MAX_UNAUTHENTICATED, metadata=flag(
        "--max-unauthenticated", "Connections not logged in yet (at most half the total; when "
        "full, the oldest of the busiest address is closed)", min=1))
    max_sessions: int = field(default=DEFAULT_MAX_SESSIONS_TOTAL, metadata=flag(
        "--max-sessions", "Open sessions in total", min=1))
    max_sessions_per_identity: int = DEFAULT_MAX_SESSIONS_PER_TOKEN  # a choice made in code
    requests_per_second: float = field(default=DEFAULT_RATE_PER_S, metadata=flag(
        "--rate", "Requests per second per connection", min=0.001))
    burst: int = field(default=int(DEFAULT_BURST), metadata=flag(
        "--burst", "Request burst per connection", min=1))
    prefill_tokens_per_second: float = field(default=DEFAULT_PREFILL_TOKENS_PER_S, metadata=flag(
        "--prefill-rate", "Prompt tokens per second per device token", min=0.001))
    prefill_burst: int = field(default=int(DEFAULT_PREFILL_BURST), metadata=flag(
        "--prefill-burst", "Prompt-token burst per device token", min=1))
    revocation_check_s: float = DEFAULT_REVOCATION_CHECK_S
    limits: Limits | None = None  # protocol bounds; None: `Limits()`

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CompanionConfigError(f"{name} must be an integer >= 1, got {value!r}")
        for name in _DURATIONS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise CompanionConfigError(f"{name} must be a number > 0, got {value!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 <= self.port <= 65535:
            raise CompanionConfigError(f"port must be 0..65535, got {self.port!r}")


class Refusal(NamedTuple):
    """What to tell a connection before it is closed."""

    code: ErrorCode
    message: str


@dataclass(eq=False)
class Entry:
    """One admitted connection as the gate tracks it (a `revocation.Revocable`). `owner` is the
    adapter's handle on it: what to close if the gate sheds it."""

    peer: str
    owner: Any
    since: float  # when it was accepted (the gate's clock)
    bucket: TokenBucket  # its requests
    identity: str | None = None  # its device's identity once logged in
    busy: bool = False  # a frame of it is being handled (set by the adapter)
    revoked: bool = False  # its token was revoked (set by the revocation watch)
    session: bool = False  # it holds one of the session slots
    counted: bool = field(default=True, repr=False)  # still counted against the caps


@dataclass(frozen=True)
class Admission:
    """The answer to a new connection: its entry (None: refused, and why), and the connections
    closed to make room for it (each was waiting to log in)."""

    entry: Entry | None
    shed: list[Entry]
    refused: str = ""


def prefill_charge(message: protocol.Message) -> tuple[int, str]:
    """Tokens `message` makes the companion prefill beyond a round's own work, and what they
    are: the prompt of an OpenSession, prompt and committed ids of a Resume, the committed ids
    of a Draft or RowRequest beyond the one a round carries."""
    if isinstance(message, protocol.OpenSession):
        return len(message.prompt_ids), "prompt tokens"
    if isinstance(message, protocol.Resume):
        return len(message.held_ids), "prompt tokens"
    if isinstance(message, protocol.Draft | protocol.RowRequest):
        extra = len(message.committed_ids) - FREE_COMMITTED_IDS
        return max(0, extra), f"committed tokens beyond {FREE_COMMITTED_IDS} a round"
    return 0, ""


class AdmissionGate:
    """The limits of one server (for the Ray ingress: of the whole cluster)."""

    def __init__(self, config: ServerConfig, *, descriptor_limit: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.max_connections = connection_cap(config.max_connections, descriptor_limit)
        self.max_per_address = min(config.max_connections_per_address, self.max_connections)
        self.max_unauthenticated = unauthenticated_cap(config.max_unauthenticated,
                                                       self.max_connections)
        self._connections = SessionCounter(self.max_per_address, self.max_connections)
        self._sessions = SessionCounter(config.max_sessions_per_identity, config.max_sessions)
        self._prefill = PrefillBudget(config.prefill_tokens_per_second, config.prefill_burst,
                                      clock=clock)
        # connections waiting to log in, per address, oldest first
        self._waiting: dict[str, OrderedDict[Entry, None]] = {}
        self._unauthenticated = 0
        self._lock = threading.Lock()
        self.live: set[Entry] = set()
        self.refused = 0  # connections refused at accept
        self.shed = 0  # connections closed before login to make room for newer ones

    # -- connections ---------------------------------------------------------------------------

    def connect(self, peer: str, owner: Any = None) -> Admission:
        """A connection from `peer` was accepted: admit it, or refuse it past its address's
        cap. When the pre-login pool (or the total) is full, a newcomer from an address with
        fewer connections waiting to log in than the busiest address takes the slot of that
        address's oldest; one from (one of) the busiest is refused, as is every newcomer when
        all slots are held by logged-in connections."""
        with self._lock:
            if self._connections.active(peer) >= self.max_per_address:
                self.refused += 1
                return Admission(None, [], f"{self.max_per_address} open from this address")
            shed: list[Entry] = []
            if (self._unauthenticated >= self.max_unauthenticated
                    or self._connections.active() >= self.max_connections):
                victim = self._next_to_shed()
                if victim is None:
                    self.refused += 1
                    return Admission(None, [], f"{self.max_connections} open in total, "
                                               "all logged in")
                waiting_here = len(self._waiting.get(peer, ()))
                if waiting_here >= len(self._waiting[victim.peer]):
                    self.refused += 1
                    return Admission(None, [], f"{self._unauthenticated} waiting to log in, "
                                               f"{waiting_here} of them from this address")
                self._drop(victim)
                self.shed += 1
                shed.append(victim)
            if not self._connections.acquire(peer):  # cannot happen: checked above
                raise AssertionError("a connection slot was not free after shedding")
            entry = Entry(peer, owner, self.clock(), TokenBucket(
                self.config.requests_per_second, self.config.burst, clock=self.clock))
            self._waiting.setdefault(peer, OrderedDict())[entry] = None
            self._unauthenticated += 1
            self.live.add(entry)
            return Admission(entry, shed)

    def _next_to_shed(self) -> Entry | None:
        """The oldest waiting connection of the address holding the most waiting ones (ties:
        the oldest of all), so that a device connecting during a distributed flood is shed
        only once no address holds more waiting connections than its one."""
        if not self._waiting:
            return None
        _, oldest = max(self._waiting.items(),
                        key=lambda item: (len(item[1]), -next(iter(item[1])).since))
        return next(iter(oldest))

    def logged_in(self, entry: Entry, identity: str) -> None:
        """`entry`'s Hello was accepted: it leaves the pre-login pool."""
        with self._lock:
            entry.identity = identity
            if entry.counted:
                self._stop_waiting(entry)

    def disconnect(self, entry: Entry) -> None:
        """The connection is gone: free every slot it held (idempotent)."""
        with self._lock:
            if entry.counted:
                self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        if entry.identity is None:
            self._stop_waiting(entry)
        entry.counted = False
        self._connections.release(entry.peer)
        self._release_session(entry)
        self.live.discard(entry)

    def _stop_waiting(self, entry: Entry) -> None:
        waiting = self._waiting.get(entry.peer)
        if waiting is not None and entry in waiting:
            del waiting[entry]
            self._unauthenticated -= 1
            if not waiting:
                del self._waiting[entry.peer]

    def release_session(self, entry: Entry) -> None:
        """The connection's session ended (its KV caches are freed): give its slot back."""
        with self._lock:
            self._release_session(entry)

    def _release_session(self, entry: Entry) -> None:
        if entry.session:
            entry.session = False
            self._sessions.release(entry.identity or "")

    # -- time ------------------------------------------------------------------------------------

    def wait_s(self, entry: Entry) -> float:
        """Seconds the connection may stay silent from now: idle timeout, or what is left of
        its Hello deadline."""
        if entry.identity is not None:
            return self.config.idle_timeout_s
        return max(0.0, entry.since + self.config.hello_timeout_s - self.clock())

    def timed_out(self, entry: Entry) -> Refusal:
        """What a connection silent past `wait_s` is told."""
        if entry.identity is not None:
            return Refusal(ErrorCode.TIMEOUT, "idle timeout")
        return Refusal(ErrorCode.TIMEOUT, f"no Hello within {self.config.hello_timeout_s:g} s")

    # -- frames ------------------------------------------------------------------------------

    def check(self, entry: Entry, frame: bytes | str, limits: Limits
              ) -> protocol.Message | Refusal:
        """A frame from `entry`, decoded with the connection's `limits`, or why it is refused:
        revoked token, text frame, request rate, invalid frame, prompt budget, sessions."""
        if entry.revoked:
            return Refusal(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE)
        if isinstance(frame, str):
            return Refusal(ErrorCode.BAD_FRAME, "text frames are not accepted")
        if not entry.bucket.try_acquire():
            return Refusal(ErrorCode.RATE_LIMITED, "too many requests")
        try:
            message = protocol.decode(frame, limits)
        except ProtocolError as exc:
            return Refusal(ErrorCode(exc.code), str(exc))
        if entry.identity is None:
            return message  # only a Hello is valid now: the endpoint refuses anything else
        return self._charge(entry, message) or message

    def _charge(self, entry: Entry, message: protocol.Message) -> Refusal | None:
        identity = entry.identity or ""
        tokens, what = prefill_charge(message)
        if tokens and (wait := self._prefill.wait_s(identity, tokens)) is not None:
            return Refusal(ErrorCode.RATE_LIMITED,
                           f"prompt budget exhausted: {tokens} {what}, retry in {wait:.1f} s")
        if isinstance(message, protocol.OpenSession | protocol.Resume) and not entry.session:
            with self._lock:
                if not self._sessions.acquire(identity):
                    return Refusal(ErrorCode.SESSION_LIMIT, "too many open sessions")
                entry.session = True
        return None

    def tidy(self) -> None:
        """Forget the refilled prompt budgets of identities with no live connection."""
        self._prefill.forget_full({entry.identity or "" for entry in list(self.live)})

    # -- counts ------------------------------------------------------------------------------

    def open_connections(self, address: str | None = None) -> int:
        """Connections admitted and still open, from `address` or in total."""
        return self._connections.active(address)

    def open_sessions(self, identity: str | None = None) -> int:
        return self._sessions.active(identity)

    @property
    def unauthenticated(self) -> int:
        """Connections admitted that have not logged in yet."""
        with self._lock:
            return self._unauthenticated
