"""`specsteer bridge --http`: the OpenAI-compatible loopback endpoint, driven by the official
`openai` Python client against a real bridge and a real companion (tiny pair)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from helpers.ci import skip_or_fail

from specsteer.bridge.http import _peer_closed, parse_address
from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.process import start_companion

pytestmark = pytest.mark.slow  # bridge and companion processes, HTTP: not in ./dev test --fast

MESSAGES = [{"role": "user", "content": "Budget for the next quarter"}]
MODEL = "tiny-llama-s0"  # the served model's id: the bridge's Specialist


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
    with pytest.raises(openai.BadRequestError, match=r"max_tokens: -1 is less than the minimum"
                       ) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=-1)
    assert refused.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\] \(role 'system'\) is not "
                       "read"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "s"}])
    with pytest.raises(openai.BadRequestError, match="n = 1"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=MODEL, prompt="legacy completions are not served")
    # a refused request's unread body must not be taken for the next request on the connection
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 2})
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
    with socket.create_connection((address.hostname, address.port), timeout=30) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + address.netloc.encode()
                    + b"\r\nAuthorization: Bearer " + token.encode()
                    + b"\r\nContent-Length: 2000000\r\n\r\n")  # refused before any body
        head = raw.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413") and "Connection: close" in head, head
    # a page that rebinds its own DNS name to 127.0.0.1 sends its own Host header: refused
    request = urllib.request.Request(url + "/models", headers={
        "Authorization": f"Bearer {token}", "Host": "evil.example:80"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert bridge.close() == 0


def test_a_failed_generation_is_an_error_streamed_or_not(spawn, tmp_path) -> None:
    """offline "fail" without a companion: 503 with the bridge's reason (a companion may come
    back: the client may retry), or, streamed, a last chunk with finish_reason "error" and the
    JSON-RPC error object."""
    bridge, url, token = start_http(spawn, tmp_path, "--companion",
                                    f"ws://127.0.0.1:{_closed_port()}")
    client = openai.OpenAI(base_url=url, api_key=token, max_retries=0)
    fail = {"specsteer": {"offline": "fail"}}
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=fail)
    assert failed.value.status_code == 503 and failed.value.code == "companion_unavailable"
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                                 extra_body=fail))
    assert chunks[-1].choices[0].finish_reason == "error"
    error = chunks[-1].model_extra["specsteer"]["error"]
    assert error["code"] == -32050 and error["data"]["reason"] == "companion_unavailable"
    assert client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                          max_tokens=2).usage.completion_tokens == 2
    assert bridge.close() == 0


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


LONG = 1500  # tokens: more than the generation would reach before the test acts on it


@pytest.fixture()
def own_companion() -> Iterator[tuple[subprocess.Popen, str]]:
    """A companion of this test's own (tiny pair), which the test may stall."""
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120)
    try:
        yield proc, url
    finally:
        proc.kill()  # stopped or not
        proc.wait(10)


@contextlib.contextmanager
def stalled(companion: subprocess.Popen) -> Iterator[None]:
    """The companion process stopped (SIGSTOP): a generation waits on it, deterministically
    still running, until the block ends (SIGCONT), well within the bridge's --timeout-s."""
    os.kill(companion.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(companion.pid, signal.SIGCONT)


def wait_status(bridge, done: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    """The bridge's status once `done(status)`."""
    deadline = time.monotonic() + timeout
    while not done(status := bridge.call("status")["result"]):
        assert time.monotonic() < deadline, f"{status}\n{bridge.stderr()}"
        time.sleep(0.02)
    return status


def idle(status: dict) -> bool:
    return status["generating"] is None


def test_busy_while_streaming_then_disconnect_cancels(spawn, own_companion, tmp_path) -> None:
    """One generation at a time: a second completion (HTTP or stdio) is refused while one
    streams; the streaming client closing its connection cancels the generation."""
    companion, companion_url = own_companion
    bridge, url, token = start_http(spawn, tmp_path, "--companion", companion_url)
    client = openai.OpenAI(base_url=url, api_key=token, max_retries=0)
    with stalled(companion):
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=LONG,
                                                stream=True)
        first = next(iter(stream))  # the role chunk: the generation has started
        assert wait_status(bridge, lambda s: s["generating"] is not None)["generating"] \
            == first.id
        with pytest.raises(openai.RateLimitError) as busy:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
        assert busy.value.status_code == 429 and busy.value.code == "busy"
        assert first.id in busy.value.message
        refused = bridge.call("generate", {"query": "x", "max_new_tokens": 4})["error"]
        assert refused["code"] == -32020 and refused["data"]["running"] == first.id

        stream.close()  # the client goes away mid-stream
        status = wait_status(bridge, idle)
        assert status["cancelled"] == 1 and status["generations"] == 1  # stdio's was refused
        # cancelled while the companion stalled, not once the device gave up on it and went on
        # locally (then a piece written to the closed connection would have failed)
        assert status["last_mode"] is None, bridge.stderr()
    done = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8
    assert bridge.call("status")["result"]["cancelled"] == 1
    assert bridge.close() == 0


def test_openai_client_retries_busy_until_served(spawn, own_companion, tmp_path) -> None:
    """The openai client's own retries (max_retries) wait out a busy bridge."""
    companion, companion_url = own_companion
    bridge, url, token = start_http(spawn, tmp_path, "--companion", companion_url)
    with stalled(companion):
        stream = openai.OpenAI(base_url=url, api_key=token, max_retries=0
                               ).chat.completions.create(model=MODEL, messages=MESSAGES,
                                                         max_tokens=LONG, stream=True)
        next(iter(stream))
        wait_status(bridge, lambda s: s["generating"] is not None)


        def leave() -> None:  # the running stream's client leaves, the companion comes back
            stream.close()
            wait_status(bridge, idle)
            os.kill(companion.pid, signal.SIGCONT)

        leaving = threading.Timer(0.5, leave)
        leaving.start()
        patient = openai.OpenAI(base_url=url, api_key=token, max_retries=5)
        done = patient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
        leaving.join()
    assert done.usage.completion_tokens == 4
    codes = re.findall(r'"POST /v1/chat/completions HTTP/1.1" (\d+)', bridge.stderr())
    # the stream, then the patient request: refused while the stream ran, then served
    assert codes[0] == "200" and codes[1] == "429" and codes[-1] == "200", codes
    assert bridge.call("status")["result"]["cancelled"] == 1
    assert bridge.close() == 0


def test_disconnect_cancels_a_completion_that_is_not_streamed(spawn, own_companion,
                                                              tmp_path) -> None:
    """A client that gives up on a non-streamed completion (a timeout) frees the bridge too."""
    companion, companion_url = own_companion
    bridge, url, token = start_http(spawn, tmp_path, "--companion", companion_url)
    address = urlsplit(url)
    with stalled(companion):
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
        connection.request("POST", "/v1/chat/completions", json.dumps(
            {"model": MODEL, "messages": MESSAGES, "max_tokens": LONG}),
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        wait_status(bridge, lambda s: s["generating"] is not None)
        connection.close()  # before any answer
        status = wait_status(bridge, idle)
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


def test_a_gone_client_is_told_from_a_quiet_or_busy_one() -> None:
    """The socket check behind "a client that leaves cancels": data waiting or nothing yet is
    not a gone client; an orderly close or a reset is; a descriptor number above select()'s
    FD_SETSIZE (1024) works too."""
    low = resource.getrlimit(resource.RLIMIT_NOFILE)
    high_fd = 1500
    if low[1] != resource.RLIM_INFINITY and low[1] <= high_fd:
        skip_or_fail(f"the hard descriptor limit {low[1]} is below {high_fd}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(low[0], high_fd + 1), low[1]))
    try:
        for high in (False, True):
            server, client = socket.socketpair()
            if high:
                os.dup2(server.fileno(), high_fd)
                server.close()
                server = socket.socket(fileno=high_fd)
            assert not _peer_closed(server)  # quiet
            client.sendall(b"GET / HTTP/1.1\r\n")  # a pipelined request: not gone
            assert not _peer_closed(server)
            assert server.recv(100)
            client.close()
            assert _peer_closed(server)
            server.close()
        server, client = socket.socketpair()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset
        assert _peer_closed(server)
        server.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, low)
