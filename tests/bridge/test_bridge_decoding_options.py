"""The bridge's `no_repeat_ngram` and `leak_guard` (what the sample apps set for their
suggestions): they reach the Client's decoder, bad values are refused, and the leak guard's
counts come back in the stats."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers.bridge_process import assert_valid

from specsteer.bridge import errors
from specsteer.bridge.handlers import Bridge
from specsteer.client import Client

pytestmark = pytest.mark.slow  # bridge and companion processes: not in ./dev test --fast

QUERY = {"query": "Bulb planting day", "task": "note", "max_new_tokens": 200}
LEAK_STATS = ("leak_flagged", "leak_redacted", "leak_held")


def _repeated(ids: list[int], n: int) -> int:
    """How many n-grams of `ids` repeat an earlier one."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) - len(set(grams))


def _refuses_bad_ngram_sizes(bridge: Any, option: str, as_text: str) -> None:
    """An n-gram size of 1, below 0, fractional or written as text is an invalid-params error."""
    for bad in (1, -1, 2.5, as_text):
        answer = bridge.call("generate", {**QUERY, option: bad})
        assert answer["error"]["code"] == errors.INVALID_PARAMS, bad


def test_no_repeat_ngram_reaches_the_decoder(spawn, tiny_model) -> None:
    """On the tiny Specialist this note's greedy continuation repeats token pairs; with
    no_repeat_ngram=2 the bridge's text is the one a decoder that never repeats a pair writes."""
    plain = Client(tiny_model).generate(QUERY["query"], task="note", max_new_tokens=200)
    banned = Client(tiny_model).generate(QUERY["query"], task="note", max_new_tokens=200,
                                         no_repeat_ngram=2)
    assert _repeated(list(plain.tokens), 2) > 0 and _repeated(list(banned.tokens), 2) == 0
    bridge = spawn()
    params = {**QUERY, "no_repeat_ngram": 2}
    assert_valid("generate", "params", params)
    assert bridge.call("generate", params)["result"]["text"] == banned.text
    assert bridge.call("generate", QUERY)["result"]["text"] == plain.text != banned.text
    _refuses_bad_ngram_sizes(bridge, "no_repeat_ngram", "8")
    assert bridge.close() == 0


def test_loop_ngram_reaches_the_decoder(spawn, tiny_model) -> None:
    """With the 8-gram rule off, this note's 300-token continuation writes some token pair three
    times or more; with loop_ngram=2 the bridge's text is the Client's, which never does."""
    def thrice(ids: list[int]) -> bool:
        pairs = [tuple(ids[i:i + 2]) for i in range(len(ids) - 1)]
        return any(pairs.count(pair) > 2 for pair in pairs)

    off = {"max_new_tokens": 300, "no_repeat_ngram": 0}
    plain = Client(tiny_model).generate(QUERY["query"], task="note", **off)
    capped = Client(tiny_model).generate(QUERY["query"], task="note", loop_ngram=2, **off)
    assert thrice(list(plain.tokens)) and not thrice(list(capped.tokens))
    bridge = spawn()
    params = {**QUERY, **off, "loop_ngram": 2}
    assert_valid("generate", "params", params)
    assert_valid("prepare", "params", params)
    assert bridge.call("generate", params)["result"]["text"] == capped.text != plain.text
    _refuses_bad_ngram_sizes(bridge, "loop_ngram", "4")
    assert bridge.close() == 0


def test_loop_end_ngram_reaches_the_decoder_and_the_stats(spawn, tiny_model) -> None:
    """With the 8-gram rule off this note's continuation writes a token pair a third time and
    later a "?": with loop_end_ngram=2 the Client's text ends there, and so does the bridge's,
    whose stats say why."""
    off = {"max_new_tokens": 300, "no_repeat_ngram": 0}
    plain = Client(tiny_model).generate(QUERY["query"], task="note", **off)
    ended = Client(tiny_model).generate(QUERY["query"], task="note", loop_end_ngram=2, **off)
    assert ended.stats.loop_ended and not plain.stats.loop_ended
    assert len(ended.tokens) < len(plain.tokens) and ended.text.endswith("?")
    bridge = spawn()
    params = {**QUERY, **off, "loop_end_ngram": 2}
    assert_valid("generate", "params", params)
    assert_valid("prepare", "params", params)
    answer = bridge.call("generate", params)["result"]
    assert answer["text"] == ended.text and answer["stats"]["loop_ended"] is True
    _refuses_bad_ngram_sizes(bridge, "loop_end_ngram", "4")
    assert bridge.close() == 0


def test_leak_guard_is_validated_and_its_counts_are_in_the_stats(spawn, companion_url) -> None:
    bridge = spawn("--companion", companion_url)
    params = {**QUERY, "max_new_tokens": 24, "offline": "fail", "leak_guard": "redact"}
    assert_valid("generate", "params", params)
    request = bridge.send("generate", params)
    result = bridge.answer(request)["result"]
    assert_valid("generate", "result", result)
    [stats] = bridge.stream_of(request, "generate.stats")
    for name in LEAK_STATS:
        assert isinstance(result["stats"][name], int) and stats["stats"][name] \
            == result["stats"][name]
    answer = bridge.call("generate", {**QUERY, "leak_guard": "block"})
    assert answer["error"]["code"] == errors.INVALID_PARAMS
    assert bridge.close() == 0


class _Recording(Client):
    """A real Client that also keeps the options each `stream` was called with."""

    calls: list[dict[str, Any]]

    def stream(self, query: Any, **options: Any):  # type: ignore[override]
        self.calls.append(options)
        return super().stream(query, **options)


@pytest.mark.parametrize("options", [{"no_repeat_ngram": 8, "leak_guard": "hold"},
                                     {"no_repeat_ngram": 0, "leak_guard": "allow"}])
def test_generate_passes_the_options_to_the_client(tiny_model, options) -> None:
    client = _Recording(tiny_model)
    client.calls = []
    answered = threading.Event()
    answers: list[Any] = []

    def respond(result: Any, error: Any) -> None:
        answers.append((result, error))
        answered.set()

    bridge = Bridge(client, lambda method, params: None, max_line_bytes=1 << 20)
    bridge.call(1, "generate", {**QUERY, "max_new_tokens": 8, **options}, respond)
    assert answered.wait(30)
    [(result, error)] = answers
    assert error is None and result["text"]
    [call] = client.calls
    assert {name: call[name] for name in options} == options
    bridge.close()


def test_openings_and_end_release_reach_the_decoder(spawn, tiny_model) -> None:
    """An app writing in another language gives its own meta-answer openings: the text the tiny
    Specialist opens with, declared one, is not written; [] turns the rule off."""
    tok = tiny_model.tokenizer
    plain = Client(tiny_model).generate(QUERY["query"], task="note", max_new_tokens=12,
                                        meta_openings=(), assistant_openings=())
    # an opening the tokenizer writes as the text's own first ids (decode does not always
    # round-trip on the tiny tokenizer, so take the first length that does)
    phrase = next(tok.decode(plain.tokens[:n]) for n in range(2, 8)
                  if tok.encode(tok.decode(plain.tokens[:n])) == list(plain.tokens[:n]))
    bridge = spawn()
    params = {**QUERY, "max_new_tokens": 12, "meta_openings": [phrase], "end_release": 0.9}
    assert_valid("generate", "params", params)
    assert_valid("prepare", "params", params)
    text = bridge.call("generate", params)["result"]["text"]
    assert not text.startswith(phrase.strip())
    off = bridge.call("generate", {**QUERY, "max_new_tokens": 12, "meta_openings": [],
                                   "assistant_openings": []})
    assert off["result"]["text"] == plain.text
    # as an assistant opening: banned too, since this user's history (none) never uses it
    assistant = {**QUERY, "max_new_tokens": 12, "meta_openings": [], "assistant_openings": [phrase]}
    assert_valid("generate", "params", assistant)
    assert not bridge.call("generate", assistant)["result"]["text"].startswith(phrase.strip())
    for bad in ({"end_release": 0}, {"end_release": 1.5}, {"meta_openings": [""]},
                {"meta_openings": "I'm sorry"}, {"assistant_openings": [""]},
                {"assistant_openings": "Here's the"}, {"banned_phrases": [""]},
                {"banned_phrases": "As an AI"}, {"assistant_phrases": [7]},
                {"assistant_phrases": ["x"] * 65}):
        answer = bridge.call("generate", {**QUERY, **bad})
        assert answer["error"]["code"] == errors.INVALID_PARAMS, bad
    assert bridge.close() == 0


def test_phrases_banned_anywhere_reach_the_decoder(spawn, tiny_model) -> None:
    """A phrase the tiny Specialist writes mid-text (its tokens 4 on), given as the app's
    `banned_phrases` or as an `assistant_phrases` entry this user (no history) never writes,
    is not written; [] leaves the text as it was."""
    tok = tiny_model.tokenizer
    off = {"meta_openings": [], "assistant_openings": [], "banned_phrases": [],
           "assistant_phrases": []}
    plain = Client(tiny_model).generate(QUERY["query"], task="note", max_new_tokens=12,
                                        **{name: () for name in off})
    span = next(plain.tokens[3:n] for n in range(5, 9)
                if tok.encode(tok.decode(plain.tokens[3:n])) == list(plain.tokens[3:n]))
    phrase = tok.decode(span)
    bridge = spawn()
    assert bridge.call("generate", {**QUERY, "max_new_tokens": 12, **off}
                       )["result"]["text"] == plain.text
    for name in ("banned_phrases", "assistant_phrases"):
        params = {**QUERY, "max_new_tokens": 12, **off, name: [phrase]}
        assert_valid("generate", "params", params)
        assert_valid("prepare", "params", params)
        tokens = tok.encode(bridge.call("generate", params)["result"]["text"])
        assert tokens[:3] == list(plain.tokens[:3]) and tokens[3:3 + len(span)] != list(span)
    assert bridge.close() == 0
