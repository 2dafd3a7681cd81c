"""`DelayProxy`: the emulated network of the latency benchmark and the evaluation's companion
process. Each direction must be held for half the round trip, in order, bytes unchanged."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from specsteer_lab.network import DelayProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture()
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"x")  # the connection is up before the timed exchange
        assert conn.recv(1) == b"x"
        started = time.monotonic()
        conn.sendall(payload)
        back = b""
        while len(back) < len(payload):
            back += conn.recv(65536)
        return back, time.monotonic() - started


def test_each_direction_is_held_for_half_the_round_trip(echo_port):
    payload = bytes(range(256)) * 400  # ~100 KB: several chunks, kept in order
    direct, direct_s = _round_trip(echo_port, payload)
    proxy = DelayProxy(echo_port, one_way_s=0.15)
    try:
        delayed, delayed_s = _round_trip(proxy.port, payload)
    finally:
        proxy.close()
    assert direct == delayed == payload
    assert delayed_s >= 0.3  # there and back
    assert delayed_s - direct_s < 0.3 + 0.25  # and not much more than that


def test_no_delay_adds_no_round_trip(echo_port):
    proxy = DelayProxy(echo_port, one_way_s=0.0)
    try:
        back, seconds = _round_trip(proxy.port, b"hello")
    finally:
        proxy.close()
    assert back == b"hello" and seconds < 0.15


def test_closing_with_a_connection_open_logs_no_error(echo_port, caplog):
    """A benchmark closes its proxy while a device's socket is still up: the cancelled
    connection ends quietly (it logged a CancelledError traceback, in the middle of the
    benchmark's output)."""
    proxy = DelayProxy(echo_port, one_way_s=0.05)
    conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    try:
        conn.sendall(b"x")
        assert conn.recv(1) == b"x"  # the proxy's connection task is running
        with caplog.at_level("DEBUG", logger="asyncio"):
            proxy.close()
            time.sleep(0.2)
    finally:
        conn.close()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text
