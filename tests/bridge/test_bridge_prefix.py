"""The bridge's `prefix` (continue the user's draft): prepared while typing, reused by the
generate that continues it, sent with the public request — and the history still is not; and
`min_token_ms`, the pace of a stream."""

from __future__ import annotations

import time

import pytest
from helpers.bridge_process import assert_valid

from specsteer.bridge import errors

pytestmark = pytest.mark.slow  # bridge and companion processes: not in ./dev test --fast

CANARY = "Quillwort-canary-8080"  # in the history: private
DRAFT = "Thanks Priya, the frost cloth is in the shed, and"


def _frames(bridge, request=None) -> list[dict]:
    return [f["params"] for _, f in bridge.notifications if f.get("method") == "companion.frame"
            and (request is None or f["params"]["generation"] == request)]


def _opened(bridge, request) -> str:
    """The text of the OpenSession frame (the public request) of one generation."""
    [frame] = [f for f in _frames(bridge, request) if f["type"] == "OpenSession"]
    return "".join(t["text"] for t in frame["tokens"]["prompt_ids"])


def test_prefix_is_prepared_continued_and_sent_with_the_request(spawn, companion_url,
                                                                tmp_path) -> None:
    bridge = spawn("--companion", companion_url, "--history", str(tmp_path / "h.db"),
                   "--audit-frames")
    bridge.call("history.add", {"kind": "email", "title": "Frost",
                                "body": f"Cover the beds; the code is {CANARY}."})
    query = {"query": {"message": "Will it frost tonight?", "subject": "Frost"},
             "task": "reply"}
    prepared = bridge.call("prepare", {**query, "prefix": DRAFT})["result"]
    assert_valid("prepare", "result", prepared)
    params = {**query, "prefix": DRAFT, "max_new_tokens": 16, "offline": "fail"}
    assert_valid("generate", "params", params)
    request = bridge.send("generate", params)
    result = bridge.answer(request)["result"]
    assert result["stats"]["prefill_reused"] > 0 and not result["stats"]["degraded"]
    assert "local" not in result["provenance"] and len(result["stats"]["records"]) == 1
    plain = bridge.send("generate", {**query, "max_new_tokens": 4, "offline": "fail"})
    bridge.answer(plain)
    assert _opened(bridge, request) == _opened(bridge, plain) + DRAFT
    for frame in _frames(bridge):  # every id list that went up or came down, as text
        for ids in frame.get("tokens", {}).values():
            assert CANARY not in "".join(t["text"] or "" for t in ids)
    bad = bridge.call("generate", {**query, "prefix": 7})
    assert bad["error"]["code"] == errors.INVALID_PARAMS
    assert bridge.close() == 0


def test_min_token_ms_paces_the_pieces(spawn, companion_url) -> None:
    """`min_token_ms` holds the decoding after each piece (how an app streams a fast model
    at reading speed): the answer comes no sooner than that pace allows."""
    bridge = spawn("--companion", companion_url)
    params = {"query": "Budget", "max_new_tokens": 8, "min_token_ms": 120, "offline": "fail"}
    assert_valid("generate", "params", params)
    sent = time.monotonic()
    request = bridge.send("generate", params)
    answered, answer = bridge.answer_at(request)
    pieces = bridge.stream_of(request)
    assert len(pieces) >= 4 and answer["result"]["text"]
    assert answered - sent >= 0.12 * (len(pieces) - 1)  # the last piece may be a held tail
    assert bridge.call("generate", {**params, "min_token_ms": -1})["error"]["code"] \
        == errors.INVALID_PARAMS
    assert bridge.close() == 0
