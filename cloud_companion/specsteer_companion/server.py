"""The companion's websocket server: a thin asyncio adapter over `AdmissionGate` and
`CompanionEndpoint`.

One endpoint (protocol state machine + verifier session) per connection; model work runs on a
`FairExecutor`, one queue per device, the device charged least for worker time served first, so
a device that floods frames or long prompts delays mostly itself (with batching models, one
thread per session, so that all of them can wait for the same pass). What a connection may do
is the gate's to say (`admission`: connections per address, in total and before login, the
Hello deadline, idle time, requests per connection, prompt tokens per device, session counts);
this adapter tells it what happens on the sockets, closes what it sheds or refuses, enforces
the frame size (websockets' max_size) and ends the connections of revoked tokens. Repeated log
messages are throttled (`logthrottle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from specsteer.protocol import ErrorCode, Limits
from specsteer_companion import logthrottle
from specsteer_companion.admission import AdmissionGate, Entry, Refusal, ServerConfig
from specsteer_companion.batching import BatchingModel
from specsteer_companion.endpoint import Authenticator, CompanionEndpoint
from specsteer_companion.limits import ACCEPT_BATCH, LISTEN_BACKLOG
from specsteer_companion.revocation import REVOKED_MESSAGE, RevocationCheck, watch_revocations
from specsteer_companion.scheduler import FairExecutor
from specsteer_companion.verifier import Verifier

__all__ = ["THROTTLE", "CompanionServer", "ServerConfig"]

log = logging.getLogger("specsteer_companion")
THROTTLE = logthrottle.Throttle()  # one per process: every server shares the log it writes to
# What `asyncio.wait_for` raises at its deadline: `asyncio.TimeoutError`, an alias of the
# builtin only from Python 3.11 on (the floor of this package); both named so a timeout is
# never mistaken for a crash.
TIMEOUTS = (TimeoutError, asyncio.TimeoutError)


def _descriptor_limit() -> int | None:
    """The process's soft `ulimit -n`, None when unlimited or unknown (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class CompanionServer:
    """Serve one Verifier to many devices over websockets."""

    def __init__(self, verifier: Verifier, config: ServerConfig | None = None, *,
                 authenticate: Authenticator | None = None,
                 check_revoked: RevocationCheck | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.verifier = verifier
        self.config = config or ServerConfig()
        self.authenticate = authenticate
        self.check_revoked = check_revoked
        self.ssl_context = ssl_context
        self.limits = self.config.limits or Limits()
        self._pool = FairExecutor(self.pool_size, name="verify")
        self.gate = AdmissionGate(self.config, descriptor_limit=_descriptor_limit(), clock=clock)
        self.port: int | None = None
        self.connections = 0  # handled (admitted and logged in or not) since start

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

    @property
    def max_connections(self) -> int:
        return self.gate.max_connections

    @property
    def refused(self) -> int:
        """Connections closed at accept by the per-address cap or a total of logged-in ones."""
        return self.gate.refused

    def open_connections(self, address: str | None = None) -> int:
        """Connections admitted and still open, from `address` or in total."""
        return self.gate.open_connections(address)

    def open_sessions(self) -> int:
        return self.gate.open_sessions()

    # -- admission at accept ---------------------------------------------------------------

    def _connection_class(self) -> type[ServerConnection]:
        gate = self.gate

        class AdmittedConnection(ServerConnection):
            """Reports itself to the gate as soon as the socket is accepted."""

            entry: Entry | None = None
            endpoint: CompanionEndpoint | None = None  # once the websocket handshake is done

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                peername = transport.get_extra_info("peername")
                peer = str(peername[0]) if peername else "?"
                admission = gate.connect(peer, owner=self)
                for shed in admission.shed:
                    log.warning("closed a connection from %s that had not logged in, to make "
                                "room for a new one (%d waiting)", shed.peer, gate.unauthenticated)
                    shed.owner.transport.abort()
                self.entry = admission.entry
                if self.entry is None:
                    log.warning("refused a connection from %s: %s", peer, admission.refused)
                    transport.abort()

            def connection_lost(self, exc: Exception | None) -> None:
                if self.entry is not None:
                    gate.disconnect(self.entry)
                super().connection_lost(exc)

        return AdmittedConnection

    # -- one connection ----------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        entry: Entry | None = getattr(ws, "entry", None)
        if entry is None or not entry.counted:  # refused or shed during the handshake
            return
        endpoint = CompanionEndpoint(self.verifier, authenticate=self.authenticate,
                                     limits=self.limits)
        ws.endpoint = endpoint  # type: ignore[attr-defined]
        self.connections += 1
        try:
            while not endpoint.closed:
                try:
                    frame = await asyncio.wait_for(ws.recv(), self.gate.wait_s(entry))
                except TIMEOUTS:
                    replies = endpoint.fail(*self.gate.timed_out(entry))
                else:
                    replies = await self._reply(entry, endpoint, frame)
                if entry.revoked and not endpoint.closed:
                    replies += endpoint.fail(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE)
                for reply in replies:
                    await ws.send(reply)
        except ConnectionClosed:
            pass
        finally:
            endpoint.release()
            self.gate.release_session(entry)
            await ws.close()

    async def _reply(self, entry: Entry, endpoint: CompanionEndpoint,
                     frame: str | bytes) -> list[bytes]:
        checked = self.gate.check(entry, frame, endpoint.conn.limits)
        if isinstance(checked, Refusal):
            return endpoint.fail(*checked)
        entry.busy = True
        try:
            job = self._pool.submit(entry.identity or f"address:{entry.peer}",
                                    partial(endpoint.handle_message, checked, len(frame)))
            replies = await asyncio.wrap_future(job)
        finally:
            entry.busy = False
        if entry.identity is None and endpoint.identity is not None and not endpoint.closed:
            self.gate.logged_in(entry, endpoint.identity)
        return replies

    # -- revocation --------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Every `revocation_check_s`: end connections whose token was revoked, tidy budgets."""
        await watch_revocations(lambda: list(self.gate.live), self.check_revoked,
                                self.config.revocation_check_s, self._end_revoked,
                                tidy=self.gate.tidy)

    async def _end_revoked(self, entry: Entry) -> None:
        ws = entry.owner
        with contextlib.suppress(ConnectionClosed):
            for reply in ws.endpoint.fail(ErrorCode.AUTH_FAILED, REVOKED_MESSAGE):
                await ws.send(reply)
        await ws.close()

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
                             ping_interval=20, ping_timeout=20,
                             backlog=ACCEPT_BATCH) as server:
                _queue_more_than_a_batch(server.sockets)
                self.port = next(iter(server.sockets)).getsockname()[1]
                log.info("companion listening on %s:%s (at most %d connections, %d per address, "
                         "%d before login)", self.config.host, self.port,
                         self.gate.max_connections, self.gate.max_per_address,
                         self.gate.max_unauthenticated)
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


def _queue_more_than_a_batch(sockets: Iterable[socket.socket]) -> None:
    """asyncio uses one number as the listen backlog and the accept batch: listen again with
    `LISTEN_BACKLOG` (on a duplicate of each descriptor: the same socket) so that a flood's
    pending connects do not fill the kernel's queue and drop a device's."""
    for listening in sockets:
        with socket.fromfd(listening.fileno(), listening.family, listening.type) as same:
            same.listen(LISTEN_BACKLOG)


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

