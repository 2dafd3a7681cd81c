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
    """The frames (`companion.frame`) in the order they crossed, of one generation or all."""
    return [f["params"] for _, f in bridge.notifications if f.get("method") == "companion.frame"
            and (request is None or f["params"]["generation"] == request)]


def _text(ids: list[dict]) -> str:
    return "".join(t["text"] or "" for t in ids)


def _opened(frames: list[dict]) -> list[str]:
    """The text of each OpenSession frame (a public request) among `frames`."""
    return [_text(f["tokens"]["prompt_ids"]) for f in frames if f["type"] == "OpenSession"]


def _sent_texts(bridge) -> list[str]:
    """What every uplink id list spells, and every Draft's committed and drafted ids joined in
    the order they went up (a span split over rounds, as the companion reads it)."""
    up = [f for f in _frames(bridge) if f["direction"] == "up"]
    lists = [_text(ids) for f in up for ids in f.get("tokens", {}).values()]
    stream = "".join(_text(f["tokens"].get(name, [])) for f in up if f["type"] == "Draft"
                     for name in ("committed_ids", "draft_ids"))
    return [*lists, stream]


def test_prefix_is_prepared_continued_and_sent_with_the_request(spawn, companion_url,
                                                                tmp_path) -> None:
    """The prefix's session is opened by `prepare` while the user types, or by the generation
    if that comes first (a race): it is told apart from the plain request's by order, not by
    the generation a frame was seen under."""
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
    [plain_request] = _opened(_frames(bridge, plain))
    [continued] = _opened([f for f in _frames(bridge) if f["generation"] != plain])
    assert continued == plain_request + DRAFT and DRAFT not in plain_request
    sent = _sent_texts(bridge)
    assert len(sent) > 3 and all(CANARY not in text for text in sent)
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
