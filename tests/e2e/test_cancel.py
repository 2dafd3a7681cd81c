"""Cancelling a generation: it stops at the next token or prefill chunk and closes its session."""

from __future__ import annotations

import threading

import pytest

from specsteer.client import Client
from specsteer.device import DecodeStats, DevicePrompt, Params, decode
from specsteer.history import HistoryStore
from specsteer.link import CompanionLink
from specsteer_companion.local import LocalChannel
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
    cancel, out, pieces = threading.Event(), [], []
    for piece in client.stream("Budget", max_new_tokens=40, method=method, cancel=cancel,
                               result=out):
        pieces.append(piece)
        if len(out) == 0 and len(pieces) == 3:
            cancel.set()
    stats = out[0].stats
    # the stream ended at once: the tokens are the pieces' plus at most a held partial character
    assert stats.cancelled and out[0].text.startswith("".join(p.text for p in pieces))
    assert len(out[0].tokens) < 8
    for channel in channels.made:  # no companion session is left open
        assert channel.closed and channel.endpoint.session is None


def test_cancel_before_the_prefill_ends_it_without_tokens(tiny_model, tiny_generalist, store):
    channels = _Channels(Verifier(tiny_generalist, tiny_model))
    client = Client(tiny_model, history=store, companion=channels)
    cancel = threading.Event()
    cancel.set()
    result = client.generate("Budget", max_new_tokens=40, cancel=cancel)
    assert result.stats.cancelled and result.tokens == [] and result.text == ""
    assert all(c.closed for c in channels.made)
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
    for event in decode(tiny_model, prompt, Params(method=method, max_new_tokens=40), link,
                        stats, cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert len(events) == 3 and stats.cancelled and stats.tokens == 3
    if method != "slm_rag":
        assert channel.closed and channel.endpoint.session is None
