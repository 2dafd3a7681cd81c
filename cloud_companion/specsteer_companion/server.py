"""The companion's websocket server: a thin asyncio adapter over `CompanionEndpoint`.

One endpoint (protocol state machine + verifier session) per connection; model work runs in a
thread pool so many devices progress while one is being verified (with batching models, one
thread per session, so that all of them can wait for the same pass). Limits enforced here are the
ones only an adapter can see: frame size (websockets' max_size), idle time, request rate and
session counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from specsteer.protocol import ErrorCode, Limits
from specsteer_companion.batching import BatchingModel
from specsteer_companion.endpoint import Authenticator, CompanionEndpoint
from specsteer_companion.limits import SessionCounter, TokenBucket
from specsteer_companion.verifier import Verifier

log = logging.getLogger("specsteer_companion")


@dataclass
class ServerConfig:
    """Network-side settings with the reason for each default."""

    host: str = "127.0.0.1"  # loopback unless asked: the companion is a service, not a toy
    port: int = 8765
    workers: int = 2  # model threads; one per core on a small box
    idle_timeout_s: float = 120.0  # a device that says nothing for 2 min frees its KV caches
    max_sessions: int = 64  # KV caches cost ~60 KB/token each for the 1.5B: bound the total
    max_sessions_per_identity: int = 4
    requests_per_second: float = 200.0  # per connection; a honest device needs < 50
    burst: int = 400
    limits: Limits | None = None


class CompanionServer:
    """Serve one Verifier to many devices over websockets."""

    def __init__(self, verifier: Verifier, config: ServerConfig | None = None, *,
                 authenticate: Authenticator | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.verifier = verifier
        self.config = config or ServerConfig()
        self.authenticate = authenticate
        self.ssl_context = ssl_context
        self.limits = self.config.limits or Limits()
        self._pool = ThreadPoolExecutor(max_workers=self.pool_size, thread_name_prefix="verify")
        self._sessions = SessionCounter(max_per_token=self.config.max_sessions_per_identity,
                                        max_total=self.config.max_sessions)
        self.port: int | None = None
        self.connections = 0

    @property
    def pool_size(self) -> int:
        """Threads that run frames: `workers`, or one per session when the models batch.

        With `BatchingModel`s a frame's thread mostly waits for a shared pass, so every session
        must be able to wait at once, or passes could never be larger than `workers`.
        """
        models = (self.verifier.generalist, self.verifier.specialist)
        if any(isinstance(m, BatchingModel) for m in models):
            return max(self.config.workers, self.config.max_sessions)
        return self.config.workers

    def _session_quota(self, identity: str, opening: bool) -> bool:
        if opening:
            return self._sessions.acquire(identity)
        self._sessions.release(identity)
        return True

    async def _handle(self, ws: ServerConnection) -> None:
        endpoint = CompanionEndpoint(self.verifier, authenticate=self.authenticate,
                                     limits=self.limits, on_session=self._session_quota)
        bucket = TokenBucket(rate=self.config.requests_per_second, burst=self.config.burst)
        loop = asyncio.get_running_loop()
        self.connections += 1
        try:
            while not endpoint.closed:
                try:
                    frame = await asyncio.wait_for(ws.recv(), self.config.idle_timeout_s)
                except TimeoutError:
                    replies = endpoint.fail(ErrorCode.TIMEOUT, "idle timeout")
                else:
                    if isinstance(frame, str):
                        replies = endpoint.fail(ErrorCode.BAD_FRAME, "text frames are not accepted")
                    elif not bucket.try_acquire():
                        replies = endpoint.fail(ErrorCode.RATE_LIMITED, "too many requests")
                    else:
                        replies = await loop.run_in_executor(self._pool, endpoint.handle, frame)
                for reply in replies:
                    await ws.send(reply)
        except ConnectionClosed:
            pass
        finally:
            endpoint.release()
            await ws.close()

    async def serve(self, ready: Callable[[int], None] | None = None,
                    stop: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set (forever when None)."""
        async with serve(self._handle, self.config.host, self.config.port, ssl=self.ssl_context,
                         max_size=self.limits.max_message_bytes, compression=None,
                         ping_interval=20, ping_timeout=20) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            log.info("companion listening on %s:%s", self.config.host, self.port)
            if ready is not None:
                ready(self.port)
            await (stop.wait() if stop is not None else asyncio.Future())

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        """Run in a background thread (tests, demos); yields the ws:// or wss:// URL."""
        started = threading.Event()
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.serve(lambda _port: started.set(), stop))

        thread = threading.Thread(target=run, name="companion", daemon=True)
        thread.start()
        if not started.wait(30):
            raise RuntimeError("the companion server did not start")
        scheme = "wss" if self.ssl_context else "ws"
        try:
            yield f"{scheme}://{self.config.host}:{self.port}"
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)
