"""`Client.prepare` opens the companion session ahead: reused when it matches, replaced if not."""

from __future__ import annotations

import time

import pytest

from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer.protocol import Limits, Mode, OpenSession, decode
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer
from specsteer_companion.verifier import Verifier

REQUEST = "Budget for the next quarter"
CHANGED = "Budget for the next quarter and the offsite"


@pytest.fixture()
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    for n in range(4):
        history.add(kind="email", title=f"Budget for quarter {n}",
                    body=f"Dear team, the budget for quarter {n} stays as it is. " * 6)
    return history


class _Channels:
    """In-process channels to one verifier, remembered (to count and check them closed);
    every frame the device sends is recorded as it goes up."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier, self.made, self.up = verifier, [], []

    def __call__(self) -> LocalChannel:
        channel = LocalChannel.for_verifier(self.verifier)
        send = channel.send

        def recorded(frame: bytes) -> None:
            self.up.append(decode(frame, Limits()))
            send(frame)

        channel.send = recorded  # type: ignore[method-assign]
        self.made.append(channel)
        return channel

    def opened(self) -> list[OpenSession]:
        return [m for m in self.up if isinstance(m, OpenSession)]


def _closed(channel: LocalChannel) -> bool:
    """Whether the channel and its companion session are closed (closing may run on a thread
    of its own: wait for it, with a generous bound that only a leak reaches)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if channel.closed and channel.endpoint.session is None:
            return True
        time.sleep(0.01)
    return False


def _client(model, channels, store) -> Client:
    return Client(model, history=store, companion=channels)


def _cold(model, generalist, store, query, **options):
    return _client(model, _Channels(Verifier(generalist, model)), store).generate(
        query, max_new_tokens=30, **options)


@pytest.mark.parametrize("method", ["specsteer", "speculative", "llm"])
def test_a_prepared_session_is_used_as_it_is(tiny_model, tiny_generalist, store, method):
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST, method=method)
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    prepared = client.prepare(REQUEST, method=method)
    assert prepared.wait(timeout=60)
    assert len(channels.made) == 1 and len(channels.opened()) == 1  # opened before the request
    result = client.generate(REQUEST, max_new_tokens=30, method=method)
    assert (result.tokens, result.provenance) == (cold.tokens, cold.provenance)
    assert result.stats.session_reused and not cold.stats.session_reused
    # no second connection, no second OpenSession: the generation went straight to its rounds
    assert len(channels.made) == 1 and len(channels.opened()) == 1
    assert result.stats.bytes_up > 0 and _closed(channels.made[0])


def test_only_the_public_prompt_goes_up_ahead(tiny_model, tiny_generalist, store):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    _, device_prompt = client.render(REQUEST)
    assert [type(m).__name__ for m in channels.up] == ["Hello", "OpenSession"]
    assert list(channels.opened()[0].prompt_ids) == list(device_prompt.public_ids)
    assert len(device_prompt.private_ids) > len(device_prompt.public_ids) + 50
    client.close()
    assert _closed(channels.made[0])  # a session never taken is closed with the client


def test_a_changed_request_replaces_the_session(tiny_model, tiny_generalist, store):
    cold = _cold(tiny_model, tiny_generalist, store, CHANGED)
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    result = client.generate(CHANGED, max_new_tokens=30)
    assert (result.tokens, result.provenance) == (cold.tokens, cold.provenance)
    assert not result.stats.session_reused
    public = [list(client.render(q)[1].public_ids) for q in (REQUEST, CHANGED)]
    assert public[0] != public[1]
    # the stale session was replaced on the same connection by one over the new prompt
    assert [list(m.prompt_ids) for m in channels.opened()] == public
    assert len(channels.made) == 1 and _closed(channels.made[0])


def test_other_settings_do_not_reuse_the_session(tiny_model, tiny_generalist, store):
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST, method="llm")
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST, method="specsteer").wait(timeout=60)
    result = client.generate(REQUEST, max_new_tokens=30, method="llm")
    assert result.tokens == cold.tokens and not result.stats.session_reused
    assert [m.settings.mode for m in channels.opened()] == [Mode.SPECSTEER, Mode.ROWS]
    assert len(channels.made) == 1 and _closed(channels.made[0])


def test_a_local_method_closes_the_prepared_session(tiny_model, tiny_generalist, store):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    client.generate(REQUEST, max_new_tokens=10, method="slm_rag")
    assert len(channels.made) == 1 and _closed(channels.made[0])


def test_preparing_again_closes_the_earlier_session(tiny_model, tiny_generalist, store):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    assert client.prepare(CHANGED).wait(timeout=60)
    assert len(channels.made) == 2 and _closed(channels.made[0])
    result = client.generate(CHANGED, max_new_tokens=10)
    assert result.stats.session_reused and len(channels.made) == 2
    assert _closed(channels.made[1])


def test_a_prepared_session_over_a_socket(tiny_model, tiny_generalist, store):
    verifier = Verifier(tiny_generalist, tiny_model)
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST)
    server = CompanionServer(verifier)
    with server.running() as url:
        client = Client(tiny_model, history=store, companion=url)
        assert client.prepare(REQUEST).wait(timeout=60)
        assert server.open_connections() == 1  # opened while the user typed
        result = client.generate(REQUEST, max_new_tokens=30)
        assert result.tokens == cold.tokens and result.stats.session_reused
        assert server.connections == 1  # the generation used that connection, no other
        assert client.prepare(CHANGED).wait(timeout=60)
        client.close()  # a prepared session never used is closed
        deadline = time.monotonic() + 10
        while server.open_connections() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.open_connections() == 0 and server.connections == 2
