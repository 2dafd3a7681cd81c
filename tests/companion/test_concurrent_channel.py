"""The in-process companion on its own thread (`ConcurrentChannel`): the evaluation harness's
stand-in for a companion on another machine. It must compute while the device works, delay
each direction by the emulated network, give the same frames as the serial `LocalChannel`, and
leave nothing running or held once closed."""

from __future__ import annotations

import threading
import time

import pytest

from specsteer import Client
from specsteer.errors import CompanionTimedOut, CompanionUnavailable
from specsteer.link import CompanionLink
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.local import ConcurrentChannel, LocalChannel
from specsteer_companion.verifier import Verifier


class Recorded(CompanionEndpoint):
    """A real endpoint that notes when and on which thread each frame was handled."""

    def __init__(self, verifier: Verifier, hold_s: float = 0.0) -> None:
        super().__init__(verifier)
        self.hold_s = hold_s  # extra compute per frame: a slow Generalist
        self.handled: list[tuple[float, float, int]] = []  # (start, end, thread id)
        self.done = threading.Event()
        self.released = threading.Event()

    def handle(self, frame: bytes) -> list[bytes]:
        started = time.monotonic()
        time.sleep(self.hold_s)
        replies = super().handle(frame)
        self.handled.append((started, time.monotonic(), threading.get_ident()))
        self.done.set()
        return replies

    def release(self) -> None:
        super().release()
        self.released.set()


@pytest.fixture()
def verifier(tiny_model, tiny_generalist) -> Verifier:
    return Verifier(tiny_generalist, tiny_model)


def _send_hello(link: CompanionLink) -> None:
    """The Hello frame sent without waiting for its reply (what `link.hello` sends first)."""
    link.conn.hello("", "", auth_token="", client_name="test")
    link._flush()


def test_the_companion_computes_on_its_own_thread_before_the_device_asks(verifier):
    endpoint = Recorded(verifier)
    channel = ConcurrentChannel(endpoint)
    link = CompanionLink(channel)
    _send_hello(link)
    # the device has not called recv: a companion that only works when asked (LocalChannel)
    # would never get here
    assert endpoint.done.wait(5.0)
    (_, _, thread), = endpoint.handled
    assert thread != threading.get_ident()
    assert link.reply_ready()  # the reply is there without blocking
    link.close()


def test_each_direction_pays_half_the_round_trip(verifier):
    endpoint = Recorded(verifier)
    channel = ConcurrentChannel(endpoint, one_way_s=0.15)
    link = CompanionLink(channel)
    sent = time.monotonic()
    _send_hello(link)
    assert channel.poll() is None  # still on its way there
    assert endpoint.done.wait(5.0)
    (started, ended, _), = endpoint.handled
    assert started - sent >= 0.15  # the request arrives one way later
    assert channel.poll() is None or time.monotonic() - ended >= 0.15
    frame = channel.recv(5.0)
    assert time.monotonic() - ended >= 0.15  # ...and the reply one way after the compute
    assert frame
    link.close()


def test_a_slow_reply_times_out_and_close_waits_for_the_frame_in_hand(verifier):
    endpoint = Recorded(verifier, hold_s=0.4)
    channel = ConcurrentChannel(endpoint)
    link = CompanionLink(channel)
    _send_hello(link)
    with pytest.raises(CompanionTimedOut):
        channel.recv(0.05)
    channel.close()  # returns once the frame in hand is handled and the session freed
    assert endpoint.handled and endpoint.released.is_set()
    with pytest.raises(CompanionUnavailable):
        channel.send(b"\x00")


def test_a_companion_failure_reaches_the_device(verifier):
    class Broken(CompanionEndpoint):
        def handle(self, frame: bytes) -> list[bytes]:
            raise RuntimeError("the companion broke")

    channel = ConcurrentChannel(Broken(verifier))
    link = CompanionLink(channel)
    _send_hello(link)
    with pytest.raises(RuntimeError, match="the companion broke"):
        channel.recv(5.0)
    channel.close()


def test_a_negative_delay_is_refused(verifier):
    with pytest.raises(ValueError, match="one_way_s"):
        ConcurrentChannel(CompanionEndpoint(verifier), one_way_s=-0.01)


def test_the_same_text_and_bytes_as_the_serial_channel(tiny_model, verifier):
    def generate(channel_for) -> tuple[str, int, int]:
        client = Client(tiny_model, companion=lambda: channel_for(verifier))
        result = client.generate("Write a note about the garden.", max_new_tokens=24)
        return result.text, result.stats.bytes_up, result.stats.bytes_down

    serial = generate(LocalChannel.for_verifier)
    concurrent = generate(lambda v: ConcurrentChannel.for_verifier(v, one_way_s=0.01))
    assert concurrent == serial
    assert serial[1] > 0 and serial[2] > 0
