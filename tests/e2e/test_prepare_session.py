"""`Client.prepare` opens the companion session ahead: reused when it matches, replaced if not."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.budget_mail import CHANGED, REQUEST, budget_history
from helpers.closing import closed_in_time
from helpers.counting import CountingModel
from helpers.declared import StopsAt

from specsteer.client import Client
from specsteer.device import Params
from specsteer.device.rounds import first_draft
from specsteer.device.rules import make_rules
from specsteer.errors import CompanionUnavailable
from specsteer.history import HistoryStore
from specsteer.protocol import Limits, Mode, OpenSession, decode
from specsteer.runtime.track import Track
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow


@pytest.fixture()
def store() -> HistoryStore:
    return budget_history()


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
    assert result.stats.bytes_up > 0 and closed_in_time(channels.made[0])


def test_only_the_public_prompt_goes_up_ahead(tiny_model, tiny_generalist, store):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    _, device_prompt = client.render(REQUEST)
    assert [type(m).__name__ for m in channels.up] == ["Hello", "OpenSession"]
    assert list(channels.opened()[0].prompt_ids) == list(device_prompt.public_ids)
    assert len(device_prompt.private_ids) > len(device_prompt.public_ids) + 50
    client.close()
    assert closed_in_time(channels.made[0])  # a session never taken is closed with the client


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
    assert len(channels.made) == 1 and closed_in_time(channels.made[0])


def test_other_settings_do_not_reuse_the_session(tiny_model, tiny_generalist, store):
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST, method="llm")
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST, method="specsteer").wait(timeout=60)
    result = client.generate(REQUEST, max_new_tokens=30, method="llm")
    assert result.tokens == cold.tokens and not result.stats.session_reused
    assert [m.settings.mode for m in channels.opened()] == [Mode.SPECSTEER, Mode.ROWS]
    assert len(channels.made) == 1 and closed_in_time(channels.made[0])


def test_a_local_method_closes_the_prepared_session(tiny_model, tiny_generalist, store):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    client.generate(REQUEST, max_new_tokens=10, method="slm_rag")
    assert len(channels.made) == 1 and closed_in_time(channels.made[0])


def test_preparing_again_replaces_the_session_on_the_same_connection(
    tiny_model, tiny_generalist, store
):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    assert client.prepare(REQUEST).wait(timeout=60)
    assert client.prepare(REQUEST).wait(timeout=60)  # the same request: nothing new goes up
    assert client.prepare(CHANGED).wait(timeout=60)
    public = [list(client.render(q)[1].public_ids) for q in (REQUEST, CHANGED)]
    assert len(channels.made) == 1 and [list(m.prompt_ids) for m in channels.opened()] == public
    assert [type(m).__name__ for m in channels.up].count("Hello") == 1
    result = client.generate(CHANGED, max_new_tokens=10)
    assert result.stats.session_reused and len(channels.made) == 1
    assert closed_in_time(channels.made[0])


def test_preparing_again_while_opening_starts_over(tiny_model, tiny_generalist, store):
    verifier = Verifier(tiny_generalist, tiny_model)
    release, made = threading.Event(), []

    def slow() -> LocalChannel:  # the first connection takes until released
        if not made:
            release.wait(30)
        made.append(LocalChannel.for_verifier(verifier))
        return made[-1]

    client = Client(tiny_model, history=store, companion=slow)
    first = client.prepare(REQUEST)
    second = client.prepare(CHANGED)  # the first is still connecting: given up
    release.set()
    assert first.wait(timeout=60) and second.wait(timeout=60)
    result = client.generate(CHANGED, max_new_tokens=10)
    assert result.stats.session_reused and len(made) == 2
    assert all(closed_in_time(c) for c in made)


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


@pytest.mark.parametrize("method", ["specsteer", "speculative"])
def test_the_first_draft_is_made_ahead_and_used(tiny_model, tiny_generalist, store, method):
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST, method=method, k=3)
    client = _client(tiny_model, _Channels(Verifier(tiny_generalist, tiny_model)), store)
    assert client.prepare(REQUEST, method=method, k=3).wait(timeout=60)
    result = client.generate(REQUEST, max_new_tokens=30, method=method, k=3)
    assert (result.tokens, result.provenance) == (cold.tokens, cold.provenance)
    assert result.stats.drafted_ahead == 3 and cold.stats.drafted_ahead == 0
    assert result.stats.prefill_reused == len(client.render(REQUEST)[1].private_ids)


@pytest.mark.parametrize("change", [dict(k=2), dict(no_repeat_ngram=3), dict(temperature=0.7),
                                    dict(meta_openings=()), dict(banned_phrases=("zq",)),
                                    dict(min_new_tokens=8, end_release=1.0)])
def test_other_draft_settings_draft_again(tiny_model, tiny_generalist, store, change):
    options = {"seed": 5, "k": 3, **change}  # the prepare's settings but for `change`
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST, **options)
    client = _client(tiny_model, _Channels(Verifier(tiny_generalist, tiny_model)), store)
    assert client.prepare(REQUEST, seed=5, k=3).wait(timeout=60)
    result = client.generate(REQUEST, max_new_tokens=30, **options)
    assert result.tokens == cold.tokens and result.stats.drafted_ahead == 0


def test_a_draft_made_ahead_is_dropped_when_the_companion_is_gone(
    tiny_model, tiny_generalist, store
):
    def gone() -> LocalChannel:
        raise CompanionUnavailable("no companion here")

    cold = Client(tiny_model, history=store, companion=gone).generate(REQUEST, max_new_tokens=30)
    client = Client(tiny_model, history=store, companion=gone)
    assert client.prepare(REQUEST).wait(timeout=60)
    assert client._kept._kept["email"].ahead is not None  # drafted after the prefill
    result = client.generate(REQUEST, max_new_tokens=30)
    assert result.stats.degraded and result.stats.drafted_ahead == 0
    # the local Specialist starts right after the prompt, not after the dropped draft
    assert result.tokens == cold.tokens


def test_the_draft_made_ahead_keeps_the_rounds_bans(tiny_model):
    """What `SteeredRounds` bans in its first draft, `first_draft` bans too: here end-of-text
    (the model's own first pick, declared end-of-text) before the minimum length."""
    tok = tiny_model.tokenizer
    prompt = tok.encode("Dear team, the budget stays as it is. " * 6)

    def drafted(params: Params, tokenizer) -> list[int]:
        rules = make_rules(params, tokenizer)
        return first_draft(Track(tiny_model, prompt, 600), params, rules).tokens

    free = drafted(Params(k=4), tok)
    stops = StopsAt(tok, free[0])  # the model's own first pick, declared end-of-text
    early = drafted(Params(k=4, min_new_tokens=2), stops)
    late = drafted(Params(k=4, min_new_tokens=0), stops)
    assert early[0] != free[0] and late == free[:1]


def test_prepare_without_a_session_sends_nothing_until_the_generation(tiny_model, tiny_generalist,
                                                                      store):
    """open_session=False (the apps, while the user types): the device prefills, nothing goes
    up; the generation then opens the session itself and writes the same text."""
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST)
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = _client(tiny_model, channels, store)
    client.prepare(REQUEST, open_session=False, max_new_tokens=30).wait()
    assert channels.made == [] and channels.up == []
    result = client.generate(REQUEST, max_new_tokens=30)
    assert result.text == cold.text and result.stats.prefill_reused > 0
    assert len(channels.opened()) == 1
    client.close()


class _SessionsCounted(CountingModel):
    """The tiny Specialist, counting the sessions it opens and those still open."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.opened = self.closed = 0

    def new_session(self, max_length: int | None = None):
        session = super().new_session(max_length)
        close, self.opened = session.close, self.opened + 1

        def closed() -> None:
            self.closed += 1
            close()

        session.close = closed
        return session


def test_p_s0_s_public_track_is_prefilled_ahead(tiny_model, tiny_generalist, store):
    """With P_S0 on the device (the default), `prepare` prefills its track over the public
    prompt after the private one: the generation opens no session of its own, writes the cold
    text, and nothing stays open once the Client closes."""
    cold = _cold(tiny_model, tiny_generalist, store, REQUEST, k=3)
    model = _SessionsCounted(tiny_model)
    client = _client(model, _Channels(Verifier(tiny_generalist)), store)
    assert client.prepare(REQUEST, k=3).wait(timeout=60)
    assert model.opened == 2  # the private track and P_S0's public one
    result = client.generate(REQUEST, max_new_tokens=30, k=3)
    assert model.opened == 2 and result.stats.drafted_ahead == 3
    assert (result.tokens, result.provenance) == (cold.tokens, cold.provenance)
    client.close()
    assert model.closed == model.opened


@pytest.mark.parametrize("change", [dict(s0_on_device=False), dict(max_new_tokens=900)])
def test_a_p_s0_track_made_ahead_that_does_not_fit_is_closed(tiny_model, tiny_generalist, store,
                                                             change):
    """P_S0 placed on the companion after all, or a longer budget than its track has room
    for: the track made ahead is closed, and the text is the cold one."""
    options = {"k": 3, "max_new_tokens": 30, "user_length": False, **change}
    cold = _client(tiny_model, _Channels(Verifier(tiny_generalist, tiny_model)), store
                   ).generate(REQUEST, **options)
    model = _SessionsCounted(tiny_model)
    client = _client(model, _Channels(Verifier(tiny_generalist, tiny_model)), store)
    prepared = client.prepare(REQUEST, k=3, max_new_tokens=30, user_length=False)
    assert prepared.wait(timeout=60) and model.opened == 2
    result = client.generate(REQUEST, **options)
    assert result.tokens == cold.tokens
    assert model.closed == model.opened - 1  # only the kept private track is open
    client.close()
    assert model.closed == model.opened
