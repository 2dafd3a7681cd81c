"""Cancelling a generation: it stops at the next token or prefill chunk and closes its session."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest
from helpers.closing import closed_in_time
from helpers.counting import CountingModel

from specsteer.client import Client
from specsteer.device import DecodeStats, DevicePrompt, Params
from specsteer.device import decode as decode_tokens
from specsteer.errors import CompanionTimedOut
from specsteer.history import HistoryStore
from specsteer.link import CompanionLink
from specsteer.protocol import Draft, Limits, decode
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer
from specsteer_companion.verifier import Verifier


@pytest.fixture()
def store() -> HistoryStore:
    history = HistoryStore(memory=True)
    for n in range(4):
        history.add(kind="email", title=f"Budget {n}", body=f"Dear team, the budget {n} " * 20)
    return history


class _Channels:
    """Factory of in-process channels that remembers them, to check they were closed."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier, self.made = verifier, []

    def __call__(self) -> LocalChannel:
        self.made.append(LocalChannel.for_verifier(self.verifier))
        return self.made[-1]


@pytest.mark.parametrize("method", ["specsteer", "llm", "slm_rag"])
def test_cancel_between_tokens_ends_the_stream_and_closes_the_session(
    tiny_model, tiny_generalist, store, method
):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = Client(tiny_model, history=store, companion=channels)
    cancel, pieces = threading.Event(), []
    stream = client.stream("Budget", max_new_tokens=40, method=method, cancel=cancel)
    for piece in stream:
        pieces.append(piece)
        if len(pieces) == 3:
            cancel.set()
    result = stream.result
    # the stream ended at once: the tokens are the pieces' plus at most a held partial character
    assert result.stats.cancelled and result.text.startswith("".join(p.text for p in pieces))
    assert len(result.tokens) < 8
    assert all(closed_in_time(c) for c in channels.made)  # no companion session is left open


def test_cancel_before_the_prefill_ends_it_without_tokens(tiny_model, tiny_generalist, store):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = Client(tiny_model, history=store, companion=channels)
    cancel = threading.Event()
    cancel.set()
    result = client.generate("Budget", max_new_tokens=40, cancel=cancel)
    assert result.stats.cancelled and result.tokens == [] and result.text == ""
    assert all(closed_in_time(c) for c in channels.made)
    again = client.generate("Budget", max_new_tokens=40)  # the client is still usable
    assert not again.stats.cancelled and len(again.tokens) > 0


@pytest.mark.parametrize("method", ["specsteer", "llm", "slm_rag"])
def test_decode_yields_nothing_after_cancel(tiny_model, tiny_generalist, method):
    tok = tiny_model.tokenizer
    prompt = DevicePrompt(tok.encode("private context " * 30), tok.encode("public request"))
    channel = LocalChannel.for_verifier(Verifier(tiny_generalist, tiny_model))
    link = CompanionLink(channel)
    link.hello()
    cancel, stats, events = threading.Event(), DecodeStats(), []
    for event in decode_tokens(tiny_model, prompt, Params(method=method, max_new_tokens=40), link,
                        stats, cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert len(events) == 3 and stats.cancelled and stats.tokens == 3
    if method != "slm_rag":
        assert closed_in_time(channel)


class _PassHook(CountingModel):
    """The real model; sets `cancel` once `after` passes (all sessions together) have run."""

    def __init__(self, model, cancel: threading.Event, after: int) -> None:
        super().__init__(model)
        self.cancel, self.after, self.passes = cancel, after, []

    def _count(self, n: int) -> None:
        super()._count(n)
        self.passes.append(n)
        if len(self.passes) == self.after:
            self.cancel.set()


@pytest.mark.parametrize("after", [1, 3])
def test_cancel_during_the_prefill_stops_between_passes_and_keeps_them(
    tiny_model, tiny_generalist, store, after
):
    cancel = threading.Event()
    hooked = _PassHook(tiny_model, cancel, after)
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = Client(hooked, history=store, companion=channels)
    private = client.render("Budget")[1].private_ids
    result = client.generate("Budget", max_new_tokens=40, cancel=cancel, warm_start=False)
    assert result.stats.cancelled and result.tokens == []
    assert len(hooked.passes) == after  # no pass after the one that saw the cancel
    ran = sum(hooked.passes)
    assert ran < len(private)
    assert all(closed_in_time(c) for c in channels.made)
    # nothing half-written: the next generation reuses exactly the passes that ran
    again = client.generate("Budget", max_new_tokens=20, warm_start=False)
    cold = Client(tiny_model, history=store, companion=_Channels(
        Verifier(tiny_generalist, tiny_model))).generate("Budget", max_new_tokens=20,
                                                          warm_start=False)
    assert again.stats.prefill_reused == ran and again.tokens == cold.tokens


class _HeldVerdict:
    """The in-process companion, except that the first Draft's verdict never arrives (the
    companion is still verifying it): sending that Draft sets `cancel`."""

    def __init__(self, verifier: Verifier, cancel: threading.Event) -> None:
        self.inner, self.cancel, self.holding, self.up = LocalChannel.for_verifier(verifier), \
            cancel, False, []

    def send(self, frame: bytes) -> None:
        self.up.append(decode(frame, Limits()))
        if isinstance(self.up[-1], Draft):
            self.holding = True
            self.cancel.set()
        self.inner.send(frame)

    def recv(self, timeout: float) -> bytes:
        if self.holding:
            time.sleep(timeout)
            raise CompanionTimedOut("still verifying")
        return self.inner.recv(timeout)

    def poll(self) -> bytes | None:
        return None if self.holding else self.inner.poll()

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("pipeline", [False, True])
def test_cancel_during_a_round_does_not_wait_for_the_verdict(
    tiny_model, tiny_generalist, store, pipeline
):
    cancel, made = threading.Event(), []

    def channel() -> _HeldVerdict:
        made.append(_HeldVerdict(Verifier(tiny_generalist, tiny_model), cancel))
        return made[-1]

    # waiting for the verdict would end in a timeout after 3 s: degraded, not cancelled
    client = Client(tiny_model, history=store, companion=channel, timeout_s=3.0)
    result = client.generate("Budget", max_new_tokens=40, cancel=cancel, warm_start=False,
                             pipeline=pipeline)
    assert result.stats.cancelled and not result.stats.degraded and result.tokens == []
    assert len(made) == 1 and sum(isinstance(m, Draft) for m in made[0].up) == 1
    assert closed_in_time(made[0].inner)  # the companion's session ended with the connection


def test_cancel_while_drafting_sends_no_draft(tiny_model, tiny_generalist, store):
    cancel = threading.Event()
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    private = Client(tiny_model, history=store).render("Budget")[1].private_ids
    hooked = _DraftHook(tiny_model, cancel, len(private))
    client = Client(hooked, history=store, companion=channels)
    result = client.generate("Budget", max_new_tokens=40, cancel=cancel, warm_start=False, k=4)
    assert result.stats.cancelled and result.tokens == [] and result.stats.drafted == 0
    assert hooked.after_prompt == [1]  # one drafted token ran, the next never did
    assert all(closed_in_time(c) for c in channels.made)


class _DraftHook(CountingModel):
    """Sets `cancel` after the first pass past the private prompt (the first drafted token)."""

    def __init__(self, model, cancel: threading.Event, prompt: int) -> None:
        super().__init__(model)
        self.cancel, self.prompt, self.after_prompt = cancel, prompt, []

    def _count(self, n: int) -> None:
        before = self.appended
        super()._count(n)
        if before >= self.prompt:
            self.after_prompt.append(n)
            self.cancel.set()



@dataclass
class _SlowVerifier(Verifier):
    """The real verifier, whose Generalist pass over a draft waits for `release` (a companion
    still busy on the round); `verifying` is set when one starts."""

    verifying: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def open(self, request, committed=(), owner=""):
        session = super().open(request, committed, owner=owner)
        score = session.score

        def slow(*args, **kwargs):
            self.verifying.set()
            self.release.wait(30)
            return score(*args, **kwargs)

        session.score = slow
        return session


def test_cancel_over_a_socket_does_not_wait_for_the_verdict(tiny_model, tiny_generalist, store):
    verifier = _SlowVerifier(tiny_generalist, tiny_model)
    server = CompanionServer(verifier)
    cancel = threading.Event()
    threading.Thread(target=lambda: verifier.verifying.wait(30) and cancel.set(),
                     daemon=True).start()
    with server.running() as url:
        # waiting for the verdict would end in a timeout after 3 s: degraded, not cancelled
        client = Client(tiny_model, history=store, companion=url, timeout_s=3.0)
        result = client.generate("Budget", max_new_tokens=40, cancel=cancel, warm_start=False,
                                 pipeline=False)
        assert not verifier.release.is_set()  # it returned while the companion was verifying
        verifier.release.set()
        assert result.stats.cancelled and not result.stats.degraded and result.tokens == []
        deadline = time.monotonic() + 10  # the companion ends the connection and its session
        while server.open_connections() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.open_connections() == 0
