"""The fault-injection proxy through real sockets: delay, order under jitter, drop, stall, cut,
the offline switch, its command line, and a real companion behind it (degrade, then resume)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from specsteer.client import Client
from specsteer.device import ModeChange, OfflinePolicy
from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.process import start_companion
from specsteer_companion.proxy import (
    FaultProxy,
    Faults,
    ProxyThread,
    parse_duration,
    parse_fraction,
)

# proxy and companion processes: not in ./dev test --fast
pytestmark = pytest.mark.slow


class Echo:
    """A websocket echo server that records when its connections end."""

    def __init__(self) -> None:
        self.closed: list[float] = []
        self.url = ""

    async def handler(self, ws: ServerConnection) -> None:
        try:
            async for frame in ws:
                await ws.send(frame)
        except ConnectionClosed:
            pass
        finally:
            self.closed.append(time.monotonic())


async def _proxy(faults: Faults) -> AsyncIterator[tuple[FaultProxy, Echo]]:
    echo = Echo()
    async with serve(echo.handler, "127.0.0.1", 0) as server:
        echo.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        proxy = FaultProxy(echo.url, faults)
        await proxy.start()
        try:
            yield proxy, echo
        finally:
            await proxy.close()


def run(coro_fn, faults: Faults):  # noqa: ANN001, ANN201
    async def main():  # noqa: ANN202
        async for proxy, echo in _proxy(faults):
            return await coro_fn(proxy, echo)

    return asyncio.run(main())


async def _round_trip(url: str, n: int = 5) -> list[float]:
    times = []
    async with connect(url) as ws:
        for i in range(n):
            started = time.monotonic()
            await ws.send(f"ping {i}")
            assert await ws.recv() == f"ping {i}"
            times.append(time.monotonic() - started)
    return times


def test_parsers() -> None:
    assert parse_duration("80ms") == pytest.approx(0.08)
    assert parse_duration("1.5s") == 1.5 and parse_duration("2m") == 120
    assert parse_duration("3") == 3
    assert parse_fraction("1%") == pytest.approx(0.01) and parse_fraction("0.25") == 0.25
    for bad in ("fast", "-1s", "10h"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="outside"):
        parse_fraction("150%")


def test_delay_is_added_in_each_direction() -> None:
    async def probe(proxy: FaultProxy, echo: Echo) -> tuple[list[float], list[float]]:
        return await _round_trip(echo.url), await _round_trip(proxy.url)

    direct, delayed = run(probe, Faults(delay_s=0.08))
    # two legs of 80 ms each; a loopback echo takes well under a millisecond
    assert min(delayed) >= 0.16
    assert sorted(delayed)[len(delayed) // 2] < 0.16 + 0.1
    assert max(direct) < 0.05


def test_jitter_varies_the_delay_but_never_reorders() -> None:
    async def burst(proxy: FaultProxy, echo: Echo) -> tuple[list[str], list[float]]:
        async with connect(proxy.url) as ws:
            for i in range(40):
                await ws.send(str(i))
            got = [await ws.recv() for _ in range(40)]
        return got, await _round_trip(proxy.url, 12)

    got, times = run(burst, Faults(delay_s=0.02, jitter_s=0.02, seed=1))
    assert got == [str(i) for i in range(40)]
    assert max(times) - min(times) > 0.01  # the delay does vary


def test_drop_loses_frames_that_the_receiver_never_sees() -> None:
    async def lossy(proxy: FaultProxy, echo: Echo) -> list[str]:
        async with connect(proxy.url) as ws:
            for i in range(200):
                await ws.send(str(i))
            got = []
            with pytest.raises(TimeoutError):
                while True:
                    got.append(await asyncio.wait_for(ws.recv(), 0.5))
        assert proxy.stats.dropped > 0
        return got

    got = run(lossy, Faults(drop=0.3, seed=7))
    # each leg loses 30 %: about half come back, and the ones that do keep their order
    assert 50 < len(got) < 150
    assert [int(x) for x in got] == sorted(int(x) for x in got)


def test_stall_stops_forwarding_but_keeps_the_connection_open() -> None:
    async def stalled(proxy: FaultProxy, echo: Echo) -> None:
        async with connect(proxy.url) as ws:
            await ws.send("before")
            assert await ws.recv() == "before"
            await asyncio.sleep(0.35)
            await ws.send("after")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.5)
            await ws.ping()  # the socket itself is alive: pings are not frames of the protocol
            assert proxy.stats.stalled == 1 and not echo.closed

    run(stalled, Faults(stall_after_s=0.3))


def test_cut_closes_both_sides_at_the_given_time() -> None:
    async def cut(proxy: FaultProxy, echo: Echo) -> None:
        async with connect(proxy.url) as ws:
            opened = time.monotonic()
            await ws.send("hello")
            assert await ws.recv() == "hello"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 3)
            assert 0.25 <= time.monotonic() - opened < 1.0
        for _ in range(100):
            if echo.closed:
                break
            await asyncio.sleep(0.01)
        assert echo.closed, "the upstream side stayed open"
        assert proxy.stats.cut == 1

    run(cut, Faults(cut_at_s=0.3))


def test_offline_cuts_and_refuses_until_online_again() -> None:
    async def switch(proxy: FaultProxy, echo: Echo) -> None:
        async with connect(proxy.url) as ws:
            proxy.set_online(False)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 3)
        with pytest.raises(InvalidStatus, match="503"):
            await connect(proxy.url)
        proxy.set_online(True)
        assert len(await _round_trip(proxy.url, 1)) == 1

    run(switch, Faults())


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "specsteer_companion.cli", "proxy", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_command_line_relays_with_the_given_delay() -> None:
    async def main() -> None:
        echo = Echo()
        async with serve(echo.handler, "127.0.0.1", 0) as server:
            upstream = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            proc = _cli("--listen", "127.0.0.1:0", "--upstream", upstream, "--delay", "50ms")
            try:
                assert proc.stdout is not None
                line = await asyncio.to_thread(proc.stdout.readline)
                assert "listening on ws://127.0.0.1:" in line, line
                url = line.split()[4]
                assert min(await _round_trip(url, 3)) >= 0.1
            finally:
                proc.terminate()
                proc.wait(10)

    asyncio.run(main())


def test_command_line_refuses_bad_options() -> None:
    proc = _cli("--upstream", "ws://127.0.0.1:1", "--drop", "lots")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "not a probability" in err
    proc = _cli("--upstream", "http://x", "--listen", "127.0.0.1:0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "ws:// or wss://" in err


def test_real_companion_behind_the_proxy_degrades_and_resumes(tiny_model) -> None:
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120)
    changes: list[ModeChange] = []
    try:
        with ProxyThread(url, Faults(delay_s=0.005)) as proxy:
            client = Client(tiny_model, companion=proxy.url, timeout_s=2)
            policy = OfflinePolicy("degrade", first_retry_s=0.0, max_retry_s=0.0)
            provenance: list[str] = []

            def on_mode(change: ModeChange) -> None:
                changes.append(change)
                if change.mode == "local":
                    proxy.set_online(True)  # the link comes back while it writes locally

            stream = client.stream("Budget for next quarter", max_new_tokens=80, k=2,
                                   offline=policy, on_mode=on_mode)
            for piece in stream:
                provenance.append(piece.provenance)
                if len(provenance) == 10:
                    proxy.set_online(False)  # the link dies mid-generation
                if piece.provenance == "local":
                    time.sleep(0.05)  # a reader's pace: the tiny model outruns the reconnect
        assert provenance[0] != "local" and "local" in provenance
        after = provenance[provenance.index("local"):]
        assert any(p != "local" for p in after), "collaboration never resumed"
        assert [c.mode for c in changes][:2] == ["local", "collaborative"]
        assert proxy.stats.cut >= 1 and proxy.stats.connections >= 2
    finally:
        proc.terminate()
        proc.wait(10)
