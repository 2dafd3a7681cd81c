"""A lone surrogate (a JSON escape such as "\\ud800" carries one) anywhere in a bridge request is
invalid params (-32602) naming where, on stdio and on the HTTP endpoint (400), never an internal
error; an id or method name holding one is still answered (issue 28)."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from helpers.bridge_process import BridgeProcess
from test_bridge_http import MODEL, start_http

from specsteer.bridge import errors

BAD = "Budget \ud800 review"


@pytest.fixture(scope="module")
def stdio_bridge(tmp_path_factory):
    """One bridge for every case: each bad request is answered and the bridge goes on."""
    folder = tmp_path_factory.mktemp("stdio")
    bridge = BridgeProcess("--history", str(folder / "h.db"), log=folder / "bridge.log")
    yield bridge
    assert bridge.close() == 0


@pytest.fixture(scope="module")
def http_bridge(tmp_path_factory):
    """One HTTP bridge for every case, the same way: (bridge, url, token)."""
    folder = tmp_path_factory.mktemp("http")
    started = start_http(lambda *args: BridgeProcess(*args, log=folder / "bridge.log"), folder)
    yield started
    assert started[0].close() == 0


@pytest.mark.parametrize(("method", "params", "where"), [
    ("generate", {"query": BAD, "max_new_tokens": 2}, "params['query']"),
    ("generate", {"query": {"subject": "ok", "to": BAD}, "task": "reply"},
     "params['query']['to']"),
    ("generate", {"query": "ok", "prefix": BAD}, "params['prefix']"),
    ("generate", {"query": "ok", "stop": ["x", BAD]}, "params['stop'][1]"),
    ("prepare", {"query": "ok", "prefix": BAD}, "params['prefix']"),
    ("history.add", {"kind": "email", "title": BAD, "body": "b"}, "params['title']"),
    ("history.add", {"kind": "email", "body": "b", "meta": {BAD: 1}}, "params['meta']: a key"),
])
def test_invalid_text_is_invalid_params_naming_where(stdio_bridge, method, params, where):
    answer = stdio_bridge.call(method, params)
    assert answer["error"]["code"] == errors.INVALID_PARAMS, answer
    assert answer["error"]["message"].startswith(f"{where} is not valid Unicode text"), answer
    assert stdio_bridge.call("generate", {"query": "ok", "max_new_tokens": 2})["result"]["text"]


def test_an_id_or_method_with_a_lone_surrogate_is_answered(spawn):
    bridge = spawn()
    answer = bridge.answer(bridge.send("status", request_id=BAD))  # echoed as its JSON escape
    assert answer["id"] == BAD and "result" in answer
    unknown = bridge.call(BAD)
    assert unknown["error"]["code"] == errors.METHOD_NOT_FOUND
    assert bridge.stray == [] and bridge.close() == 0


def _post(url: str, token: str, body: dict) -> tuple[int, dict]:
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps(body),  # "\ud800" escaped
                       {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer


@pytest.mark.parametrize(("body", "where"), [
    ({"messages": [{"role": "user", "content": BAD}]}, "the body['messages'][0]['content']"),
    ({"model": BAD, "messages": [{"role": "user", "content": "hi"}]}, "the body['model']"),
    ({"messages": [{"role": "user", "content": "hi"}], "specsteer": {"prefix": BAD}},
     "the body['specsteer']['prefix']"),
])
def test_the_http_endpoint_answers_400(http_bridge, body, where):
    bridge, url, token = http_bridge
    status, answer = _post(url, token, body)
    assert status == 400 and answer["error"]["code"] == "invalid_params", answer
    assert answer["error"]["message"].startswith(f"{where} is not valid Unicode text")
    status, _ = _post(url, token, {"model": MODEL, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and bridge.proc.poll() is None  # and it goes on
