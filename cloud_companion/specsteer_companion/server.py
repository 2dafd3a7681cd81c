"""The companion's websocket server: a thin asyncio adapter over `CompanionEndpoint`.

One endpoint (protocol state machine + verifier session) per connection; model work runs on a
`FairExecutor`, one queue per device, the device charged least for worker time served first, so
a device that floods frames or long prompts delays mostly itself (with batching models, one
thread per session, so that all of them can wait for the same pass). Enforced here are the
limits only an adapter can see: connections per address and in total (lowered to fit the
descriptor limit), the Hello deadline, frame size (websockets' max_size), idle time, requests
per connection, prompt tokens per device, session counts, and token revocation for live
connections. Repeated log messages are throttled (`logthrottle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from specsteer import protocol
from specsteer.errors import ProtocolError
from specsteer.protocol import ErrorCode, Limits, MessageType
from specsteer_companion import logthrottle
from specsteer_companion.batching import BatchingModel
from specsteer_companion.endpoint import Authenticator, CompanionEndpoint
from specsteer_companion.limits import (
    DEFAULT_BURST,
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    DEFAULT_MAX_SESSIONS_PER_TOKEN,
    DEFAULT_MAX_SESSIONS_TOTAL,
    DEFAULT_PREFILL_BURST,
    DEFAULT_PREFILL_TOKENS_PER_S,
    DEFAULT_RATE_PER_S,
    PrefillBudget,
    SessionCounter,
    TokenBucket,
    connection_cap,
)
from specsteer_companion.revocation import REVOKED_MESSAGE, RevocationCheck, watch_revocations
from specsteer_companion.scheduler import FairExecutor
from specsteer_companion.verifier import Verifier

log = logging.getLogger("specsteer_companion")
THROTTLE = logthrottle.Throttle()  # one per process: every server shares the log it writes to


@dataclass
class ServerConfig:
    """Network-side settings; the reason for each default is next to it in `limits`."""

    host: str = "127.0.0.1"  # loopback unless asked: the companion is a service, not a toy
    port: int = 8765
    workers: int = 2  # model threads; one per core on a small box
    idle_timeout_s: float = 120.0  # a device that says nothing for 2 min frees its KV caches
    hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    max_sessions: int = DEFAULT_MAX_SESSIONS_TOTAL
    max_sessions_per_identity: int = DEFAULT_MAX_SESSIONS_PER_TOKEN
    requests_per_second: float = DEFAULT_RATE_PER_S  # per connection
    burst: int = int(DEFAULT_BURST)
    prefill_tokens_per_second: float = DEFAULT_PREFILL_TOKENS_PER_S  # per identity
    prefill_burst: int = int(DEFAULT_PREFILL_BURST)
    revocation_check_s: float = 2.0  # how often live connections' tokens are re-checked
    limits: Limits | None = None


@dataclass(eq=False)
class _Live:
    """One open connection as the server tracks it."""

    ws: ServerConnection
    endpoint: CompanionEndpoint
    key: str  # the scheduling queue before login: the peer address
    busy: bool = False  # a frame of it is being handled on a worker thread
    revoked: bool = False

    @property
    def identity(self) -> str | None:
        return self.endpoint.identity


def _descriptor_limit() -> int | None:
    """The process's soft `ulimit -n`, None when unlimited or unknown (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def prompt_tokens(frame: bytes, limits: Limits) -> int:
    """Tokens an OpenSession or Resume frame asks to prefill, 0 for any other (or malformed)."""
    if len(frame) < 2 or frame[1] not in (MessageType.OPEN_SESSION, MessageType.RESUME):
        return 0
    try:
        message = protocol.decode(frame, limits)
    except ProtocolError:
        return 0  # the endpoint will refuse it with the right code
    if isinstance(message, protocol.Resume):
        return len(message.held_ids)
    return len(message.prompt_ids) if isinstance(message, protocol.OpenSession) else 0


def prefill_refusal(budget: PrefillBudget, identity: str, tokens: int) -> str | None:
    """None if `identity` may prefill `tokens` prompt tokens now, else what to tell it."""
    wait = budget.wait_s(identity, tokens)
    if wait is None:
        return None
    return f"prompt budget exhausted: {tokens} prompt tokens, retry in {wait:.1f} s"


class CompanionServer:
    """Serve one Verifier to many devices over websockets."""

    def __init__(self, verifier: Verifier, config: ServerConfig | None = None, *,
                 authenticate: Authenticator | None = None,
                 check_revoked: RevocationCheck | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.verifier = verifier
        self.config = config or ServerConfig()
        self.authenticate = authenticate
        self.check_revoked = check_revoked
        self.ssl_context = ssl_context
        self.limits = self.config.limits or Limits()
        self._pool = FairExecutor(self.pool_size, name="verify")
        self._sessions = SessionCounter(max_per_token=self.config.max_sessions_per_identity,
                                        max_total=self.config.max_sessions)
        self.max_connections = connection_cap(self.config.max_connections, _descriptor_limit())
        self._connections = SessionCounter(
            max_per_token=min(self.config.max_connections_per_address, self.max_connections),
            max_total=self.max_connections)
        self._prefill = PrefillBudget(self.config.prefill_tokens_per_second,
                                      self.config.prefill_burst)
        self._live: set[_Live] = set()
        self.port: int | None = None
        self.connections = 0  # handled (admitted and logged in or not) since start
        self.refused = 0  # connections closed at accept by the per-address or total cap

    @property
    def pool_size(self) -> int:
        """Threads that run frames: `workers`, or one per session when the models batch.

        With `BatchingModel`s or an engine that batches sessions itself (vLLM) a frame's thread
        mostly waits for a shared pass, so every session must be able to wait at once, or
        passes could never be larger than `workers`.
        """
        models = (self.verifier.generalist, self.verifier.specialist)
        if any(isinstance(m, BatchingModel) or getattr(m, "batches_sessions", False)
               for m in models):
            return max(self.config.workers, self.config.max_sessions)
        return self.config.workers

    def open_connections(self, address: str | None = None) -> int:
        """Connections admitted and still open, from `address` or in total."""
        return self._connections.active(address)

    def _session_quota(self, identity: str, opening: bool) -> bool:
        if opening:
            return self._sessions.acquire(identity)
        self._sessions.release(identity)
        return True

    # -- admission at accept ---------------------------------------------------------------

    def _connection_class(self) -> type[ServerConnection]:
        server = self

        class AdmittedConnection(ServerConnection):
            """Counts itself against the caps as soon as the socket is accepted."""

            peer = ""
            admitted = False
            accepted_at = 0.0

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                self.accepted_at = time.monotonic()
                peername = transport.get_extra_info("peername")
                self.peer = str(peername[0]) if peername else "?"
                self.admitted = server._connections.acquire(self.peer)
                if not self.admitted:
                    server.refused += 1
                    per_address = server._connections.max_per_token
                    why = (f"{per_address} open from this address"
                           if server._connections.active(self.peer) >= per_address
                           else f"{server.max_connections} open in total")
                    log.warning("refused a connection from %s: %s", self.peer, why)
                    transport.abort()

            def connection_lost(self, exc: Exception | None) -> None:
                if self.admitted:
                    self.admitted = False
                    server._connections.release(self.peer)
                super().connection_lost(exc)

        return AdmittedConnection

    # -- budgets -----------------------------------------------------------------------------

    def _forget_full_buckets(self) -> None:
        self._prefill.forget_full({conn.endpoint.identity or "" for conn in self._live})

    # -- one connection ----------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        endpoint = CompanionEndpoint(self.verifier, authenticate=self.authenticate,
                                     limits=self.limits, on_session=self._session_quota)
        bucket = TokenBucket(rate=self.config.requests_per_second, burst=self.config.burst)
        peer = getattr(ws, "peer", "?")
        conn = _Live(ws, endpoint, key=f"address:{peer}")
        hello_deadline = getattr(ws, "accepted_at", time.monotonic()) + self.config.hello_timeout_s
        self.connections += 1
        self._live.add(conn)
        try:
            while not endpoint.closed:
                logged_in = endpoint.identity is not None
                timeout = (self.config.idle_timeout_s if logged_in
                           else max(0.0, hello_deadline - time.monotonic()))
                try:
                    frame = await asyncio.wait_for(ws.recv(), timeout)
                except TimeoutError:
                    why = ("idle timeout" if logged_in
                           else f"no Hello within {self.config.hello_timeout_s:g} s")
                    replies = endpoint.fail(ErrorCode.TIMEOUT, why)
                else:
                    replies = await self._reply(conn, bucket, frame)
                if conn.revoked and not endpoint.closed:
                    replies += endpoint.fail(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE)
                for reply in replies:
                    await ws.send(reply)
        except ConnectionClosed:
            pass
        finally:
            self._live.discard(conn)
            endpoint.release()
            await ws.close()

    async def _reply(self, conn: _Live, bucket: TokenBucket, frame: str | bytes) -> list[bytes]:
        endpoint = conn.endpoint
        if conn.revoked:
            return endpoint.fail(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE)
        if isinstance(frame, str):
            return endpoint.fail(ErrorCode.BAD_FRAME, "text frames are not accepted")
        if not bucket.try_acquire():
            return endpoint.fail(ErrorCode.RATE_LIMITED, "too many requests")
        identity = endpoint.identity
        prefill = prompt_tokens(frame, self.limits) if identity is not None else 0
        if prefill and (why := prefill_refusal(self._prefill, identity or "", prefill)):
            return endpoint.fail(ErrorCode.RATE_LIMITED, why)
        conn.busy = True
        try:
            job = self._pool.submit(identity or conn.key, partial(endpoint.handle, frame))
            return await asyncio.wrap_future(job)
        finally:
            conn.busy = False

    # -- revocation --------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Every `revocation_check_s`: end connections whose token was revoked, tidy budgets."""
        await watch_revocations(lambda: self._live, self.check_revoked,
                                self.config.revocation_check_s, self._end_revoked,
                                tidy=self._forget_full_buckets)

    async def _end_revoked(self, conn: _Live) -> None:
        with contextlib.suppress(ConnectionClosed):
            for reply in conn.endpoint.fail(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE):
                await conn.ws.send(reply)
        await conn.ws.close()

    # -- running -----------------------------------------------------------------------------

    async def serve(self, ready: Callable[[int], None] | None = None,
                    stop: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set (forever when None)."""
        logthrottle.install(THROTTLE)
        asyncio.get_running_loop().set_exception_handler(_out_of_descriptors_quietly)
        watcher = asyncio.create_task(self._watch())
        try:
            async with serve(self._handle, self.config.host, self.config.port,
                             ssl=self.ssl_context, create_connection=self._connection_class(),
                             open_timeout=self.config.hello_timeout_s,
                             max_size=self.limits.max_message_bytes, compression=None,
                             ping_interval=20, ping_timeout=20) as server:
                self.port = next(iter(server.sockets)).getsockname()[1]
                log.info("companion listening on %s:%s (at most %d connections, %d per address)",
                         self.config.host, self.port, self.max_connections,
                         self._connections.max_per_token)
                if ready is not None:
                    ready(self.port)
                await (stop.wait() if stop is not None else asyncio.Future())
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        """Run in a background thread (tests, demos); yields the ws:// or wss:// URL."""
        started = threading.Event()
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()

        failed: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.serve(lambda _port: started.set(), stop))
            except BaseException as exc:  # surfaced to the caller below, not lost in the thread
                failed.append(exc)
                started.set()

        thread = threading.Thread(target=run, name="companion", daemon=True)
        thread.start()
        if not started.wait(60):
            raise RuntimeError("the companion server did not start within 60 s")
        if failed:
            raise RuntimeError("the companion server failed to start") from failed[0]
        scheme = "wss" if self.ssl_context else "ws"
        try:
            yield f"{scheme}://{self.config.host}:{self.port}"
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)


_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _out_of_descriptors_quietly(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """asyncio's accept loop hit the descriptor limit (it pauses accepting for a second and
    retries): one throttled line instead of a traceback per refused connection."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRORS:
        log.warning("out of file descriptors (%s): refusing connections for a moment",
                    exc.strerror)
        return
    loop.default_exception_handler(context)

