"""`specsteer bridge --http`: the OpenAI-compatible loopback endpoint, driven by the official
`openai` Python client against a real bridge and a real companion (tiny pair)."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from specsteer.bridge.http import parse_address


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
    # a page that rebinds its own DNS name to 127.0.0.1 sends its own Host header: refused
    request = urllib.request.Request(url + "/models", headers={
        "Authorization": f"Bearer {token}", "Host": "evil.example:80"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert bridge.close() == 0


def test_only_loopback_unless_allowed() -> None:
    assert parse_address("127.0.0.1:8080", False) == ("127.0.0.1", 8080)
    assert parse_address("[::1]:0", False) == ("::1", 0)
    with pytest.raises(ValueError, match="--allow-remote"):
        parse_address("0.0.0.0:8080", False)
    assert parse_address("0.0.0.0:8080", True) == ("0.0.0.0", 8080)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address("8080", False)
