"""`specsteer bridge --http`: the OpenAI-compatible loopback endpoint, driven by the official
`openai` Python client against a real bridge and a real companion (tiny pair)."""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from specsteer.bridge.http import parse_address

MESSAGES = [{"role": "user", "content": "Budget for the next quarter"}]


def start_http(spawn, tmp_path: Path, *args: str) -> tuple[object, str, str]:
    token_file = tmp_path / "token"
    bridge = spawn("--http", "127.0.0.1:0", "--http-token-file", str(token_file), *args)
    deadline = time.monotonic() + 60
    while not (found := re.search(r"http ready: (\S+)", bridge.stderr())):
        assert bridge.proc.poll() is None and time.monotonic() < deadline, bridge.stderr()
        time.sleep(0.05)
    assert token_file.stat().st_mode & 0o077 == 0  # created owner-only
    return bridge, found.group(1), token_file.read_text().strip()


def test_openai_client_models_completion_and_stream(spawn, companion_url, tmp_path) -> None:
    bridge, url, token = start_http(spawn, tmp_path, "--companion", companion_url)
    client = openai.OpenAI(base_url=url, api_key=token, max_retries=0)
    [model] = client.models.list().data
    assert model.id == "tiny-llama-s0"
    messages = [{"role": "user", "content": "Budget for the next quarter"}]
    done = client.chat.completions.create(model=model.id, messages=messages, max_tokens=24)
    extension = done.model_extra["specsteer"]
    assert done.choices[0].finish_reason in ("stop", "length")
    assert len(extension["provenance"]) == done.usage.completion_tokens
    assert "local" not in extension["provenance"] and not extension["stats"]["degraded"]
    chunks = list(client.chat.completions.create(model=model.id, messages=messages,
                                                 max_tokens=24, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == done.choices[0].message.content  # greedy: the same text, streamed
    pieces = [c.model_extra["specsteer"] for c in chunks if c.choices[0].delta.content]
    assert [p["provenance"] for p in pieces] and all(
        p["provenance"] in ("draft", "recovered", "bonus") for p in pieces)
    assert chunks[-1].choices[0].finish_reason == done.choices[0].finish_reason
    assert chunks[-1].model_extra["specsteer"]["stats"]["tokens"] == done.usage.completion_tokens
    # the stdio side is still live and reports the endpoint
    assert bridge.call("status")["result"]["http"] == url
    assert bridge.close() == 0


def test_bad_token_bad_host_and_bad_body(spawn, tmp_path) -> None:
    bridge, url, token = start_http(spawn, tmp_path)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="wrong-" + token, max_retries=0).models.list()
    client = openai.OpenAI(base_url=url, api_key=token, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_new_tokens"):
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="user message"):
        client.chat.completions.create(model="x", messages=[{"role": "system", "content": "s"}])
    # a refused request's unread body must not be taken for the next request on the connection
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    body = json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 2})
    for auth, code in (("wrong", 401), (token, 200), ("wrong", 401), (token, 200)):
        connection.request("POST", "/v1/chat/completions", body,
                           {"Authorization": f"Bearer {auth}", "Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == code, answer
    connection.request("POST", "/v1/chat/completions", b"{}", {"Authorization": f"Bearer {token}",
                                                             "Transfer-Encoding": "chunked"})
    assert connection.getresponse().status == 411
    connection.close()
    # a page that rebinds its own DNS name to 127.0.0.1 sends its own Host header: refused
    request = urllib.request.Request(url + "/models", headers={
        "Authorization": f"Bearer {token}", "Host": "evil.example:80"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert bridge.close() == 0


LONG = 1500  # tokens: a generation that is still running while the test acts on it


def wait_idle(bridge, timeout: float = 30.0) -> dict:
    """The bridge's status once no generation runs."""
    deadline = time.monotonic() + timeout
    while (status := bridge.call("status")["result"])["generating"] is not None:
        assert time.monotonic() < deadline, f"still generating: {status}"
        time.sleep(0.05)
    return status


def test_busy_while_streaming_then_disconnect_cancels(spawn, tmp_path) -> None:
    """One generation at a time: a second completion (HTTP or stdio) is refused while one
    streams; the streaming client closing its connection cancels the generation."""
    bridge, url, token = start_http(spawn, tmp_path)
    client = openai.OpenAI(base_url=url, api_key=token, max_retries=0)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=LONG,
                                            stream=True)
    chunks = iter(stream)
    first = next(chunks)
    while not next(chunks).choices[0].delta.content:  # a mode chunk, then the first piece
        pass
    with pytest.raises(openai.RateLimitError) as busy:
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
    assert busy.value.status_code == 429 and busy.value.code == "busy"
    assert first.id in busy.value.message
    refused = bridge.call("generate", {"query": "x", "max_new_tokens": 4})["error"]
    assert refused["code"] == -32020 and refused["data"]["running"] == first.id
    assert bridge.call("status")["result"]["generating"] == first.id

    stream.close()  # the client goes away mid-stream
    status = wait_idle(bridge)
    assert status["cancelled"] == 1 and status["generations"] == 1  # stdio's was refused
    done = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8
    assert bridge.call("status")["result"]["cancelled"] == 1
    assert bridge.close() == 0


def test_disconnect_cancels_a_completion_that_is_not_streamed(spawn, tmp_path) -> None:
    """A client that gives up on a non-streamed completion (a timeout) frees the bridge too."""
    bridge, url, token = start_http(spawn, tmp_path)
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    connection.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "m", "messages": MESSAGES, "max_tokens": LONG}),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    deadline = time.monotonic() + 30
    while bridge.call("status")["result"]["generating"] is None:
        assert time.monotonic() < deadline, bridge.stderr()
        time.sleep(0.01)
    connection.close()  # before any answer
    status = wait_idle(bridge)
    assert status["cancelled"] == 1, status
    assert "went away: cancelling" in bridge.stderr()
    again = bridge.call("generate", {"query": "Notes", "max_new_tokens": 4})["result"]
    assert again["finish_reason"] == "length"
    assert bridge.close() == 0


def test_only_loopback_unless_allowed() -> None:
    assert parse_address("127.0.0.1:8080", False) == ("127.0.0.1", 8080)
    assert parse_address("[::1]:0", False) == ("::1", 0)
    with pytest.raises(ValueError, match="--allow-remote"):
        parse_address("0.0.0.0:8080", False)
    assert parse_address("0.0.0.0:8080", True) == ("0.0.0.0", 8080)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address("8080", False)
