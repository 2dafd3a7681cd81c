"""Fault-injection proxy: a websocket relay between an app and a companion that makes the link
slow, lossy, stalled or dead on purpose (`specsteer-companion proxy`, docs/robustness.md).

It works on websocket frames (messages), not TCP bytes: every frame the app or the companion
sends is received whole, held for `delay ± jitter`, and then forwarded, dropped (probability
`drop`), or kept back forever once the connection is `stall_after` seconds old; `cut_at` seconds
after a connection opened, both of its sides are aborted (TCP reset, no closing handshake: a dead
link, not a polite goodbye). A dropped frame is therefore a lost protocol message that the
device must notice by its own timeout, as on a link whose messages go missing. Frames keep their
order in each direction (jitter never reorders: a websocket runs over one ordered stream).
`FaultProxy.set_online(False)` cuts every connection and refuses new ones (HTTP 503) until
`set_online(True)`: the switch the sample apps' browser tests use. This module owns the relay and
its fault model; the command line lives in `cli.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds from '80ms', '1.5s', '2m' or a bare number of seconds; ValueError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (examples: 80ms, 1.5s, 2m)")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def parse_fraction(text: str) -> float:
    """A probability from '1%' or '0.01'; ValueError outside 0..1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"not a probability: {text!r} (examples: 1%, 0.01)") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"probability {text!r} is outside 0..100 %")
    return value


@dataclass(frozen=True)
class Faults:
    """What the proxy does to every connection (times in seconds from the connection's start)."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    drop: float = 0.0
    stall_after_s: float | None = None
    cut_at_s: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0:
            raise ValueError("delay and jitter must be >= 0")
        if not 0.0 <= self.drop <= 1.0:
            raise ValueError("drop must be a probability in 0..1")
        for name in ("stall_after_s", "cut_at_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")


@dataclass
class ProxyStats:
    """Frames seen per fate, both directions together."""

    connections: int = 0
    forwarded: int = 0
    dropped: int = 0
    stalled: int = 0
    cut: int = 0
    refused: int = 0


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Relay:
    """One app connection and its upstream twin."""

    app: ServerConnection
    upstream: ClientConnection
    started: float
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for side in (self.app, self.upstream):
            transport = side.transport
            if transport is not None:
                transport.abort()


class FaultProxy:
    """A websocket relay from `listen` to `upstream` applying `faults` (asyncio).

    `start()` binds (port 0 picks a free one; see `url`), `close()` stops it and every relay.
    """

    def __init__(self, upstream: str, faults: Faults = Faults(), *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if not upstream.startswith(("ws://", "wss://")):
            raise ValueError(f"upstream must be a ws:// or wss:// URL, got {upstream!r}")
        self.upstream = upstream
        self.faults = faults
        self.host = host
        self.port = port
        self.stats = ProxyStats()
        self._random = random.Random(faults.seed)
        self._online = True
        self._relays: set[_Relay] = set()
        self._server: Server | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    @property
    def online(self) -> bool:
        return self._online

    async def start(self) -> None:
        self._server = await serve(self._relay, self.host, self.port, max_size=None,
                                   process_request=self._admit, ping_interval=None)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._cut_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def set_online(self, online: bool) -> None:
        """Offline: cut every relay now and refuse new connections; online: accept again."""
        self._online = online
        if not online:
            self._cut_all()

    def _cut_all(self) -> None:
        for relay in list(self._relays):
            self.stats.cut += 1
            relay.abort()

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        if self._online:
            return None
        self.stats.refused += 1
        return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "proxy is offline\n")

    async def _relay(self, app: ServerConnection) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream = await connect(self.upstream, max_size=None, ping_interval=None,
                                     open_timeout=10)
        except Exception:  # refused, unreachable, timed out: tell the app the same way
            await app.close(1011, "upstream unreachable")
            return
        relay = _Relay(app, upstream, loop.time())
        if not self._online:  # went offline while the upstream connection was being made
            self.stats.cut += 1
            relay.abort()
            return
        self._relays.add(relay)
        self.stats.connections += 1
        relay.tasks = [asyncio.create_task(self._pump(relay, app, upstream)),
                       asyncio.create_task(self._pump(relay, upstream, app))]
        if self.faults.cut_at_s is not None:
            relay.tasks.append(asyncio.create_task(self._cut_later(relay)))
        try:
            await asyncio.wait(relay.tasks[:2], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in relay.tasks:
                task.cancel()
            self._relays.discard(relay)
            for side in (app, upstream):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(side.close(), 2)

    async def _cut_later(self, relay: _Relay) -> None:
        assert self.faults.cut_at_s is not None
        await asyncio.sleep(self.faults.cut_at_s)
        self.stats.cut += 1
        relay.abort()

    async def _pump(self, relay: _Relay, source: Any, sink: Any) -> None:
        """Read frames from `source`; forward each after its delay, in order, or lose it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, str | bytes]] = asyncio.Queue()
        faults = self.faults

        async def send() -> None:
            while True:
                release_at, frame = await queue.get()
                await asyncio.sleep(max(0.0, release_at - loop.time()))
                try:
                    await sink.send(frame)
                except ConnectionClosed:
                    return  # the other side is gone: the relay ends with the reading side
                self.stats.forwarded += 1
                queue.task_done()

        sender = asyncio.create_task(send())
        last_release = 0.0
        try:
            async for frame in source:
                now = loop.time()
                if faults.stall_after_s is not None and now - relay.started >= faults.stall_after_s:
                    self.stats.stalled += 1
                    continue
                if faults.drop and self._random.random() < faults.drop:
                    self.stats.dropped += 1
                    continue
                jitter = self._random.uniform(-faults.jitter_s, faults.jitter_s)
                last_release = max(last_release, now + max(0.0, faults.delay_s + jitter))
                queue.put_nowait((last_release, frame))
                if sender.done():
                    break
        except ConnectionClosed:
            pass
        finally:
            # let frames already in flight arrive (a delayed close must not eat them)
            drained = asyncio.create_task(queue.join())
            await asyncio.wait([drained, sender], timeout=faults.delay_s + faults.jitter_s + 1,
                               return_when=asyncio.FIRST_COMPLETED)
            drained.cancel()
            sender.cancel()
            await asyncio.gather(drained, sender, return_exceptions=True)


class ProxyThread:
    """A FaultProxy on its own event loop thread, for synchronous programs and tests.

    `with ProxyThread(upstream, faults) as proxy: ... proxy.url ... proxy.set_online(False)`.
    """

    def __init__(self, upstream: str, faults: Faults = Faults(), *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.proxy = FaultProxy(upstream, faults, host=host, port=port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy",
                                        daemon=True)

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def stats(self) -> ProxyStats:
        return self.proxy.stats

    def start(self) -> ProxyThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        return self

    def set_online(self, online: bool) -> None:
        self._loop.call_soon_threadsafe(self.proxy.set_online, online)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def run_proxy(upstream: str, faults: Faults, host: str, port: int,
                    ready: Any = print) -> None:
    """Serve until cancelled (the command line's loop); `ready` gets the listening line."""
    proxy = FaultProxy(upstream, faults, host=host, port=port)
    await proxy.start()
    ready(f"specsteer-companion proxy listening on {proxy.url} -> {upstream}")
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.close()
