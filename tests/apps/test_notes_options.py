"""The notes app's engine on the tiny Specialist (no browser): continuations never repeat an
n-gram (8 by default) and run under the leak guard the settings chose, whose counts come back in
the `done` event the privacy panel reads; "ready to continue" means the prefill is done."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.counting import SlowModel

pytestmark = pytest.mark.slow  # a companion server and many generations: not in ./dev test --fast

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sample_apps" / "notes"))

import engine as notes_engine  # noqa: E402
from engine import NO_REPEAT_NGRAM, NotesEngine, Settings  # noqa: E402
from server import serve  # noqa: E402

from specsteer.client import Client  # noqa: E402
from specsteer.history import HistoryStore  # noqa: E402
from specsteer.history.ingest import ingest_path  # noqa: E402
from specsteer_companion.server import CompanionServer  # noqa: E402
from specsteer_companion.verifier import Verifier  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "sample_apps" / "data"

TITLE, BODY = "Bulb planting day", "Tulips along the fence this Saturday."


class _Recording(Client):
    """A real Client that also keeps the options each `stream` was called with."""

    calls: list[dict[str, Any]] = []  # the options of each `stream`, and the stream itself

    def stream(self, query: Any, **options: Any):  # type: ignore[override]
        stream = super().stream(query, **options)
        _Recording.calls.append({**options, "stream": stream})
        return stream


def _repeated(ids: list[int], n: int) -> int:
    """How many n-grams of `ids` repeat an earlier one."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) - len(set(grams))


def _continue(engine: NotesEngine) -> tuple[str, dict[str, Any]]:
    events: list[tuple[str, dict[str, Any]]] = []
    engine.continue_note(TITLE, BODY, None, lambda event, data: events.append((event, data)))
    assert events[-1][0] == "done", events[-1]
    return "".join(d["text"] for e, d in events if e == "piece"), events[-1][1]


@pytest.fixture()
def recording(monkeypatch) -> list[dict[str, Any]]:
    _Recording.calls = []
    monkeypatch.setattr(notes_engine, "Client", _Recording)
    return _Recording.calls


def test_continuations_never_repeat_an_ngram(tiny_model, recording) -> None:
    store = HistoryStore(memory=True)
    ingest_path(store, DATA / "notes.json")  # the persona's notes: the continuation's context
    engine = NotesEngine(tiny_model, store, Settings(), max_new_tokens=120)
    _continue(engine)
    assert NO_REPEAT_NGRAM == 8 and recording[-1]["no_repeat_ngram"] == 8
    # the option reaches the decoder: this continuation repeats token pairs without the rule
    plain, _ = _continue(NotesEngine(tiny_model, store, Settings(), max_new_tokens=120,
                                     no_repeat_ngram=0))
    banned, _ = _continue(NotesEngine(tiny_model, store, Settings(), max_new_tokens=120,
                                      no_repeat_ngram=2))
    assert plain != banned
    assert [call["no_repeat_ngram"] for call in recording[-2:]] == [0, 2]
    plain_ids, banned_ids = (list(call["stream"].result.tokens) for call in recording[-2:])
    assert _repeated(plain_ids, 2) > 0 and _repeated(banned_ids, 2) == 0


@pytest.mark.parametrize("policy", ["allow", "redact", "hold"])
def test_the_chosen_leak_guard_runs_and_its_counts_are_in_done(tiny_model, recording,
                                                               policy) -> None:
    engine = NotesEngine(tiny_model, HistoryStore(memory=True), Settings(leak_guard=policy),
                         max_new_tokens=16)
    _, done = _continue(engine)
    assert recording[-1]["leak_guard"] == policy and done["leak_guard"] == policy
    result = recording[-1]["stream"].result  # the Client's Result the engine reported from
    for name in ("leak_flagged", "leak_redacted", "leak_held"):
        assert isinstance(done[name], int) and done[name] == getattr(result.stats, name)


@pytest.fixture()
def server() -> Iterator[tuple[str, NotesEngine]]:
    from specsteer.models.tiny import tiny_model_dir
    from specsteer.runtime import load_model

    engine = NotesEngine(load_model(tiny_model_dir("llama", seed=0)), HistoryStore(memory=True),
                         Settings())
    httpd = serve(engine, port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", engine
    finally:
        httpd.shutdown()
        httpd.server_close()


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_settings_choose_the_leak_guard_and_refuse_a_bad_one(server) -> None:
    url, engine = server
    with urllib.request.urlopen(f"{url}/api/settings", timeout=10) as answer:
        settings = json.loads(answer.read())
    assert settings["leak_guard"] == "redact" and settings["leak_guards"] == [
        "allow", "redact", "hold"]
    status, body = _post(f"{url}/api/settings", {"leak_guard": "block"})
    assert status == 400 and "leak_guard" in body["error"]
    assert engine.settings.leak_guard == "redact"  # a refused change changes nothing
    status, body = _post(f"{url}/api/settings", {"leak_guard": "hold"})
    assert status == 200 and body["leak_guard"] == "hold" == engine.settings.leak_guard


def test_prepare_answers_ready_once_the_prefill_is_done(tiny_model) -> None:
    """The page shows "ready to continue" on `ready`: the continuation asked for then runs no
    prompt token again (an engine answering before its prefill is done fails here)."""
    store = HistoryStore(memory=True)
    ingest_path(store, DATA / "notes.json")
    slow = SlowModel(tiny_model, delay_s=0.2)
    engine = NotesEngine(slow, store, Settings(), max_new_tokens=4)
    started = time.perf_counter()
    assert engine.prepare(TITLE, BODY) == {"prefilling": True, "ready": True}
    waited = time.perf_counter() - started
    _, done = _continue(engine)
    assert done["prefill_reused"] > 128 and done["prefill_tokens"] == 0, done
    assert waited >= 0.2 * (done["prefill_reused"] // 128)  # one pass per chunk, all waited for


def test_a_continuation_prepared_while_typing_uses_the_draft_made_ahead(tiny_model,
                                                                     tiny_generalist) -> None:
    """The engine prepares with the continuation's decoding options (`no_repeat_ngram` 8, its
    `max_new_tokens`, preset, leak guard): the first round's draft made after the prefill is
    the one the continuation uses (`drafted_ahead`, shown in the suggestion's state line).
    Prepared without them, the draft was made for other settings and made again."""
    store = HistoryStore(memory=True)
    ingest_path(store, DATA / "notes.json")
    with CompanionServer(Verifier(tiny_generalist, tiny_model)).running() as url:
        engine = NotesEngine(tiny_model, store, Settings(companion=url), max_new_tokens=16)
        assert engine.prepare(TITLE, BODY)["ready"]
        _, done = _continue(engine)
        engine.close()
    assert done["drafted_ahead"] > 0 and done["prefill_tokens"] == 0, done
