"""A companion address whose peer stalls must cost the device its connect timeout, not minutes.

Real sockets on loopback: a peer that accepts TCP (and completes TLS with a self-signed
certificate made here) and then never answers the websocket upgrade, and one that answers it and
then stops in the middle of a TLS record. websockets' receive thread sits in a blocking TLS read
on such a peer, and before `transport._DeviceConnection` shut the socket down first, every close
joined that thread until the peer hung up, so `WebSocketChannel(url, open_timeout=...)` did not
return and the device never fell back to offline. Each call runs on a watchdog thread so that a
regression fails here rather than hanging the suite.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from websockets.utils import accept_key

from specsteer.client import Client
from specsteer.errors import CompanionTimedOut, CompanionUnavailable
from specsteer.transport import WebSocketChannel
from specsteer_companion.tls import client_ssl_context, make_self_signed, server_ssl_context

pytestmark = pytest.mark.slow  # sockets and timeouts: not in ./dev test --fast

OPEN_TIMEOUT_S = 0.5
MARGIN_S = 1.0  # loopback on a loaded 2-core machine
T = TypeVar("T")


class StalledPeer:
    """Accepts connections on 127.0.0.1 (TLS if given a context) and never finishes talking.

    `answer_upgrade=False`: reads the HTTP upgrade request and never replies. True: replies 101,
    then writes the 5-byte header of a TLS record whose body never comes (the device's TLS read
    waits for it). Records when the device closes each connection (`closed`).
    """

    def __init__(self, context: ssl.SSLContext | None = None, *,
                 answer_upgrade: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.context = context
        self.answer_upgrade = answer_upgrade
        self.accepted = threading.Event()
        self.closed = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{'wss' if self.context else 'ws'}://127.0.0.1:{self.port}/"

    def _serve(self) -> None:
        try:
            raw, _ = self.listener.accept()
            conn = self.context.wrap_socket(raw, server_side=True) if self.context else raw
        except OSError:
            return
        self._held.append(conn)
        self.accepted.set()
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                request += chunk
            if self.answer_upgrade and request:
                conn.sendall(_switching_protocols(request))
                socket.socket.sendall(conn, b"\x17\x03\x03\x00\x40")  # raw, past the TLS layer
            while conn.recv(4096):  # until the device closes
                pass
        except OSError:  # reset by the device: closed as well
            pass
        self.closed.set()

    def close(self) -> None:
        self.listener.close()
        for conn in self._held:
            conn.close()


def _switching_protocols(request: bytes) -> bytes:
    headers = dict(
        line.split(": ", 1) for line in request.decode("latin-1").split("\r\n")[1:] if ": " in line
    )
    key = next(value for name, value in headers.items() if name.lower() == "sec-websocket-key")
    return ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(key)}\r\n\r\n").encode()


def within(seconds: float, call: Callable[[], T]) -> tuple[T | BaseException, float]:
    """(result or raised exception, elapsed); fails if `call` is still blocked after `seconds`."""
    outcome: list[T | BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    elapsed = time.monotonic() - started
    assert not worker.is_alive(), f"still blocked after {seconds:.1f} s"
    return outcome[0], elapsed


def receive_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "recv_events" in t.name and t.is_alive()]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_self_signed(tmp_path_factory.mktemp("stalled-tls"))


@pytest.fixture
def tls_peer(certs: tuple[Path, Path]) -> Iterator[StalledPeer]:
    peer = StalledPeer(server_ssl_context(*certs))
    yield peer
    peer.close()


@pytest.fixture
def tcp_peer() -> Iterator[StalledPeer]:
    peer = StalledPeer()
    yield peer
    peer.close()


def _assert_gave_up_cleanly(peer: StalledPeer, outcome: object, elapsed: float,
                            before: list[threading.Thread]) -> None:
    assert isinstance(outcome, CompanionUnavailable), outcome
    assert "timed out while waiting for handshake response" in str(outcome)
    assert peer.accepted.is_set()  # the stall was the upgrade, not TCP or TLS
    assert OPEN_TIMEOUT_S * 0.9 <= elapsed <= OPEN_TIMEOUT_S + MARGIN_S, elapsed
    assert peer.closed.wait(MARGIN_S), "the device left the stalled connection open"
    assert receive_threads() == before, "a receive thread outlived the failed connect"


def test_tls_peer_that_never_answers_the_upgrade_costs_one_open_timeout(tls_peer, certs):
    before = receive_threads()
    outcome, elapsed = within(OPEN_TIMEOUT_S + 10, lambda: WebSocketChannel(
        tls_peer.url, ssl_context=client_ssl_context(certs[0]), open_timeout=OPEN_TIMEOUT_S))
    _assert_gave_up_cleanly(tls_peer, outcome, elapsed, before)


def test_tcp_peer_that_never_answers_the_upgrade_costs_one_open_timeout(tcp_peer):
    before = receive_threads()
    outcome, elapsed = within(OPEN_TIMEOUT_S + 10, lambda: WebSocketChannel(
        tcp_peer.url, open_timeout=OPEN_TIMEOUT_S))
    _assert_gave_up_cleanly(tcp_peer, outcome, elapsed, before)


def test_close_returns_when_the_tls_peer_stops_mid_record(certs):
    """Open, then the peer stalls inside a TLS record: a read times out and close() is bounded."""
    peer = StalledPeer(server_ssl_context(*certs), answer_upgrade=True)
    try:
        before = receive_threads()
        channel = WebSocketChannel(peer.url, ssl_context=client_ssl_context(certs[0]),
                                   open_timeout=5)
        with pytest.raises(CompanionTimedOut):
            channel.recv(timeout=0.2)
        outcome, elapsed = within(15, channel.close)
        assert outcome is None
        assert elapsed <= 2 + MARGIN_S, elapsed  # the channel's close_timeout is 2 s
        assert peer.closed.wait(MARGIN_S), "the device left the stalled connection open"
        assert receive_threads() == before
    finally:
        peer.close()


def test_device_falls_back_to_local_when_the_tls_companion_stalls(tiny_model, tls_peer, certs):
    client = Client(tiny_model, companion=tls_peer.url, ssl_context=client_ssl_context(certs[0]),
                    connect_timeout_s=1.0)
    outcome, elapsed = within(15, lambda: client.generate("Meeting notes", max_new_tokens=16))
    assert not isinstance(outcome, BaseException), outcome
    assert outcome.stats.degraded and outcome.tokens
    assert 0.9 <= elapsed <= 2.5, elapsed
