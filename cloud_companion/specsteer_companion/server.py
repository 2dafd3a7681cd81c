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
import json
import logging
import socket
import ssl
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from http import HTTPStatus
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from specsteer.protocol import ErrorCode, Limits, Message
from specsteer_companion import logthrottle
from specsteer_companion.admission import AdmissionGate, Entry, Refusal, ServerConfig
from specsteer_companion.batching import BatchingModel
from specsteer_companion.endpoint import Authenticator, CompanionEndpoint
from specsteer_companion.limits import ACCEPT_BATCH, LISTEN_BACKLOG
from specsteer_companion.revocation import REVOKED_MESSAGE, RevocationCheck, watch_revocations
from specsteer_companion.scheduler import FairExecutor
from specsteer_companion.verifier import Verifier

__all__ = ["THROTTLE", "CompanionServer", "FrontEndpoint", "ServerConfig", "WebSocketFront"]

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


class FrontEndpoint(Protocol):
    """What a server's connection loop needs of the side that answers a connection's frames
    (`CompanionEndpoint`, or the Ray ingress's handle on a verifier replica)."""

    identity: str | None  # the device's, once its Hello was accepted
    close_code: int  # the websocket close code once closed (1000; 1011: resume elsewhere)
    close_reason: str

    @property
    def closed(self) -> bool: ...

    @property
    def frame_limits(self) -> Limits:
        """What the next frame is decoded with (the vocabulary is known after the Hello)."""
        ...

    def fail(self, code: ErrorCode, message: str) -> list[bytes]:
        """Close from the server's side: the Error frame to send."""
        ...

    def release(self) -> None:
        """The connection is gone: free what it held."""
        ...


class AdmittedConnection(ServerConnection):
    """Reports itself to the gate as soon as the TCP socket is accepted, before any TLS
    handshake: a socket that never starts one is counted, capped and shed like any
    other that has not logged in (asyncio's own TLS would hand it over only after the
    handshake, so a flood of silent sockets would hold descriptors beyond every cap)."""

    # bound per server by `WebSocketFront._connection_class`
    admission_gate: AdmissionGate
    tls_context: ssl.SSLContext | None = None
    tls_handshake_s: float = 5.0
    entry: Entry | None = None
    endpoint: FrontEndpoint | None = None  # once the websocket handshake is done
    raw: asyncio.BaseTransport | None = None  # the TCP transport, under any TLS
    made = False  # the websocket connection has its transport (after any TLS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.early: list[bytes | None] = []  # data (None: EOF) before `made`

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if peername else "?"
        admission = self.admission_gate.connect(peer, owner=self)
        for shed in admission.shed:
            log.warning("closed a connection from %s that had not logged in, to make "
                        "room for a new one (%d waiting)", shed.peer,
                        self.admission_gate.unauthenticated)
            shed.owner.abort()
        self.entry = admission.entry
        if self.entry is None:
            log.warning("refused a connection from %s: %s", peer, admission.refused)
            transport.abort()
        elif self.tls_context is None:
            self._made(transport)
        else:  # no byte may reach this protocol before TLS takes the transport over
            transport.pause_reading()  # type: ignore[attr-defined]
            self.securing = asyncio.ensure_future(self._secure(transport))

    async def _secure(self, transport: asyncio.BaseTransport) -> None:
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport, self, self.tls_context, server_side=True,  # type: ignore[arg-type]
                ssl_handshake_timeout=self.tls_handshake_s, ssl_shutdown_timeout=10)
        except (OSError, ssl.SSLError, *TIMEOUTS) as exc:  # a handshake that failed
            log.debug("TLS handshake failed: %r", exc)
            self.abort()
            return
        if secure is None or self.entry is None or not self.entry.counted:
            self.abort()  # shed while it shook hands
            return
        self._made(secure)

    def _made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True
        super().connection_made(transport)
        early, self.early = self.early, []
        for data in early:  # what TLS delivered before its handshake's waiter woke us
            if data is None:
                super().eof_received()
            else:
                super().data_received(data)

    def abort(self) -> None:
        """Close at once, whatever the handshake has reached."""
        if self.entry is not None:
            self.admission_gate.disconnect(self.entry)
        if self.made:
            self.transport.abort()
        elif self.raw is not None:
            self.raw.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.entry is not None:
            self.admission_gate.disconnect(self.entry)
        if self.made:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.made:
            super().data_received(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool | None:
        if self.made:
            return super().eof_received()
        self.early.append(None)
        return None


class WebSocketFront(ABC):
    """What every companion server does with sockets: admission at accept (`AdmissionGate`),
    the life of one device websocket (the Hello deadline, idle time, each frame through the
    gate, the replies back), revocation, and serving until stopped. Where a frame's answer
    comes from is the subclass's: an endpoint in this process (`CompanionServer`), or the
    verifier replica holding the connection (`ray_app`'s ingress). `http_stats`: what a plain
    GET /stats answers (None: no such page)."""

    def __init__(self, config: ServerConfig | None = None, *,
                 check_revoked: RevocationCheck | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or ServerConfig()
        self.check_revoked = check_revoked
        self.ssl_context = ssl_context
        self.limits = self.config.limits or Limits()
        self.gate = AdmissionGate(self.config, descriptor_limit=_descriptor_limit(), clock=clock)
        self.port: int | None = None
        self.listening = False  # from the socket's bind until `serve` returns
        self.connections = 0  # handled (admitted and logged in or not) since start
        self.http_stats: Callable[[], dict[str, object]] | None = None

    # share the port with another server of this user (SO_REUSEPORT): the Ray ingress's next
    # replica binds it while the one it replaces still serves; off for `serve`, where a second
    # companion on the same port is a mistake to report
    reuse_port = False

    @abstractmethod
    def endpoint(self) -> FrontEndpoint:
        """A new connection's answering side."""

    @abstractmethod
    async def answer(self, entry: Entry, endpoint: FrontEndpoint, message: Message,
                     size: int) -> list[bytes]:
        """The frames that answer `message` (admitted by the gate) on `endpoint`."""

    async def stopped(self) -> None:  # noqa: B027 - a hook: most fronts keep nothing to finish
        """The server stopped listening: finish what is in flight."""

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
        """`AdmittedConnection` bound to this front's gate and TLS settings."""
        return type("AdmittedConnection", (AdmittedConnection,), {
            "admission_gate": self.gate, "tls_context": self.ssl_context,
            "tls_handshake_s": self.config.hello_timeout_s})

    # -- one connection ----------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        entry: Entry | None = getattr(ws, "entry", None)
        if entry is None or not entry.counted:  # refused or shed during the handshake
            return
        endpoint = self.endpoint()
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
            await ws.close(endpoint.close_code, endpoint.close_reason)

    async def _reply(self, entry: Entry, endpoint: FrontEndpoint,
                     frame: str | bytes) -> list[bytes]:
        checked = self.gate.check(entry, frame, endpoint.frame_limits)
        if isinstance(checked, Refusal):
            return endpoint.fail(*checked)
        entry.busy = True
        try:
            replies = await self.answer(entry, endpoint, checked, len(frame))
        finally:
            entry.busy = False
        if entry.identity is None and endpoint.identity is not None and not endpoint.closed:
            self.gate.logged_in(entry, endpoint.identity)
        return replies

    def _stats_page(self, connection: ServerConnection, request: Request) -> Response | None:
        """A plain GET /stats (no websocket upgrade) answered with `http_stats()` as JSON."""
        if self.http_stats is None or request.path != "/stats" \
                or "upgrade" in request.headers.get("Connection", "").lower():
            return None
        entry: Entry | None = getattr(connection, "entry", None)
        if entry is not None:  # the page counts the devices' connections, not itself
            self.gate.disconnect(entry)
        response = connection.respond(HTTPStatus.OK, json.dumps(self.http_stats()) + "\n")
        del response.headers["Content-Type"]  # websockets' Headers adds, not replaces
        response.headers["Content-Type"] = "application/json"
        return response

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
                             create_connection=self._connection_class(),  # its own TLS
                             process_request=self._stats_page, reuse_port=self.reuse_port,
                             open_timeout=self.config.hello_timeout_s,
                             max_size=self.limits.max_message_bytes, compression=None,
                             ping_interval=20, ping_timeout=20,
                             backlog=ACCEPT_BATCH) as server:
                _queue_more_than_a_batch(server.sockets)
                self.port = next(iter(server.sockets)).getsockname()[1]
                self.listening = True
                log.info("companion listening on %s:%s (at most %d connections, %d per address, "
                         "%d before login)", self.config.host, self.port,
                         self.gate.max_connections, self.gate.max_per_address,
                         self.gate.max_unauthenticated)
                if ready is not None:
                    ready(self.port)
                await (stop.wait() if stop is not None else asyncio.Future())
        finally:
            self.listening = False
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self.stopped()

    @contextlib.contextmanager
    def running(self, new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
                ) -> Iterator[str]:
        """Run in a background thread (tests, demos, the Ray ingress) on a loop from
        `new_loop`; yields the ws:// or wss:// URL."""
        started = threading.Event()
        loop = new_loop()
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


class CompanionServer(WebSocketFront):
    """Serve one Verifier to many devices over websockets: an endpoint per connection in this
    process, its model work on the `FairExecutor`."""

    def __init__(self, verifier: Verifier, config: ServerConfig | None = None, *,
                 authenticate: Authenticator | None = None,
                 check_revoked: RevocationCheck | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, check_revoked=check_revoked, ssl_context=ssl_context,
                         clock=clock)
        self.verifier = verifier
        self.authenticate = authenticate
        self._pool = FairExecutor(self.pool_size, name="verify")

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

    def endpoint(self) -> CompanionEndpoint:
        return CompanionEndpoint(self.verifier, authenticate=self.authenticate,
                                 limits=self.limits)

    async def answer(self, entry: Entry, endpoint: FrontEndpoint, message: Message,
                     size: int) -> list[bytes]:
        assert isinstance(endpoint, CompanionEndpoint)
        job = self._pool.submit(entry.identity or f"address:{entry.peer}",
                                partial(endpoint.handle_message, message, size))
        return await asyncio.wrap_future(job)

    async def stopped(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)


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

