"""The bridge's `prefix` (continue the user's draft): prepared while typing, reused by the
generate that continues it, and never in a frame that goes to the companion."""

from __future__ import annotations

import json

from bridge_process import assert_valid

from specsteer.bridge import errors

CANARY = "Quillwort-canary-8080"
DRAFT = f"Thanks Priya, the frost cloth is in the shed behind {CANARY}, and"


def _opened(bridge, request) -> list[str]:
    """The token texts of the OpenSession frame (the public request) of one generation."""
    [frame] = [f["params"] for _, f in bridge.notifications
               if f.get("method") == "companion.frame" and f["params"]["generation"] == request
               and f["params"]["type"] == "OpenSession"]
    return [t["text"] for t in frame["tokens"]["prompt_ids"]]


def test_prefix_is_prepared_continued_and_kept_on_the_device(spawn, companion_url,
                                                             tmp_path) -> None:
    bridge = spawn("--companion", companion_url, "--history", str(tmp_path / "h.db"),
                   "--audit-frames")
    bridge.call("history.add", {"kind": "email", "title": "Frost", "body": "Cover the beds."})
    query = {"query": {"message": "Will it frost tonight?", "subject": "Frost"},
             "task": "reply"}
    prepared = bridge.call("prepare", {**query, "prefix": DRAFT})["result"]
    assert_valid("prepare", "result", prepared)
    params = {**query, "prefix": DRAFT, "max_new_tokens": 16, "offline": "fail"}
    assert_valid("generate", "params", params)
    request = bridge.send("generate", params)
    result = bridge.answer(request)["result"]
    assert result["stats"]["prefill_reused"] > 0 and not result["stats"]["degraded"]
    assert "local" not in result["provenance"]
    plain = bridge.send("generate", {**query, "max_new_tokens": 4, "offline": "fail"})
    bridge.answer(plain)
    assert _opened(bridge, request) == _opened(bridge, plain)  # the same public request
    frames = [f["params"] for _, f in bridge.notifications if f.get("method") == "companion.frame"]
    assert CANARY not in json.dumps(frames) and "frost cloth" not in json.dumps(frames)
    bad = bridge.call("generate", {**query, "prefix": 7})
    assert bad["error"]["code"] == errors.INVALID_PARAMS
    assert bridge.close() == 0
