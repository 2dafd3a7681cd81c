"""The OpenAI contract of `specsteer bridge --http`, checked with the official `openai` Python
client against a real bridge (and a real companion where one is needed): usage counts, streamed
usage, model names, unsupported parameters refused by name, client errors as 4xx in OpenAI's
error shape that the client does not retry, and the bridge's own codes for them over stdio.
(The npm `openai` client and the Vercel AI SDK: bindings/node/test/openai*.test.mjs.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import openai
import pytest
from test_bridge_http import MESSAGES, MODEL, start_http

from specsteer.client import Client
from specsteer.models.tiny import tiny_model_dir
from specsteer_companion.auth import TokenStore
from specsteer_companion.process import start_companion

LONG_REQUEST = "Budget " * 1200  # the request alone is over the email task's prompt budget


@pytest.fixture()
def endpoint(spawn, companion_url, tmp_path) -> Iterator[tuple[object, openai.OpenAI]]:
    bridge, url, token = start_http(spawn, tmp_path, "--companion", companion_url)
    yield bridge, openai.OpenAI(base_url=url, api_key=token, max_retries=2)
    assert bridge.close() == 0


def _posts(bridge) -> list[str]:
    """The status of every chat-completions POST the bridge answered, in order."""
    return re.findall(r'"POST /v1/chat/completions HTTP/1.1" (\d+)', bridge.stderr())


def test_usage_counts_the_prompt_and_the_completion(endpoint, tiny_model) -> None:
    bridge, client = endpoint
    done = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12)
    # the prompt the Specialist read: the email task's private prompt (no history here),
    # rendered by a Client of this process over the same model
    _, prompt = Client(tiny_model).render(MESSAGES[0]["content"], task="email")
    assert done.usage.prompt_tokens == len(prompt.private_ids) > 20
    assert done.usage.completion_tokens == len(done.model_extra["specsteer"]["provenance"])
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, stream=True,
        stream_options={"include_usage": True}))
    *text_chunks, last = chunks
    assert last.choices == [] and last.usage == done.usage  # OpenAI's usage chunk
    assert all(chunk.usage is None and chunk.choices for chunk in text_chunks)
    assert "".join(c.choices[0].delta.content or "" for c in text_chunks) \
        == done.choices[0].message.content
    plain = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                                stream=True))
    assert all(chunk.usage is None and chunk.choices for chunk in plain)  # not asked for
    with pytest.raises(openai.BadRequestError, match="only allowed when stream is true"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                       stream_options={"include_usage": True})


def test_model_names_are_checked(endpoint) -> None:
    bridge, client = endpoint
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError, match="'gpt-4o' does not exist") as wrong:
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=stream)
        assert wrong.value.code == "model_not_found" and wrong.value.param == "model"
    assert _posts(bridge) == ["404", "404"]  # not retried


@pytest.mark.parametrize(("options", "named"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ({"frequency_penalty": 0.5, "presence_penalty": 0.2}, "frequency_penalty"),
    ({"extra_body": {"guided_json": {}}}, "guided_json"),
])
def test_unsupported_parameters_are_refused_by_name(endpoint, options, named) -> None:
    bridge, client = endpoint
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, **options)
    assert refused.value.param == named and named in str(refused.value)
    assert refused.value.code in ("unsupported_parameter", "unknown_parameter")
    for name in options.get("extra_body", options):  # every one of them is named
        assert name in refused.value.message
    assert _posts(bridge) == ["400"]  # not retried
    # at the value that asks for nothing they are accepted (clients send some by default)
    neutral = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, tools=[], frequency_penalty=0,
        presence_penalty=0, logprobs=False, response_format={"type": "text"}, user="u-1")
    assert neutral.usage.completion_tokens == 2


def test_client_errors_are_4xx_in_openai_shape_and_never_retried(endpoint) -> None:
    """A request over the prompt budget is `context_length_exceeded`, an unknown task and a bad
    option are 400s naming the field; streamed or not, before any generation starts."""
    bridge, client = endpoint
    cases = [
        ({"messages": [{"role": "user", "content": LONG_REQUEST}]},
         "context_length_exceeded", "messages", "over max_prompt_tokens=768"),
        ({"extra_body": {"specsteer": {"task": "limerick"}}},
         "unknown_task", "specsteer.task", "unknown task 'limerick'"),
        ({"extra_body": {"specsteer": {"task": "abstract"}}, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "unsupported_value", "messages[0].content[0]", "only text parts are read"),
        ({"messages": [{"role": "user", "content": ""}]},
         "invalid_value", "messages", "messages: '' should be non-empty"),
        ({"extra_body": {"specsteer": {"offline": "later"}}},
         "invalid_value", "specsteer.offline",
         "specsteer.offline: 'later' is not 'degrade', 'fail' or 'wait(SECONDS)'"),
        ({"temperature": -1}, "invalid_value", "temperature", "temperature: -1"),
    ]
    for stream in (False, True):
        for options, code, param, says in cases:
            body = {"messages": MESSAGES, **options}
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model=MODEL, stream=stream, **body)
            error = refused.value.body
            assert (error["code"], error["param"], error["type"]) == (
                code, param, "invalid_request_error"), error
            assert says in error["message"], error
    assert _posts(bridge) == ["400"] * 2 * len(cases)  # each once: never a 500, never retried
    assert bridge.call("status")["result"]["generations"] == 0  # none reached the model


def test_a_companion_that_refuses_the_token_is_a_502_not_retried(spawn, tmp_path) -> None:
    """The bridge's token is refused: no retry fixes it, so the answer says so
    (`x-should-retry: false`, which the openai clients honour) and no local text is made."""
    store = TokenStore(tmp_path / "tokens.db")
    store.create("someone-else")
    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), timeout_s=120,
                                open_access=False, args=["--tokens", str(store.path)])
    try:
        bridge, http_url, token = start_http(spawn, tmp_path, "--companion", url, "--token",
                                             "sst_0000000000000000_" + "x" * 43)
        client = openai.OpenAI(base_url=http_url, api_key=token, max_retries=2)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
        assert refused.value.status_code == 502 and refused.value.code == "companion_error"
        assert "unknown or revoked device token" in refused.value.message
        assert refused.value.response.headers["x-should-retry"] == "false"
        assert _posts(bridge) == ["502"]
        assert bridge.close() == 0
    finally:
        proc.kill()
        proc.wait(10)


def test_the_bridge_gives_request_errors_codes_of_their_own(spawn) -> None:
    """Over stdio: an unknown task, a query without its task's field and a request over the
    prompt budget each have a code (they all were -32041 history_error), and a schema error
    says what is wrong with the value."""
    bridge = spawn()
    cases = [
        ({"query": "x", "task": "limerick"}, -32030, "unknown_task", "unknown task 'limerick'"),
        ({"query": {"subject": "x"}, "task": "abstract"}, -32031, "invalid_query",
         "needs a non-empty 'title'"),
        ({"query": LONG_REQUEST}, -32032, "prompt_too_long", "over max_prompt_tokens=768"),
        ({"query": ""}, -32602, "invalid_params", "params['query']: '' should be non-empty"),
        ({"query": 5}, -32602, "invalid_params",
         "params['query']: 5 is not of type 'string' or 'object'"),
        ({"query": "x", "max_new_tokens": 0}, -32602, "invalid_params",
         "params['max_new_tokens']: 0 is less than the minimum of 1"),
    ]
    for params, code, reason, says in cases:
        for method in ("generate", "prepare"):
            error = bridge.call(method, params)["error"]
            assert (error["code"], error["data"]["reason"]) == (code, reason), (method, error)
            assert says in error["message"], error
    assert bridge.close() == 0


def test_the_error_schema_lists_every_code() -> None:
    """bindings/schema/v1/error.json names every reason and its code, as the bridge has them
    (the Node client's ErrorCodes are checked against the same file)."""
    from specsteer.bridge.errors import CODES
    from specsteer.bridge.schemas import SCHEMA_DIR

    schema = json.loads((SCHEMA_DIR / "error.json").read_text(encoding="utf-8"))
    assert schema["codes"] == {reason: code for code, reason in CODES.items()}
    assert schema["$defs"]["reason"]["enum"] == list(CODES.values())


def test_only_a_refusal_no_retry_fixes_tells_the_client_not_to_retry() -> None:
    """A companion that refuses the bridge's token or models: `x-should-retry: false`; one at its
    session limit (it may free a session) leaves the client's retries alone."""
    from specsteer.bridge.errors import from_exception
    from specsteer.bridge.openai_api import bridge_error
    from specsteer.errors import CompanionAuthError, CompanionError, CompanionTLSError

    for refusal in (CompanionAuthError(9, "unknown or revoked device token"),
                    CompanionTLSError("certificate verify failed")):
        error = from_exception(refusal)
        assert error.data == {"reason": "companion_error", "refused": True}
        assert (bridge_error(error).status, bridge_error(error).retry) == (502, False)
    full = from_exception(CompanionError(13, "the companion holds as many sessions as it can"))
    assert "refused" not in full.data
    assert (bridge_error(full).status, bridge_error(full).retry) == (502, None)
