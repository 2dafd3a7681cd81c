"""Every byte a device sends up is the same whatever its history holds, except the drafted and
committed ids (issue 28: the history's titles put into `Hello.client_name` went unseen, because
the differential test's two histories shared their titles).

Two histories of the same shape, every field different: titles, bodies, senders and other
metadata, sources, ids and dates each carry a canary of their own. One request is generated
over each, in every method and policy the device has, over a link that dies mid-generation (a
Resume) and over a real websocket (its HTTP upgrade request included). `privacy_audit.
public_uplink` takes the ids out of every uplink frame after checking that what is left is a
function of public data and the output; the two runs' lists must be equal byte for byte, no
canary may go up in any id list or raw frame, and each run's drafts must differ (the history
did change what was drafted)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from helpers.dying_channel import DyingChannel
from helpers.privacy_audit import assert_canary_not_sent, public_uplink

from specsteer import protocol
from specsteer.client import Client
from specsteer.history import HistoryStore
from specsteer_companion.endpoint import CompanionEndpoint
from specsteer_companion.local import LocalChannel
from specsteer_companion.server import CompanionServer, ServerConfig
from specsteer_companion.verifier import Verifier

SUBJECT = "Budget for the next quarter"
FIELDS = ("title", "body", "sender", "recipient", "newsgroup", "source", "id")


def canaries(side: str) -> dict[str, str]:
    """One canary per history field; the two sides share none of them."""
    return {name: f"Zq{side}{name.capitalize()}{7731 if side == 'A' else 4410}x"
            for name in FIELDS}


def history(side: str) -> HistoryStore:
    c = canaries(side)
    store = HistoryStore(memory=True)
    store.add(kind="email", id=f"email:{c['id']}", source=c["source"],
              title=f"{SUBJECT} {c['title']}",
              body=f"Dear team, the budget for the next quarter is in {c['body']}; ask me.",
              created_at="2024-03-01" if side == "A" else "2023-11-20",
              meta={"from": c["sender"], "to": c["recipient"], "newsgroup": c["newsgroup"]})
    store.add(kind="email", title=f"Meeting notes {c['title']}",
              body=f"Thank you for the notes, I will send the draft to {c['sender']} by Friday.",
              meta={"from": c["sender"]})
    return store


def _generate(tiny_model, companion, side: str, **params):  # type: ignore[no-untyped-def]
    frames: list[tuple[str, bytes]] = []
    client = Client(tiny_model, history=history(side), companion=companion,
                    tap=lambda d, f: frames.append((d, f)))
    result = client.generate(SUBJECT, max_new_tokens=32, offline="fail", **params)
    return result, frames


def _check(tiny_model, runs, params) -> None:  # type: ignore[no-untyped-def]
    """The two sides' runs: same public uplink, no canary sent, drafts that differ."""
    temperature = params.get("temperature", 0.0)
    publics, drafted = [], []
    for side, (result, frames) in zip("AB", runs, strict=True):
        assert not result.stats.degraded, result.stats.offline_reason
        for field in ("title", "body", "newsgroup"):  # what the email task puts in its prompt
            assert canaries(side)[field] in result.prompt.with_context
        for canary in canaries(side).values():
            assert_canary_not_sent(tiny_model.tokenizer, frames, canary)
        publics.append(public_uplink(tiny_model, frames, temperature, list(result.tokens)))
        drafted.append([m.draft_ids for d, f in frames if d == "up"
                        for m in [protocol.decode(f, protocol.Limits())]
                        if isinstance(m, protocol.Draft)])
    assert publics[0] == publics[1]
    assert [kind for kind, *_ in publics[0]][:2] == ["Hello", "OpenSession"]
    if params.get("method") not in ("costeer", "llm"):  # rows: no drafts go up at all
        assert drafted[0] != drafted[1]


@pytest.fixture(scope="module")
def verifier(tiny_model, tiny_generalist) -> Verifier:
    return Verifier(tiny_generalist, tiny_model)


@pytest.mark.parametrize("params", [
    dict(),
    dict(s0_on_device=True),
    dict(s0_on_device=True, pipeline=False, k=6, gamma=0.1),
    dict(s0_on_device=True, temperature=0.8, seed=3),
    dict(method="speculative"),
    dict(method="costeer"),
    dict(method="llm"),
    dict(leak_guard="redact"),
    dict(leak_guard="hold"),
])
def test_only_the_ids_depend_on_the_history(tiny_model, verifier, params):
    runs = [_generate(tiny_model, lambda: LocalChannel.for_verifier(verifier), side, **params)
            for side in "AB"]
    _check(tiny_model, runs, params)


def test_a_resume_carries_only_the_output_and_public_state(tiny_model, verifier):
    """The first link dies after Hello, OpenSession and three Drafts; the device resumes on a
    fresh one (a Resume with the output so far)."""
    def dies_once() -> Iterator:
        yield DyingChannel(CompanionEndpoint(verifier), 5)
        while True:
            yield LocalChannel.for_verifier(verifier)

    runs = []
    for side in "AB":
        links = dies_once()
        runs.append(_generate(tiny_model, lambda links=links: next(links), side))
        assert runs[-1][0].stats.resyncs == 1
    _check(tiny_model, runs, {})
    assert "Resume" in [kind for kind, *_ in public_uplink(
        tiny_model, runs[0][1], 0.0, list(runs[0][0].tokens))]


@contextmanager
def _recording_relay(port: int) -> Iterator[tuple[int, list[bytes]]]:
    """A TCP relay to 127.0.0.1:`port` recording what each client sends before its first
    frame: the websocket upgrade request, the one part of the uplink the tap does not see."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def pipe(src: socket.socket, dst: socket.socket, record: bool) -> None:
        seen = b""
        with src, dst:
            while chunk := src.recv(65536):
                if record and b"\r\n\r\n" not in seen:
                    seen += chunk
                    if b"\r\n\r\n" in seen:
                        requests.append(seen.split(b"\r\n\r\n")[0])
                dst.sendall(chunk)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", port))
            threading.Thread(target=pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client, False), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], requests
    finally:
        listener.close()


def _without_key(request: bytes) -> list[bytes]:
    """The upgrade request's lines but the random Sec-WebSocket-Key."""
    return [line for line in request.split(b"\r\n")
            if not line.lower().startswith(b"sec-websocket-key:")]


def test_over_a_websocket_the_upgrade_request_is_the_same_too(tiny_model, verifier):
    server = CompanionServer(verifier, ServerConfig(port=0))
    with server.running() as url, _recording_relay(int(url.rsplit(":", 1)[1])) as (port, seen):
        runs = [_generate(tiny_model, f"ws://127.0.0.1:{port}", side) for side in "AB"]
    _check(tiny_model, runs, {})
    assert len(seen) == 2 and _without_key(seen[0]) == _without_key(seen[1])
    assert all(canary.encode() not in request for request in seen
               for side in "AB" for canary in canaries(side).values())
