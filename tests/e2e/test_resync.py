"""Stateless resync: a link that drops mid-generation is replaced at once by a `Resume` on a
fresh connection, and the greedy output is the uninterrupted run's, token for token.

The uninterrupted runs are the pins of `tests/data/pinned_tiny.json` (test_pinned_outputs); here
the first connection dies after a fixed number of frames (so at a known round) and every later
one is healthy, in process (`DyingChannel`) and over websockets with a list of companion URLs.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from helpers.dying_channel import DyingChannel
from test_pinned_outputs import PINS

from specsteer import protocol
from specsteer.client import Client
from specsteer.device import DecodeStats, DevicePrompt, Params, decode
from specsteer.errors import CompanionConfigError, CompanionUnavailable
from specsteer.link import CompanionLink, FrameChannel
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_model
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer, ServerConfig
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

GREEDY = [c for c in PINS["cases"] if not c["params"].get("temperature") and c["params"]["method"]
          not in ("slm", "slm_rag")]
CROSS_GREEDY = [c for c in PINS["cross"] if not c["params"].get("temperature")]
SUBJECT = "Budget for next quarter"
# Frames the first connection carries: Hello and OpenSession, then 0, 2 and 6 requests, so it
# dies on the first request, early, and in the middle of the generation.
DEATHS = (2, 4, 8)


class _DiesOnce:
    """Connection factory: the first channel dies after `frames` frames, later ones work."""

    def __init__(self, verifier: Verifier, frames: int) -> None:
        self.verifier, self.frames, self.calls = verifier, frames, 0
        self.sent: list[bytes] = []

    def __call__(self) -> CompanionLink:
        self.calls += 1
        channel: FrameChannel = DyingChannel(CompanionEndpoint(self.verifier), self.frames) \
            if self.calls == 1 else LocalChannel.for_verifier(self.verifier)
        link = CompanionLink(channel, tap=lambda d, f: self.sent.append(f) if d == "up" else None)
        link.hello()
        return link


def _run(specialist, generalist, case: dict, frames: int) -> tuple[list, list, DecodeStats, list]:
    tok = specialist.tokenizer
    prompt = DevicePrompt(tok.encode(PINS["private"]), tok.encode(PINS["public"]))
    params = Params(max_new_tokens=PINS["max_new_tokens"], **case["params"])
    factory = _DiesOnce(Verifier(generalist, specialist), frames)
    stats = DecodeStats()
    events = list(decode(specialist, prompt, params, None, stats, connect=factory, offline="fail"))
    sent = [protocol.decode(f, protocol.Limits()) for f in factory.sent]
    return [e.token for e in events], [e.provenance for e in events], stats, sent


@pytest.mark.parametrize("frames", DEATHS)
@pytest.mark.parametrize("case", GREEDY, ids=lambda c: json.dumps(c["params"]))
def test_a_dropped_link_resyncs_to_the_uninterrupted_output(tiny_model, tiny_generalist, case,
                                                           frames):
    tokens, provenance, stats, sent = _run(tiny_model, tiny_generalist, case, frames)
    assert tokens == case["tokens"]
    assert provenance == case["provenance"]
    assert stats.resyncs == 1 and not stats.degraded and stats.reconnects == 0
    opened, again = [m for m in sent if isinstance(m, protocol.OpenSession | protocol.Resume)]
    if frames == 2:  # died before a single token: nothing to resume, a fresh open
        assert again == opened
        return
    assert isinstance(opened, protocol.OpenSession) and isinstance(again, protocol.Resume)
    assert again.prompt_ids == opened.prompt_ids and again.settings == opened.settings
    # what the device had emitted when the link dropped, nothing more
    assert again.committed_ids and list(again.committed_ids) == tokens[: len(again.committed_ids)]


@pytest.fixture(scope="module")
def cross_generalist():
    return load_model(tiny_model_dir("llama", seed=1, vocab=384))


@pytest.mark.parametrize("case", CROSS_GREEDY, ids=lambda c: json.dumps(c["params"]))
def test_resync_across_tokenizers_gives_the_uninterrupted_output(tiny_model, cross_generalist,
                                                                 case):
    tokens, provenance, stats, _ = _run(tiny_model, cross_generalist, case, frames=6)
    assert (tokens, provenance) == (case["tokens"], case["provenance"])
    assert stats.resyncs == 1


def test_a_resync_that_drops_before_a_token_goes_offline(tiny_model, tiny_generalist):
    """Every connection dies on its first request: one immediate resync, then the offline
    policy (no loop of resyncs that never make progress)."""
    verifier = Verifier(tiny_generalist, tiny_model)
    calls = []

    def always_dying() -> CompanionLink:
        calls.append(1)
        link = CompanionLink(DyingChannel(CompanionEndpoint(verifier), frames=2))
        link.hello()
        return link

    tok = tiny_model.tokenizer
    prompt = DevicePrompt(tok.encode(PINS["private"]), tok.encode(PINS["public"]))
    stats = DecodeStats()
    with pytest.raises(CompanionUnavailable):
        list(decode(tiny_model, prompt, Params(max_new_tokens=20), None, stats,
                    connect=always_dying, offline="fail"))
    assert len(calls) == 2 and stats.resyncs == 0


class _StopsServer:
    """Frame tap: after `frames` frames went up, stop the server `stack` runs (the device
    waits for it), so the device's next read finds the connection closed."""

    def __init__(self, frames: int, stack: contextlib.ExitStack) -> None:
        self.left, self.stack = frames, stack

    def __call__(self, direction: str, frame: bytes) -> None:
        if direction == "up":
            self.left -= 1
            if self.left == 0:
                self.stack.close()


def test_a_list_of_companions_fails_over_with_the_same_text(tiny_model, tiny_generalist):
    """Two companions over websockets: the first stops mid-generation, the device resumes on
    the second, and the text is the one an uninterrupted companion writes."""
    verifier = Verifier(tiny_generalist, tiny_model)
    reference = Client(tiny_model, companion=lambda: LocalChannel.for_verifier(verifier))
    expected = reference.generate(SUBJECT, max_new_tokens=40, k=2)
    first, second = (CompanionServer(verifier, ServerConfig(port=0)) for _ in range(2))
    with contextlib.ExitStack() as first_running, second.running() as url_b:
        url_a = first_running.enter_context(first.running())
        client = Client(tiny_model, companion=[url_a, url_b], tap=_StopsServer(6, first_running))
        result = client.generate(SUBJECT, max_new_tokens=40, k=2, offline="fail")
    assert result.tokens == expected.tokens and result.provenance == expected.provenance
    assert result.stats.resyncs == 1 and not result.stats.degraded
    assert first.connections == 1 and second.connections == 1


def test_unreachable_urls_in_the_list_are_skipped(tiny_model, tiny_generalist):
    verifier = Verifier(tiny_generalist, tiny_model)
    server = CompanionServer(verifier, ServerConfig(port=0))
    with server.running() as url:
        dead = "ws://127.0.0.1:9"  # discard port: nothing listens
        client = Client(tiny_model, companion=[dead, url], connect_timeout_s=2)
        result = client.generate(SUBJECT, max_new_tokens=8, offline="fail")
    assert not result.stats.degraded and server.connections == 1
    with pytest.raises(CompanionConfigError, match="non-empty list"):
        Client(tiny_model, companion=[])


def test_a_resync_keeps_the_count_of_the_draft_made_ahead(tiny_model, tiny_generalist):
    from specsteer.history import HistoryStore

    store = HistoryStore(memory=True)
    store.add(kind="email", title="Budget", body="The budget stays flat this quarter. " * 4)
    verifier = Verifier(tiny_generalist, tiny_model)
    calls = []

    def channels() -> FrameChannel:  # the first connection dies after 6 frames
        calls.append(1)
        return DyingChannel(CompanionEndpoint(verifier), 6) if len(calls) == 1 \
            else LocalChannel.for_verifier(verifier)

    client = Client(tiny_model, history=store, companion=channels)
    assert client.prepare(SUBJECT, k=3, open_session=False).wait(timeout=60)
    result = client.generate(SUBJECT, max_new_tokens=30, k=3, offline="fail")
    assert result.stats.resyncs == 1 and result.stats.drafted_ahead == 3
