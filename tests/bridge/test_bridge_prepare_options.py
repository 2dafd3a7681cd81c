"""`prepare` takes generate's decoding options (common.json `decoding_options`), so what it
makes ahead — the first round's draft, keyed by the draft settings, and the companion session,
opened with the session settings — is what the generate with those options uses; the options
are defined once and refused in prepare exactly as in generate."""

from __future__ import annotations

import json
import threading

import pytest
from helpers.bridge_process import assert_valid

from specsteer.bridge import errors
from specsteer.bridge.handlers import DECODING_OPTIONS, Bridge
from specsteer.bridge.schemas import SCHEMA_DIR, declared_members
from specsteer.client import Client

pytestmark = pytest.mark.slow  # bridge and companion processes: not in ./dev test --fast

QUERY = {"query": "Budget for the next quarter", "task": "email"}
# what the sample apps send: a preset (other session settings: gamma, top_k) and a device-only
# rule that the first round's draft depends on (another draft key)
OPTIONS = {"preset": "fast", "no_repeat_ngram": 8, "max_new_tokens": 16}
# prepare is answered once its prefill and first draft are made (a draft still being made when
# generate takes the track is dropped, not waited for)
WAIT = {"wait_s": 30}


def _frames(bridge) -> list[dict]:
    return [f["params"] for _, f in bridge.notifications if f["method"] == "companion.frame"]


def test_prepare_with_the_generate_options_makes_the_draft_and_session_ahead(
        spawn, companion_url, tmp_path) -> None:
    bridge = spawn("--companion", companion_url, "--history", str(tmp_path / "h.db"))
    bridge.call("history.add", {"kind": "email", "title": "Budget", "body": "Dear team, ..."})
    params = {**QUERY, **OPTIONS}
    assert_valid("prepare", "params", params)
    assert bridge.call("prepare", {**params, **WAIT})["result"] == {
        "task": "email", "prefilling": True, "ready": True}
    result = bridge.call("generate", {**params, "offline": "fail"})["result"]
    stats = result["stats"]
    assert not stats["degraded"] and stats["prefill_reused"] > 0
    assert stats["session_reused"]  # opened with the fast preset's gamma and top_k
    assert stats["drafted_ahead"] > 0  # drafted with no_repeat_ngram 8, the generate's key
    # the same generate again: nothing made ahead (the prefill is kept), the same text
    again = bridge.call("generate", {**params, "offline": "fail"})["result"]
    assert again["text"] == result["text"]
    assert again["stats"]["drafted_ahead"] == 0 and not again["stats"]["session_reused"]
    assert bridge.close() == 0


def test_a_local_method_prepared_opens_no_companion_session(spawn, companion_url) -> None:
    """`method: "slm_rag"` needs no companion: prepared with it, nothing is sent, neither
    by prepare nor by the generate (a session opened ahead would have gone up meanwhile)."""
    bridge = spawn("--companion", companion_url, "--audit-frames")
    local = {**QUERY, "method": "slm_rag", "max_new_tokens": 8}
    assert bridge.call("prepare", {**local, **WAIT})["result"]["ready"]
    result = bridge.call("generate", local)["result"]
    assert result["text"] and set(result["provenance"]) == {"local"}
    assert result["stats"]["bytes_up"] == 0 and _frames(bridge) == []
    # prepared without it, the session over the public request goes up at once
    bridge.call("prepare", QUERY)
    hello = bridge.wait_for(lambda f: f["method"] == "companion.frame"
                            and f["params"]["type"] == "OpenSession")
    assert hello["params"]["generation"] is None
    assert bridge.close() == 0


@pytest.mark.parametrize("bad", [
    {"no_repeat_ngram": 1},  # the schema refuses it
    {"preset": "turbo"},
    {"temprature": 0.5},  # a misspelt option
    {"max_new_tokens": "many"},
    {"adaptive_k": True, "k": 12},  # the SDK refuses it (k_max 8)
])
def test_a_bad_option_gets_the_same_error_in_prepare_as_in_generate(spawn, bad) -> None:
    bridge = spawn()
    in_generate = bridge.call("generate", {**QUERY, **bad})["error"]
    in_prepare = bridge.call("prepare", {**QUERY, **bad})["error"]
    assert in_prepare == in_generate and in_prepare["code"] == errors.INVALID_PARAMS
    assert_valid("error", "data", in_prepare["data"])
    named = next(iter(bad))
    assert named in in_prepare["message"] or named in json.dumps(in_prepare["data"])
    assert bridge.call("prepare", QUERY)["result"]["prefilling"]  # the bridge goes on
    assert bridge.close() == 0


def test_stream_only_options_are_refused_in_prepare(spawn) -> None:
    bridge = spawn()
    for option in ({"stop": ["\n"]}, {"offline": "fail"}, {"min_token_ms": 20}):
        error = bridge.call("prepare", {**QUERY, **option})["error"]
        assert error["code"] == errors.INVALID_PARAMS and next(iter(option)) in error["message"]
    assert bridge.close() == 0


def test_a_wrong_value_is_named_not_reported_as_unknown() -> None:
    """The params are closed by `unevaluatedProperties`, which also flags a declared member
    whose value is wrong; the error names the value, and only unknown names as unknown."""
    from specsteer.bridge.errors import BridgeError
    from specsteer.bridge.schemas import check_params

    with pytest.raises(BridgeError) as wrong:
        check_params("prepare", {**QUERY, "max_new_tokens": "many", "temprature": 1})
    assert str(wrong.value) == "params: Additional properties are not allowed ('temprature' " \
        "was unexpected)"
    assert wrong.value.data["errors"] == [
        {"path": [], "message": "Additional properties are not allowed ('temprature' was "
         "unexpected)"},
        {"path": ["max_new_tokens"], "message": "'many' is not of type 'integer'"}]
    with pytest.raises(BridgeError) as value_only:
        check_params("generate", {**QUERY, "max_new_tokens": "many", "k": 2})
    assert str(value_only.value) == "params['max_new_tokens']: 'many' is not of type 'integer'"
    assert len(value_only.value.data["errors"]) == 1


def test_the_options_are_defined_once() -> None:
    """One schema definition, one tuple in the bridge: generate and prepare both take all of
    them; the rest of each method's params is its own."""
    common = json.loads((SCHEMA_DIR / "common.json").read_text(encoding="utf-8"))
    assert tuple(common["$defs"]["decoding_options"]["properties"]) == DECODING_OPTIONS
    request = set(common["$defs"]["request"]["properties"])
    assert declared_members("generate") - request - set(DECODING_OPTIONS) \
        == {"stop", "offline", "min_token_ms"}
    assert declared_members("prepare") - request - set(DECODING_OPTIONS) \
        == {"open_session", "wait_s"}



def test_closing_the_bridge_stops_what_prepare_runs(tiny_model) -> None:
    """An app that quits right after preparing: the bridge stops the background prefill and
    frees the prepared state before the process exits (a native prefill still running at
    exit aborted the process: exit code -6 in about one run of six)."""
    client = Client(tiny_model)
    bridge = Bridge(client, lambda method, params: None, max_line_bytes=1 << 20)
    answers: list[tuple] = []
    draft = " ".join(f"line {n} of the draft, still being typed;" for n in range(150))
    bridge.call(1, "prepare", {**QUERY, "prefix": draft, **OPTIONS},
                lambda result, error: answers.append((result, error)))
    assert answers == [({"task": "email", "prefilling": True, "ready": False}, None)]
    assert client._kept._kept  # the prepared track, prefilling
    bridge.close()
    assert not client._kept._kept
    assert not [t for t in threading.enumerate() if t.name == "specsteer-prepare"]


def test_a_closed_bridge_leaves_no_thread_behind(tiny_model) -> None:
    """The bridge's own threads (a generation's worker, a prepare answered later, here still
    waiting for its prefill) and its Client's are all joined by `close`."""
    before = set(threading.enumerate())
    bridge = Bridge(Client(tiny_model), lambda method, params: None, max_line_bytes=1 << 20)
    generated = threading.Event()
    bridge.call(1, "generate", {**QUERY, "max_new_tokens": 4},
                lambda result, error: generated.set())
    assert generated.wait(60)
    draft = " ".join(f"line {n} of the draft, still being typed;" for n in range(150))
    bridge.call(2, "prepare", {**QUERY, "prefix": draft, "wait_s": 30},
                lambda result, error: None)
    assert "bridge-prepare" in [t.name for t in threading.enumerate()]  # still waiting
    bridge.close()
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []
