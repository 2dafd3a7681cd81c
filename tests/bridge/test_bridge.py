"""`specsteer bridge` as a real child process: framing, errors, history, generate, cancel.

Every test talks to the bridge over its stdin/stdout pipes exactly as an app would; generations
run against a real `specsteer-companion serve` process on the tiny model pair.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from helpers.bridge_process import assert_valid

from specsteer.bridge import errors

pytestmark = pytest.mark.slow  # bridge and companion processes: not in ./dev test --fast

LONG = 1500  # tokens: a generation that is still running when the test acts on it
# the tiny model may end a long generation early (end-of-text) in well under a second: pieces
# paced 20 ms apart keep it running for seconds whatever it writes
PACED = {"max_new_tokens": LONG, "min_token_ms": 20}


def error_of(answer: dict) -> dict:
    assert "error" in answer, answer
    return answer["error"]


def test_initialize_and_status(spawn, companion_url) -> None:
    bridge = spawn("--companion", companion_url)
    answer = bridge.call("initialize", {"protocol_version": 1})
    result = answer["result"]
    assert_valid("initialize", "result", result)
    assert result["protocol_version"] == 1 and result["package_version"]
    assert result["capabilities"]["concurrent_generate"] == "refuse"
    assert {"generate", "cancel", "history.search", "prepare"} <= set(result["methods"])
    status = bridge.call("status")["result"]
    assert_valid("status", "result", status)
    assert status["generating"] is None and status["companion"] == companion_url
    assert bridge.close() == 0


def test_bad_input_gets_errors_and_the_bridge_keeps_serving(spawn) -> None:
    bridge = spawn()
    bridge.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": "status"\n')  # cut short
    bridge.send_raw(b"\xff\xfe not utf-8\n")
    bridge.send_raw(b'[{"jsonrpc": "2.0", "id": 2, "method": "status"}]\n')
    bridge.send_raw(b'{"id": 3, "method": "status"}\n')  # no "jsonrpc"
    bridge.send_raw(b'{"jsonrpc": "2.0", "id": 4, "method": "status", "params": [1]}\n')
    bridge.send_raw(b'{"jsonrpc": "2.0", "id": true, "method": "status"}\n')
    # an error to a request whose id could not be read has id null (JSON-RPC 2.0)
    codes = [error_of(bridge.answer(None))["code"] for _ in range(4)]
    assert codes == [errors.PARSE_ERROR, errors.PARSE_ERROR, *[errors.INVALID_REQUEST] * 2]
    assert error_of(bridge.answer(3))["code"] == errors.INVALID_REQUEST
    assert "by-name" in error_of(bridge.answer(4))["message"]
    # wrong types: the schema names the member and the bridge runs nothing
    wrong = error_of(bridge.call("generate", {"query": "Budget", "max_new_tokens": "many"}))
    assert wrong["code"] == errors.INVALID_PARAMS and "max_new_tokens" in wrong["message"]
    assert error_of(bridge.call("generate", {"query": "x", "temprature": 0.5}))["code"] \
        == errors.INVALID_PARAMS  # a misspelt option is refused, not ignored
    assert error_of(bridge.call("cancel", {}))["code"] == errors.INVALID_PARAMS
    unknown = error_of(bridge.call("generate.now", {}))
    assert unknown["code"] == errors.METHOD_NOT_FOUND and "generate" in unknown["data"]["methods"]
    assert error_of(bridge.call("prepare", {}))["code"] == errors.INVALID_PARAMS  # no query
    # a notification (no id) of an unknown method is dropped silently; the next call is answered
    bridge.send_raw(b'{"jsonrpc": "2.0", "method": "nothing"}\n')
    assert bridge.call("status")["result"]["generating"] is None
    assert not any(bridge.answers.values())
    assert bridge.close() == 0


def test_an_oversized_line_is_refused_and_the_stream_stays_in_step(spawn) -> None:
    bridge = spawn("--max-line-bytes", "4096")
    big = {"jsonrpc": "2.0", "id": 1, "method": "history.search", "params": {"query": "x" * 9000}}
    bridge.send_raw(json.dumps(big).encode() + b"\n")
    refused = error_of(bridge.answer(None))
    assert refused["code"] == errors.LINE_TOO_LONG and "4096" in refused["message"]
    assert bridge.call("status")["result"]["uptime_s"] > 0  # the next line is read whole
    assert not bridge.answers.get(1)
    assert bridge.close() == 0


def test_history_methods(spawn, tmp_path: Path) -> None:
    bridge = spawn("--history", str(tmp_path / "h.db"))
    added = bridge.call("history.add", {"kind": "email", "title": "Budget",
                                        "body": "Dear team, the budget stays.",
                                        "created_at": "2024-03-01"})["result"]
    assert_valid("history.add", "result", added)
    bridge.call("history.add", {"kind": "note", "body": "buy milk"})
    hits = bridge.call("history.search", {"query": "budget", "k": 3})["result"]["hits"]
    assert [h["record"]["id"] for h in hits] == [added["record"]["id"]]
    listed = bridge.call("history.list", {"kinds": ["note"]})["result"]["records"]
    assert [r["body"] for r in listed] == ["buy milk"]
    missing = error_of(bridge.call("history.delete", {"ids": [added["record"]["id"], "nope"]}))
    assert missing["code"] == errors.RECORD_NOT_FOUND and missing["data"]["missing"] == ["nope"]
    stats = bridge.call("history.stats")["result"]
    assert_valid("history.stats", "result", stats)
    assert stats["records"] == 2  # the failed delete deleted nothing
    assert error_of(bridge.call("history.add", {"kind": "", "body": "x"}))["code"] \
        == errors.INVALID_PARAMS
    assert error_of(bridge.call("history.forget", {}))["code"] == errors.INVALID_PARAMS
    assert bridge.call("history.forget", {"kinds": ["note"]})["result"] == {"deleted": 1}
    assert bridge.call("history.forget", {"all": True})["result"] == {"deleted": 1}
    assert bridge.close() == 0


def test_a_locked_history_answers_history_locked_and_status_stays_live(spawn, tmp_path) -> None:
    path = tmp_path / "h.db"
    bridge = spawn("--history", str(path), "--history-timeout-s", "1")
    bridge.call("history.add", {"kind": "note", "body": "first"})
    other_app = sqlite3.connect(path, isolation_level=None)
    other_app.execute("BEGIN EXCLUSIVE")
    try:
        writing = bridge.send("history.add", {"kind": "note", "body": "second"})
        started = time.monotonic()
        assert bridge.call("status", timeout=0.5)["result"]  # not stuck behind the lock
        assert time.monotonic() - started < 0.5
        locked = error_of(bridge.answer(writing))
        assert locked["code"] == errors.HISTORY_LOCKED and "locked" in locked["message"]
    finally:
        other_app.execute("ROLLBACK")
        other_app.close()
    assert bridge.call("history.add", {"kind": "note", "body": "second"})["result"]["record"]
    assert bridge.close() == 0


def test_no_history_store(spawn) -> None:
    bridge = spawn()
    assert error_of(bridge.call("history.stats"))["code"] == errors.NO_HISTORY
    assert bridge.close() == 0


def test_generate_streams_pieces_with_provenance(spawn, companion_url, tmp_path) -> None:
    bridge = spawn("--companion", companion_url, "--history", str(tmp_path / "h.db"))
    bridge.call("history.add", {"kind": "email", "title": "Budget", "body": "Dear team, ..."})
    request = bridge.send("generate", {"query": "Budget for the next quarter",
                                       "max_new_tokens": 40, "offline": "fail"})
    result = bridge.answer(request)["result"]
    assert_valid("generate", "result", result)
    pieces = bridge.stream_of(request)
    for piece in pieces:
        assert_valid("generate.piece", "params", piece)
    assert "".join(p["text"] for p in pieces) == result["text"]
    assert result["finish_reason"] in ("stop", "length")
    assert "local" not in result["provenance"] and {"draft", "recovered", "bonus"} \
        & set(result["provenance"])
    [stats] = bridge.stream_of(request, "generate.stats")
    assert_valid("generate.stats", "params", stats)
    assert stats["stats"] == result["stats"] and not result["stats"]["degraded"]
    assert result["stats"]["bytes_up"] > 0 and len(result["stats"]["records"]) == 1
    assert bridge.close() == 0


def test_prepare_then_generate_reuses_the_prefilled_prompt(spawn, companion_url, tmp_path):
    bridge = spawn("--companion", companion_url, "--history", str(tmp_path / "h.db"))
    bridge.call("history.add", {"kind": "email", "title": "Budget", "body": "Dear team, ..."})
    query = {"query": "Budget for the next quarter", "task": "email"}
    prepared = bridge.call("prepare", query)["result"]
    assert_valid("prepare", "result", prepared)
    cold = bridge.call("generate", {**query, "max_new_tokens": 8, "offline": "fail"})["result"]
    assert cold["stats"]["prefill_reused"] > 0  # the prepared prompt was not run again
    again = bridge.call("generate", {**query, "max_new_tokens": 8, "offline": "fail"})["result"]
    assert again["text"] == cold["text"]
    assert bridge.close() == 0


def test_a_second_generate_is_refused_while_one_runs(spawn, companion_url) -> None:
    bridge = spawn("--companion", companion_url)
    first = bridge.send("generate", {"query": "Budget", **PACED})
    second = bridge.send("generate", {"query": "Notes", "max_new_tokens": 8})
    busy = error_of(bridge.answer(second))
    assert busy["code"] == errors.BUSY and busy["data"]["running"] == first
    assert bridge.call("status")["result"]["generating"] == first
    result = bridge.answer(first, timeout=120)["result"]
    assert result["finish_reason"] in ("stop", "length")
    assert not bridge.stream_of(second)
    again = bridge.send("generate", {"query": "Notes", "max_new_tokens": 8})
    assert bridge.answer(again)["result"]["text"]  # free again once the first is answered
    assert bridge.close() == 0


def test_cancel_answers_within_200_ms_and_frees_the_bridge(spawn, companion_url) -> None:
    bridge = spawn("--companion", companion_url)
    request = bridge.send("generate", {"query": "Budget", **PACED})
    bridge.wait_for(lambda f: f["method"] == "generate.piece")
    sent = time.monotonic()
    cancel = bridge.send("cancel", {"id": request})
    answered_at, answer = bridge.answer_at(request)
    assert answered_at - sent < 0.2
    result = answer["result"]
    assert result["finish_reason"] == "cancelled" and result["stats"] is None
    assert bridge.answer(cancel)["result"] == {"cancelled": True}
    pieces = bridge.stream_of(request)
    assert len(pieces) < LONG and result["text"] == "".join(p["text"] for p in pieces)
    time.sleep(0.3)  # nothing of the cancelled generation arrives after its answer
    next_request = bridge.send("generate", {"query": "Notes", "max_new_tokens": 8})
    assert bridge.answer(next_request)["result"]["finish_reason"] in ("stop", "length")
    assert all(t <= answered_at for t, f in bridge.notifications
               if f["params"].get("id") == request)
    assert bridge.call("cancel", {"id": request})["result"] == {"cancelled": False}
    assert bridge.close() == 0


def test_closing_stdin_stops_the_bridge_mid_generation(spawn, companion_url) -> None:
    bridge = spawn("--companion", companion_url)
    bridge.send("generate", {"query": "Budget", **PACED})
    bridge.wait_for(lambda f: f["method"] == "generate.piece")
    started = time.monotonic()
    assert bridge.close() == 0
    assert time.monotonic() - started < 5


def test_shutdown_answers_then_exits(spawn) -> None:
    bridge = spawn()
    assert bridge.call("shutdown")["result"] == {}
    assert bridge.proc.wait(10) == 0
    bridge.close()


def test_audit_frames_notifies_every_frame_decoded_without_private_text(
        spawn, companion_url, tmp_path) -> None:
    canary = "Heliotrope-canary-5150"
    bridge = spawn("--companion", companion_url, "--history", str(tmp_path / "h.db"),
                   "--audit-frames", "--token", "secret-device-token")
    init = bridge.call("initialize", {})["result"]
    assert "companion.frame" in init["notifications"]
    bridge.call("history.add", {"kind": "email", "title": "Budget", "body": f"Dear team, {canary}"})
    request = bridge.send("generate", {"query": "Budget for the next quarter",
                                       "max_new_tokens": 20, "offline": "fail"})
    result = bridge.answer(request)["result"]
    frames = [f["params"] for _, f in bridge.notifications if f.get("method") == "companion.frame"]
    for frame in frames:
        assert_valid("companion.frame", "params", frame)
    assert [f["n"] for f in frames] == list(range(1, len(frames) + 1))
    assert [f["type"] for f in frames[:4]] == ["Hello", "HelloOk", "OpenSession", "SessionOpened"]
    assert sum(f["bytes"] for f in frames if f["direction"] == "up") == result["stats"]["bytes_up"]
    assert all(f["generation"] == request for f in frames)
    drafted = [t for f in frames if f["type"] == "Draft" for t in f["tokens"]["draft_ids"]]
    assert drafted and all(isinstance(t["text"], str) for t in drafted)
    text = json.dumps(frames)
    assert canary not in text and "secret-device-token" not in text
    assert bridge.close() == 0


def test_without_audit_frames_no_frame_is_notified(spawn, companion_url) -> None:
    bridge = spawn("--companion", companion_url)
    request = bridge.send("generate", {"query": "Budget", "max_new_tokens": 5})
    bridge.answer(request)
    assert not [f for _, f in bridge.notifications if f.get("method") == "companion.frame"]
    assert "companion.frame" not in bridge.call("initialize", {})["result"]["notifications"]
    assert bridge.close() == 0


def test_each_task_is_prefilled_within_its_own_budget(spawn, tmp_path) -> None:
    """The bridge's Client is given no budget: an abstract and an email request prefill the
    private prompt each task's measured budget allows (`prompts.Task.max_prompt_tokens`)."""
    from specsteer.history.prompts import get_task

    bridge = spawn("--history", str(tmp_path / "h.db"))
    sentence = "We measured the decoding of private drafts against a public verifier today. "
    for n in range(6):
        bridge.call("history.add", {"kind": "paper", "title": f"Sparse verification {n}",
                                    "body": sentence * 80})
        bridge.call("history.add", {"kind": "email", "title": f"Budget for Q{n}",
                                    "body": sentence * 80})
    prefilled = {}
    for task, query in (("abstract", "Sparse verification"), ("email", "Budget for Q3")):
        result = bridge.call("generate", {"query": query, "task": task, "max_new_tokens": 1},
                             timeout=60)["result"]
        prefilled[task] = result["stats"]["prefill_tokens"]
        # the chat template's own markup adds a few tokens to the counted messages
        assert 0 < prefilled[task] <= get_task(task).max_prompt_tokens + 16, (task, prefilled)
    budgets = {task: get_task(task).max_prompt_tokens for task in prefilled}
    if budgets["abstract"] != budgets["email"]:  # the larger budget is used, not the smaller
        larger = max(budgets, key=budgets.__getitem__)
        assert prefilled[larger] > min(budgets.values()) + 16, (prefilled, budgets)
    assert bridge.close() == 0
