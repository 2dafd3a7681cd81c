"""Warm start: the Generalist writes while the device prefills, then Draft-Verify-Recover."""

from __future__ import annotations

import threading

import pytest
from helpers.counting import CountingModel

from specsteer import protocol
from specsteer.client import Client
from specsteer.device import DecodeStats, DevicePrompt, Params, decode
from specsteer.errors import CompanionUnavailable
from specsteer.link import CompanionLink
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_model
from specsteer.settings import METHODS
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

# many tiny-model generations: not in ./dev test --fast
pytestmark = pytest.mark.slow

MAX_NEW = 40


@pytest.fixture(scope="module")
def prompt(tiny_model) -> DevicePrompt:
    tok = tiny_model.tokenizer
    return DevicePrompt(tok.encode("the user's earlier posts, private " * 12),
                        tok.encode("write the post"))


def _run(model, generalist, prompt, params, switch_after=None, cancel_at=None):
    channel = LocalChannel.for_verifier(Verifier(generalist, model))
    link = CompanionLink(channel)
    link.hello()
    stats, events, cancel = DecodeStats(), [], threading.Event()
    for event in decode(model, prompt, params, link, stats, switch_after=switch_after,
                        cancel=cancel):
        events.append(event)
        if len(events) == cancel_at:
            cancel.set()
    return [e.token for e in events], [e.provenance for e in events], stats, channel


@pytest.mark.parametrize("method", ["specsteer", "speculative"])
@pytest.mark.parametrize("switch", [0, 1, 5, 12])
def test_after_the_switch_the_method_writes_as_if_started_there(
    tiny_model, tiny_generalist, prompt, method, switch
):
    params = Params(method=method, max_new_tokens=MAX_NEW, warm_start_min_s=0.0)
    tokens, provenance, stats, _ = _run(tiny_model, tiny_generalist, prompt, params, switch)
    assert stats.warm_tokens == switch and stats.switch_s is not None
    # before the switch: exactly the Generalist alone (the LLM baseline's tokens)
    llm, llm_prov, _, _ = _run(tiny_model, tiny_generalist, prompt,
                               Params(method="llm", max_new_tokens=switch)) if switch \
        else ([], [], None, None)
    assert tokens[:switch] == llm and provenance[:switch] == ["generalist"] * switch
    # after it: a cold generation of the method over both prompts plus those tokens
    pre = tokens[:switch]
    started_there = DevicePrompt([*prompt.private_ids, *pre], [*prompt.public_ids, *pre])
    rest, rest_prov, _, _ = _run(
        tiny_model, tiny_generalist, started_there,
        Params(method=method, max_new_tokens=MAX_NEW - switch, warm_start=False))
    assert tokens[switch:] == rest and provenance[switch:] == rest_prov
    assert "generalist" not in provenance[switch:]


def test_the_switch_follows_the_prefill_when_not_pinned(tiny_model, tiny_generalist, prompt):
    params = Params(max_new_tokens=MAX_NEW, warm_start_min_s=0.0)
    tokens, provenance, stats, _ = _run(tiny_model, tiny_generalist, prompt, params)
    k = stats.warm_tokens  # wherever the background prefill let it happen
    assert stats.switch_s is not None and provenance[:k] == ["generalist"] * k
    started_there = DevicePrompt([*prompt.private_ids, *tokens[:k]],
                                 [*prompt.public_ids, *tokens[:k]])
    rest, _, _, _ = _run(tiny_model, tiny_generalist, started_there,
                         Params(max_new_tokens=MAX_NEW - k, warm_start=False))
    assert tokens[k:] == rest


def test_no_warm_start_when_off_short_or_for_other_methods(tiny_model, tiny_generalist, prompt):
    off = _run(tiny_model, tiny_generalist, prompt,
               Params(max_new_tokens=MAX_NEW, warm_start=False, warm_start_min_s=0.0), 5)
    short = _run(tiny_model, tiny_generalist, prompt, Params(max_new_tokens=MAX_NEW), 5)
    for _tokens, provenance, stats, _ in (off, short):  # the tiny prefill is estimated at ~us
        assert stats.warm_tokens == 0 and stats.switch_s is None
        assert "generalist" not in provenance
    assert off[0] == short[0]
    for method in set(METHODS) - {"specsteer", "speculative"}:
        _, _, stats, _ = _run(tiny_model, tiny_generalist, prompt,
                              Params(method=method, max_new_tokens=8, warm_start_min_s=0.0), 3)
        assert stats.switch_s is None


def test_cancel_during_the_warm_start_stops_the_prefill_and_the_session(
    tiny_model, tiny_generalist, prompt
):
    params = Params(max_new_tokens=MAX_NEW, warm_start_min_s=0.0)
    tokens, provenance, stats, channel = _run(tiny_model, tiny_generalist, prompt, params,
                                              switch_after=10, cancel_at=3)
    assert len(tokens) == 3 and provenance == ["generalist"] * 3 and stats.cancelled
    assert channel.closed and channel.endpoint.session is None


def test_offline_the_local_specialist_writes_as_today(tiny_model, prompt):
    def unreachable() -> CompanionLink:
        raise CompanionUnavailable("no route")

    params = Params(max_new_tokens=MAX_NEW, warm_start_min_s=0.0)
    events = list(decode(tiny_model, prompt, params, connect=unreachable))
    local = list(decode(tiny_model, prompt, Params(method="slm_rag", max_new_tokens=MAX_NEW)))
    assert [e.token for e in events] == [e.token for e in local]
    assert {e.provenance for e in events} == {"local"}


def test_the_client_reports_the_warm_start(tiny_model, tiny_generalist):
    from specsteer.history import HistoryStore

    store = HistoryStore(memory=True)
    store.add(kind="email", title="Budget", body="Dear team, the budget stays. " * 10)
    verifier = Verifier(tiny_generalist, tiny_model)
    client = Client(tiny_model, history=store,
                    companion=lambda: LocalChannel.for_verifier(verifier))
    result = client.generate("Budget", max_new_tokens=20, warm_start_min_s=0.0)
    stats = result.stats
    # the switch comes when the prefill is done, or never if the end comes first
    assert stats.warm_tokens == result.provenance.count("generalist") >= 1
    assert result.provenance[: stats.warm_tokens] == ["generalist"] * stats.warm_tokens
    # the stats table (CLI and demo) says where the wait went
    from rich.console import Console

    from specsteer.cli.generate import stats_table

    console = Console(width=200, record=True)
    console.print(stats_table(result))
    text = console.export_text()
    assert f"{stats.warm_tokens} Generalist tokens, " + (
        "Draft-Verify-Recover from" if stats.switch_s is not None
        else "the end came before the prefill was done") in text
    assert f"({stats.prefill_tokens} prompt tokens; 0 reused" in text


def test_the_estimate_scales_with_the_graph_s_multiply_adds_and_threads():
    """The compiled graph's multiply-adds a token (recorded in its manifest: every linear layer
    but the output layer) at the precision's measured rate per core."""
    from specsteer.device.warm import MACS_PER_CORE, estimated_prefill_s

    one = load_model(tiny_model_dir("llama", seed=0), threads=1)
    two = load_model(tiny_model_dir("llama", seed=0), threads=2)
    # the tiny recipe: 2 layers of q, k, v, o (64x64, 64x32 twice, 64x64) and the MLP (3 x
    # 64x128); the output layer (64 x vocabulary) is not per token
    assert one.manifest["prefill_macs_per_token"] == 2 * (64 * 64 * 2 + 64 * 32 * 2
                                                          + 3 * 64 * 128)
    assert estimated_prefill_s(one, 100) == pytest.approx(
        100 * one.manifest["prefill_macs_per_token"] / MACS_PER_CORE["fp32"])
    assert estimated_prefill_s(one, 100) == pytest.approx(2 * estimated_prefill_s(two, 100))
    assert estimated_prefill_s(one, 200) == pytest.approx(2 * estimated_prefill_s(one, 100))
    assert estimated_prefill_s(one, 1000) < Params().warm_start_min_s  # tiny: never by default


def test_the_prefill_waits_for_the_first_generalist_token(tiny_model, tiny_generalist, prompt):
    """A model pass holds the GIL: the prefill must not slow the hello, the session and the
    first row down. Nothing of the private prompt runs before the first row is in."""
    counted = CountingModel(tiny_model)
    inner = LocalChannel.for_verifier(Verifier(tiny_generalist, tiny_model))
    seen: list[tuple[str, int]] = []  # (frame received, device tokens run before it)

    class Watched:
        def send(self, frame: bytes) -> None:
            inner.send(frame)

        def recv(self, timeout: float) -> bytes:
            frame = inner.recv(timeout)
            seen.append((type(protocol.decode(frame, protocol.Limits())).__name__,
                         counted.appended))
            return frame

        def close(self) -> None:
            inner.close()

    link = CompanionLink(Watched())
    link.hello()
    stats = DecodeStats()
    events = list(decode(counted, prompt, Params(max_new_tokens=MAX_NEW, warm_start_min_s=0.0),
                         link, stats))
    first_row = next(i for i, (name, _) in enumerate(seen) if name == "RowReply")
    assert all(ran == 0 for _, ran in seen[: first_row + 1])
    # where the switch falls is timing, so the text may reach an end-of-text before MAX_NEW
    assert stats.warm_tokens >= 1 and stats.switch_s is not None
    assert len(events) == MAX_NEW or events[-1].token in tiny_model.tokenizer.eos_ids
    assert counted.appended >= len(prompt.private_ids)  # and then it ran


def test_a_generation_that_ends_before_the_switch_counts_its_warm_tokens(
    tiny_model, tiny_generalist, prompt
):
    params = Params(max_new_tokens=MAX_NEW, warm_start_min_s=0.0)
    tokens, provenance, stats, _ = _run(tiny_model, tiny_generalist, prompt, params,
                                        switch_after=MAX_NEW + 1)
    assert stats.switch_s is None and stats.warm_tokens == len(tokens) == MAX_NEW
    assert provenance == ["generalist"] * MAX_NEW
