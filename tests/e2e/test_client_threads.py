"""The Client owns its threads: after `close()` (or a `with` block) none it started is left,
whatever ran before — a prepared prefill and session, a warm start's prefill, a link closed
off the caller's time after a cancel, reconnect probes to a companion that is down."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from helpers.budget_mail import REQUEST, budget_history

from specsteer.client import Client
from specsteer.device import OfflinePolicy
from specsteer.errors import CompanionUnavailable
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# probes as often as the loop asks: a companion that is down is being probed when it ends
NOW = OfflinePolicy("degrade", first_retry_s=0.0, max_retry_s=0.0)


def _left_behind(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


def _slowly_down(seconds: float) -> Callable[[], LocalChannel]:
    """A companion that takes `seconds` to refuse each connection (a probe is in flight)."""

    def connect() -> LocalChannel:
        time.sleep(seconds)
        raise CompanionUnavailable("the companion is down")

    return connect


def _runs(client: Client, kind: str) -> None:
    if kind == "prepared, then closed unused":
        assert client.prepare(REQUEST, max_new_tokens=12) is not None
    elif kind == "prepared and generated":
        client.prepare(REQUEST, max_new_tokens=12).wait(60)
        client.generate(REQUEST, max_new_tokens=12)
    elif kind == "cancelled mid-generation":
        cancel = threading.Event()
        with client.stream(REQUEST, max_new_tokens=30, cancel=cancel) as stream:
            for n, _ in enumerate(stream):
                if n == 2:
                    cancel.set()
    elif kind == "warm start":
        client.generate(REQUEST, max_new_tokens=12, warm_start_min_s=0.0)
    else:  # the companion is down: local tokens while probes run
        client.generate(REQUEST, max_new_tokens=12, offline=NOW)


@pytest.mark.parametrize("kind", ["prepared, then closed unused", "prepared and generated",
                                  "cancelled mid-generation", "warm start",
                                  "companion down, probing"])
def test_a_closed_client_leaves_no_thread_behind(tiny_model, tiny_generalist, kind):
    verifier = Verifier(tiny_generalist, tiny_model)
    companion = _slowly_down(0.5) if kind == "companion down, probing" else \
        (lambda: LocalChannel.for_verifier(verifier))
    before = set(threading.enumerate())
    with Client(tiny_model, history=budget_history(), companion=companion) as client:
        _runs(client, kind)
    assert _left_behind(before) == []


def test_close_waits_for_a_probe_still_connecting(tiny_model):
    """A generation that ended while its probe was still connecting: `close` waits for the
    probe (bounded by the connection attempt), so nothing outlives the Client."""
    before = set(threading.enumerate())
    client = Client(tiny_model, history=budget_history(), companion=_slowly_down(1.0))
    client.generate(REQUEST, max_new_tokens=4, offline=NOW)
    probing = [name for name in _left_behind(before) if name == "specsteer-reconnect"]
    client.close()
    assert probing and _left_behind(before) == []
