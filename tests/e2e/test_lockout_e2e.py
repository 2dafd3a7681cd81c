"""Lock-out and starvation, tried against a real `CompanionServer` on loopback sockets.

Idle sockets that never log in, floods from one address, a full server, fd pressure in a child
process with a low `ulimit -n`, the request rate and the prompt budget, and revocation of a live
connection through `specsteer-companion tokens revoke`. Every loop is bounded and every test
stops by itself. Attackers use other loopback source addresses (127.0.0.2...) so that the
per-address cap can be told from the total one; Linux routes all of 127/8 to the loopback.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from helpers.flooding import DEFAULTS, ULIMIT_256, descriptors_for, flood_module
from helpers.manual_clock import ManualClock
from websockets.sync.client import connect

from specsteer import protocol
from specsteer.client import Client
from specsteer.errors import CompanionError, CompanionUnavailable
from specsteer.link import CompanionLink
from specsteer.models.tiny import tiny_model_dir
from specsteer.protocol import ErrorCode, Limits
from specsteer.transport import WebSocketChannel
from specsteer_companion.auth import TokenStore
from specsteer_companion.limits import DEFAULT_BURST, DEFAULT_RATE_PER_S, FD_RESERVE
from specsteer_companion.process import start_companion
from specsteer_companion.server import THROTTLE, CompanionServer, ServerConfig
from specsteer_companion.tls import client_ssl_context, make_self_signed, server_ssl_context
from specsteer_companion.verifier import Verifier

# companion processes and request-rate timing: not in ./dev test --fast
pytestmark = pytest.mark.slow

SESSION = protocol.SessionSettings(top_k=8)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _attacker(port: int, source: str = "127.0.0.2") -> socket.socket:
    """A TCP connection that never says anything."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.settimeout(0.05)
    return sock


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True once the server has closed (or reset) `sock`, False if it is still open."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset
            return True
    return False


def _closed_now(sock: socket.socket) -> bool:
    """True if the server has closed (or reset) `sock` by now; never waits."""
    try:
        return sock.recv(4096, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _wait_for(predicate, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@contextlib.contextmanager
def _held(sockets: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def test_connections_that_never_log_in_are_closed_after_the_hello_deadline(
        tiny_model, tiny_generalist):
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(port=0, hello_timeout_s=0.5))
    with server.running() as url:
        raw = [_attacker(_port(url)) for _ in range(3)]  # not even a websocket handshake
        with contextlib.ExitStack() as stack:
            # a websocket handshake, then no Hello
            sockets = [stack.enter_context(connect(url, open_timeout=5)) for _ in range(3)]
            started = time.monotonic()
            try:
                assert _wait_for(lambda: server.open_connections() == 6, 2)
                for ws in sockets:  # told why before the close
                    reply = protocol.decode(ws.recv(timeout=5), Limits())
                    assert isinstance(reply, protocol.Error) and reply.code == ErrorCode.TIMEOUT
                    assert "no Hello within 0.5 s" in reply.message
                assert all(_closed_by_server(sock, 3) for sock in raw)
                assert time.monotonic() - started < 3
                assert _wait_for(lambda: server.open_connections() == 0, 2)
            finally:
                for sock in raw:
                    sock.close()
        # a device that logs in at once is not affected by the deadline
        client = Client(tiny_model, companion=url)
        assert not client.generate("Team offsite", max_new_tokens=8, offline="fail").stats.degraded


def test_a_tls_handshake_that_never_ends_is_cut_at_the_hello_deadline(
        tiny_model, tiny_generalist, tmp_path):
    """With TLS, a socket is counted against the caps from its TCP accept, before any TLS
    handshake (the server starts TLS itself: asyncio's would hand it over only once the
    handshake is done, and a flood of sockets that never start one went uncounted), and one
    that never finishes it is cut at the Hello deadline."""
    cert, key = make_self_signed(tmp_path / "tls")
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(port=0, hello_timeout_s=1.0),
                             ssl_context=server_ssl_context(cert, key))
    with server.running() as url, _held([]) as held:
        held.extend(_attacker(_port(url)) for _ in range(3))  # TCP only: no ClientHello
        started = time.monotonic()
        # counted while in the handshake: all three at once before the deadline closes them
        assert _wait_for(lambda: server.open_connections() == 3, 0.9)
        assert all(_closed_by_server(sock, 4) for sock in held)
        assert time.monotonic() - started < 3
        assert _wait_for(lambda: server.open_connections() == 0, 5)
        client = Client(tiny_model, companion=url, ssl_context=client_ssl_context(cert))
        assert not client.generate("Team offsite", max_new_tokens=8, offline="fail").stats.degraded


def test_per_address_cap_refuses_the_next_and_a_device_is_still_served(
        tiny_model, tiny_generalist):
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(port=0, max_connections_per_address=4,
                                          hello_timeout_s=30))
    with server.running() as url, _held([]) as held:
        held.extend(_attacker(_port(url)) for _ in range(4))
        assert _wait_for(lambda: server.open_connections("127.0.0.2") == 4, 2)
        extra = _attacker(_port(url))
        held.append(extra)
        assert _closed_by_server(extra, 2)
        assert server.refused == 1
        assert not any(_closed_by_server(sock, 0.1) for sock in held[:4])  # still held
        for _ in range(2):  # the device (127.0.0.1) is served while the attacker holds its max
            client = Client(tiny_model, companion=url)
            result = client.generate("Team offsite", max_new_tokens=8, offline="fail")
            assert not result.stats.degraded


def test_a_full_pre_login_pool_sheds_its_oldest_and_a_device_still_logs_in(
        tiny_model, tiny_generalist):
    """6 connections in total, so 3 before login: six idle sockets from six addresses leave
    the last three open (each newcomer closed the oldest), and a device still logs in."""
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(port=0, max_connections=6, hello_timeout_s=30))
    with server.running() as url, _held([]) as held:
        for i in range(6):
            held.append(_attacker(_port(url), f"127.0.0.{2 + i}"))
            assert _wait_for(lambda i=i: server.open_connections(f"127.0.0.{2 + i}") == 1, 5)
        assert [_closed_by_server(sock, 2) for sock in held[:3]] == [True] * 3
        assert not any(_closed_by_server(sock, 0.1) for sock in held[3:])
        assert server.gate.shed == 3 and server.refused == 0
        client = Client(tiny_model, companion=url)
        assert not client.generate("Team offsite", max_new_tokens=8, offline="fail").stats.degraded
        assert _closed_by_server(held[3], 2)  # the device's connection took the oldest's slot


def test_when_every_slot_is_logged_in_the_next_connection_is_refused(
        tiny_model, tiny_generalist):
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(port=0, max_connections=2))
    with server.running() as url:
        links = []
        for _ in range(2):  # one at a time: the pool before login holds one of the two
            links.append(CompanionLink(WebSocketChannel(url)))
            links[-1].hello()
        with pytest.raises(CompanionUnavailable):
            Client(tiny_model, companion=url).generate("Team offsite", max_new_tokens=4,
                                                       offline="fail")
        assert server.refused == 1
        links[0].close()
        assert _wait_for(lambda: server.open_connections() == 1, 5)
        client = Client(tiny_model, companion=url)
        assert not client.generate("Team offsite", max_new_tokens=8, offline="fail").stats.degraded
        links[1].close()


def test_a_flood_of_refusals_logs_a_bounded_number_of_lines(tiny_model, tiny_generalist):
    records: list[logging.LogRecord] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Count(level=logging.DEBUG)
    logger = logging.getLogger("specsteer_companion")
    logger.addHandler(handler)
    server = CompanionServer(Verifier(tiny_generalist, tiny_model),
                             ServerConfig(port=0, max_connections_per_address=2,
                                          hello_timeout_s=30))
    try:
        with server.running() as url, _held([]) as held:
            dropped_before = THROTTLE.dropped
            for _ in range(300):
                held.append(_attacker(_port(url)))
            assert _wait_for(lambda: server.refused == 298, 10)
    finally:
        logger.removeHandler(handler)
    refusals = [r for r in records if r.getMessage().startswith("refused a connection")]
    # at most per_window lines per window (and the test runs within about two windows)
    assert 1 <= len(refusals) <= 2 * THROTTLE.per_window
    assert THROTTLE.dropped - dropped_before >= 298 - 2 * THROTTLE.per_window


def _served_until_refused(ws, frames: int) -> tuple[int, protocol.Error | None]:  # type: ignore[no-untyped-def]
    """Send `frames` OpenSessions; count the replies before an Error (and return it)."""
    opening = protocol.encode(protocol.OpenSession(prompt_ids=(1,), settings=SESSION))
    for _ in range(frames):
        ws.send(opening)
    for served in range(frames):
        reply = protocol.decode(ws.recv(timeout=120), Limits(vocab_size=1 << 20))
        if isinstance(reply, protocol.Error):
            return served, reply
    return frames, None


def _rate_is_enforced(tiny_model, tiny_generalist, config: ServerConfig, rate: int,
                      burst: int) -> None:
    """On a clock that moves only when told: exactly `burst` requests (the Hello among them)
    are served at once, and exactly `rate` more after one second; the next is refused. What
    is counted does not depend on how fast this machine serves them."""
    clock = ManualClock()
    server = CompanionServer(Verifier(tiny_generalist, tiny_model), config, clock=clock)
    hello = protocol.encode(protocol.Hello(generalist_sha256="", client_name="flood"))
    with server.running() as url:
        with connect(url, open_timeout=30, close_timeout=1, max_size=1 << 20) as ws:
            ws.send(hello)
            assert isinstance(protocol.decode(ws.recv(timeout=120), Limits()), protocol.HelloOk)
            assert _served_until_refused(ws, burst - 1) == (burst - 1, None)
            clock.advance(1.0)
            served, error = _served_until_refused(ws, rate + 1)
        assert served == rate and error is not None, (served, error)
        assert error.code == ErrorCode.RATE_LIMITED and error.message == "too many requests"


def test_the_documented_request_rate_is_what_runs(tiny_model, tiny_generalist):
    assert (ServerConfig().requests_per_second, ServerConfig().burst) == (200, 400)
    assert (DEFAULT_RATE_PER_S, DEFAULT_BURST) == (200, 400)
    _rate_is_enforced(tiny_model, tiny_generalist, ServerConfig(port=0), 200, 400)


def test_a_small_configured_rate_is_enforced(tiny_model, tiny_generalist):
    _rate_is_enforced(tiny_model, tiny_generalist,
                      ServerConfig(port=0, requests_per_second=5, burst=10), 5, 10)


def test_prompt_tokens_are_charged_to_the_device_across_its_connections(
        tiny_model, tiny_generalist, tmp_path):
    tokens = TokenStore(tmp_path / "tokens.db")
    greedy, other = tokens.create("greedy"), tokens.create("other")
    server = CompanionServer(
        Verifier(tiny_generalist, tiny_model),
        ServerConfig(port=0, prefill_tokens_per_second=1, prefill_burst=1000),
        authenticate=lambda s: info.token_id if (info := tokens.verify(s)) else None)
    prompt = list(range(1, 301))
    with server.running() as url:
        link = CompanionLink(WebSocketChannel(url))
        link.hello(auth_token=greedy.secret)
        for _ in range(3):  # 900 of 1000 prompt tokens
            link.open(prompt, SESSION)
        with pytest.raises(CompanionError) as info:
            link.open(prompt, SESSION)
        assert info.value.code == ErrorCode.RATE_LIMITED
        assert "prompt budget exhausted" in str(info.value)
        link.close()
        again = CompanionLink(WebSocketChannel(url))  # a new connection does not reset it
        again.hello(auth_token=greedy.secret)
        with pytest.raises(CompanionError, match="prompt budget"):
            again.open(prompt, SESSION)
        again.close()
        fine = CompanionLink(WebSocketChannel(url))  # another device has its own budget
        fine.hello(auth_token=other.secret)
        assert fine.open(prompt, SESSION) == len(prompt)
        fine.close()


def test_revoking_a_token_ends_its_live_connection(tiny_model, tiny_generalist, tmp_path):
    store_path = tmp_path / "tokens.db"
    tokens = TokenStore(store_path)
    device = tokens.create("alice-phone")
    bystander = tokens.create("bob-phone")
    server = CompanionServer(
        Verifier(tiny_generalist, tiny_model), ServerConfig(port=0, revocation_check_s=0.2),
        authenticate=lambda s: info.token_id if (info := tokens.verify(s)) else None,
        check_revoked=tokens.revoked_among)
    with server.running() as url:
        links = []
        for secret in (device.secret, bystander.secret):
            link = CompanionLink(WebSocketChannel(url))
            link.hello(auth_token=secret)
            link.open([1, 2, 3], SESSION)
            links.append(link)
        revoked = subprocess.run(
            [sys.executable, "-m", "specsteer_companion.cli", "tokens", "revoke",
             device.token_id, "--store", str(store_path)],
            capture_output=True, text=True, timeout=60)
        assert revoked.returncode == 0, revoked.stderr
        started = time.monotonic()
        frame = links[0].channel.recv(timeout=5)  # the server speaks first
        error = protocol.decode(frame, Limits())
        assert isinstance(error, protocol.Error) and error.code == ErrorCode.AUTH_FAILED
        assert error.message == "device token revoked"
        assert time.monotonic() - started < 2
        assert links[1].verify([5, 6]).accepted >= 0  # the other device goes on
        for link in links:
            link.close()


def test_fd_pressure_in_a_child_with_a_low_ulimit(tmp_path):
    """The issue's setting: 256 descriptors, hundreds of idle sockets. The companion caps its
    connections below the limit (128, 64 of them before login), closes the oldest waiting
    ones as new ones come, logs little, and serves a device while the sockets are still held."""
    from specsteer.runtime import load_model

    limit = 256
    startup: list[str] = []
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120,
                                descriptor_limit=limit, args=["--hello-timeout", "30"],
                                startup=startup)
    port = _port(url)
    held: list[socket.socket] = []
    pool = (limit - FD_RESERVE) // 2
    try:
        for i in range(400):  # 20 addresses x 20: under the per-address cap, over the total
            with contextlib.suppress(OSError):
                held.append(_attacker(port, f"127.0.1.{1 + i // 20}"))
        closed: set[int] = set()

        def caught_up() -> bool:  # the server accepts what the kernel queued at its own pace
            closed.update(i for i, sock in enumerate(held) if i in closed or _closed_now(sock))
            return len(closed) >= len(held) - pool  # at most 64 wait to log in

        assert _wait_for(caught_up, 120), (len(closed), len(held))
        client = Client(load_model(tiny_model_dir("llama", seed=0)), companion=url,
                        connect_timeout_s=30)
        assert not client.generate("Team offsite", max_new_tokens=8,
                                   offline="fail").stats.degraded
        assert proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    lines = out.splitlines()
    assert "Traceback" not in out and "out of system resource" not in out
    assert len(lines) < 60, out[-3000:]
    assert sum("had not logged in" in line for line in lines) <= 2 * THROTTLE.per_window
    assert any(f"at most {limit - FD_RESERVE} connections" in line
               and f"{pool} before login" in line for line in startup)


@pytest.mark.parametrize(("addresses", "per_address", "descriptor_limit"), [
    (*ULIMIT_256, 256), (*DEFAULTS, 4096)], ids=["ulimit-256", "defaults"])
def test_a_device_logs_in_and_generates_during_a_distributed_flood(
        tmp_path, addresses, per_address, descriptor_limit):
    """Silent sockets from many addresses, each reopened as soon as the companion drops it:
    every login of a real device (with its token) during the flood succeeds, because the
    flood can hold at most the pre-login half of the slots and a lone device's connection
    is never the one shed. Timings are bench/flood.py's, not this test's."""
    from specsteer.runtime import load_model

    flood = flood_module()
    descriptors_for(addresses * per_address + 512)
    tokens = TokenStore(tmp_path / "tokens.db")
    secret = tokens.create("legit-device").secret
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120,
                                open_access=False, descriptor_limit=descriptor_limit,
                                args=["--tokens", str(tokens.path)])
    model = load_model(tiny_model_dir("llama", seed=0))
    try:
        hosts = [f"127.0.1.{n + 1}" for n in range(addresses)]
        with flood.Flood(_port(url), hosts, per_address) as attack:
            assert _wait_for(lambda: attack.counts.dropped >= 2 * per_address, 60)
            for _ in range(3):
                client = Client(model, companion=url, token=secret, connect_timeout_s=60)
                result = client.generate("Team offsite", max_new_tokens=8, offline="fail")
                assert not result.stats.degraded
            assert attack.counts.dropped > attack.counts.failed  # it went on all along
        assert proc.poll() is None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out and "out of file descriptors" not in out, out[-3000:]
